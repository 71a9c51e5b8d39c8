"""The shipped code's one door into other libraries' internals, each behind a guard.

Two kinds of reach:
- Private registries, behind a version guard (`require_tested`): undoing an external package's
  takeover of transformers' own model types (flash-linear-attention registers its own `mamba2`).
- Module attributes the recurrent block steps read (transformers' `Mamba2Mixer` sizes and its
  `time_step_limit`, xLSTM's layer dims and cache, fla's `RWKV7Attention` weights, ...). They are
  not promised to stay, so one adapter per backbone (`BACKBONE_ADAPTERS`) reads them into small
  typed parts, and the model files read only those. The adapter runs once at load
  (`check_backbone_internals`) and fails naming the library, its version and the attribute,
  before any wrong number can come out.
Everything else in the shipped files uses public APIs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# The versions each reach was tested with: (first tested release, first untested release).
TESTED_TRANSFORMERS = ((5, 23), (5, 24))


class UntestedVersionError(RuntimeError):
    """A library's installed version is outside the range a private reach was tested with."""


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "5.23.0" -> (5, 23, 0); "5.24.0.dev0" -> (5, 24, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise UntestedVersionError(f"Cannot read the version {version!r}.")
    return tuple(int(part) for part in match.group().split("."))


def tested_spec(tested: tuple[tuple[int, ...], tuple[int, ...]]) -> str:
    """A tested range as a pip specifier: ((5, 23), (5, 24)) -> ">=5.23,<5.24"."""
    first, beyond = tested
    return f">={'.'.join(map(str, first))},<{'.'.join(map(str, beyond))}"


def require_tested(library: str, version: str, tested: tuple[tuple[int, ...], tuple[int, ...]], reach: str) -> None:
    """Raise `UntestedVersionError` naming `version` unless `tested[0] <= version < tested[1]`."""
    first, beyond = tested
    spec = tested_spec(tested)
    if not first <= release(version) < beyond:
        raise UntestedVersionError(
            f"{reach} relies on {library} internals tested with {library}{spec}, but {library} {version} is "
            f"installed: install a tested version (pip install '{library}{spec}') or update this code."
        )


def restore_transformers_model_types(package: str) -> list[str]:
    """Point the model types transformers defines itself back at transformers' own config classes,
    where importing `package` (e.g. "fla") re-registered them with its own; returns those types.

    Only the entries `package` took over change, and only through the public
    `CONFIG_MAPPING.register(..., exist_ok=True)`: nothing is deleted from transformers' registries,
    and other packages' registrations stay. Finding what `package` registered reads transformers'
    private `CONFIG_MAPPING._extra_content` (there is no public listing), hence the version guard.
    """
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    require_tested("transformers", transformers.__version__, TESTED_TRANSFORMERS,
                   f"Undoing {package}'s registration of transformers' model types")
    registered = CONFIG_MAPPING._extra_content
    restored = []
    for model_type, config_class in list(registered.items()):
        if model_type in CONFIG_MAPPING_NAMES and config_class.__module__.split(".")[0] == package:
            CONFIG_MAPPING.register(model_type, getattr(transformers, CONFIG_MAPPING_NAMES[model_type]), exist_ok=True)
            restored.append(model_type)
    return restored


class MissingInternalError(RuntimeError):
    """An attribute a block step reads is gone from the installed library."""


def _library_version(library: str) -> str:
    try:
        from importlib.metadata import version

        return version({"fla": "flash-linear-attention"}.get(library, library))
    except Exception:  # not installed as a distribution
        return "unknown"


class _Reader:
    """Reads attributes of one backbone's modules for one block step; a missing one raises
    `MissingInternalError` naming the library, its version and the attribute's path."""

    def __init__(self, model_type: str, library: str, backbone):
        self.model_type, self.library, self.backbone_name = model_type, library, type(backbone).__name__

    def __call__(self, module, path: str, name: str):
        try:
            return getattr(module, name)
        except AttributeError:
            where = f"{path}.{name}" if path else name
            raise MissingInternalError(
                f"The {self.model_type} block step reads `{where}` of {self.backbone_name}, which {self.library} "
                f"{_library_version(self.library)} does not have; install the tested versions (constraints.txt) "
                "or update this code.") from None


# ---- the adapters: what each recurrent block step reads of its backbone, read here only ---------
#
# Each returns small typed parts holding the library's own modules and parameters (not copies). The
# model files read only these parts, built anew by each block step (a few reads per layer), so LoRA
# layers injected after load and in-place weight changes are seen; `check_backbone_internals` builds
# them once at load, so a renamed attribute fails there.


@dataclass(frozen=True)
class NormParts:
    """A norm's parameters: weight [D], eps, and bias [D] (LayerNorm), `group_size` (Mamba2's gated
    RMSNorm) or `num_groups` (GroupNorm) where the norm has them."""

    weight: torch.Tensor
    eps: float
    bias: torch.Tensor | None = None
    group_size: int | None = None
    num_groups: int | None = None


@dataclass(frozen=True)
class Mamba2MixerParts:
    """transformers' `Mamba2Mixer`, as our block step reads it: its projections (modules, so LoRA
    applies), the depthwise conv's weight [channels, k] (a view of the parameter) and bias, the sizes,
    the SSM parameters and the gated norm."""

    in_proj: torch.nn.Module
    conv_weight: torch.Tensor
    conv_bias: torch.Tensor | None
    act: torch.nn.Module
    intermediate_size: int
    conv_dim: int
    num_heads: int
    n_groups: int
    ssm_state_size: int
    head_dim: int
    A_log: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor
    time_step_limit: tuple
    chunk_size: int
    norm: NormParts
    out_proj: torch.nn.Module


@dataclass(frozen=True)
class Mamba2LayerParts:
    norm: NormParts
    residual_in_fp32: bool
    mixer: Mamba2MixerParts


@dataclass(frozen=True)
class Mamba2Parts:
    """transformers' `Mamba2Model`: the embedding module, its layers and the final norm."""

    embeddings: torch.nn.Module
    layers: list[Mamba2LayerParts]
    norm_f: NormParts


def mamba2_parts(backbone) -> Mamba2Parts:
    """What our Mamba2 block step (and the student's weight surgery) reads of transformers' `Mamba2Model`."""
    read = _Reader("mamba2", "transformers", backbone)

    def rms(module, path: str, gated: bool = False) -> NormParts:
        return NormParts(read(module, path, "weight"), read(module, path, "variance_epsilon"),
                         group_size=read(module, path, "group_size") if gated else None)

    layers = []
    for index, layer in enumerate(read(backbone, "", "layers")):
        path = f"layers[{index}]"
        mixer = read(layer, path, "mixer")
        at = f"{path}.mixer"
        conv = read(mixer, at, "conv1d")
        sizes = {name: read(mixer, at, name) for name in ("intermediate_size", "conv_dim", "num_heads", "n_groups",
                                                           "ssm_state_size", "head_dim", "chunk_size")}
        layers.append(Mamba2LayerParts(rms(read(layer, path, "norm"), f"{path}.norm"), read(layer, path, "residual_in_fp32"),
                                       Mamba2MixerParts(
            in_proj=read(mixer, at, "in_proj"), conv_weight=read(conv, f"{at}.conv1d", "weight").squeeze(1),
            conv_bias=read(conv, f"{at}.conv1d", "bias"), act=read(mixer, at, "act"), **sizes,
            A_log=read(mixer, at, "A_log"), D=read(mixer, at, "D"), dt_bias=read(mixer, at, "dt_bias"),
            time_step_limit=read(mixer, at, "time_step_limit"),
            # The gated norm's groups: a release storing them under another name would otherwise be
            # read as one group, silently (0.14 off transformers' own forward).
            norm=rms(read(mixer, at, "norm"), f"{at}.norm", gated=True), out_proj=read(mixer, at, "out_proj"))))
    return Mamba2Parts(read(backbone, "", "embeddings"), layers, rms(read(backbone, "", "norm_f"), "norm_f"))


@dataclass(frozen=True)
class XlstmParts:
    """transformers' `xLSTMModel`: its heads, layers, and the per-head qk / v sizes of its mLSTM layers
    (transformers' cache sizes them from the config, rounded up to multiples of 64, which crashes for
    e.g. qk_dim_factor=0.5)."""

    num_heads: int
    num_layers: int
    qk_head_dim: int
    v_head_dim: int


def xlstm_parts(backbone) -> XlstmParts:
    read = _Reader("xlstm", "transformers", backbone)
    config = read(backbone, "", "config")
    layer = read(read(backbone, "", "blocks")[0], "blocks[0]", "mlstm_layer")
    heads = int(config.num_heads)
    return XlstmParts(heads, int(config.num_hidden_layers), read(layer, "blocks[0].mlstm_layer", "qk_dim") // heads,
                      read(layer, "blocks[0].mlstm_layer", "v_dim") // heads)


def new_xlstm_cache(backbone, batch_size: int, device):
    """A zero `xLSTMCache` for `batch_size` rows with the layers' real head sizes (`xlstm_parts`); per
    layer `rnn_state[i]` = (C [B, heads, qk, v], n [B, heads, qk], m [B, heads, 1])."""
    from transformers.models.xlstm.modeling_xlstm import xLSTMCache

    parts = xlstm_parts(backbone)
    cache = xLSTMCache(backbone.config, batch_size, dtype=torch.float32, device=device)
    zeros = lambda *shape: torch.zeros(batch_size, parts.num_heads, *shape, device=device)  # noqa: E731
    cache.rnn_state = {i: (zeros(parts.qk_head_dim, parts.v_head_dim), zeros(parts.qk_head_dim), zeros(1))
                       for i in range(parts.num_layers)}
    return cache


def select_xlstm_cache_rows(cache, rows: torch.Tensor):
    """`cache` keeping only batch `rows`, in place (its `rnn_state` store has no method for that)."""
    cache.rnn_state = {layer: tuple(t[rows] for t in states) for layer, states in cache.rnn_state.items()}
    return cache


@dataclass(frozen=True)
class Rwkv7AttentionParts:
    """fla's `RWKV7Attention`, as the plain-torch time mix reads it: the six token-shift mixes
    (x_r, x_w, x_k, x_v, x_a, x_g, each [D]), the projections and LoRAs (modules, so LoRA applies),
    the sizes, the key and bonus parameters and the output GroupNorm. `v_lora` is None on layer 0,
    which makes the value residual (`first_layer`)."""

    mixes: tuple[torch.Tensor, ...]
    r_proj: torch.nn.Module
    k_proj: torch.nn.Module
    v_proj: torch.nn.Module
    o_proj: torch.nn.Module
    w_lora: torch.nn.Module
    a_lora: torch.nn.Module
    g_lora: torch.nn.Module
    v_lora: torch.nn.Module | None
    first_layer: bool
    num_heads: int
    head_dim: int
    head_v_dim: int
    k_k: torch.Tensor
    k_a: torch.Tensor
    r_k: torch.Tensor
    g_norm: NormParts
    fuse_norm: bool


@dataclass(frozen=True)
class Rwkv7FeedForwardParts:
    key: torch.nn.Module
    value: torch.nn.Module
    x_k: torch.Tensor


@dataclass(frozen=True)
class Rwkv7LayerParts:
    pre_norm: NormParts | None  # layer 0 with `norm_first`
    attn_norm: NormParts
    attn: Rwkv7AttentionParts
    ffn_norm: NormParts
    ffn: Rwkv7FeedForwardParts


@dataclass(frozen=True)
class Rwkv7Parts:
    """fla's `RWKV7Model`: the embedding module, its layers and the final LayerNorm, and what its
    config says of the layers (`attn`: standard attention layers mixed in, None for none; `hidden_act`)."""

    embeddings: torch.nn.Module
    layers: list[Rwkv7LayerParts]
    norm: NormParts
    attn: object = None
    hidden_act: str = "sqrelu"


def rwkv7_parts(backbone) -> Rwkv7Parts:
    """What the plain-torch RWKV-7 path (`modeling_rwkv7`) reads of fla's `RWKV7Model`."""
    read = _Reader("rwkv7", "fla", backbone)
    config = read(backbone, "", "config")
    norm_first = bool(read(config, "config", "norm_first"))

    def layer_norm(module, path: str) -> NormParts:
        return NormParts(read(module, path, "weight"), read(module, path, "eps"), bias=read(module, path, "bias"))

    layers = []
    for index, layer in enumerate(read(backbone, "", "layers")):
        path = f"layers[{index}]"
        attn, ffn = read(layer, path, "attn"), read(layer, path, "ffn")
        at, ff = f"{path}.attn", f"{path}.ffn"
        first_layer = read(attn, at, "layer_idx") == 0
        g_norm = read(attn, at, "g_norm")
        layers.append(Rwkv7LayerParts(
            # fla's block has `pre_norm` on layer 0 with `norm_first` only (its config's public field).
            pre_norm=layer_norm(read(layer, path, "pre_norm"), f"{path}.pre_norm") if norm_first and index == 0 else None,
            attn_norm=layer_norm(read(layer, path, "attn_norm"), f"{path}.attn_norm"),
            attn=Rwkv7AttentionParts(
                mixes=tuple(read(attn, at, name) for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")),
                **{name: read(attn, at, name) for name in ("r_proj", "k_proj", "v_proj", "o_proj", "w_lora", "a_lora",
                                                           "g_lora", "num_heads", "head_dim", "head_v_dim", "k_k",
                                                           "k_a", "r_k", "fuse_norm")},
                v_lora=None if first_layer else read(attn, at, "v_lora"), first_layer=first_layer,
                g_norm=NormParts(read(g_norm, f"{at}.g_norm", "weight"), read(g_norm, f"{at}.g_norm", "eps"),
                                 bias=read(g_norm, f"{at}.g_norm", "bias"),
                                 num_groups=read(g_norm, f"{at}.g_norm", "num_groups"))),
            ffn_norm=layer_norm(read(layer, path, "ffn_norm"), f"{path}.ffn_norm"),
            ffn=Rwkv7FeedForwardParts(read(ffn, ff, "key"), read(ffn, ff, "value"), read(ffn, ff, "x_k"))))
    return Rwkv7Parts(read(backbone, "", "embeddings"), layers, layer_norm(read(backbone, "", "norm"), "norm"),
                      attn=read(config, "config", "attn"), hidden_act=read(config, "config", "hidden_act"))


# The adapter of each recurrent backbone whose modules a block step reads (by `model_type`); other
# model types run through their library's own forward and need none.
BACKBONE_ADAPTERS = {"mamba2": mamba2_parts, "xlstm": xlstm_parts, "rwkv7": rwkv7_parts}


def check_backbone_internals(model_type: str, backbone):
    """At load: raise `MissingInternalError` naming the library, its version and the attribute unless
    `model_type`'s adapter (`BACKBONE_ADAPTERS`) reads every part it needs of `backbone`; returns
    the parts (None: no adapter for `model_type`)."""
    adapter = BACKBONE_ADAPTERS.get(model_type)
    return None if adapter is None else adapter(backbone)


def carried_cache(output, cache_type):
    """The cache a backbone's forward returned in `output`: transformers 5.23 names it `cache_params`,
    later releases `cache`. Found by type, not by the keyword's name."""
    for name in ("cache_params", "cache"):
        value = getattr(output, name, None)
        if isinstance(value, cache_type):
            return value
    raise MissingInternalError(f"The backbone's output carries no {cache_type.__name__} (neither `cache_params` "
                               "nor `cache`); this transformers release renamed it again.")


def cache_keyword(forward) -> str:
    """The keyword that passes a cache into `forward`: `cache_params` (transformers 5.23) or `cache` (later)."""
    import inspect

    parameters = inspect.signature(forward).parameters
    for name in ("cache_params", "cache"):
        if name in parameters:
            return name
    raise MissingInternalError("The backbone's forward takes neither `cache_params` nor `cache`; this transformers "
                               "release renamed it again.")


__all__ = ["BACKBONE_ADAPTERS", "Mamba2Parts", "MissingInternalError", "NormParts", "Rwkv7Parts", "UntestedVersionError",
           "XlstmParts", "cache_keyword", "carried_cache", "check_backbone_internals", "mamba2_parts", "new_xlstm_cache",
           "require_tested", "restore_transformers_model_types", "tested_spec", "rwkv7_parts", "select_xlstm_cache_rows", "xlstm_parts"]
