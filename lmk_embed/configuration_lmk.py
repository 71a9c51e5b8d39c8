"""Configuration of `LMKModel`: an encoder backbone (nested config) plus the pooling defaults."""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .encoding import Option, check_choice, check_max_length, check_positive_int, option_defaults

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


def check_lmk_max_length(max_length, limit: int | None = None, name: str = "max_length") -> int | None:
    """`max_length` (None: no budget), or an error naming it (`name`): an integer of at least
    `MIN_MAX_LENGTH` and at most `limit`, the backbone's positions (None: no limit)."""
    return check_max_length(max_length, MIN_MAX_LENGTH, "[CLS], one token and a landmark", limit, name)


def check_long_input(long_input, pooling: str) -> str:
    """`long_input`, or a ValueError naming it: one of `LONG_INPUTS`, and `windows` only with lmk pooling."""
    check_choice("long_input", long_input, LONG_INPUTS)
    if long_input == "windows" and pooling != "lmk":
        raise ValueError(f"`long_input='windows'` pools landmarks: it needs pooling='lmk', not {pooling!r}.")
    return long_input


def check_window_length(window_length, name: str = "window_length", limit: int | None = None) -> int | None:
    """`window_length` (None: the default window), or an error naming it (`name`): the budget rule
    (`check_max_length`) of a window, which holds [CLS], one token and a landmark, within `limit`."""
    return check_max_length(window_length, MIN_MAX_LENGTH, "[CLS], one token and a landmark in a window", limit, name)


def check_granularities(granularities) -> list[int]:
    """The `variable` splitter's set as a list, or an error naming `granularities`: positive integers,
    at least one (the splitter draws g from it)."""
    if isinstance(granularities, (str, bytes)) or not hasattr(granularities, "__iter__"):
        raise TypeError(f"`granularities` must be a list of positive integers, got {granularities!r}.")
    checked = [check_positive_int("granularities", g) for g in granularities]
    if not checked:
        raise ValueError("`granularities` must hold at least one positive integer (the `variable` splitter draws g "
                         "from it), got an empty list.")
    return checked


def _window_length_rule(window_length, config, name: str = "window_length") -> int | None:
    window_length = check_window_length(window_length, name)
    if window_length is not None and config.pooling != "lmk":
        raise ValueError(f"`{name}` is the window of long_input='windows', which pools landmarks: it needs "
                         f"pooling='lmk', not {config.pooling!r} (leave {name} out).")
    return window_length


# The family's options (`Option`): each one's default and rule, declared here once. `LMKConfig`'s
# fields take these defaults, its `check()` runs these rules, and `LMKModel.resolve` runs the same rule
# on a call's value: a default and an argument meet one rule.
LMK_OPTIONS = (
    Option("pooling", "lmk", "str", lambda value, config: check_choice("pooling", value, POOLINGS),
           "lmk_pooling", cli_flag="--pooling"),
    Option("granularity", 128, "int", lambda value, config: check_positive_int("granularity", value),
           "lmk_granularity", per_call=True, cli_flag="--granularity"),
    Option("splitter", "fixed", "str", lambda value, config: check_choice("splitter", value, SPLITTERS),
           "lmk_splitter", per_call=True, cli_flag="--splitter"),
    Option("granularities", DEFAULT_GRANULARITIES, "list[int]", lambda value, config: check_granularities(value),
           "lmk_granularities", cli_flag="--granularities"),
    Option("splitter_seed", 0, "int", None, "lmk_seed", cli_flag="--seed"),
    # no `_token` suffix in the key: transformers would make it a special token
    Option("landmark_token", "sep", "str", None, "lmk_landmark", cli_flag="--landmark-token"),
    Option("max_length", None, "int | None", lambda value, config: check_lmk_max_length(value),
           per_call=True, cli_flag="--max-length"),
    Option("normalize", True, "bool", None, per_call=True, cli_flag="--no-normalize"),
    Option("long_input", "one-pass", "str", lambda value, config: check_long_input(value, config.pooling),
           per_call=True, cli_flag="--long-input"),
    Option("window_length", None, "int | None", _window_length_rule, per_call=True, cli_flag="--window-length"),
)
OPTION = {option.name: option for option in LMK_OPTIONS}
_DEFAULT = option_defaults(LMK_OPTIONS)


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
    index_window_length: the W that landmark vectors and late chunks (`encode(output_value=...)`, and so
        an index) are read in by default, chosen for search (None: `window_length`); the document
        vector keeps `window_length`. Read by windows only.
    position_extension: None, or how the backbone reads past its original positions:
        `{"method": interpolate|recurrent|group|dynamic, "original_positions": Lo, "max_positions": N}`,
        plus for absolute tables `"first_row"` (where the N extended rows start in the backbone's
        table, after the original rows) and `"position_offset"` (rows reserved before position 0,
        RoBERTa's padding offset). Inputs of at most Lo tokens read the original rows, unchanged.
    """

    model_type = "lmk_embedder"
    sub_configs_defaults = {"backbone_config": SubConfigSpec(AutoConfig, model_type="modernbert")}

    backbone_config: dict | PretrainedConfig | None = None
    # The options' defaults are `LMK_OPTIONS`'s; the annotations are for readers (a test compares them).
    pooling: str = _DEFAULT["pooling"]
    granularity: int = _DEFAULT["granularity"]
    splitter: str = _DEFAULT["splitter"]
    granularities: list[int] | tuple[int, ...] = _DEFAULT["granularities"]
    splitter_seed: int = _DEFAULT["splitter_seed"]
    landmark_token: str = _DEFAULT["landmark_token"]
    normalize: bool = _DEFAULT["normalize"]
    max_length: int | None = _DEFAULT["max_length"]
    num_latents: int = 64
    latent_heads: int = 8
    query_prompt: str = ""
    document_prompt: str = ""
    base_model: str | None = None
    position_extension: dict | None = None
    long_input: str = _DEFAULT["long_input"]
    window_length: int | None = _DEFAULT["window_length"]
    index_window_length: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check()

    def check(self) -> None:
        """Raise naming the field for any bad value (also run by the model, since
        `from_pretrained(..., pooling=...)` sets fields after `__post_init__`): each option's rule
        (`LMK_OPTIONS`: a TypeError for a wrong type, a ValueError for a wrong value), then the
        position extension."""
        for option in LMK_OPTIONS:
            setattr(self, option.name, option.check(getattr(self, option.name), self))
        self.index_window_length = _window_length_rule(self.index_window_length, self, "index_window_length")
        self.check_position_extension()

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


__all__ = ["LMKConfig", "LMK_OPTIONS", "OPTION", "check_granularities", "check_lmk_max_length", "check_long_input",
           "check_window_length"]
