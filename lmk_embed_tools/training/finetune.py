"""Contrastive fine-tuning of our checkpoints on the field's engines.

sentence-transformers provides the trainer, InfoNCE (MultipleNegativesRankingLoss), GradCache
(CachedMultipleNegativesRankingLoss), the KL distillation loss and the IR evaluator; peft the
LoRA adapters; bitsandbytes 4-bit QLoRA; accelerate / torchrun the multi-process runs; datasets
the data. This module only wires them to our two families:

- LMK: with the `variable` splitter, g is drawn once per batch (queries and passages alike) from
  the configured set; queries and passages have separate max lengths.
- Recurrent: instructions go on queries only; the schedule may be vertical for long passages
  (gradients through the carried state are exact).
- LMK with an extended position table: `position_skipping` gives passages skipped position ids
  (PoSE), and `finetune="positions"` trains the extended rows only (positions.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmk_embed_tools.compat import bitsandbytes_kept_out, import_peft_without_bitsandbytes

import_peft_without_bitsandbytes()  # before sentence-transformers imports it: bitsandbytes only for QLoRA
from sentence_transformers.base.sampler import DefaultBatchSampler
from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
from torch import nn
from transformers import TrainerCallback

from lmk_embed import lora_target_modules
from lmk_embed.encoding import check_positive_int

from .config import FAMILY_LEARNING_RATES, PASSAGE_MAX_LENGTH, QUERY_MAX_LENGTH, TrainConfig
from .data import load_training_rows, stdlib_training_rows, to_training_dataset
from .positions import extended_row_indices, extension_of, skipped_positions

logger = logging.getLogger(__name__)

RUN_CONFIG_NAME = "run_config.yaml"
EVAL_NAME = "stdlib-heldout"


# ---- pieces -------------------------------------------------------------------------------------


@dataclass
class EmbeddingDataCollator(SentenceTransformerDataCollator):
    """sentence-transformers' collator, plus: query vs passage max lengths by column position,
    and (LMK `variable` splitter) one granularity drawn per batch. `drawn` records the draws."""

    embedder: object = None
    query_max_length: int = QUERY_MAX_LENGTH
    passage_max_length: int = PASSAGE_MAX_LENGTH
    position_skipping: bool = False
    position_skipping_share: float = 1.0
    layout_options: dict = field(default_factory=dict)  # LMK: long_input / window_length for every column
    drawn: list = field(default_factory=list)
    tokens: int = 0  # real (unpadded) tokens collated so far, for `ThroughputCallback`

    def column_tasks(self, columns) -> dict[str, str]:
        """The role of each column: the first text column holds queries, the others passages
        (the label column and `dataset_name` are not text columns)."""
        texts = [name for name in columns if name != "dataset_name" and name not in self.valid_label_columns]
        return {name: "query" if position == 0 else "passage" for position, name in enumerate(texts)}

    def __post_init__(self):
        self.preprocess_texts = self.preprocess_fn
        self.preprocess_fn = self.preprocess_with_granularity
        self.granularity = None

    def preprocess_with_granularity(self, inputs, **kwargs):
        """The model's preprocess, given this batch's drawn g explicitly (LMK `variable` splitter)."""
        if self.granularity is not None:
            kwargs["granularity"] = self.granularity
        return self.preprocess_texts(inputs, **kwargs, **self.layout_options)

    def __call__(self, features):
        draw = getattr(self.embedder, "draw_granularity", None)
        self.granularity = draw() if draw is not None else None
        if self.granularity is not None:
            self.drawn.append(self.granularity)
        # The collator's public options: `router_mapping` gives each column its task and a `max_length`
        # dict each task its budget (set per call: the columns are known only here).
        self.router_mapping = self.column_tasks(features[0]) if features else {}
        self.max_length = {"query": self.query_max_length, "passage": self.passage_max_length}
        batch = super().__call__(features)
        for key in [k for k in batch if k.endswith("_task")]:  # column roles, not model inputs
            del batch[key]
        self.tokens += sum(int(v.sum()) for k, v in batch.items() if k.endswith("attention_mask"))
        if self.position_skipping:  # passages only: queries stay short at inference, on the original rows
            extension = extension_of(self.embedder)
            for name, task in self.router_mapping.items():
                if task == "passage":
                    batch[f"{name}_position_ids"] = skipped_positions(batch[f"{name}_attention_mask"], extension,
                                                                         share=self.position_skipping_share)
        return batch


class ThroughputCallback(TrainerCallback):
    """At every log: real tokens per second since the last log (the collator counts them) and the
    estimated time left, printed, and kept in `history` [(step, tokens/s, seconds left)]."""

    def __init__(self, collator: EmbeddingDataCollator):
        self.collator, self.history = collator, []
        self.last = None  # (time, tokens, step) at the previous log

    def on_step_begin(self, args, state, control, **kwargs):
        if self.last is None:  # from the first step: loading and setup are not throughput
            self.last = (time.perf_counter(), self.collator.tokens, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.last is None or state.global_step == self.last[2]:
            return
        now, tokens = time.perf_counter(), self.collator.tokens
        seconds, steps = now - self.last[0], state.global_step - self.last[2]
        rate, left = (tokens - self.last[1]) / seconds, (state.max_steps - state.global_step) * seconds / steps
        self.history.append((state.global_step, rate, left))
        self.last = (now, tokens, state.global_step)
        if state.is_world_process_zero:
            print(f"step {state.global_step}/{state.max_steps}: {rate:,.0f} tokens/s, about {left / 60:.1f} min left", flush=True)


class LengthGroupedBatchSampler(DefaultBatchSampler):
    """Batches of rows of similar length, each row once, no text twice in a batch.

    A batch is padded to its longest passage, so random batches of documentation pages (a third run
    past 512 tokens) are padded to the maximum length nearly every step. Like transformers'
    `group_by_length`, the rows are shuffled, cut into mega-batches of `MEGA_BATCH` batches, sorted
    by length within each, then cut into batches whose order is shuffled again. Length is the
    characters of a row's text columns (a proxy for tokens that needs no tokenizer). A row that
    would put a text twice into a batch (a duplicate, which would be its own in-batch negative) waits
    for the next batch, as sentence-transformers' `NO_DUPLICATES` sampler does.
    """

    MEGA_BATCH = 50

    def __init__(self, dataset, batch_size: int, drop_last: bool, valid_label_columns=None, generator=None, seed: int = 0):
        super().__init__(dataset, batch_size=batch_size, drop_last=drop_last, valid_label_columns=valid_label_columns,
                         generator=generator, seed=seed)
        text_columns = [name for name in dataset.column_names if name not in (valid_label_columns or []) and name != "label"]
        self.texts = list(zip(*(dataset[name] for name in text_columns)))
        self.lengths = [sum(len(text) for text in row) for row in self.texts]
        self._batches: tuple[int, list[list[int]]] | None = None

    def _batches_for_epoch(self) -> list[list[int]]:
        if self._batches is not None and self._batches[0] == self.epoch:
            return self._batches[1]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        mega = self.batch_size * self.MEGA_BATCH
        batches = []
        for start in range(0, len(order), mega):
            pending = sorted(order[start:start + mega], key=lambda i: -self.lengths[i])
            while pending:
                batch, seen, waiting = [], set(), []
                for index in pending:
                    if len(batch) < self.batch_size and seen.isdisjoint(self.texts[index]):
                        batch.append(index)
                        seen.update(self.texts[index])
                    else:
                        waiting.append(index)
                batches.append(batch)
                pending = waiting
        if self.drop_last:
            batches = [batch for batch in batches if len(batch) == self.batch_size]
        shuffled = torch.randperm(len(batches), generator=generator).tolist()
        self._batches = (self.epoch, [batches[i] for i in shuffled])
        return self._batches[1]

    def __iter__(self):
        yield from self._batches_for_epoch()

    def __len__(self) -> int:
        return len(self._batches_for_epoch())


class InfoNCEWithDistillation(nn.Module):
    """InfoNCE plus `weight` x KL(teacher || student) over (positive, negatives), on one embedding pass."""

    def __init__(self, model, temperature: float, weight: float, teacher_temperature: float, gather_across_devices: bool):
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import DistillKLDivLoss, MultipleNegativesRankingLoss

        self.model = model
        self.infonce = MultipleNegativesRankingLoss(model, scale=1 / temperature, gather_across_devices=gather_across_devices)
        self.distill = DistillKLDivLoss(model, student_temperature=temperature, teacher_temperature=teacher_temperature)
        self.weight = weight

    def forward(self, sentence_features, labels):
        embeddings = [self.model(features)["sentence_embedding"] for features in sentence_features]
        return self.infonce.compute_loss_from_embeddings(embeddings, labels) + self.weight * (
            self.distill.compute_loss_from_embeddings(embeddings, labels)
        )


class InfoNCEWithEmbeddingDistillation(nn.Module):
    """InfoNCE plus `weight` x mean cosine distance between the student's and a teacher's embedding of
    every text in the row (query, positive, negatives), on one embedding pass.

    `labels` is [batch, columns * dim]: the teacher's vectors, flattened per row. Matching the
    teacher's vectors keeps what the teacher (the untouched base) knows while the student learns a
    new pooling; it is a far denser signal than scores over a few candidates.
    """

    def __init__(self, model, temperature: float, weight: float, gather_across_devices: bool):
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        self.model = model
        self.infonce = MultipleNegativesRankingLoss(model, scale=1 / temperature, gather_across_devices=gather_across_devices)
        self.weight = weight

    def forward(self, sentence_features, labels):
        embeddings = [self.model(features)["sentence_embedding"] for features in sentence_features]
        student = torch.stack(embeddings, dim=1)  # [batch, columns, dim]
        teacher = labels.to(student.dtype).view(student.shape[0], student.shape[1], -1)
        if teacher.shape != student.shape:
            raise ValueError(f"teacher embeddings have shape {tuple(teacher.shape)}; the student's are {tuple(student.shape)}.")
        distance = 1 - nn.functional.cosine_similarity(student, teacher, dim=-1).mean()
        return self.infonce.compute_loss_from_embeddings(embeddings, None) + self.weight * distance


def model_family(model: str) -> tuple[str, str]:
    """(our model_type, the backbone's model_type) of a checkpoint folder or Hub id."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, trust_remote_code=True)
    if config.model_type not in FAMILY_LEARNING_RATES:
        raise ValueError(f"`model` must be one of our checkpoints (LMK or recurrent); {model!r} is {config.model_type!r}.")
    return config.model_type, config.backbone_config.model_type


def check_qlora_supported(model: str) -> None:
    """QLoRA needs bitsandbytes; on CPU its 4-bit kernels need layer widths that are multiples of 32."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as error:
        raise ValueError("`finetune='qlora'` needs bitsandbytes: pip install 'lmk-embed[train]'.") from error
    if torch.cuda.is_available():
        return
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(model, trust_remote_code=True)
    with torch.device("meta"):
        skeleton = AutoModel.from_config(config, trust_remote_code=True)
    odd = [f"{name} ({m.in_features}->{m.out_features})" for name, m in skeleton.named_modules()
           if isinstance(m, nn.Linear) and (m.in_features % 32 or m.out_features % 32)]
    if odd:
        raise ValueError(
            "`finetune='qlora'` cannot run on this CPU-only machine: bitsandbytes' CPU 4-bit kernels need every "
            f"linear layer's widths to be multiples of 32, and these are not: {odd[:4]}"
            f"{' ...' if len(odd) > 4 else ''}. Use finetune='lora' here, or a GPU."
        )


def apply_overrides(embedder, config: TrainConfig, family: str) -> None:
    """Per-run changes to the model's own config (saved with the trained model) and tokenizer."""
    lmk_fields = ("splitter", "granularities", "granularity")
    recurrent_fields = ("schedule", "block_size")
    lmk_only = (*lmk_fields, "passage_long_input", "passage_window_length")
    wrong = [n for n in (recurrent_fields if family == "lmk_embedder" else lmk_only) if getattr(config, n) is not None]
    if wrong:
        kind = "recurrent" if family == "lmk_embedder" else "LMK"
        raise ValueError(f"{', '.join(f'`{n}`' for n in wrong)} applies to {kind} models only.")
    model_config = embedder.config
    if family == "lmk_embedder":
        for name in lmk_fields:
            if getattr(config, name) is not None:
                setattr(model_config, name, getattr(config, name))
        model_config.check()  # the model reads these from its config; the saved tokenizer mirrors them
    else:
        for name in recurrent_fields:
            if getattr(config, name) is not None:
                setattr(model_config, name, getattr(config, name))
        model_config.check()


def load_sentence_transformer(config: TrainConfig, family: str, backbone_type: str):
    """The checkpoint as a SentenceTransformer, with LoRA (or 4-bit + LoRA) attached as asked."""
    from peft import LoraConfig, TrainableTokensConfig
    from sentence_transformers import SentenceTransformer

    model_kwargs = {}
    if config.finetune == "qlora":
        check_qlora_supported(config.model)
        from transformers import BitsAndBytesConfig

        model_kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        )
    st = SentenceTransformer(config.model, trust_remote_code=True, model_kwargs=model_kwargs or None)
    embedder = st.transformers_model
    apply_overrides(embedder, config, family)
    set_dropout(embedder, config.dropout, config.attention_dropout)
    if config.freeze_input_embeddings:
        embedder.get_input_embeddings().weight.requires_grad_(False)  # the trainer's optimizer skips it
    if config.finetune == "qlora":
        from peft import prepare_model_for_kbit_training

        prepare_model_for_kbit_training(embedder, use_gradient_checkpointing=config.gradient_checkpointing)
    if config.finetune in ("lora", "qlora"):
        targets = config.lora_target_modules or lora_target_modules(backbone_type)
        if config.lora_layers is not None and targets == "all-linear":
            # peft accepts layers_to_transform only with a list of names: every Linear leaf name here.
            targets = sorted({name.rsplit(".", 1)[-1] for name, module in embedder.named_modules()
                              if isinstance(module, nn.Linear)})
        st.add_adapter(LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                                  target_modules=targets, layers_to_transform=config.lora_layers))
    if config.finetune == "positions":
        check_positions_trainable(config, embedder, family)
        st.add_adapter(TrainableTokensConfig(target_modules=["position_embeddings"],
                                             token_indices=extended_row_indices(embedder)))
    if config.position_skipping:
        if family != "lmk_embedder":
            raise ValueError("`position_skipping` applies to LMK models only.")
        extension_of(embedder)
    return st, embedder


