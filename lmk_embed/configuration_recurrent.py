"""Configuration of `RecurrentEmbedModel`: a recurrent LM backbone (nested config), EOS pooling,
query instructions and the inference schedule."""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .compat import restore_transformers_model_types
from .encoding import Option, check_choice, check_max_length, check_positive_int, option_defaults

SCHEDULES = ("auto", "horizontal", "vertical")
AUTO = "auto"
# The CPU block rule's budget: a block's per-layer working set should stay in the caches of a few
# cores (L2 + a share of L3). 8 MiB puts d=256 at V=512, the fastest V on two 2-core CPUs (float32
# and bfloat16, 1 and 2 threads), and d=768 at 256, level with 512 there (docs/recurrent-schedules.md).
CPU_CACHE_BUDGET = 8 * 2**20
# Floats a Mamba2-style layer touches per token, per unit of width d (expand 2): in_proj's output
# (~4.5d), the conv's input, padded copy and output (~7.5d), gate, y and the normed y (~3d), hidden
# and residual (~1d); rounded up to 16.
FLOATS_PER_TOKEN_PER_WIDTH = 16
MIN_AUTO_BLOCK, MAX_AUTO_BLOCK = 256, 4096
DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"
QUERY_TEMPLATE = "Instruct: {task}\nQuery: "
# Q, the GPU chunk of a backbone's chunked scan, for the "auto" V of a batch (2Q): read from the
# backbone (Mamba2's mixers), else this, Mamba2's own default, for backbones without a chunked scan.
DEFAULT_GPU_CHUNK_SIZE = 256


def check_schedule(schedule) -> str:
    """`schedule`, or a ValueError naming it: one of `SCHEDULES`."""
    return check_choice("schedule", schedule, SCHEDULES)


def check_block_size(block_size, name: str = "block_size") -> int | str:
    """V, or an error naming it (`name`): a positive integer, or "auto"."""
    if block_size == AUTO:
        return AUTO
    if isinstance(block_size, str):
        raise ValueError(f"`{name}` must be a positive integer or 'auto', got {block_size!r}.")
    return check_positive_int(name, block_size)


def check_recurrent_max_length(max_length, add_bos: bool, limit: int | None = None,
                               name: str = "max_length") -> int | None:
    """`max_length` (None: no budget), or an error naming it (`name`): an integer that holds one token and
    EOS, and BOS when `add_bos`, within `limit` positions (None: no limit)."""
    return check_max_length(max_length, 2 + bool(add_bos), "BOS, one token and EOS" if add_bos else "one token and EOS",
                            limit, name)


def check_default_task(default_task) -> str:
    """The instruction of queries without a task, or an error naming `default_task`: a non-empty string
    (an empty one would silently give every query an empty instruction)."""
    if not isinstance(default_task, str):
        raise TypeError(f"`default_task` must be a string, got {type(default_task).__name__}.")
    if not default_task.strip():
        raise ValueError("`default_task` must be a non-empty instruction, got an empty string; leave it out for the "
                         f"default ({DEFAULT_TASK!r}).")
    return default_task


# The family's options (`Option`): each one's default and rule, declared here once.
# `RecurrentEmbedConfig`'s fields take these defaults, its `check()` runs these rules, and
# `RecurrentEmbedModel.resolve` runs the same rule on a call's value.
RECURRENT_OPTIONS = (
    Option("schedule", AUTO, "str", lambda value, config: check_schedule(value), per_call=True, cli_flag="--schedule"),
    Option("block_size", AUTO, "int | str", lambda value, config: check_block_size(value), per_call=True,
           cli_flag="--block-size"),
    Option("add_bos_token", False, "bool", None, "rec_add_bos", cli_flag="--add-bos-token"),  # no `_token` suffix in the key
    Option("max_length", None, "int | None", lambda value, config: check_recurrent_max_length(value, config.add_bos_token),
           per_call=True, cli_flag="--max-length"),
    Option("normalize", True, "bool", None, per_call=True, cli_flag="--no-normalize"),
    Option("default_task", DEFAULT_TASK, "str", lambda value, config: check_default_task(value), cli_flag="--default-task"),
)
OPTION = {option.name: option for option in RECURRENT_OPTIONS}
_DEFAULT = option_defaults(RECURRENT_OPTIONS)


# Backbones that live outside transformers: model_type -> (module that registers it, the extra that installs it).
EXTERNAL_BACKBONES = {"rwkv7": ("fla.models.rwkv7", "rwkv7", "flash-linear-attention")}


def register_external_backbone(backbone_config) -> None:
    """Import the package that registers an external backbone's config and model with the Auto classes.

    Without it, say which extra to install instead of transformers' "unrecognized model type"."""
    model_type = backbone_config.get("model_type") if isinstance(backbone_config, dict) else None
    if model_type not in EXTERNAL_BACKBONES:
        return
    module, extra, package = EXTERNAL_BACKBONES[model_type]
    try:
        __import__(module)
    except ImportError as error:
        raise ImportError(
            f"This checkpoint's backbone is {model_type!r}, which {package} provides: install the "
            f"`{extra}` extra (pip install 'lmk-embed[{extra}]'). Importing {module} failed: {error}"
        ) from error
    # Importing any fla model imports them all, and fla registers its own `mamba2`, `mamba` and `bitnet`
    # with `exist_ok=True`: AutoConfig / AutoModel would then build fla's Triton-only Mamba2 for every
    # Mamba2 checkpoint in the process. Point those types back at transformers' own classes.
    restore_transformers_model_types(module.split(".")[0])


