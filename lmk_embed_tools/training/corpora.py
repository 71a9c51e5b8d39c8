"""Offline documentation corpora from what `make` installs: summary line -> rest of the page.

Every item is one documented object (module, class, function or method) of an installed
package. The query is the first line of its own docstring; the document is its whole pydoc page
with that line removed, so the query never occurs verbatim in its positive. Pages are kept whole:
a class page holds every method, and a page can run to tens of thousands of tokens.

Items are grouped into *sources* (families of packages). Training and evaluation are split by
source, so that an out-of-domain score comes from packages the model never saw. The validation
source is neither trained on nor a test: a recipe chosen on it is chosen for out-of-domain quality
without looking at the test splits.

    stdlib       Python's standard library            train, and an in-domain held-out split (by module)
    torch        PyTorch                              train
    huggingface  transformers, datasets, hub, ...     train
    arrays       numpy, pandas, pyarrow               train
    tools        matplotlib, PIL, rich, pydantic, ... train
    scientific   scipy, scikit-learn                  out-of-domain evaluation only
    symbolic     sympy, networkx                      out-of-domain evaluation only
    systems      ray, pytest, anyio, fontTools, ...   validation only: chooses between recipes

Near-copies are removed: the same object re-exported under several names is kept once, as is a
docstring shared by several objects, and a query text is kept once. The man pages installed on the
machine are reserved: no item is ever read from them (`RESERVED_DIRS`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import warnings
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from lmk_embed_tools.retrieval_data import RetrievalData

from .overlap import TrainingText
from .stdlib_corpus import import_quietly, render_page, stdlib_module_names, synopsis_of

# Modules walked per source: public API modules, not test suites or per-model files.
SOURCE_MODULES: dict[str, tuple[str, ...]] = {
    "stdlib": (),  # filled from sys.stdlib_module_names
    "torch": (
        "torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.utils", "torch.nn.utils.rnn",
        "torch.nn.parallel", "torch.optim", "torch.optim.lr_scheduler", "torch.utils.data", "torch.utils.checkpoint",
        "torch.autograd", "torch.autograd.functional", "torch.linalg", "torch.fft", "torch.special", "torch.sparse",
        "torch.distributions", "torch.random", "torch.amp", "torch.cuda", "torch.jit", "torch.fx", "torch.export",
        "torch.profiler", "torch.testing", "torch.func", "torch.quantization", "torch.nn.attention", "torch.hub",
        "torch.serialization", "torch.overrides", "torch.masked", "torch.nested", "torch.library",
    ),
    "huggingface": (
        "transformers.trainer", "transformers.training_args", "transformers.trainer_callback", "transformers.trainer_utils",
        "transformers.tokenization_utils_base", "transformers.modeling_utils", "transformers.configuration_utils",
        "transformers.generation.utils", "transformers.generation.configuration_utils", "transformers.generation.logits_process",
        "transformers.generation.stopping_criteria", "transformers.pipelines", "transformers.data.data_collator",
        "transformers.optimization", "transformers.cache_utils", "transformers.modeling_outputs", "transformers.utils.hub",
        "transformers.feature_extraction_utils", "transformers.processing_utils", "transformers.integrations",
        "datasets", "datasets.arrow_dataset", "datasets.dataset_dict", "datasets.features", "datasets.load",
        "datasets.iterable_dataset", "datasets.builder", "huggingface_hub", "huggingface_hub.hf_api",
        "huggingface_hub.file_download", "huggingface_hub.repocard", "huggingface_hub.utils", "peft", "peft.tuners.lora",
        "peft.peft_model", "peft.utils", "accelerate", "accelerate.accelerator", "accelerate.utils", "safetensors.torch",
        "sentence_transformers", "sentence_transformers.util", "sentence_transformers.sentence_transformer.losses",
        "sentence_transformers.sentence_transformer.evaluation", "tokenizers", "tokenizers.normalizers",
        "tokenizers.pre_tokenizers", "tokenizers.models", "tokenizers.trainers", "tokenizers.processors",
    ),
    "arrays": (
        "numpy", "numpy.linalg", "numpy.fft", "numpy.random", "numpy.ma", "numpy.polynomial", "numpy.polynomial.polynomial",
        "numpy.lib.stride_tricks", "numpy.testing", "numpy.strings", "numpy.char", "numpy.rec",
        "pandas", "pandas.api.types", "pandas.api.extensions", "pandas.plotting", "pandas.tseries.offsets",
        "pandas.core.groupby", "pandas.core.window", "pandas.core.resample", "pandas.io.formats.style",
        "pyarrow", "pyarrow.compute", "pyarrow.parquet", "pyarrow.csv", "pyarrow.dataset", "pyarrow.fs",
    ),
    "tools": (
        "matplotlib", "matplotlib.pyplot", "matplotlib.axes", "matplotlib.figure", "matplotlib.colors", "matplotlib.ticker",
        "matplotlib.patches", "matplotlib.lines", "matplotlib.text", "matplotlib.dates", "matplotlib.animation",
        "PIL.Image", "PIL.ImageDraw", "PIL.ImageFilter", "PIL.ImageOps", "PIL.ImageFont", "pygments", "pygments.lexers",
        "pygments.formatters", "rich", "rich.console", "rich.table", "rich.progress", "rich.text", "rich.panel",
        "click", "typer", "jinja2", "jinja2.environment", "jinja2.filters", "pydantic", "pydantic.fields", "pydantic.main",
        "requests", "requests.sessions", "requests.models", "requests.adapters", "yaml", "dateutil.parser",
        "dateutil.relativedelta", "dateutil.rrule", "dateutil.tz", "fsspec", "fsspec.spec", "fsspec.implementations.local",
        "polars", "polars.dataframe.frame", "polars.series.series", "polars.expr.expr", "polars.lazyframe.frame",
        "tqdm", "tqdm.auto", "psutil", "filelock", "packaging.version", "packaging.specifiers", "regex", "pyparsing",
        "urllib3", "urllib3.util", "markdown_it", "mpmath", "joblib", "xxhash", "dill", "cloudpickle",
    ),
    "scientific": (
        "scipy.stats", "scipy.optimize", "scipy.linalg", "scipy.signal", "scipy.sparse", "scipy.sparse.linalg",
        "scipy.sparse.csgraph", "scipy.interpolate", "scipy.integrate", "scipy.spatial", "scipy.spatial.distance",
        "scipy.special", "scipy.ndimage", "scipy.cluster.hierarchy", "scipy.cluster.vq", "scipy.io", "scipy.fft",
        "scipy.constants", "scipy.odr", "scipy.differentiate", "sklearn.linear_model", "sklearn.ensemble", "sklearn.svm",
        "sklearn.tree", "sklearn.neighbors", "sklearn.cluster", "sklearn.decomposition", "sklearn.preprocessing",
        "sklearn.metrics", "sklearn.model_selection", "sklearn.pipeline", "sklearn.feature_extraction.text",
        "sklearn.feature_selection", "sklearn.naive_bayes", "sklearn.neural_network", "sklearn.manifold",
        "sklearn.mixture", "sklearn.impute", "sklearn.compose", "sklearn.covariance", "sklearn.gaussian_process",
        "sklearn.kernel_approximation", "sklearn.calibration", "sklearn.inspection", "sklearn.utils",
        "sklearn.datasets", "sklearn.discriminant_analysis", "sklearn.cross_decomposition", "sklearn.isotonic",
        "sklearn.random_projection", "sklearn.semi_supervised", "sklearn.multiclass", "sklearn.multioutput",
    ),
    "symbolic": (
        "sympy", "sympy.simplify", "sympy.solvers", "sympy.integrals", "sympy.series", "sympy.matrices",
        "sympy.polys", "sympy.functions", "sympy.logic", "sympy.sets", "sympy.ntheory", "sympy.combinatorics",
        "sympy.geometry", "sympy.physics.units", "sympy.stats", "sympy.printing", "sympy.parsing.sympy_parser",
        "sympy.tensor", "sympy.calculus", "sympy.discrete", "sympy.codegen", "sympy.utilities",
        "networkx", "networkx.algorithms", "networkx.algorithms.community", "networkx.algorithms.flow",
        "networkx.algorithms.shortest_paths", "networkx.algorithms.centrality", "networkx.generators",
        "networkx.drawing", "networkx.readwrite", "networkx.linalg", "networkx.utils", "networkx.algorithms.approximation",
        "networkx.algorithms.isomorphism", "networkx.algorithms.bipartite", "networkx.algorithms.tree",
        "networkx.algorithms.traversal", "networkx.algorithms.components", "networkx.algorithms.connectivity",
        "networkx.algorithms.coloring", "networkx.algorithms.link_analysis", "networkx.classes",
    ),
    "systems": (
        "ray", "ray.data", "ray.data.dataset", "ray.util", "ray.util.queue", "ray.util.actor_pool",
        "ray.util.placement_group", "ray.train", "ray.tune", "ray.job_submission", "ray.runtime_context", "ray.actor",
        "ray.exceptions", "pytest", "_pytest.fixtures", "_pytest.python", "_pytest.monkeypatch", "_pytest.capture",
        "_pytest.config", "_pytest.mark", "_pytest.nodes", "_pytest.tmpdir", "_pytest.logging", "_pytest.recwarn",
        "_pytest.python_api", "pluggy", "setuptools", "setuptools.dist", "setuptools.command.build_py", "attr",
        "anyio", "anyio.abc", "anyio.streams.memory", "jsonschema", "jsonschema.validators", "jsonschema.exceptions",
        "referencing", "fontTools.ttLib", "fontTools.ttLib.ttFont", "fontTools.pens.basePen", "fontTools.subset",
        "fontTools.varLib", "fontTools.feaLib.parser", "google.protobuf.message", "google.protobuf.json_format",
        "google.protobuf.descriptor", "google.protobuf.text_format", "msgpack", "einops",
    ),
}
TRAIN_SOURCES = ("stdlib", "torch", "huggingface", "arrays", "tools")
# Public submodules of the standard library, walked besides every top-level module.
STDLIB_SUBMODULES = (
    "os.path", "xml.etree.ElementTree", "xml.dom.minidom", "xml.sax", "email.message", "email.utils", "email.parser",
    "email.mime.text", "http.client", "http.server", "http.cookies", "urllib.request", "urllib.parse", "urllib.error",
    "json.decoder", "json.encoder", "concurrent.futures", "multiprocessing.pool", "multiprocessing.managers",
    "asyncio.tasks", "asyncio.streams", "asyncio.queues", "asyncio.locks", "asyncio.events", "asyncio.subprocess",
    "importlib.util", "importlib.metadata", "importlib.resources", "unittest.mock", "logging.handlers", "logging.config",
    "collections.abc", "encodings.idna", "html.parser", "sqlite3.dbapi2", "ctypes.util", "wsgiref.simple_server",
    "dbm.dumb", "curses.textpad", "xmlrpc.client", "xmlrpc.server", "unittest.case",
)
OUT_OF_DOMAIN_SOURCES = ("scientific", "symbolic")
VALIDATION_SOURCE = "systems"
# Also the order of the cross-source dedup: a page shared by two sources stays with the earlier one.
SOURCES = TRAIN_SOURCES + OUT_OF_DOMAIN_SOURCES + (VALIDATION_SOURCE,)
# Seconds each source took to render on one core (measured once; sympy's module pages are the longest).
RENDER_SECONDS = {"symbolic": 52, "huggingface": 31, "tools": 26, "stdlib": 23, "torch": 23, "arrays": 19, "scientific": 19,
                  "systems": 12}
# The man pages are reserved: never read, neither for training nor for evaluation.
RESERVED_DIRS = tuple(
    str(Path(d).resolve()) for d in (os.environ.get("MANPATH", "").split(os.pathsep) + ["/usr/share/man", "/usr/local/share/man"]) if d
)
# Import names whose distribution is named otherwise.
DISTRIBUTIONS = {"sklearn": "scikit-learn", "PIL": "pillow", "yaml": "PyYAML", "dateutil": "python-dateutil",
                 "markdown_it": "markdown-it-py", "_pytest": "pytest", "attr": "attrs", "fontTools": "fonttools",
                 "google": "protobuf"}
MIN_SYNOPSIS_WORDS = 3
MIN_BODY_CHARS = 80  # a page that is little more than its signature teaches nothing
CORPUS_VERSION = 8  # 8: machine paths replaced before pydoc cuts a long value


@dataclass(frozen=True)
class DocItem:
    """One documented object. `text` is its whole page, without the synopsis line."""

    source: str
    module: str
    name: str
    kind: str  # module | class | function | method
    synopsis: str
    text: str


def is_reserved(obj) -> bool:
    """True when `obj` was defined in a file under a reserved folder (the man pages)."""
    try:
        path = inspect.getsourcefile(obj) or inspect.getfile(obj)
    except (TypeError, OSError):
        return False
    resolved = str(Path(path).resolve())
    return any(resolved == d or resolved.startswith(d + os.sep) for d in RESERVED_DIRS)


def normalized_text(text: str) -> str:
    """Whitespace-collapsed, lower-cased: the key under which near-copies of a page are one."""
    return re.sub(r"\s+", " ", text).strip().lower()


def _page_item(source: str, module: str, name: str, kind: str, obj) -> DocItem | None:
    synopsis = synopsis_of(obj)
    if len(synopsis.split()) < MIN_SYNOPSIS_WORDS or is_reserved(obj):
        return None
    try:
        page = render_page(obj)
    except Exception:  # pydoc cannot render some C extension objects; they are not documentation we need
        return None
    text = page.replace(synopsis, " ", 1).strip()
    if len(text) < MIN_BODY_CHARS:
        return None
    return DocItem(source, module, name, kind, synopsis, text)


def _defined_here(obj, module_name: str, source: str) -> bool:
    """False for objects re-exported from another package (typing.Text is str): their page belongs there."""
    defined_in = getattr(obj, "__module__", None)
    if type(obj).__name__ == "ufunc":  # numpy's ufuncs carry no module of their own
        return module_name.startswith("numpy")
    if not isinstance(defined_in, str):
        return False
    root, own = defined_in.split(".")[0], module_name.split(".")[0]
    if source == "stdlib":  # io.BytesIO lives in _io, os.listdir in posix
        return root.lstrip("_") == own.lstrip("_") or (own == "os" and root in ("posix", "nt"))
    return root == own


def _members(module, module_name: str, source: str, max_methods_per_class: int):
    """(qualified name, kind, object) for a module's public classes/functions and their own methods."""
    for attribute in sorted(dir(module)):
        if attribute.startswith("_"):
            continue
        try:
            obj = getattr(module, attribute)
        except Exception:  # lazy modules can fail on access; skip what cannot be loaded
            continue
        if not _defined_here(obj, module_name, source):
            continue
        if inspect.isclass(obj):
            yield f"{module_name}.{attribute}", "class", obj
            methods = [(n, m) for n, m in sorted(vars(obj).items())
                       if not n.startswith("_") and (inspect.isfunction(m) or inspect.ismethoddescriptor(m))]
            for method_name, method in methods[:max_methods_per_class]:
                yield f"{module_name}.{attribute}.{method_name}", "method", getattr(obj, method_name, method)
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj) or type(obj).__name__ == "ufunc":
            yield f"{module_name}.{attribute}", "function", obj


