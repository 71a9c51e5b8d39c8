"""A recurrent student of a sentence-transformers teacher: a fresh Mamba2 embedder distilled from it.

No pretrained recurrent LM is reachable offline, so the recurrent family's first trained model is
taught by the one real model here (all-MiniLM-L6-v2): the student reads the teacher's tokenizer
(WordPiece, its [SEP] as the EOS the student pools) and, by default, starts as a bag of the
teacher's static token vectors (Model2Vec's distillation, SIF-weighted), built into its first
Mamba2 layer; the other layers start as the identity. It learns to reproduce the teacher's vector of every
text (embedding distillation, as Model2Vec / tokenlearn do for static embeddings) plus InfoNCE on
(synopsis, page) pairs, through the package's ordinary path: `init_student` writes the backbone,
`convert_to_recurrent` makes it a checkpoint, `finetune.train` trains it.

A page longer than the teacher reads gets a target from every one of the teacher's window vectors
(their mean, LongEmbed's PCW, mixed with the first window: `teacher_page_vectors`), so the student
learns to embed whole pages in one recurrent pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from lmk_embed.compat import mamba2_parts
from lmk_embed_tools.compat import transformers_model

from .teacher_targets import add_student_teacher_embeddings, cut_to_tokens, teacher_page_vectors  # noqa: F401

# Student sizes, chosen by measurement on 2 CPU cores (docs/recurrent-student.md). The width is the
# teacher's (384), so its word embeddings carry over; 12 heads of 64 = expand 2 x 384.
STUDENT_SIZES = {
    "demo": {"num_hidden_layers": 4, "state_size": 64, "head_dim": 64},
    "full": {"num_hidden_layers": 6, "state_size": 64, "head_dim": 64},
}
INITS = ("static-bag", "teacher-embeddings", "random")
# SIF's a in a / (a + p(token)), chosen on the validation source: a bag of the teacher's token vectors
# scored nDCG@10 0.536 with 1e-3, 0.531 with 1e-4 and 0.377 with 1e-5 (docs/recurrent-student.md).
SIF_SMOOTHING = 1e-3


def student_backbone_config(teacher_config, *, num_hidden_layers: int, state_size: int, head_dim: int, eos_token_id: int,
                            pad_token_id: int):
    """A transformers `Mamba2Config` as wide as the teacher, over the teacher's vocabulary. Its
    `initializer_range` is nn.Linear's default scale, std 1/sqrt(3 x D), as in mamba_ssm; transformers'
    default (0.1) puts in_proj at 3.4x that, and a student so initialised trains slower
    (docs/recurrent-student.md)."""
    from transformers import Mamba2Config

    width = int(teacher_config.hidden_size)
    if (2 * width) % head_dim:
        raise ValueError(f"`head_dim` {head_dim} must divide the student's inner width {2 * width} (expand 2 x {width}).")
    return Mamba2Config(
        vocab_size=int(teacher_config.vocab_size), hidden_size=width, num_hidden_layers=num_hidden_layers,
        state_size=state_size, head_dim=head_dim, num_heads=2 * width // head_dim, expand=2, n_groups=1,
        chunk_size=64, pad_token_id=pad_token_id, bos_token_id=eos_token_id, eos_token_id=eos_token_id,
        tie_word_embeddings=False, initializer_range=1 / math.sqrt(3 * width),
    )


def static_token_vectors(teacher, batch_size: int = 1024) -> torch.Tensor:
    """The teacher's sentence vector of each vocabulary token read alone ([CLS] token [SEP]) [vocab, D]
    float64: Model2Vec's distillation of a sentence-transformers model into static vectors."""
    tokenizer, vocab = teacher.tokenizer, transformers_model(teacher).config.vocab_size
    ids, vectors = torch.arange(vocab), []
    with torch.no_grad():
        for start in range(0, vocab, batch_size):
            tokens = ids[start:start + batch_size]
            batch = torch.stack([torch.full_like(tokens, tokenizer.cls_token_id), tokens,
                                 torch.full_like(tokens, tokenizer.sep_token_id)], dim=1)
            features = {"input_ids": batch, "attention_mask": torch.ones_like(batch), "token_type_ids": torch.zeros_like(batch)}
            vectors.append(teacher(features)["sentence_embedding"].double())
    return torch.cat(vectors)


