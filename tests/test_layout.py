"""The house: the shipped folder holds only shipped code, a checkpoint carries exactly its family's
share of it (which imports nothing it does not carry), and no package of ours imports a package that
imports it back."""

import ast
from pathlib import Path

import pytest

import lmk_embed

ROOT = Path(__file__).resolve().parent.parent
TOOLS = "lmk_embed_tools"
# Our units (the shipped package, the tooling package's parts, the benchmarks) and the ones each may import.
ALLOWED_IMPORTS = {
    "lmk_embed": set(),
    # what every subcommand shares: any job's module may hold its command (the shipped rules: its checks)
    f"{TOOLS}.commandline": {"lmk_embed"},
    f"{TOOLS}.compat": {"lmk_embed"},  # the one door into other libraries' internals (the shipped error class)
    f"{TOOLS}.onnx_export": {"lmk_embed", f"{TOOLS}.commandline"},  # writes the graphs the shipped runtime reads
    f"{TOOLS}.model_cards": {"lmk_embed", f"{TOOLS}.commandline"},
    # What training and evaluation share: the split type, and the base's window vectors (the windows
    # baseline of evaluation, the teacher's targets of training).
    f"{TOOLS}.retrieval_data": set(),
    f"{TOOLS}.window_vectors": {"lmk_embed"},
    # evaluation also ranks through the index users search (`--through-index`) and fuses with its one fusion
    f"{TOOLS}.evaluation": {"lmk_embed", f"{TOOLS}.compat", f"{TOOLS}.retrieval_data", f"{TOOLS}.window_vectors",
                            f"{TOOLS}.corpus"},
    f"{TOOLS}.training": {"lmk_embed", f"{TOOLS}.compat", f"{TOOLS}.commandline", f"{TOOLS}.retrieval_data",
                          f"{TOOLS}.window_vectors"},
    f"{TOOLS}.evaluation_jobs": {"lmk_embed", *(f"{TOOLS}.{p}" for p in ("training", "evaluation", "model_cards",
                                                                       "commandline", "retrieval_data"))},
    f"{TOOLS}.push": {"lmk_embed", f"{TOOLS}.model_cards", f"{TOOLS}.onnx_export"},
    # the check before training: every evaluation task (evaluation's genres, training's corpora) against training
    f"{TOOLS}.disjointness": {f"{TOOLS}.training", f"{TOOLS}.evaluation"},
    # corpus runs any checkpoint through its own code (trust_remote_code); it reads only the option spec (its flags).
    f"{TOOLS}.corpus": {"lmk_embed", f"{TOOLS}.compat", f"{TOOLS}.commandline"},
    # serve: the corpus loader and index, and the shipped engine's token count.
    f"{TOOLS}.serve": {"lmk_embed", f"{TOOLS}.corpus", f"{TOOLS}.commandline"},
    f"{TOOLS}.cli": {f"{TOOLS}.{p}" for p in ("commandline", "training", "model_cards", "push", "evaluation_jobs", "corpus",
                                              "onnx_export", "demo", "student_demo", "serve")},
    f"{TOOLS}.demo": {"lmk_embed", *(f"{TOOLS}.{p}" for p in ("training", "evaluation", "evaluation_jobs", "model_cards",
                                                              "push", "commandline", "disjointness"))},  # the demo's tables are evaluate's rows
    f"{TOOLS}.student_demo": {f"{TOOLS}.{p}" for p in ("training", "evaluation", "model_cards", "push", "commandline")},
    f"{TOOLS}.recipes": {"lmk_embed", f"{TOOLS}.training", f"{TOOLS}.evaluation", f"{TOOLS}.retrieval_data"},
    "benchmarks": {"lmk_embed", *(f"{TOOLS}.{p}" for p in ("training", "evaluation", "corpus", "model_cards", "push",
                                                          "onnx_export", "serve"))},
}