def source_items(source: str, max_methods_per_class: int = 120, modules: list[str] | None = None) -> list[DocItem]:
    """Every documented object of one source (or of the given `modules` only), deduplicated."""
    if source not in SOURCE_MODULES:
        raise ValueError(f"Unknown `source` {source!r}; expected one of {list(SOURCE_MODULES)}.")
    module_names = modules
    if module_names is None:
        module_names = stdlib_module_names() + list(STDLIB_SUBMODULES) if source == "stdlib" else SOURCE_MODULES[source]
    modules = {name: import_quietly(name) for name in module_names}  # import all before rendering (stable pages)
    items, seen_objects, seen_bodies, seen_queries = [], {}, set(), set()
    for module_name, module in modules.items():
        if module is None:
            continue
        with warnings.catch_warnings():  # attribute access can raise deprecation warnings (torch's TypedStorage)
            warnings.simplefilter("ignore")
            candidates = [(module_name, "module", module)] + list(_members(module, module_name, source, max_methods_per_class))
        for name, kind, obj in candidates:
            # A classmethod read through two names is two bound methods of one function. The seen objects
            # are held, not only their ids: a freed bound method's id is reused by the next one, which
            # would then be dropped as a copy depending on memory layout.
            function = getattr(obj, "__func__", obj)
            if id(function) in seen_objects:
                continue
            seen_objects[id(function)] = function
            item = _page_item(source, module_name, name, kind, obj)
            if item is None or item.synopsis in seen_queries:
                continue
            body = hashlib.sha1(normalized_text(inspect.getdoc(obj) or item.text).encode()).hexdigest()
            if body in seen_bodies:
                continue
            seen_bodies.add(body)
            seen_queries.add(item.synopsis)
            items.append(item)
    return items


