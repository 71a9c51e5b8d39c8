"""The house: the shipped folder holds only shipped code, checkpoints carry exactly that code, and no
package of ours imports a package that imports it back."""

import ast
from pathlib import Path

import pytest

import lmk_embed

ROOT = Path(__file__).resolve().parent.parent
# Top-level packages and modules of this repository, and the ones each may import.
ALLOWED_IMPORTS = {
    "lmk_embed": set(),
    "model_cards": {"lmk_embed"},
    "evaluation": set(),
    "training": {"lmk_embed"},
    "push": {"lmk_embed", "model_cards"},
    # corpus runs any checkpoint through its own code (trust_remote_code), so it imports none of ours.
    "corpus": set(),
    "cli": {"lmk_embed", "training", "evaluation", "model_cards", "push", "corpus"},
    "demo": {"lmk_embed", "training", "evaluation", "model_cards", "push"},
}


def imported_top_levels(path: Path, skip_optional: bool = False) -> set[str]:
    """Top-level names `path` imports; `skip_optional` leaves out imports guarded by try/except ImportError."""
    tree = ast.parse(path.read_text())
    if skip_optional:
        for node in ast.walk(tree):
            if isinstance(node, ast.Try):
                node.body = []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("unit", sorted(ALLOWED_IMPORTS))
def test_no_package_imports_back(unit):
    files = [ROOT / f"{unit}.py"] if (ROOT / f"{unit}.py").is_file() else sorted((ROOT / unit).glob("*.py"))
    assert files
    ours = set(ALLOWED_IMPORTS) - {unit}
    used = set().union(*(imported_top_levels(f) for f in files)) & ours
    assert used <= ALLOWED_IMPORTS[unit], f"{unit} imports {sorted(used - ALLOWED_IMPORTS[unit])}"


def test_shipped_files_import_only_each_other_and_allowed_libraries():
    """Optional kernels (mamba_ssm) may be imported inside try/except."""
    # tqdm comes with transformers; sentence_transformers only in st_module.py, which only it loads.
    allowed = {"torch", "transformers", "safetensors", "tokenizers", "numpy", "tqdm", "sentence_transformers"}
    import sys

    for path in lmk_embed.shipped_files():
        foreign = imported_top_levels(path, skip_optional=True) - allowed - set(sys.stdlib_module_names)
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("checkpoint", ["lmk_checkpoint", "mamba2_checkpoint"])
def test_checkpoint_code_is_exactly_the_shipped_folder(checkpoint, request):
    folder = Path(request.getfixturevalue(checkpoint))
    shipped = {p.name: p.read_bytes() for p in lmk_embed.shipped_files()}
    in_checkpoint = {p.name: p.read_bytes() for p in folder.glob("*.py")}
    assert in_checkpoint == shipped
    assert "__init__.py" not in in_checkpoint and len(shipped) == 9