def sif_weights(tokenizer, texts: list[str], vocab_size: int, smoothing: float = SIF_SMOOTHING) -> torch.Tensor:
    """SIF's weight a / (a + p(token)) of each vocabulary token [vocab] float64, p from the token counts of
    `texts` (add-one, so an unseen token weighs about 1): frequent tokens count little in a bag."""
    counts = torch.ones(vocab_size, dtype=torch.float64)
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size).double()
    return smoothing / (smoothing + counts / counts.sum())


# The bag layer's constants. Each puts the layer where it is linear: a gate far from silu's bend and dt
# small enough that softplus(x) ~ exp(x); x is read as +u and -u, since silu(z) - silu(-z) = z at any
# scale. Each also sets how far one optimiser step moves the bag: Adam moves every parameter by about
# the learning rate per step, so a coordinate's gain must be small. The embedding rows sit at the norm
# the block's RMSNorm gives them (sqrt(D)) and dt's slope on beta is BAG_DT_SLOPE: one step at 2e-3
# moves a token's log-weight by about 0.02. (With rows at unit norm and a slope of 100, it moved by 4,
# and training undid the bag; docs/recurrent-student.md.)
BAG_GATE, BAG_INPUT, BAG_DT_SLOPE, BAG_DT_BASE, BAG_CONSTANT, BAG_DECAY = 10.0, 1.0, 10.0, 0.01, 0.05, 1e-4


def static_bag_student(student, static: torch.Tensor, weights: torch.Tensor, eos_token_id: int) -> None:
    """Set `student` (a fresh `Mamba2Model`) so that its state at EOS is the SIF-weighted sum of the teacher's
    static vectors of the tokens before it, in D-2 principal directions, in place.

    The embedding of token t is sqrt(D) x [u_t (D-2, unit norm), beta_t, c]: u_t is its static vector
    in the principal directions, beta_t encodes log w_t and c is a constant. Layer 0's mixer then reads
    a constant gate from c, the input x_t = [u_t, -u_t] (2 x (D-2) channels), constant B and C,
    dt_t ~ w_t from beta_t and no decay, so its scan sums w_t silu(u_t) and w_t silu(-u_t); its
    out_proj writes their difference, the sum of w_t u_t, back to the residual stream at about unit rms.
    The other layers start as the identity (out_proj zero). The EOS row keeps no content of its own.
    """
    width = student.config.hidden_size
    content = width - 2
    layers = mamba2_parts(student).layers
    mixer = layers[0].mixer
    inner = mixer.intermediate_size
    if inner < 2 * content:
        raise ValueError(f"A static bag needs an inner width of at least {2 * content} (2 x (D-2)), got {inner}.")
    centered = static - static.mean(dim=0)
    directions = torch.linalg.svd(centered, full_matrices=False).Vh[:content]   # [D-2, D]
    units = static @ directions.T
    units = units / units.norm(dim=1, keepdim=True).clamp_min(1e-12)
    # The block's RMSNorm scales a row to norm sqrt(D); beta is set so that BAG_DT_SLOPE x beta's normed
    # value is log w, since the row's norm is close to sqrt(D (1 + c^2)) (beta is small).
    beta = torch.log(weights) * math.sqrt(1 + BAG_CONSTANT ** 2) / (BAG_DT_SLOPE * math.sqrt(width))
    embeddings = torch.cat([units, beta[:, None], torch.full_like(beta[:, None], BAG_CONSTANT)], dim=1)
    embeddings[eos_token_id, :content] = 0
    with torch.no_grad():
        student.get_input_embeddings().weight.copy_(embeddings * math.sqrt(width))
        channels = torch.arange(content)
        in_proj = torch.zeros_like(mixer.in_proj.weight)                 # rows: gate | x | B | C | dt
        in_proj[:inner, content + 1] = BAG_GATE
        in_proj[inner + channels, channels] = BAG_INPUT
        in_proj[inner + content + channels, channels] = -BAG_INPUT
        in_proj[inner + mixer.conv_dim:, content] = BAG_DT_SLOPE
        mixer.in_proj.weight.copy_(in_proj)
        conv = torch.zeros_like(mixer.conv_weight)                          # [channels, k], a view of the weight
        conv[:, -1] = 1.0                                                  # the current token alone
        mixer.conv_weight.copy_(conv)
        mixer.conv_bias.zero_()
        mixer.conv_bias[inner:] = 2.0                                      # B = C = silu(2), constant
        mixer.dt_bias.fill_(math.log(BAG_DT_BASE))
        mixer.A_log.fill_(math.log(BAG_DECAY))
        mixer.D.zero_()
        mixer.norm.weight.fill_(1.0)
        # The gated norm scales the sums [S+, S-, 0] to unit rms over the inner width; out_proj writes
        # S+ - S- (the sum of w_t u_t) back at about unit rms.
        scale = 0.5 * math.sqrt(inner / (2 * content))
        out_proj = torch.zeros_like(mixer.out_proj.weight)
        out_proj[channels, channels] = scale
        out_proj[channels, content + channels] = -scale
        mixer.out_proj.weight.copy_(out_proj)
        for layer in layers[1:]:
            layer.mixer.out_proj.weight.zero_()


