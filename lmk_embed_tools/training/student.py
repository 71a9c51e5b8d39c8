"""A recurrent student of a sentence-transformers teacher: a fresh Mamba2 embedder distilled from it.

No pretrained recurrent LM is reachable offline, so the recurrent family's first trained model is
taught by the one real model here (all-MiniLM-L6-v2): the student reads the teacher's tokenizer
(WordPiece, its [SEP] as the EOS the student pools) and starts from the teacher's word embeddings
(same width); its Mamba2 layers are fresh. It learns to reproduce the teacher's vector of every
text (embedding distillation, as Model2Vec / tokenlearn do for static embeddings) plus InfoNCE on
(synopsis, page) pairs, through the package's ordinary path: `init_student` writes the backbone,
`convert_to_recurrent` makes it a checkpoint, `finetune.train` trains it.

A page longer than the teacher reads gets the mean of the teacher's window vectors (LongEmbed's
PCW, the `windows-mean` baseline), so the student learns to embed whole pages in one recurrent pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

# Student sizes, chosen by measurement on 2 CPU cores (docs/recurrent-student.md). The width is the
# teacher's (384), so its word embeddings carry over; 12 heads of 64 = expand 2 x 384.
STUDENT_SIZES = {
    "demo": {"num_hidden_layers": 4, "state_size": 64, "head_dim": 64},
    "full": {"num_hidden_layers": 6, "state_size": 64, "head_dim": 64},
}
INITS = ("teacher-embeddings", "random")


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


def init_student(teacher: str | Path, folder: str | Path, *, init: str = "teacher-embeddings", seed: int = 0,
                 num_hidden_layers: int, state_size: int, head_dim: int) -> Path:
    """Write a fresh Mamba2 backbone (`Mamba2Model` + the teacher's tokenizer with [SEP] as EOS) to `folder`.

    `init="teacher-embeddings"` copies the teacher's word embeddings [vocab, D] into the student's;
    `"random"` keeps the fresh ones. Everything else is fresh (seeded), at mamba_ssm's scale."""
    from transformers import AutoModel, AutoTokenizer, Mamba2Model

    if init not in INITS:
        raise ValueError(f"Unknown `init` {init!r}; expected one of {list(INITS)}.")
    tokenizer = AutoTokenizer.from_pretrained(str(teacher))
    eos = tokenizer.eos_token or tokenizer.sep_token
    if eos is None:
        raise ValueError(f"The teacher's tokenizer ({teacher}) has neither an EOS nor a SEP token for the student to pool.")
    tokenizer.eos_token = eos
    teacher_model = AutoModel.from_pretrained(str(teacher))
    config = student_backbone_config(teacher_model.config, num_hidden_layers=num_hidden_layers, state_size=state_size,
                                     head_dim=head_dim, eos_token_id=tokenizer.convert_tokens_to_ids(eos),
                                     pad_token_id=tokenizer.pad_token_id or 0)
    torch.manual_seed(seed)
    student = Mamba2Model(config)
    with torch.no_grad():
        # mamba_ssm scales each residual projection by 1/sqrt(layers). Done here, not by the config's
        # `rescale_prenorm_residual`: transformers 5 applies that flag again to weights it loads.
        for layer in student.layers:
            layer.mixer.out_proj.weight /= math.sqrt(num_hidden_layers)
        if init == "teacher-embeddings":
            student.get_input_embeddings().weight.copy_(teacher_model.get_input_embeddings().weight)
    folder = Path(folder)
    student.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def teacher_page_vectors(teacher, texts: list[str], window: int | None = None, batch_size: int = 32) -> np.ndarray:
    """The teacher's unit vector of each whole text [n, D]: one pass when the text fits its window,
    else the normalised mean of its windows' unit vectors (every token read, none truncated).

    `teacher` is a SentenceTransformer; `window` defaults to its `max_seq_length`."""
    from lmk_embed_tools.evaluation.retrievers import window_texts

    window = int(window or teacher.max_seq_length)
    content = max(window - teacher.tokenizer.num_special_tokens_to_add(), 1)
    pieces = [window_texts(teacher.tokenizer, text, content, None) for text in texts]
    flat = [piece for row in pieces for piece in row]
    previous, teacher.max_seq_length = teacher.max_seq_length, window
    try:
        vectors = teacher.encode(flat, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=len(flat) > 10 * batch_size)
    finally:
        teacher.max_seq_length = previous
    bounds = np.cumsum([0] + [len(row) for row in pieces])
    means = np.stack([vectors[a:b].mean(axis=0) for a, b in zip(bounds[:-1], bounds[1:])])
    return means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)


