"""Configuration of `LMKModel`: an encoder backbone (nested config) plus the pooling defaults."""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .encoding import Option, check_choice, check_max_length, check_positive_int

POOLINGS = ("lmk", "cls", "mean", "mean@k", "multi_cls", "latent_attention")
CHUNK_ALIGNED_POOLINGS = ("lmk", "mean@k")  # pool one position per chunk: landmark vectors + spans exist
SPLITTERS = ("fixed", "variable", "sentence")
# How a text longer than one window is read: `one-pass` (one sequence, on the extended positions when
# the backbone was extended) or `windows` (windows of whole chunks at the original positions, every
# landmark of every window pooled). A text that fits one window reads the same either way.
LONG_INPUTS = ("one-pass", "windows")
DEFAULT_GRANULARITIES = (32, 64, 128, 256)
# Position extension past the backbone's table (LongEmbed, Zhu et al. 2024). The first three are for
# absolute position tables; `dynamic` is the backbone's own dynamic NTK rope scaling (rotary backbones).
ABSOLUTE_POSITION_EXTENSIONS = ("interpolate", "recurrent", "group")
ROTARY_POSITION_EXTENSIONS = ("dynamic",)
POSITION_EXTENSIONS = ABSOLUTE_POSITION_EXTENSIONS + ROTARY_POSITION_EXTENSIONS
MIN_MAX_LENGTH = 3  # [CLS] + one token + a landmark

# The family's options (`Option`). Their rules are the `check_*` functions below, which the config applies to
# its defaults and `LMKModel.resolve` to each call's values: a default and an argument meet one rule.
LMK_OPTIONS = (
    Option("pooling", "lmk_pooling", cli_flag="--pooling"),
    Option("granularity", "lmk_granularity", per_call=True, cli_flag="--granularity"),
    Option("splitter", "lmk_splitter", per_call=True, cli_flag="--splitter"),
    Option("granularities", "lmk_granularities", cli_flag="--granularities"),
    Option("splitter_seed", "lmk_seed", cli_flag="--seed"),
    # no `_token` suffix in the key: transformers would make it a special token
    Option("landmark_token", "lmk_landmark", cli_flag="--landmark-token"),
    Option("max_length", per_call=True, cli_flag="--max-length"),
    Option("normalize", per_call=True, cli_flag="--no-normalize"),
    Option("long_input", per_call=True, cli_flag="--long-input"),
    Option("window_length", per_call=True, cli_flag="--window-length"),
)


def check_lmk_max_length(max_length) -> int | None:
    """`max_length` (None: no budget), or an error naming it: an integer of at least `MIN_MAX_LENGTH`."""
    check_max_length(max_length, MIN_MAX_LENGTH, "[CLS], one token and a landmark")
    return max_length


def check_long_input(long_input, pooling: str) -> str:
    """`long_input`, or a ValueError naming it: one of `LONG_INPUTS`, and `windows` only with lmk pooling."""
    check_choice("long_input", long_input, LONG_INPUTS)
    if long_input == "windows" and pooling != "lmk":
        raise ValueError(f"`long_input='windows'` pools landmarks: it needs pooling='lmk', not {pooling!r}.")
    return long_input


def check_window_length(window_length, name: str = "window_length") -> int | None:
    """`window_length` (None: the default window), or an error naming it (`name`): an integer of at
    least 3 ([CLS], one token, a landmark)."""
    if window_length is None:
        return None
    window_length = check_positive_int(name, window_length)
    if window_length < MIN_MAX_LENGTH:
        raise ValueError(f"`{name}`={window_length} is too small: a window holds [CLS], one token and a landmark "
                         f"(at least {MIN_MAX_LENGTH}).")
    return window_length