def init_student(teacher: str | Path, folder: str | Path, *, init: str = "static-bag", seed: int = 0,
                 num_hidden_layers: int, state_size: int, head_dim: int, frequency_texts: list[str] | None = None) -> Path:
    """Write a fresh Mamba2 backbone (`Mamba2Model` + the teacher's tokenizer with [SEP] as EOS) to `folder`.

    `init="static-bag"` starts the student as a SIF-weighted bag of the teacher's static token vectors
    (`static_bag_student`; the weights come from the token counts of `frequency_texts`, the texts as
    the student reads them). `"teacher-embeddings"` copies the teacher's word embeddings [vocab, D]
    into the student's; `"random"` keeps the fresh ones. Everything else is fresh (seeded), at mamba_ssm's scale."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, Mamba2Model

    if init not in INITS:
        raise ValueError(f"Unknown `init` {init!r}; expected one of {list(INITS)}.")
    if init == "static-bag" and not frequency_texts:
        raise ValueError("`init='static-bag'` needs `frequency_texts`, whose token counts weigh the bag.")
    tokenizer = AutoTokenizer.from_pretrained(str(teacher))
    eos = tokenizer.eos_token or tokenizer.sep_token
    if eos is None:
        raise ValueError(f"The teacher's tokenizer ({teacher}) has neither an EOS nor a SEP token for the student to pool.")
    tokenizer.eos_token = eos
    teacher_model = SentenceTransformer(str(teacher), device="cpu")
    teacher_config = transformers_model(teacher_model).config
    config = student_backbone_config(teacher_config, num_hidden_layers=num_hidden_layers, state_size=state_size,
                                     head_dim=head_dim, eos_token_id=tokenizer.convert_tokens_to_ids(eos),
                                     pad_token_id=tokenizer.pad_token_id or 0)
    torch.manual_seed(seed)
    student = Mamba2Model(config)
    with torch.no_grad():
        # mamba_ssm scales each residual projection by 1/sqrt(layers). Done here, not by the config's
        # `rescale_prenorm_residual`: transformers 5 applies that flag again to weights it loads.
        for layer in mamba2_parts(student).layers:
            layer.mixer.out_proj.weight /= math.sqrt(num_hidden_layers)
        if init == "teacher-embeddings":
            student.get_input_embeddings().weight.copy_(transformers_model(teacher_model).get_input_embeddings().weight)
    if init == "static-bag":
        weights = sif_weights(tokenizer, frequency_texts, teacher_config.vocab_size)
        static_bag_student(student, static_token_vectors(teacher_model), weights, config.eos_token_id)
    folder = Path(folder)
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# The weight of a page target's first window (`teacher_page_vectors`): 0 is the teacher's windows-mean,
# 1 its one pass over the first window alone. As a retriever the windows-mean ranks pages well below
# the one pass, and the student cannot beat its target; the validation source chose 0.75 among the
# targets that still read the whole page (docs/recurrent-student.md).
PAGE_FIRST_WINDOW_WEIGHT = 0.75


# The student's recipe (`train_student`): the whole model trains (nothing of it is pretrained but
# the embeddings), InfoNCE with in-batch negatives plus `distill_weight` x the cosine distance to the
# teacher's vectors, under bfloat16 autocast where the CPU has it (AVX512_BF16 / AMX). Pages are read
# to 512 tokens; past 256 their teacher vector weighs the first window and the windows-mean
# (`PAGE_FIRST_WINDOW_WEIGHT`). Weights were chosen on the
# validation source (docs/recurrent-student.md).
STUDENT_RECIPE = {
    "finetune": "full",
    "learning_rate": 2e-3,
    "warmup_ratio": 0.05,
    "per_device_train_batch_size": 32,
    "group_by_length": True,
    "num_negatives": 0,
    "query_max_length": 64,
    "passage_max_length": 512,
    "temperature": 0.05,
    "distill_weight": 4.0,
}


def cpu_has_bf16() -> bool:
    """bfloat16 autocast pays on this CPU: it has AVX512_BF16 or AMX (Linux /proc/cpuinfo flags)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def student_training_rows(corpus, teacher, recipe: dict, max_rows: int | None, seed: int = 0) -> list[dict]:
    """The recipe's (synopsis, page) rows from the training sources, cut to the student's lengths, with
    the teacher's vectors (`add_student_teacher_embeddings`, pages' first windows at
    `PAGE_FIRST_WINDOW_WEIGHT`)."""
    from .recipe import docs_training_rows

    rows = docs_training_rows(corpus, num_negatives=recipe["num_negatives"], max_rows=max_rows, seed=seed)
    return add_student_teacher_embeddings(rows, teacher, recipe["query_max_length"], recipe["passage_max_length"],
                                          first_window_weight=PAGE_FIRST_WINDOW_WEIGHT)