def build_corpus(cache_dir: str | Path | None = None, sources=SOURCES) -> dict[str, list[DocItem]]:
    """{source: items}, cached as jsonl under `cache_dir` keyed by the installed package versions."""
    cache = Path(cache_dir) if cache_dir is not None else None
    by_cost = render_order(sources)
    with ThreadPoolExecutor(max_workers=2) as pool:  # each source renders in its own interpreter
        rendered = dict(zip(by_cost, pool.map(lambda source: _cached_source_items(source, cache), by_cost)))
    corpus = {source: rendered[source] for source in sources}
    seen_queries, seen_texts = set(), set()
    for source in sources:
        # Across sources too: a page shared by two sources stays with the first (training sources come first,
        # so an out-of-domain split never holds a page the model was trained on).
        kept = []
        for item in corpus[source]:
            key = hashlib.sha1(normalized_text(item.text).encode()).hexdigest()
            if item.synopsis in seen_queries or key in seen_texts:
                continue
            seen_queries.add(item.synopsis)
            seen_texts.add(key)
            kept.append(item)
        corpus[source] = kept
    # Nor an evaluation page that repeats a training page's sentence or 13-word run (a docstring copied
    # between libraries); `make demo` checks every evaluation task against training before it trains.
    corpus, dropped = apart_from_training(corpus)
    if dropped:
        print("Left out of evaluation, sharing a sentence or a 13-word run with a training page: "
              + ", ".join(f"{source} {count}" for source, count in dropped.items()), file=sys.stderr)
    return corpus