def unit_of(module: str) -> str:
    """"lmk_embed_tools.training.convert" -> "lmk_embed_tools.training"; "torch.nn" -> "torch"."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == TOOLS and len(parts) > 1 else parts[0]


def imported_top_levels(path: Path, skip_optional: bool = False) -> set[str]:
    """Units `path` imports; `skip_optional` leaves out imports guarded by try/except ImportError."""
    tree = ast.parse(path.read_text())
    if skip_optional:
        for node in ast.walk(tree):
            if isinstance(node, ast.Try):
                node.body = []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(unit_of(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == TOOLS:  # from lmk_embed_tools import push
                names.update(f"{TOOLS}.{alias.name}" for alias in node.names)
            else:
                names.add(unit_of(node.module))
    return names


def unit_files(unit: str) -> list[Path]:
    """Every .py file of a unit, recursively."""
    path = ROOT.joinpath(*unit.split("."))
    return [path.with_suffix(".py")] if path.with_suffix(".py").is_file() else sorted(path.rglob("*.py"))


@pytest.mark.parametrize("unit", sorted(ALLOWED_IMPORTS))
def test_no_package_imports_back(unit):
    files = unit_files(unit)
    assert files
    ours = set(ALLOWED_IMPORTS) - {unit}
    used = set().union(*(imported_top_levels(f) for f in files)) & ours
    assert used <= ALLOWED_IMPORTS[unit], f"{unit} imports {sorted(used - ALLOWED_IMPORTS[unit])}"


def test_every_python_file_belongs_to_a_unit():
    """The walk above covers the whole tree (tests aside): nothing sits outside a checked unit."""
    covered = {f for unit in ALLOWED_IMPORTS for f in unit_files(unit)}
    covered |= set((ROOT / TOOLS).glob("*.py"))  # the tooling package's own __init__
    ignored = {".venv", "tests", "runs", ".git", "build", "dist"}  # build outputs hold copies of the packages
    every = {p for p in ROOT.rglob("*.py") if not ignored & set(p.relative_to(ROOT).parts)}
    assert every - covered == set()


def test_shipped_files_import_only_each_other_and_allowed_libraries():
    """Optional kernels (mamba_ssm) may be imported inside try/except."""
    # tqdm comes with transformers; sentence_transformers only in st_module.py, which only it loads.
    allowed = {"torch", "transformers", "safetensors", "tokenizers", "numpy", "tqdm", "sentence_transformers"}
    import sys

    for path in lmk_embed.shipped_files():
        foreign = imported_top_levels(path, skip_optional=True) - allowed - set(sys.stdlib_module_names)
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def relative_imports(path: Path) -> set[str]:
    """The same-folder files `path` imports by relative import: `from .encoding import x` -> "encoding.py"."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1, f"{path.name}: shipped files import only from their own folder"
            names.update([f"{node.module}.py"] if node.module else (f"{alias.name}.py" for alias in node.names))
    return names


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (file -> the files it imports) as [a, b, ..., a], or None when it has none."""
    state = {}  # "open" while on the current path, "done" once every path from it was walked

    def walk(node, path):
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := walk(target, path + [target])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start, [start])):
            return found
    return None


def test_import_cycle_names_a_cycle_or_none():
    assert import_cycle({"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}}) == ["a.py", "b.py", "c.py", "a.py"]
    assert import_cycle({"a.py": {"a.py"}}) == ["a.py", "a.py"]
    assert import_cycle({"a.py": {"b.py", "c.py"}, "b.py": {"c.py"}, "c.py": set()}) is None


def test_shipped_files_do_not_import_each_other_in_a_circle():
    """The shipped files' relative imports, those inside functions included (transformers' remote-code
    loader copies those too), form no cycle: a circle means two files that can only be read, changed and
    loaded together, and an import order that works only by accident of which one Python meets first."""
    graph = {path.name: relative_imports(path) for path in lmk_embed.shipped_files()}
    cycle = import_cycle(graph)
    assert cycle is None, "the shipped files import each other in a circle: " + " -> ".join(cycle)


def tooling_module_name(path: Path) -> str:
    """lmk_embed_tools/training/convert.py -> "lmk_embed_tools.training.convert"; a package's __init__.py -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tooling_import_graph() -> dict[str, set[str]]:
    """Module -> the tooling modules it imports, every import of the file counted: top-level ones and
    the lazy ones inside functions (`from .student import x` in a function body still ties the two).
    `from package import name` points at the submodule `name` when there is one, else the package."""
    paths = {tooling_module_name(path): path for path in sorted((ROOT / TOOLS).rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                targets.update(f"{module}.{alias.name}" if f"{module}.{alias.name}" in paths else module
                               for alias in node.names)
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def test_the_tooling_graph_sees_lazy_imports():
    graph = tooling_import_graph()
    assert f"{TOOLS}.training.convert" in graph[f"{TOOLS}.training.commands"]  # imported inside a function
    assert f"{TOOLS}.training.teacher_targets" in graph[f"{TOOLS}.training.long_pages"]


def test_no_tooling_modules_import_each_other_in_a_circle():
    """The tooling's modules, their lazy imports inside functions included, form no cycle: a lazy
    import only hides a circle from Python's import order, not from a reader (issue: finetune ->
    long_pages -> student -> finetune)."""
    cycle = import_cycle(tooling_import_graph())
    assert cycle is None, "tooling modules import each other in a circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("family", sorted(lmk_embed.AUTO_MAPS))
def test_a_family_ships_every_file_its_files_import(family):
    """Closed under relative imports: a checkpoint's code imports nothing the checkpoint lacks. It also
    holds the modules its config's `auto_map` and its modules.json name."""
    files = {path.name: path for path in lmk_embed.shipped_files(family)}
    assert all(path.is_file() for path in files.values())
    for name, path in files.items():
        missing = relative_imports(path) - set(files)
        assert not missing, f"{name} imports {sorted(missing)}, which a {family} checkpoint does not ship"
    references = [ref for value in lmk_embed.AUTO_MAPS[family].values() for ref in (value if isinstance(value, list) else [value])]
    named = {ref.rsplit(".", 1)[0] + ".py" for ref in references if ref} | {"st_module.py"}
    assert named <= set(files)


def test_every_shipped_file_belongs_to_a_family_and_only_shared_files_to_both():
    every = {path.name for path in lmk_embed.shipped_files()}
    sets = {family: {path.name for path in lmk_embed.shipped_files(family)} for family in lmk_embed.AUTO_MAPS}
    assert set().union(*sets.values()) == every
    assert sets["lmk_embedder"] & sets["recurrent_embedder"] == set(lmk_embed.SHARED_FILES)
    with pytest.raises(ValueError, match="Unknown family 'bert'"):
        lmk_embed.shipped_files("bert")


@pytest.mark.parametrize("checkpoint, family", [("lmk_checkpoint", "lmk_embedder"), ("mamba2_checkpoint", "recurrent_embedder")])
def test_checkpoint_code_is_exactly_the_family_file_set(checkpoint, family, request):
    folder = Path(request.getfixturevalue(checkpoint))
    shipped = {p.name: p.read_bytes() for p in lmk_embed.shipped_files(family)}
    in_checkpoint = {p.name: p.read_bytes() for p in folder.glob("*.py")}
    assert in_checkpoint == shipped
    other = {p.name for p in lmk_embed.shipped_files()} - set(lmk_embed.SHARED_FILES) - set(shipped)
    assert other and not other & set(in_checkpoint)  # an LMK checkpoint holds no recurrent file, and vice versa
    assert "__init__.py" not in in_checkpoint


# Optional runtimes a shipped file may import: only the file named here, only lazily (inside a function)
# and only inside a try block, which transformers' remote-code loader skips when it lists what a
# checkpoint's code requires. Anywhere else, every checkpoint would need them installed to load at all.
LAZY_IMPORTS = {"onnx_backend.py": {"onnxruntime"}}


def _imports_with_context(tree, in_function=False, in_try=False):
    """(imported unit, inside a function, inside a try block) for every import statement of `tree`."""
    for node in ast.iter_child_nodes(tree):
        function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        guarded = in_try or isinstance(node, ast.Try)
        if isinstance(node, ast.Import):
            yield from ((unit_of(alias.name), in_function, in_try) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield unit_of(node.module), in_function, in_try
        yield from _imports_with_context(node, function, guarded)


def test_optional_runtimes_are_imported_lazily_inside_try_and_only_by_their_file():
    optional = set().union(*LAZY_IMPORTS.values())
    seen = set()
    for path in lmk_embed.shipped_files():
        for unit, in_function, in_try in _imports_with_context(ast.parse(path.read_text())):
            if unit not in optional:
                continue
            seen.add(unit)
            assert unit in LAZY_IMPORTS.get(path.name, set()), f"{path.name} imports {unit}"
            assert in_function and in_try, f"{path.name} imports {unit} outside a function's try block"
    assert seen == optional  # the allowance is used, so it stays no wider than needed


LONGEST_FUNCTION_BODY = 80  # lines, docstring and signature aside: longer ones are split into named steps


def test_no_function_body_is_longer_than_a_screen():
    too_long = []
    for path in [*lmk_embed.shipped_files(), *sorted((ROOT / TOOLS).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            if body and node.end_lineno - body[0].lineno + 1 > LONGEST_FUNCTION_BODY:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not too_long, too_long