def check_positions_trainable(config: TrainConfig, embedder, family: str) -> None:
    """`finetune='positions'` needs an extended table, and rows that reach it."""
    if family != "lmk_embedder":
        raise ValueError("`finetune='positions'` applies to LMK models only.")
    extension = extension_of(embedder)
    if not config.position_skipping and config.passage_max_length <= extension["original_positions"]:
        raise ValueError(
            f"`finetune='positions'` with `passage_max_length` {config.passage_max_length} never reaches the "
            f"extended rows (inputs of at most {extension['original_positions']} tokens read the original ones): "
            "set `position_skipping: true`, or a longer `passage_max_length`."
        )


def set_dropout(model: nn.Module, hidden: float | None, attention: float | None = None) -> None:
    """Set the dropout probabilities of `model` in place; None leaves them as the checkpoint has them.

    `attention` (default: `hidden`) goes to the attention-probability dropout: the `dropout` module beside
    `query`/`key` (BERT, RoBERTa, XLM-R, MiniLM) or a float `attention_dropout` attribute (ModernBERT and
    most decoder layers). `hidden` goes to every other dropout module.
    """
    attention = hidden if attention is None else attention
    attention_modules = set()
    for module in model.modules():
        if isinstance(getattr(module, "attention_dropout", None), float) and attention is not None:
            module.attention_dropout = attention
        if hasattr(module, "query") and hasattr(module, "key") and isinstance(getattr(module, "dropout", None), nn.Dropout):
            attention_modules.add(module.dropout)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            value = attention if module in attention_modules else hidden
            if value is not None:
                module.p = value