class LMKConfig(PretrainedConfig):
    r"""
    backbone_config: the encoder's config (ModernBERT, BERT, XLM-RoBERTa, ... any `AutoModel` encoder).
    pooling: `lmk` (landmark mean, the default), `cls`, `mean`, `mean@k`, `multi_cls` or `latent_attention`.
    granularity: g, the content tokens per chunk at inference (and k for `mean@k`).
    splitter: `fixed`, `variable` (g drawn per training batch from `granularities`) or `sentence`.
        At inference `variable` uses `granularity`; `encode()` can override both per call.
    splitter_seed: seed of the `variable` draws.
    landmark_token: `sep` (SEP, or EOS without SEP), `eos`, or a literal token.
    normalize: L2-normalise embeddings by default.
    max_length: default token budget, landmarks included (None: the tokenizer's / backbone's limit).
    num_latents, latent_heads: the latent-attention pooler (NV-Embed: 512 latents; 64 is lighter).
    query_prompt, document_prompt: prepended by `encode_query` / `encode_document`.
    base_model: the Hub id the backbone came from, when known (for model cards).
    long_input: `one-pass` or `windows`, the default schedule for long texts (`encode(long_input=...)`
        per call; windows needs `lmk` pooling).
    window_length: W, the most tokens of one window, its start token and landmarks included (None:
        the backbone's original positions).
    position_extension: None, or how the backbone reads past its original positions:
        `{"method": interpolate|recurrent|group|dynamic, "original_positions": Lo, "max_positions": N}`,
        plus for absolute tables `"first_row"` (where the N extended rows start in the backbone's
        table, after the original rows) and `"position_offset"` (rows reserved before position 0,
        RoBERTa's padding offset). Inputs of at most Lo tokens read the original rows, unchanged.
    """

    model_type = "lmk_embedder"
    sub_configs_defaults = {"backbone_config": SubConfigSpec(AutoConfig, model_type="modernbert")}

    backbone_config: dict | PretrainedConfig | None = None
    pooling: str = "lmk"
    granularity: int = 128
    splitter: str = "fixed"
    granularities: list[int] | tuple[int, ...] = DEFAULT_GRANULARITIES
    splitter_seed: int = 0
    landmark_token: str = "sep"
    normalize: bool = True
    max_length: int | None = None
    num_latents: int = 64
    latent_heads: int = 8
    query_prompt: str = ""
    document_prompt: str = ""
    base_model: str | None = None
    position_extension: dict | None = None
    long_input: str = "one-pass"
    window_length: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check()

    def check(self) -> None:
        """Raise a ValueError naming the field for any bad value (also run by the model, since
        `from_pretrained(..., pooling=...)` sets fields after `__post_init__`)."""
        if self.pooling not in POOLINGS:
            raise ValueError(f"Unknown `pooling` {self.pooling!r}; expected one of {list(POOLINGS)}.")
        if self.splitter not in SPLITTERS:
            raise ValueError(f"Unknown `splitter` {self.splitter!r}; expected one of {list(SPLITTERS)}.")
        for name, value in [("granularity", self.granularity), *(("granularities", g) for g in self.granularities)]:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must hold positive integers, got {value!r}.")
        self.granularities = [int(g) for g in self.granularities]
        self.check_position_extension()
        check_long_input(self.long_input, self.pooling)
        check_window_length(self.window_length)
        if self.window_length is not None and self.pooling != "lmk":
            raise ValueError(f"`window_length` is the window of long_input='windows', which pools landmarks: it needs "
                             f"pooling='lmk', not {self.pooling!r} (leave window_length out).")
        check_lmk_max_length(self.max_length)

    def check_position_extension(self) -> None:
        extension = self.position_extension
        if extension is None:
            return
        if not isinstance(extension, dict):
            raise ValueError(f"`position_extension` must be a dict or None, got {type(extension).__name__}.")
        method = extension.get("method")
        if method not in POSITION_EXTENSIONS:
            raise ValueError(f"`position_extension.method` {method!r} is not one of {list(POSITION_EXTENSIONS)}.")
        needed = ["original_positions", "max_positions"]
        if method in ABSOLUTE_POSITION_EXTENSIONS:
            needed += ["first_row", "position_offset"]
        for key in needed:
            value = extension.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`position_extension.{key}` must be a non-negative integer, got {value!r}.")
        if extension["max_positions"] <= extension["original_positions"]:
            raise ValueError(
                f"`position_extension.max_positions`={extension['max_positions']} must exceed "
                f"`original_positions`={extension['original_positions']}."
            )

    @property
    def embedding_dim(self) -> int:
        return int(self.backbone_config.hidden_size)

    def tokenizer_options(self) -> dict:
        """The options `LMK_OPTIONS` mirrors, as the tokenizer reads them from tokenizer_config.json."""
        return {option.tokenizer_key: getattr(self, option.name) for option in LMK_OPTIONS if option.tokenizer_key}


__all__ = ["LMKConfig", "LMK_OPTIONS", "check_lmk_max_length", "check_long_input", "check_window_length"]