def student_texts(train_file: str | Path) -> list[str]:
    """Every text of `train_file`'s rows as the student reads it: queries after the family's instruction."""
    import json

    from lmk_embed.configuration_recurrent import DEFAULT_TASK, QUERY_TEMPLATE

    prompt = QUERY_TEMPLATE.format(task=DEFAULT_TASK)
    texts = []
    with open(train_file) as rows:
        for line in rows:
            row = json.loads(line)
            texts += [prompt + row["query"], row["positive"], *row.get("negatives", [])]
    return texts


def train_student(teacher: str | Path, train_file: str | Path, output_dir: str | Path, *, size: str | dict = "demo",
                  steps: int, init: str = "static-bag", bf16: bool | None = None, seed: int = 0,
                  recipe: dict | None = None, teacher_id: str | None = None, logging_steps: int = 20) -> dict:
    """Initialise a student (`init_student`), convert it (`convert_to_recurrent`) and train it on
    `train_file` (rows with `teacher_embeddings`) for `steps` steps; returns `finetune.train`'s result.
    `teacher_id` (default: `teacher`) is recorded as the checkpoint's `distilled_from`, for its card."""
    from .config import TrainConfig
    from .convert import convert_to_recurrent
    from .finetune import train

    if isinstance(size, str):
        if size not in STUDENT_SIZES:
            raise ValueError(f"Unknown `size` {size!r}; expected one of {list(STUDENT_SIZES)} or a dict of their fields.")
        size = STUDENT_SIZES[size]
    recipe = {**STUDENT_RECIPE, **(recipe or {})}
    output_dir = Path(output_dir)
    frequency_texts = student_texts(train_file) if init == "static-bag" else None
    backbone = init_student(teacher, output_dir / "backbone", init=init, seed=seed, frequency_texts=frequency_texts, **size)
    checkpoint = convert_to_recurrent(backbone, output_dir / "init", distilled_from=str(teacher_id or teacher))
    run = TrainConfig(model=str(checkpoint), output_dir=str(output_dir / "run"), train_data=str(train_file),
                      eval_data="none", max_steps=steps, save_steps=100_000, logging_steps=logging_steps, seed=seed,
                      bf16=cpu_has_bf16() if bf16 is None else bf16, **recipe)
    return train(run)