def build_loss(config: TrainConfig, st, has_teacher_scores: bool, has_teacher_embeddings: bool = False):
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    if has_teacher_embeddings and config.distill_weight > 0:
        if config.loss == "gradcache":
            raise ValueError("`loss='gradcache'` with teacher_embeddings distillation is not supported; use loss='infonce'.")
        return InfoNCEWithEmbeddingDistillation(st, config.temperature, config.distill_weight, config.gather_across_devices)
    if has_teacher_scores and config.distill_weight > 0:
        if config.loss == "gradcache":
            raise ValueError("`loss='gradcache'` with teacher_scores distillation is not supported; use loss='infonce'.")
        return InfoNCEWithDistillation(st, config.temperature, config.distill_weight, config.teacher_temperature,
                                       config.gather_across_devices)
    if config.loss == "gradcache":
        return CachedMultipleNegativesRankingLoss(st, scale=1 / config.temperature, mini_batch_size=config.gradcache_mini_batch_size,
                                                  gather_across_devices=config.gather_across_devices)
    return MultipleNegativesRankingLoss(st, scale=1 / config.temperature, gather_across_devices=config.gather_across_devices)


def build_evaluator(held_out, st, batch_size: int = 16):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    queries, corpus, relevant = held_out
    return InformationRetrievalEvaluator(
        queries, corpus, relevant, name=EVAL_NAME, batch_size=batch_size, show_progress_bar=False, write_csv=False,
        query_prompt=st.prompts.get("query") or None, corpus_prompt=st.prompts.get("document") or None,
        accuracy_at_k=[1], precision_recall_at_k=[1, 10], mrr_at_k=[10], ndcg_at_k=[10], map_at_k=[10],
    )