def render_order(sources) -> list[str]:
    """`sources`, longest to render first: then neither worker idles while the other renders the last one."""
    return sorted(sources, key=lambda source: -RENDER_SECONDS.get(source, 0))


def _cached_source_items(source: str, cache: Path | None) -> list[DocItem]:
    """`source_items(source)`, read from / written to `cache` when given."""
    path = cache / f"{source}-{_environment_key(source)}.jsonl" if cache is not None else None
    if path is not None and path.is_file():
        return [DocItem(**json.loads(line)) for line in path.read_text().splitlines()]
    items = rendered_source_items(source)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(asdict(item)) + "\n" for item in items))
        tmp.replace(path)
    return items


def rendered_source_items(source: str, modules: list[str] | None = None) -> list[DocItem]:
    """`source_items(source, modules=modules)`, rendered in a fresh interpreter with a fixed string-hash seed.

    pydoc prints sets, and dicts filled from sets, in hash order, which Python draws anew for every
    process; with `PYTHONHASHSEED=0` the pages come out the same on every run. The fresh interpreter
    also keeps the pages independent of what the caller imported, and keeps those imports out of it.
    """
    if os.environ.get("PYTHONHASHSEED") == "0":
        return source_items(source, modules=modules)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{source}.jsonl"
        # Arguments go through stdin: `sys.argv` is printed on the sys page, so it must not hold a temp path.
        script = ("import json, sys; from dataclasses import asdict; from lmk_embed_tools.training.corpora import source_items; "
                  "source, modules, out = json.loads(sys.stdin.read()); items = source_items(source, modules=modules); "
                  "open(out, 'w').write(''.join(json.dumps(asdict(i)) + chr(10) for i in items))")
        done = subprocess.run([sys.executable, "-c", script], input=json.dumps([source, modules, str(out)]), text=True,
                              env={**os.environ, "PYTHONHASHSEED": "0"}, cwd=Path(__file__).resolve().parents[2],
                              capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"Rendering the {source!r} corpus failed:\n{done.stderr[-4000:]}")
        return [DocItem(**json.loads(line)) for line in out.read_text().splitlines()]


