"""The shipped code's one door into other libraries' internals, each behind a guard.

Two kinds of reach:
- Private registries, behind a version guard (`require_tested`): undoing an external package's
  takeover of transformers' own model types (flash-linear-attention registers its own `mamba2`).
- Module attributes the recurrent block steps read (transformers' `Mamba2Mixer` sizes and its
  `time_step_limit`, xLSTM's layer dims and cache, fla's `RWKV7Attention` weights, ...). They are
  not promised to stay, so `check_backbone_internals` checks, once per model load, that every
  attribute a backbone's step reads exists (`BACKBONE_INTERNALS`), and otherwise fails naming the
  library, its version and the attribute, before any wrong number can come out.
Everything else in the shipped files uses public APIs.
"""

from __future__ import annotations

import re

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


def require_tested(library: str, version: str, tested: tuple[tuple[int, ...], tuple[int, ...]], reach: str) -> None:
    """Raise `UntestedVersionError` naming `version` unless `tested[0] <= version < tested[1]`."""
    first, beyond = tested
    spec = f">={'.'.join(map(str, first))},<{'.'.join(map(str, beyond))}"
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


# What each recurrent backbone's block step reads, per module: (library, {module path: attributes}).
# A module path is a dotted walk from the backbone, `layers[0]` meaning the first layer.
BACKBONE_INTERNALS = {
    "mamba2": ("transformers", {
        "": ("embeddings", "layers", "norm_f"),
        "norm_f": ("weight", "variance_epsilon"),
        "layers[0]": ("norm", "mixer", "residual_in_fp32"),
        "layers[0].norm": ("weight", "variance_epsilon"),
        "layers[0].mixer": ("in_proj", "conv1d", "act", "intermediate_size", "conv_dim", "num_heads", "n_groups",
                            "ssm_state_size", "head_dim", "A_log", "time_step_limit", "chunk_size", "D", "dt_bias",
                            "norm", "out_proj"),
        "layers[0].mixer.conv1d": ("weight", "bias"),
        # The gated norm's groups: a release storing them under another name would otherwise be read
        # as one group, silently (0.14 off transformers' own forward).
        "layers[0].mixer.norm": ("weight", "variance_epsilon", "group_size"),
    }),
    "xlstm": ("transformers", {"": ("config", "blocks"), "blocks[0]": ("mlstm_layer",),
                               "blocks[0].mlstm_layer": ("qk_dim", "v_dim")}),
    "rwkv7": ("fla", {
        "": ("embeddings", "layers", "norm"),
        "layers[0]": ("attn", "attn_norm", "ffn", "ffn_norm"),
        # `v_lora` too, on every layer after the first (layer 0 has none): read there, not checked here.
        "layers[0].attn": ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "r_proj", "k_proj", "v_proj", "o_proj", "w_lora",
                           "a_lora", "g_lora", "layer_idx", "num_heads", "head_dim", "head_v_dim", "k_k",
                           "k_a", "r_k", "g_norm", "fuse_norm"),
        "layers[0].attn.g_norm": ("num_groups", "weight", "bias", "eps"),
        "layers[0].ffn": ("key", "value", "x_k"),
        "layers[0].attn_norm": ("weight", "bias", "eps"),
        "layers[0].ffn_norm": ("weight", "bias", "eps"),
        "norm": ("weight", "bias", "eps"),
    }),
}


class MissingInternalError(RuntimeError):
    """An attribute a block step reads is gone from the installed library."""


def _library_version(library: str) -> str:
    try:
        from importlib.metadata import version

        return version({"fla": "flash-linear-attention"}.get(library, library))
    except Exception:  # not installed as a distribution
        return "unknown"


def _walk(module, path: str):
    for part in filter(None, path.replace("]", "").replace("[", ".").split(".")):
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    return module


def check_backbone_internals(model_type: str, backbone) -> None:
    """Raise `MissingInternalError` naming the library, its version and the attribute unless `backbone`
    (of `model_type`) has every attribute its block step reads (`BACKBONE_INTERNALS`); other model
    types run through their library's own forward and need nothing."""
    if model_type not in BACKBONE_INTERNALS:
        return
    library, paths = BACKBONE_INTERNALS[model_type]
    for path, names in paths.items():
        try:
            module = _walk(backbone, path)
        except (AttributeError, IndexError, TypeError):
            module, names = None, (path,)
        for name in names:
            if module is None or not hasattr(module, name):
                where = f"{path}.{name}" if module is not None and path else name
                raise MissingInternalError(
                    f"The {model_type} block step reads `{where}` of {type(backbone).__name__}, which {library} "
                    f"{_library_version(library)} does not have; install the tested versions (constraints.txt) "
                    "or update this code.")


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


__all__ = ["BACKBONE_INTERNALS", "MissingInternalError", "UntestedVersionError", "cache_keyword", "carried_cache",
           "check_backbone_internals", "require_tested", "restore_transformers_model_types"]