# ---- saving -------------------------------------------------------------------------------------


def save_final(config: TrainConfig, st, embedder, family: str) -> Path:
    """The trained model as a full checkpoint (full / merged) or as a LoRA adapter."""
    from transformers import AutoModel

    from .convert import save_checkpoint

    final_dir = Path(config.output_dir) / "final"
    if final_dir.exists():
        shutil.rmtree(final_dir)
    if config.finetune == "full":
        save_checkpoint(embedder, embedder.tokenizer, final_dir)
    elif config.save_mode == "adapter":
        embedder.save_pretrained(final_dir)  # adapter_config.json + adapter_model.safetensors
    else:  # merge into the unquantised base weights, loaded fresh, with peft's own merge
        from peft import PeftModel

        with tempfile.TemporaryDirectory() as adapter_dir:
            embedder.save_pretrained(adapter_dir)  # adapter_config.json + adapter_model.safetensors
            base = AutoModel.from_pretrained(config.model, trust_remote_code=True)
            for name in ("splitter", "granularities", "granularity", "schedule", "block_size"):
                if hasattr(base.config, name):
                    setattr(base.config, name, getattr(embedder.config, name))
            merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
            save_checkpoint(merged, embedder.tokenizer, final_dir)
    config.to_yaml(final_dir / RUN_CONFIG_NAME)
    return final_dir