def _environment_key(source: str) -> str:
    """Python and package versions a source's pages depend on, as a short hash."""
    from importlib import metadata

    roots = sorted({name.split(".")[0] for name in SOURCE_MODULES[source]})  # stdlib: none, the Python version says it
    versions = [sys.version]
    for root in roots:
        try:
            versions.append(f"{root}=={metadata.version(DISTRIBUTIONS.get(root, root))}")
        except metadata.PackageNotFoundError:
            versions.append(f"{root}==?")
    return hashlib.sha1(json.dumps([CORPUS_VERSION, versions]).encode()).hexdigest()[:12]


def source_distributions() -> set[str]:
    """The names of the installed distributions every source reads (training, validation and evaluation):
    each top-level import name of `SOURCE_MODULES` (and of the standard library, for backports) mapped
    through `packages_distributions()`, and through `DISTRIBUTIONS` besides (a package not installed
    still names its distribution). The held-out genres of other pages never read these."""
    from importlib import metadata

    installed = metadata.packages_distributions()
    roots = {name.split(".")[0] for modules in SOURCE_MODULES.values() for name in modules} | set(sys.stdlib_module_names)
    return {dist for root in roots for dist in installed.get(root, [])} | {DISTRIBUTIONS.get(root, root) for root in roots
                                                                           if root not in sys.stdlib_module_names}


