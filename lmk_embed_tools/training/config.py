"""One dataclass describes a training run; a YAML file (or flags) fills it, and it is saved beside
the checkpoint so the run can be repeated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

import yaml

from lmk_embed.configuration_lmk import LONG_INPUTS, OPTION, SPLITTERS, check_granularities, check_window_length
from lmk_embed.configuration_recurrent import SCHEDULES, check_block_size
from lmk_embed.encoding import check_positive_int

# The papers' learning rates: LMK fine-tunes the whole encoder at 2e-5; the recurrent embedders
# train QLoRA adapters at 4e-4 (Mamba2-1.3B needed 2.4e-3).
FAMILY_LEARNING_RATES = {"lmk_embedder": 2e-5, "recurrent_embedder": 4e-4}
# The token budgets of a training row: a query, and a passage (the base's pretraining length).
QUERY_MAX_LENGTH = 128
PASSAGE_MAX_LENGTH = 512


@dataclass
class TrainConfig:
    """A contrastive training run (InfoNCE with in-batch + hard negatives, optional distillation)."""

    model: str = field(default=None, metadata={"help": "Our checkpoint to train: a folder or a Hub id (LMK or recurrent)."})
    output_dir: str = field(default=None, metadata={"help": "Where checkpoints, the final model and run_config.yaml go."})
    train_data: str = field(default="stdlib", metadata={"help": "jsonl / csv / parquet file, or 'stdlib' (built-in, offline)."})
    eval_data: str | None = field(default="stdlib", metadata={"help": "'stdlib' (held-out modules) or none."})
    num_negatives: int | None = field(default=None, metadata={"help": "Hard negatives per query: rows with fewer are dropped, extra ones cut (default: each row's own, "
                "rows with different counts batched apart)."})
    max_train_rows: int | None = field(default=None, metadata={"help": "Use at most this many training rows."})
    query_max_length: int = QUERY_MAX_LENGTH
    passage_max_length: int = PASSAGE_MAX_LENGTH

    loss: Literal["infonce", "gradcache"] = field(default="infonce", metadata={"help": "gradcache: CachedMultipleNegativesRankingLoss."})
    temperature: float = field(default=0.02, metadata={"help": "InfoNCE temperature tau (scale = 1 / tau)."})
    gradcache_mini_batch_size: int = 8
    distill_weight: float = field(default=1.0, metadata={
        "help": "Weight of the distillation term: KL when rows have teacher_scores, cosine distance when they have teacher_embeddings."})
    teacher_temperature: float = 1.0
    window_distill_weight: float = field(default=0.0, metadata={
        "help": "LMK: weight of the window term: the cosine distance between each passage window's landmark mean and "
                "`window_teacher`'s vector of the same span (the user's own window vectors), averaged over windows."})
    landmark_distill_weight: float = field(default=0.0, metadata={
        "help": "LMK: weight of the landmark term: the cosine distance between every passage landmark state and "
                "`window_teacher`'s late chunk of its own chunk (its token states mean-pooled over the chunk, read in "
                "the same window), averaged over landmarks."})
    maxsim_weight: float = field(default=0.0, metadata={
        "help": "LMK: weight of an InfoNCE on the score the landmark index serves: a passage scored by its best "
                "landmark (max-sim), against every passage of the batch."})
    window_teacher: str | None = field(default=None, metadata={
        "help": "With window_distill_weight or landmark_distill_weight: the SentenceTransformer (folder or Hub id) "
                "whose window vectors and token states are the targets, usually the untouched base."})
    gather_across_devices: bool = field(default=False, metadata={"help": "Negatives from every device under DDP."})

    finetune: Literal["full", "lora", "qlora", "positions"] = field(default="lora", metadata={
        "help": "positions: only the extended position rows of an extended LMK checkpoint (peft TrainableTokens)."})
    position_skipping: bool = field(default=False, metadata={
        "help": "LMK, extended table: train short rows at skipped position ids of a virtual length up to N (PoSE)."})
    position_skipping_share: float = field(default=1.0, metadata={
        "help": "With position_skipping: the share of passages given skipped ids; the others keep their own "
                "positions (on the original rows, at most Lo tokens)."})
    freeze_input_embeddings: bool = field(default=False, metadata={
        "help": "finetune='full': keep the token embedding matrix as it is, so that tokens unseen in training stay "
                "in the space the trained layers read."})
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "Default: all linear layers; in_proj for Mamba2."})
    lora_layers: list[int] | None = field(default=None, metadata={
        "help": "Adapt only these layer indices (peft layers_to_transform); the layers below need no backward pass."})
    save_mode: Literal["merged", "adapter"] = field(default="merged", metadata={"help": "For LoRA/QLoRA: merged full checkpoint or adapter only."})

    dropout: float | None = field(default=None, metadata={
        "help": "Set every dropout module's probability while training (default: the checkpoint's). 0 makes CPU "
                "training at long lengths several times faster (no attention-mask sampling)."})
    attention_dropout: float | None = field(default=None, metadata={
        "help": "Dropout on the attention probabilities only (default: as `dropout`). 0 with `dropout` > 0 keeps the "
                "cheap hidden-state dropout and skips the attention masks, the costly part on CPU."})

    splitter: Literal[SPLITTERS] | None = field(default=None, metadata={"help": "LMK: override the checkpoint's splitter."})
    granularities: list[int] | None = field(default=None, metadata={"help": "LMK: the set `variable` draws g from."})
    granularity: int | None = field(default=None, metadata={"help": "LMK: g for `fixed`/`sentence` (and inference)."})
    passage_long_input: Literal[LONG_INPUTS] | None = field(default=None, metadata={
        "help": "LMK: how training reads a passage longer than a window (default: one pass); windows train in the "
                "schedule `encode()` reads long texts in. The checkpoint's own inference schedule is unchanged."})
    passage_window_length: int | None = field(default=None, metadata={
        "help": "LMK, passage_long_input='windows': W while training (default: the checkpoint's)."})
    schedule: Literal[SCHEDULES] | None = field(default=None, metadata={"help": "Recurrent: schedule while training."})
    block_size: int | str | None = field(default=None, metadata={
        "help": "Recurrent: V while training, a positive integer or 'auto' (default: the checkpoint's)."})

    learning_rate: float | None = field(default=None, metadata={"help": "Default per family: LMK 2e-5, recurrent 4e-4."})
    per_device_train_batch_size: int = 16
    group_by_length: bool = field(default=False, metadata={
        "help": "Batch rows of similar length (less padding: a cheaper step when lengths vary); no text twice in a batch."})
    gradient_accumulation_steps: int = 1
    num_train_epochs: float = 1.0
    max_steps: int = -1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    bf16: bool = False
    gradient_checkpointing: bool = False
    logging_steps: int = 10
    eval_steps: int | None = None
    save_steps: int = 500
    save_total_limit: int | None = 2
    seed: int = 42
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "'last' (the latest checkpoint) or a path."})
    ddp_backend: str | None = field(default=None, metadata={"help": "e.g. gloo for multi-process CPU runs."})
    dataloader_num_workers: int = 0

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Raise an error that names the field for every bad value: a TypeError for a wrong type, a
        ValueError for a wrong value (the options' own rules, as `encode()` and the checkpoint configs)."""
        if not self.model:
            raise ValueError("`model` is required: our checkpoint folder or Hub id.")
        if not self.output_dir:
            raise ValueError("`output_dir` is required.")
        positive_ints = ["query_max_length", "passage_max_length", "gradcache_mini_batch_size", "lora_r", "lora_alpha",
                         "per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps", "save_steps"]
        optional_ints = ["num_negatives", "eval_steps", "max_train_rows"]
        if isinstance(self.block_size, str) and self.block_size.isdigit():  # a flag's text
            self.block_size = int(self.block_size)
        if self.block_size is not None:
            check_block_size(self.block_size)  # the option's own rule: a positive integer or "auto"
        for name in positive_ints + optional_ints:
            value = getattr(self, name)
            if value is None and name not in positive_ints:
                continue
            if not (name == "num_negatives" and value == 0 and not isinstance(value, bool)):
                check_positive_int(name, value)
        if self.granularity is not None:  # the LMK options' own rules
            OPTION["granularity"].check(self.granularity, None)
        if self.granularities is not None:
            check_granularities(self.granularities)
        check_window_length(self.passage_window_length, "passage_window_length")
        for name in ("temperature", "teacher_temperature", "num_train_epochs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be > 0, got {getattr(self, name)!r}.")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0, got {self.learning_rate!r}.")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"`warmup_ratio` must be in [0, 1), got {self.warmup_ratio!r}.")
        for name in ("dropout", "attention_dropout"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be in [0, 1), got {getattr(self, name)!r}.")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"`lora_dropout` must be in [0, 1), got {self.lora_dropout!r}.")
        if isinstance(self.position_skipping_share, bool) or not 0 < self.position_skipping_share <= 1:
            raise ValueError(f"`position_skipping_share` must be in (0, 1], got {self.position_skipping_share!r}.")
        if self.position_skipping_share != 1 and not self.position_skipping:
            raise ValueError("`position_skipping_share` applies with `position_skipping: true` only.")
        if self.freeze_input_embeddings and self.finetune != "full":
            raise ValueError(f"`freeze_input_embeddings` applies with finetune='full' only (got {self.finetune!r}, "
                             "which trains no embeddings).")
        if self.distill_weight < 0:
            raise ValueError(f"`distill_weight` must be >= 0, got {self.distill_weight!r}.")
        for name in ("window_distill_weight", "landmark_distill_weight", "maxsim_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"`{name}` must be a number >= 0, got {value!r}.")
        taught = max(self.window_distill_weight, self.landmark_distill_weight)
        if (taught > 0) != bool(self.window_teacher):
            raise ValueError("`window_distill_weight` or `landmark_distill_weight` > 0 and `window_teacher` go together: "
                             f"give both or neither (got {self.window_distill_weight!r}, {self.landmark_distill_weight!r} "
                             f"and {self.window_teacher!r}).")
        choices = {"loss": ("infonce", "gradcache"), "finetune": ("full", "lora", "qlora", "positions"), "save_mode": ("merged", "adapter"),
                   "splitter": (*SPLITTERS, None), "schedule": (*SCHEDULES, None),
                   "passage_long_input": (*LONG_INPUTS, None)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"Unknown `{name}` {getattr(self, name)!r}; expected one of {[a for a in allowed if a]}.")
        if self.lora_layers is not None and (not self.lora_layers or any(
                isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.lora_layers)):
            raise ValueError(f"`lora_layers` must be a non-empty list of layer indices >= 0, got {self.lora_layers!r}.")
        if self.passage_window_length is not None and self.passage_long_input != "windows":
            raise ValueError("`passage_window_length` applies with passage_long_input='windows' only "
                             f"(got {self.passage_long_input!r}).")
        if self.eval_data not in (None, "stdlib", "none"):
            raise ValueError(f"`eval_data` must be 'stdlib' or none, got {self.eval_data!r}.")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"`max_steps` must be -1 (use num_train_epochs) or positive, got {self.max_steps!r}.")

    # ---- files -------------------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> TrainConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a training config must be a mapping of field: value.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {unknown}.")
        data.update(overrides)
        return cls(**data)

    def to_yaml(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(asdict(self), sort_keys=False))
        return path