# ---- the run --------------------------------------------------------------------------------------


def finished_run(config: TrainConfig) -> dict | None:
    """`train`'s result for a resume of a run that already reached its last step, or None. The
    trainer would take one more step past `max_steps` (at learning rate 0) and rewrite final/;
    instead the finished run's final/ is kept and returned, untouched."""
    from sentence_transformers import SentenceTransformer
    from transformers.trainer_utils import get_last_checkpoint

    resume = config.resume_from_checkpoint
    if resume is None:
        return None
    checkpoints = Path(config.output_dir) / "checkpoints"
    checkpoint = get_last_checkpoint(str(checkpoints)) if resume == "last" and checkpoints.is_dir() else resume
    state_file = Path(checkpoint or "") / "trainer_state.json"
    if not checkpoint or not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    last_step = config.max_steps if config.max_steps and config.max_steps > 0 else state.get("max_steps", float("inf"))
    if state.get("global_step", 0) < last_step:  # a larger --max_steps extends the run
        return None
    final_dir = Path(config.output_dir) / "final"
    if not (final_dir / "config.json").is_file():
        raise ValueError(f"`resume_from_checkpoint`: {checkpoint} is the last step ({state['global_step']}) of a finished run, "
                         f"but {final_dir} is missing; load the checkpoint's model and save it there, or train anew.")
    logger.warning("The run already finished at step %s (max_steps %s): %s is kept as it is.",
                   state["global_step"], state["max_steps"], final_dir)
    return {"model": SentenceTransformer(str(final_dir), trust_remote_code=True), "log_history": state.get("log_history", []),
            "final_dir": final_dir, "metrics": {}, "granularities_drawn": [], "load_report": None,
            "global_step": state["global_step"], "throughput": []}


def training_rows(config: TrainConfig) -> tuple[list[dict], list | None, dict | None]:
    """(training rows, held-out rows or None, the data file's load report or None) for `config`."""
    held_out = None
    if config.train_data == "stdlib":
        negatives = 1 if config.num_negatives is None else config.num_negatives
        rows, held_out = stdlib_training_rows(num_negatives=negatives, seed=config.seed)
        report = None
    else:
        rows, report = load_training_rows(config.train_data, config.num_negatives)
        if config.eval_data == "stdlib":
            _, held_out = stdlib_training_rows(num_negatives=0, seed=config.seed)
    if config.eval_data in (None, "none"):
        held_out = None
    if config.max_train_rows is not None:
        rows = rows[: config.max_train_rows]
    return rows, held_out, report