class RecurrentEmbedConfig(PretrainedConfig):
    r"""
    backbone_config: the recurrent LM's config without its head (Mamba2, xLSTM, RWKV).
    schedule: `horizontal` (the backbone's own full-sequence forward), `vertical` (blocks of
        `block_size` tokens through all layers, per-layer state carried) or `auto` (horizontal when
        the longest input fits in one block).
    block_size: V, tokens per vertical block, or "auto" (the default; `auto_block_size`): chosen per
        call from the device, the model width and the batch. An explicit integer always wins.
    ssd_chunk_size: the chunk of our CPU/torch Mamba2 scan (exact for any value; 64 suits CPU caches).
    normalize: L2-normalise embeddings by default.
    add_bos_token: put the tokenizer's BOS before every input (EOS always closes it).
    max_length: token budget incl. BOS/EOS (None: unbounded, which the vertical schedule allows).
    query_template, default_task: queries become `query_template.format(task=...) + query`.
    document_prompt: prepended to documents (none in the paper, so a corpus serves every task).
    base_model: the Hub id the backbone came from, when known (for model cards).
    distilled_from: the Hub id of the teacher a student was distilled from, when it was (for model cards).
    """

    model_type = "recurrent_embedder"
    sub_configs_defaults = {"backbone_config": SubConfigSpec(AutoConfig, model_type="mamba2")}

    backbone_config: dict | PretrainedConfig | None = None
    # The options' defaults are `RECURRENT_OPTIONS`'s; the annotations are for readers (a test compares them).
    schedule: str = _DEFAULT["schedule"]
    block_size: int | str = _DEFAULT["block_size"]
    ssd_chunk_size: int = 64
    normalize: bool = _DEFAULT["normalize"]
    add_bos_token: bool = _DEFAULT["add_bos_token"]
    max_length: int | None = _DEFAULT["max_length"]
    query_template: str = QUERY_TEMPLATE
    default_task: str = _DEFAULT["default_task"]
    document_prompt: str = ""
    base_model: str | None = None
    distilled_from: str | None = None

    def __post_init__(self, **kwargs):
        register_external_backbone(self.backbone_config)
        super().__post_init__(**kwargs)
        self.check()

    def check(self) -> None:
        """Raise naming the field for any bad value: each option's rule (`RECURRENT_OPTIONS`: a TypeError
        for a wrong type, a ValueError for a wrong value), then the other fields'."""
        for option in RECURRENT_OPTIONS:
            setattr(self, option.name, option.check(getattr(self, option.name), self))
        check_positive_int("ssd_chunk_size", self.ssd_chunk_size)
        if "{task}" not in self.query_template:
            raise ValueError("`query_template` must contain '{task}'.")

    @property
    def embedding_dim(self) -> int:
        return int(self.backbone_config.hidden_size)

    def query_prompt(self, task: str | None = None) -> str:
        """`Instruct: {task}\\nQuery: ` with `task` (default: `default_task`)."""
        if task is not None and not isinstance(task, str):
            raise TypeError(f"`task` must be a string, got {type(task).__name__}.")
        return self.query_template.format(task=self.default_task if task is None else task)

    def tokenizer_options(self) -> dict:
        """The options `RECURRENT_OPTIONS` mirrors, as the tokenizer reads them from tokenizer_config.json."""
        return {option.tokenizer_key: getattr(self, option.name) for option in RECURRENT_OPTIONS if option.tokenizer_key}


def auto_block_size(device_type: str, width: int, batch_size: int = 1, gpu_chunk_size: int = DEFAULT_GPU_CHUNK_SIZE,
                    cache_bytes: int = CPU_CACHE_BUDGET) -> int:
    """V for `block_size="auto"`: a pure function of the device type, the model width d and the batch.

    cuda (any accelerator): the paper's guidance, 4096 for a single sequence and 2Q for a batch
        (Q = the backbone's GPU chunk size, 256 for Mamba2), so a batch's blocks stay short.
    cpu: the largest power of two V whose per-layer working set, about
        batch * V * 16 * d float32 values, fits `cache_bytes`; clamped to [256, 4096].
    """
    if device_type != "cpu":
        return MAX_AUTO_BLOCK if batch_size <= 1 else 2 * gpu_chunk_size
    per_token = FLOATS_PER_TOKEN_PER_WIDTH * width * 4 * max(batch_size, 1)
    block = MIN_AUTO_BLOCK
    while block * 2 <= MAX_AUTO_BLOCK and block * 2 * per_token <= cache_bytes:
        block *= 2
    return block


__all__ = ["DEFAULT_GPU_CHUNK_SIZE", "OPTION", "RECURRENT_OPTIONS", "RecurrentEmbedConfig", "auto_block_size",
           "check_block_size", "check_default_task", "check_recurrent_max_length", "check_schedule"]