def cut_to_tokens(tokenizer, texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut to the characters of its first `max_tokens` content tokens (a text that fits is
    unchanged), so the student and the teacher read exactly the same tokens."""
    from lmk_embed.encoding import encode_content

    cut = []
    for text, encoding in zip(texts, encode_content(tokenizer, texts, max_tokens=max_tokens)):
        offsets = encoding.offsets
        cut.append(text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]])
    return cut


def add_student_teacher_embeddings(rows: list[dict], teacher, query_max_length: int, passage_max_length: int,
                                   window: int | None = None, batch_size: int = 32) -> list[dict]:
    """Cut each row's texts to what the student reads (max length less its EOS) and set `teacher_embeddings`
    to the teacher's vectors [query, positive, negatives...]: queries in one pass, pages as
    `teacher_page_vectors` (windows past the teacher's length). Rounded to 6 decimals."""
    tokenizer = teacher.tokenizer
    queries = cut_to_tokens(tokenizer, [r["query"] for r in rows], query_max_length - 1)
    per_row = 1 + len(rows[0]["negatives"]) if rows else 0
    pages = cut_to_tokens(tokenizer, [p for r in rows for p in [r["positive"], *r["negatives"]]], passage_max_length - 1)
    query_vectors = teacher_page_vectors(teacher, queries, window, batch_size)
    page_vectors = teacher_page_vectors(teacher, pages, window, batch_size).reshape(len(rows), per_row, -1)
    for i, row in enumerate(rows):
        row["query"], row["positive"], row["negatives"] = queries[i], pages[i * per_row], pages[i * per_row + 1:(i + 1) * per_row]
        vectors = np.concatenate([query_vectors[i][None], page_vectors[i]])
        row["teacher_embeddings"] = np.round(vectors.astype(np.float64), 6).tolist()
    return rows


# The student's recipe (`train_student`): the whole model trains (nothing of it is pretrained but
# the embeddings), InfoNCE with in-batch negatives plus `distill_weight` x the cosine distance to the
# teacher's vectors, under bfloat16 autocast where the CPU has it (AVX512_BF16 / AMX). Pages are read
# to 512 tokens and their teacher vector is the windows-mean past 256. Weights were chosen on the
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
    the teacher's vectors (`add_student_teacher_embeddings`)."""
    from .recipe import docs_training_rows

    rows = docs_training_rows(corpus, num_negatives=recipe["num_negatives"], max_rows=max_rows, seed=seed)
    return add_student_teacher_embeddings(rows, teacher, recipe["query_max_length"], recipe["passage_max_length"])


def train_student(teacher: str | Path, train_file: str | Path, output_dir: str | Path, *, size: str | dict = "demo",
                  steps: int, init: str = "teacher-embeddings", bf16: bool | None = None, seed: int = 0,
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
    backbone = init_student(teacher, output_dir / "backbone", init=init, seed=seed, **size)
    checkpoint = convert_to_recurrent(backbone, output_dir / "init", distilled_from=str(teacher_id or teacher))
    run = TrainConfig(model=str(checkpoint), output_dir=str(output_dir / "run"), train_data=str(train_file),
                      eval_data="none", max_steps=steps, save_steps=100_000, logging_steps=logging_steps, seed=seed,
                      bf16=cpu_has_bf16() if bf16 is None else bf16, **recipe)
    return train(run)