def training_arguments(config: TrainConfig, family: str, output_dir: Path, eval_during_training: bool):
    """sentence-transformers' training arguments for `config` (the family's learning rate by default)."""
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers

    return SentenceTransformerTrainingArguments(
        output_dir=str(output_dir / "checkpoints"),
        per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate or FAMILY_LEARNING_RATES[family],
        num_train_epochs=config.num_train_epochs,
        max_steps=config.max_steps,
        warmup_steps=config.warmup_ratio,  # a float below 1 is a ratio of the total steps
        weight_decay=config.weight_decay,
        lr_scheduler_type="linear",
        bf16=config.bf16,
        use_cpu=not (torch.cuda.is_available() or torch.backends.mps.is_available()),  # bf16 on CPU needs it said
        activation_checkpointing=config.gradient_checkpointing,
        logging_steps=config.logging_steps,
        eval_strategy="steps" if eval_during_training else "no",
        eval_steps=config.eval_steps if eval_during_training else None,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        seed=config.seed,
        data_seed=config.seed,
        batch_sampler=LengthGroupedBatchSampler if config.group_by_length else BatchSamplers.NO_DUPLICATES,
        report_to="none",
        ddp_backend=config.ddp_backend,
        dataloader_num_workers=config.dataloader_num_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        disable_tqdm=False,
    )


def train(config: TrainConfig) -> dict:
    """Run `config`; returns the trained SentenceTransformer ("model"), "final_dir", held-out "metrics",
    "log_history", "granularities_drawn", "load_report" and "global_step"."""
    with bitsandbytes_kept_out(config.finetune != "qlora"):  # peft imports it whenever it wraps a layer in LoRA
        return _run(config)


def _run(config: TrainConfig) -> dict:
    """`train`'s run, with bitsandbytes kept out unless it asks for 4-bit weights."""
    from sentence_transformers import SentenceTransformerTrainer
    from transformers import set_seed

    from lmk_embed_tools.compat import single_writer_trainer

    finished = finished_run(config)
    if finished is not None:
        return finished
    set_seed(config.seed)
    family, backbone_type = model_family(config.model)
    st, embedder = load_sentence_transformer(config, family, backbone_type)
    rows, held_out, report = training_rows(config)
    output_dir = Path(config.output_dir)  # written once the data is read: a bad file leaves nothing behind
    output_dir.mkdir(parents=True, exist_ok=True)
    config.to_yaml(output_dir / RUN_CONFIG_NAME)
    query_prefix = embedder.config.query_prompt if family == "recurrent_embedder" else None
    dataset = to_training_dataset(rows, query_prefix=query_prefix)
    columns = dataset.column_names  # a DatasetDict (rows with different numbers of negatives) gives one list each
    has_label = all("label" in names for names in (columns.values() if isinstance(columns, dict) else [columns]))
    has_vectors = has_label and rows[0].get("teacher_embeddings") is not None
    if has_label and config.distill_weight == 0:
        dataset = dataset.remove_columns("label")
    loss = build_loss(config, st, has_label and not has_vectors, has_vectors)
    if max(config.window_distill_weight, config.landmark_distill_weight, config.maxsim_weight) > 0:
        from sentence_transformers import SentenceTransformer

        from .long_pages import LongPageLoss

        if config.loss == "gradcache":
            raise ValueError("`window_distill_weight`, `landmark_distill_weight` and `maxsim_weight` need loss='infonce' "
                             "(not 'gradcache').")
        teacher = SentenceTransformer(config.window_teacher, device=str(st.device)) if config.window_teacher else None
        loss = LongPageLoss(st, teacher, config.temperature, config.distill_weight if has_vectors else 0.0,
                            config.window_distill_weight, config.landmark_distill_weight, config.maxsim_weight,
                            config.gather_across_devices)

    evaluator = build_evaluator(held_out, st) if held_out else None
    eval_during_training = evaluator is not None and config.eval_steps is not None
    if eval_during_training and config.finetune == "qlora" and not torch.cuda.is_available():
        # bitsandbytes on CPU repacks 4-bit weights irreversibly on an eval-mode forward.
        logger.warning("QLoRA on CPU: evaluation runs after training only (an eval forward would break training).")
        eval_during_training = False

    args = training_arguments(config, family, output_dir, eval_during_training)
    collator = EmbeddingDataCollator(
        preprocess_fn=st.preprocess, embedder=embedder,
        query_max_length=config.query_max_length, passage_max_length=config.passage_max_length,
        position_skipping=config.position_skipping, position_skipping_share=config.position_skipping_share,
        layout_options={option: getattr(config, f"passage_{option}") for option in ("long_input", "window_length")
                        if getattr(config, f"passage_{option}")},
    )
    trainer = single_writer_trainer(SentenceTransformerTrainer)(
        model=st, args=args, train_dataset=dataset, loss=loss,
        evaluator=evaluator if eval_during_training else None, data_collator=collator,
        callbacks=[throughput := ThroughputCallback(collator)],
    )
    resume = config.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=True if resume == "last" else resume)

    metrics = {}
    if trainer.is_world_process_zero():
        if evaluator is not None:
            metrics = evaluator(st)
        final_dir = save_final(config, st, embedder, family)
    else:
        final_dir = output_dir / "final"
    return {
        "model": st,
        "log_history": trainer.state.log_history,
        "final_dir": final_dir,
        "metrics": metrics,
        "granularities_drawn": collator.drawn,
        "load_report": report,
        "global_step": trainer.state.global_step,
        "throughput": throughput.history,
    }