def is_held_out_module(module: str, fraction: float = 0.2) -> bool:
    """Deterministic in-domain hold-out of stdlib modules (by top-level module name)."""
    return (zlib.crc32(module.split(".")[0].encode()) % 1000) / 1000 < fraction


def length_summary(items: list[DocItem], tokenizer=None) -> dict[str, float]:
    """Document length distribution (words, or tokens when a tokenizer is given): median, p90, max."""
    if not items:
        return {"count": 0}
    if tokenizer is not None:
        lengths = [len(ids) for ids in tokenizer([i.text for i in items], add_special_tokens=False)["input_ids"]]
    else:
        lengths = [len(i.text.split()) for i in items]
    lengths.sort()
    return {"count": len(lengths), "median": statistics.median(lengths),
            "p90": lengths[int(0.9 * (len(lengths) - 1))], "max": lengths[-1]}


def corpus_report(corpus: dict[str, list[DocItem]]) -> dict[str, dict]:
    """Per source: items, kinds and word-length distribution."""
    return {source: {**length_summary(items), "kinds": dict(Counter(i.kind for i in items))} for source, items in corpus.items()}


# ---- training pairs and evaluation splits ----------------------------------------------------------


IN_DOMAIN_SPLIT = "stdlib held-out modules (in-domain)"
EVAL_KINDS = ("class", "function")  # leaf pages: a module page repeats its members' synopses, a class page its methods'


def training_items(corpus: dict[str, list[DocItem]], held_out_fraction: float = 0.2) -> list[DocItem]:
    """Items of the training sources, less the stdlib modules held out for the in-domain split."""
    return [item for source in TRAIN_SOURCES for item in corpus.get(source, [])
            if not (source == "stdlib" and is_held_out_module(item.module, held_out_fraction))]


def _split_from_items(name: str, items: list[DocItem], max_queries: int, seed: int) -> RetrievalData:
    import random

    leaves = [i for i in items if i.kind in EVAL_KINDS]
    random.Random(seed).shuffle(leaves)
    chosen = leaves[:max_queries]
    documents = {i.name: i.text for i in chosen}
    queries, relevant = {}, {}
    for item in chosen:
        # A query whose text occurs verbatim in some other document has two right answers; leave it out.
        if any(item.synopsis in text for doc_id, text in documents.items() if doc_id != item.name):
            continue
        queries[item.name] = item.synopsis
        relevant[item.name] = {item.name: 1}
    return RetrievalData(name, queries, documents, relevant)


def evaluation_splits(corpus: dict[str, list[DocItem]], max_queries: int = 320, seed: int = 0,
                      held_out_fraction: float = 0.2, in_domain_queries: int | None = None) -> list[RetrievalData]:
    """The in-domain held-out stdlib split (`in_domain_queries`, default `max_queries`), then one
    out-of-domain split per evaluation-only source (`max_queries` each)."""
    held_out = [i for i in corpus.get("stdlib", []) if is_held_out_module(i.module, held_out_fraction)]
    splits = [_split_from_items(IN_DOMAIN_SPLIT, held_out, in_domain_queries or max_queries, seed)]
    for source in OUT_OF_DOMAIN_SOURCES:
        if source in corpus:
            splits.append(_split_from_items(f"{source} (out-of-domain)", corpus[source], max_queries, seed))
    return splits


def validation_split(corpus: dict[str, list[DocItem]], max_queries: int = 2000, seed: int = 0) -> RetrievalData:
    """Up to `max_queries` classes and functions of the validation source (every one by default).

    Its packages are neither trained on nor in a test split, so choosing a recipe by its score
    there chooses for out-of-domain quality without looking at the test splits.
    """
    if not corpus.get(VALIDATION_SOURCE):
        raise ValueError(f"`corpus` holds no {VALIDATION_SOURCE!r} items; build it with `sources` including it.")
    return _split_from_items(f"{VALIDATION_SOURCE} (validation)", corpus[VALIDATION_SOURCE], max_queries, seed)


