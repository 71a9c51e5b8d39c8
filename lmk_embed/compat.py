"""The shipped code's one door into other libraries' private internals, each behind a version guard.

Everything else in the shipped files uses public APIs. A reach below works only with the versions
it was tested with: outside that range it fails at once, naming the installed version, rather than
misbehaving silently. Today there is one reach: undoing an external package's takeover of
transformers' own model types (flash-linear-attention registers its own `mamba2`).
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


__all__ = ["UntestedVersionError", "require_tested", "restore_transformers_model_types"]