# ---- several runs at once on one machine ----------------------------------------------------------


def _train_in_worker(config: TrainConfig, threads: int, log_path: str, caller: int) -> dict:
    """`train(config)` in a worker process on `threads` torch threads, its output into `log_path`;
    it exits when process `caller` (its parent) is gone. Returns `train`'s dict without the model
    (it stays in the worker)."""
    import os
    import sys
    import threading
    import time
    import traceback

    def exit_with_parent() -> None:  # a killed caller waits for no result: stop rather than train on for no one
        while os.getppid() == caller:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    with open(log_path, "w") as log:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)  # file descriptors, so that tqdm, logging and C++ warnings all land there
        os.dup2(log.fileno(), 2)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        run = train(config)
    except BaseException:
        traceback.print_exc()  # into the log as well: the caller's message points there
        sys.stderr.flush()
        raise
    run.pop("model")
    return {**run, "seconds": time.perf_counter() - start}


def train_side_by_side(configs: dict[str, TrainConfig], threads_per_run: int | None = None) -> dict[str, dict]:
    """Run `train` on every config at the same time, one process each, torch threads shared out.

    On a CPU, a training step gains well short of 2x from a second thread, so two runs on one
    thread each finish sooner than the same two runs one after the other on two threads
    (`benchmarks/side_by_side.py`). A run's result equals
    what `train` gives on the same number of threads. Each run writes its output to
    `<output_dir>/train.log`, which every config must have to itself. When a run fails, the error
    names it and its log, once the other runs have stopped. Returns {name: `train`'s dict without
    "model", plus "seconds"}.

    threads_per_run: torch threads of each run (default: this process's threads split evenly, at least 1).
    """
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    if not configs:
        raise ValueError("`configs` is empty: give at least one run.")
    if threads_per_run is None:
        threads_per_run = max(1, torch.get_num_threads() // len(configs))
    else:
        threads_per_run = check_positive_int("threads_per_run", threads_per_run)
    folders = [Path(config.output_dir).resolve() for config in configs.values()]
    if len(set(folders)) < len(folders):
        raise ValueError(f"Every config needs an `output_dir` of its own, got {[str(f) for f in folders]}.")
    logs = {}
    for name, folder in zip(configs, folders):
        folder.mkdir(parents=True, exist_ok=True)
        logs[name] = folder / "train.log"
    # spawn, not fork: a forked child would inherit this process's torch thread pool and locks.
    with ProcessPoolExecutor(max_workers=len(configs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_train_in_worker, config, threads_per_run, str(logs[name]), os.getpid())
                   for name, config in configs.items()}
        results, failures = {}, {}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except BrokenProcessPool as error:  # a worker was killed (out of memory?): every unfinished run reports this
                failures[name] = error
            except Exception as error:
                raise RuntimeError(f"Training run {name!r} failed; its output is in {logs[name]}") from error
    if failures:
        raise RuntimeError(f"A training process died (killed, or out of memory?) before finishing {sorted(failures)}; "
                           f"their output is in {', '.join(str(logs[name]) for name in failures)}") from next(iter(failures.values()))
    return results