def deep_evidence_split(corpus: dict[str, list[DocItem]], source: str, count_tokens, min_depth: int = 600,
                        max_depth: int = 3800, max_queries: int = 50, max_documents: int = 100,
                        seed: int = 0) -> RetrievalData:
    """A long-document split whose evidence lies past the first 512 tokens of its page.

    The query is a method's summary line; its document is the page of the class that holds the
    method, with that line removed, where the line sat `min_depth` to `max_depth` tokens deep
    (`count_tokens(texts) -> [n_tokens]`). One query per class page; other long class pages of the source
    (over `min_depth` tokens) fill the candidates up to `max_documents`; pages whose query was left
    out (found verbatim elsewhere, or past `max_queries`) stay as candidates. A model that reads only the
    first 512 tokens sees the page's topic but never the method.
    """
    import random

    items = corpus.get(source) or []
    classes = {item.name: item for item in items if item.kind == "class"}
    methods = [item for item in items if item.kind == "method" and item.name.rsplit(".", 1)[0] in classes]
    rng = random.Random(seed)
    rng.shuffle(methods)
    queries, relevant, documents, depths = {}, {}, {}, {}
    for method in methods:
        page_name = method.name.rsplit(".", 1)[0]
        page = classes[page_name].text
        where = page.find(method.synopsis)
        if page_name in documents or where < 0 or len(documents) >= max_documents:
            continue
        depth = count_tokens([page[:where]])[0]
        if not min_depth <= depth <= max_depth:
            continue
        documents[page_name] = page.replace(method.synopsis, " ")
        queries[method.name], relevant[method.name], depths[method.name] = method.synopsis, {page_name: 1}, depth
    distractors = sorted(set(classes) - set(documents))
    rng.shuffle(distractors)
    for name in distractors:
        if len(documents) >= max_documents:
            break
        if count_tokens([classes[name].text])[0] > min_depth:
            documents[name] = classes[name].text
    for query_id in list(queries):  # a query found verbatim in another page has two right answers
        if any(queries[query_id] in text for doc_id, text in documents.items() if doc_id not in relevant[query_id]):
            del queries[query_id], relevant[query_id], depths[query_id]
    for query_id in list(queries)[max_queries:]:  # their pages stay, as candidates
        del queries[query_id], relevant[query_id], depths[query_id]
    return RetrievalData(f"{source} deep evidence", queries, documents, relevant)


_TRAINING = {}  # digest of the training items -> their TrainingText: built once per process


def training_text(corpus: dict) -> TrainingText:
    """The `TrainingText` of every training item of `corpus` (`training_items`: page and synopsis), the
    superset of any rows a run trains on (synopsis rows, deep-sentence rows cut from those pages)."""
    items = training_items(corpus)
    digest = hashlib.sha1()
    for item in items:
        digest.update(item.synopsis.encode() + b"\0" + item.text.encode() + b"\0")
    key = digest.hexdigest()
    if key not in _TRAINING:
        _TRAINING[key] = TrainingText((text for item in items for text in (item.synopsis, item.text)),
                                      (item.synopsis for item in items))
    return _TRAINING[key]


def apart_from_training(corpus: dict) -> tuple[dict, dict[str, int]]:
    """(`corpus` less every evaluation item that shares text with a training item, {source: items left
    out}). Evaluation items: the held-out stdlib modules' and every non-training source's. Training keeps
    all its items; an evaluation page that repeats a training page's sentence or 13-word run (a docstring
    copied between libraries: scipy's phrasing of numpy's) is left out, as an identical page already is."""
    training = training_text(corpus)
    kept, dropped = {}, {}
    for source, items in corpus.items():
        evaluated = [source not in TRAIN_SOURCES or (source == "stdlib" and is_held_out_module(item.module))
                     for item in items]  # the complement of `training_items`
        kept[source] = [item for item, is_evaluated in zip(items, evaluated)
                        if not is_evaluated or (training.shared(item.text) is None
                                                and training.query_in_training(item.synopsis) is None)]
        if len(kept[source]) < len(items):
            dropped[source] = len(items) - len(kept[source])
    return kept, dropped
