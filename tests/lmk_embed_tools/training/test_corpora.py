"""The documentation corpora, negative mining and the evaluation table (issue: fine-tuning that beats its base)."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmk_embed_tools.evaluation.table import paired_bootstrap
from lmk_embed_tools.training import corpora
from lmk_embed_tools.training.corpora import DocItem, build_corpus, evaluation_splits, source_items, training_items
from lmk_embed_tools.training.mining import mine_negatives

from tests import helpers


def item(source, module, name, synopsis, text, kind="function"):
    return DocItem(source, module, name, kind, synopsis, text)


def test_source_items_dedup_and_no_synopsis_in_positive():
    items = source_items("stdlib", modules=["json", "json.decoder", "json.encoder"])
    names = [i.name for i in items]
    # json re-exports JSONDecoder from json.decoder: one object, one item.
    assert sum(n.endswith(".JSONDecoder") for n in names) == 1
    assert len(set(i.synopsis for i in items)) == len(items)
    assert all(i.synopsis not in i.text for i in items)
    assert {"module", "class", "function"} <= {i.kind for i in items}
    assert all(i.source == "stdlib" for i in items)


def test_reexports_from_other_packages_are_not_ours():
    # typing.Text is str: re-exported into many modules, its methods are not that module's documentation.
    items = source_items("stdlib", modules=["typing"])
    assert not any(i.name.startswith("typing.Text.") for i in items)


def test_reserved_man_pages_are_never_read(monkeypatch, tmp_path):
    import json as json_module
    from pathlib import Path

    assert source_items("stdlib", modules=["json"])
    monkeypatch.setattr(corpora, "RESERVED_DIRS", (str(Path(json_module.__file__).resolve().parent),))
    assert source_items("stdlib", modules=["json"]) == []


def test_reserved_dirs_cover_the_man_pages():
    assert any(d.endswith("share/man") for d in corpora.RESERVED_DIRS)


def test_unknown_source_is_named():
    with pytest.raises(ValueError, match="`source` 'nope'"):
        source_items("nope")


def toy_corpus():
    corpus = {source: [] for source in corpora.SOURCES}
    for source in corpora.SOURCES:
        for module in ("site", "uu", "json", "csv", "zlib"):  # site and uu are held out
            for k in range(3):
                corpus[source].append(item(source, f"{module}", f"{source}.{module}.f{k}", f"{source} {module} does thing {k}",
                                           f"page of {source} {module} {k} " * 20))
    return corpus


def test_splits_by_source_and_held_out_modules():
    corpus = toy_corpus()
    train = training_items(corpus)
    assert {i.source for i in train} == set(corpora.TRAIN_SOURCES)
    assert not any(i.source == "stdlib" and corpora.is_held_out_module(i.module) for i in train)
    splits = evaluation_splits(corpus, max_queries=50)
    assert [s.name for s in splits][1:] == [f"{s} (out-of-domain)" for s in corpora.OUT_OF_DOMAIN_SOURCES]
    train_texts = {i.text for i in train}
    for split in splits:
        assert split.queries and not set(split.documents.values()) & train_texts
        assert all(split.relevant[q] == {q: 1} for q in split.queries)
    in_domain = splits[0]
    assert all(corpora.is_held_out_module(name.split(".")[1]) for name in in_domain.documents)


def test_validation_split_is_its_own_source_never_trained_nor_tested():
    corpus = toy_corpus()
    assert corpora.SOURCES[-1] == corpora.VALIDATION_SOURCE  # last in the dedup order: it never takes a page from another
    assert corpora.VALIDATION_SOURCE not in corpora.TRAIN_SOURCES + corpora.OUT_OF_DOMAIN_SOURCES
    split = corpora.validation_split(corpus, max_queries=4)
    assert split.name == "systems (validation)" and len(split.queries) == 4
    assert all(name.startswith("systems.") for name in split.documents)
    train_texts = {i.text for i in training_items(corpus)}
    test_texts = {text for s in evaluation_splits(corpus, max_queries=50) for text in s.documents.values()}
    assert not set(split.documents.values()) & (train_texts | test_texts)
    assert len(corpora.validation_split(corpus).queries) == 15  # by default every class and function page
    with pytest.raises(ValueError, match="`corpus` holds no 'systems' items"):
        corpora.validation_split({source: items for source, items in corpus.items() if source != "systems"})


def test_every_source_names_installed_distributions():
    # A root without a distribution would key its cache on "==?" and never see an upgrade.
    from importlib import metadata

    for source, modules in corpora.SOURCE_MODULES.items():
        for root in {name.split(".")[0] for name in modules}:
            assert metadata.version(corpora.DISTRIBUTIONS.get(root, root)), (source, root)


def test_eval_split_leaves_out_queries_with_two_right_answers():
    items = [item("scientific", "m", "m.a", "compute the widget norm", "the widget page " * 10),
             item("scientific", "m", "m.b", "unrelated summary here", "contains: compute the widget norm " * 5),
             item("scientific", "m", "m.c", "a third summary line", "third page " * 10)]
    split = corpora._split_from_items("s", items, max_queries=10, seed=0)
    assert "m.a" not in split.queries and {"m.b", "m.c"} <= set(split.queries)
    assert len(split.documents) == 3


def test_build_corpus_caches_and_dedups_across_sources(tmp_path, monkeypatch):
    fake = {"torch": [item("torch", "x", "x.f", "shared summary line", "same page text " * 10)],
            "scientific": [item("scientific", "y", "y.f", "shared summary line", "same page text " * 10),
                           item("scientific", "y", "y.g", "its own summary", "its own page " * 10)]}
    calls = []

    def fake_items(source, **kwargs):
        calls.append(source)
        return fake[source]

    monkeypatch.setattr(corpora, "rendered_source_items", fake_items)
    first = build_corpus(tmp_path, sources=("torch", "scientific"))
    assert [i.name for i in first["torch"]] == ["x.f"]
    assert [i.name for i in first["scientific"]] == ["y.g"]  # the copy stays with the training source
    again = build_corpus(tmp_path, sources=("torch", "scientific"))
    assert sorted(calls) == ["scientific", "torch"] and again == first  # read back from the cache
    cached = list(tmp_path.glob("torch-*.jsonl"))
    assert len(cached) == 1 and json.loads(cached[0].read_text().splitlines()[0])["name"] == "x.f"


def test_build_corpus_renders_longest_first_but_dedups_in_the_given_order(tmp_path, monkeypatch):
    order = corpora.render_order(corpora.SOURCES)
    assert sorted(order) == sorted(corpora.SOURCES) and order[0] == "symbolic"
    assert [corpora.RENDER_SECONDS[s] for s in order] == sorted(corpora.RENDER_SECONDS.values(), reverse=True)
    submitted = []
    # symbolic renders first, yet a page shared with a training source stays with the training source.
    fake = {"arrays": [item("arrays", "n", "n.f", "shared summary line", "same page text " * 10)],
            "symbolic": [item("symbolic", "s", "s.f", "shared summary line", "same page text " * 10),
                         item("symbolic", "s", "s.g", "its own summary", "its own page " * 10)]}
    monkeypatch.setattr(corpora, "rendered_source_items", lambda source, **kwargs: fake[source])
    real_order = corpora.render_order
    monkeypatch.setattr(corpora, "render_order", lambda sources: submitted.append(real_order(sources)) or submitted[-1])
    corpus = build_corpus(tmp_path, sources=("arrays", "symbolic"))
    assert submitted == [["symbolic", "arrays"]]  # build_corpus hands the sources to the pool in this order
    assert list(corpus) == ["arrays", "symbolic"]
    assert [i.name for i in corpus["arrays"]] == ["n.f"] and [i.name for i in corpus["symbolic"]] == ["s.g"]


def test_mining_never_returns_the_positive_or_a_near_copy_or_a_container():
    items = [
        item("torch", "m", "m.norm", "compute the vector norm", "norm of a vector computed over an axis " * 5),
        item("torch", "m", "m.norm_copy", "other synopsis one", "Norm of a vector   computed over an axis " * 5),  # near-copy
        item("torch", "m", "m", "module summary text", "index: compute the vector norm; vector axis norm", kind="module"),
        item("torch", "m", "m.dot", "dot product of vectors", "vector dot product over an axis " * 5),
        item("torch", "m", "m.sum", "sum of vector entries", "sum of the vector over an axis " * 5),
        item("arrays", "n", "n.norm", "norm in another source", "norm of a vector computed over an axis " * 5),
    ]
    negatives = mine_negatives(items, num_negatives=2, seed=0)
    assert all(len(n) == 2 for n in negatives[:5])
    assert not {0, 1, 2} & set(negatives[0])  # itself, its near-copy, the page that lists it
    for index, chosen in enumerate(negatives):
        assert index not in chosen and len(set(chosen)) == len(chosen)
        assert all(items[j].source == items[index].source for j in chosen)
    assert negatives[5] == []  # nothing admissible in its own source: no negative rather than a wrong one


def test_evaluation_table_on_a_tiny_model(lmk_model, tmp_path):
    from lmk_embed_tools.evaluation.table import evaluate_table, format_table, save_table

    split = corpora.RetrievalData(
        "toy", {"q1": "json parsing", "q2": "zip archives"},
        {"d1": "json parsing of documents " * 5, "d2": "zip archives and files " * 5, "d3": "unrelated " * 5},
        {"q1": {"d1": 1}, "q2": {"d2": 1}})
    rows = evaluate_table({"tiny": (lmk_model, [16, 64])}, [split], progress=False)
    assert [(r["model"], r["split"], r["max_length"]) for r in rows] == [("tiny", "toy", 16), ("tiny", "toy", 64)]
    assert all(0 <= r["ndcg_at_10"] <= 1 and 0 <= r["recall_at_1"] <= 1 for r in rows)
    table = format_table(rows)
    assert "tiny" in table and "toy" in table
    files = save_table(rows, tmp_path)
    assert json.loads(files["json"].read_text()) == rows and files["png"].stat().st_size > 1000


def test_evaluation_table_scores_a_real_model_sensibly(minilm_path):
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.evaluation.table import compare, evaluate_table

    model = SentenceTransformer(str(minilm_path), device="cpu")
    documents = {"json": "JSON encoder and decoder: parse and serialise JSON documents.",
                 "zip": "Read and write ZIP-format archive files.",
                 "csv": "CSV file reading and writing of comma-separated values.",
                 "time": "Time access and conversions: clocks, sleeping, formatting dates."}
    queries = {"q-json": "parse a json string", "q-zip": "open a zip archive", "q-csv": "read comma separated values"}
    right = corpora.RetrievalData("right", queries, documents, {"q-json": {"json": 1}, "q-zip": {"zip": 1}, "q-csv": {"csv": 1}})
    wrong = corpora.RetrievalData("wrong", queries, documents, {"q-json": {"time": 1}, "q-zip": {"csv": 1}, "q-csv": {"json": 1}})
    rows = evaluate_table({"minilm": (model, [128])}, [right, wrong], progress=False, per_query=True)
    assert rows[0]["ndcg_at_10"] == pytest.approx(1.0) and rows[0]["recall_at_1"] == pytest.approx(1.0)
    assert rows[1]["ndcg_at_10"] < 0.7 and rows[1]["recall_at_1"] == 0
    with pytest.raises(ValueError, match="different splits"):
        compare(rows[0], rows[1])
    for row in rows:  # mteb's score is the mean of the per-query scores kept beside it (mteb rounds to 5 places)
        for metric in ("ndcg_at_10", "recall_at_1"):
            values = row["per_query"][metric]
            assert set(values) == set(queries) and sum(values.values()) / len(values) == pytest.approx(row[metric], abs=1e-5)
    # The same queries scored by a model that ranks them the wrong way round: a paired comparison on one split.
    flipped = {**rows[1], "split": rows[0]["split"]}
    difference, low, high = compare(rows[0], flipped)
    assert difference == pytest.approx(rows[0]["ndcg_at_10"] - rows[1]["ndcg_at_10"], abs=1e-5) and 0 < low <= difference <= high
    with pytest.raises(ValueError, match="rival"):
        compare(rows[0], {k: v for k, v in flipped.items() if k != "per_query"})
    with pytest.raises(ValueError, match="metric"):
        compare(rows[0], flipped, metric="ndcg_at_1")


def test_shared_forward_gives_the_base_and_the_converted_cls_checkpoint_from_one_forward(minilm_path, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from lmk_embed_tools.evaluation.table import SharedForward, evaluate_table
    from lmk_embed_tools.training.convert import convert_to_lmk

    cls_checkpoint = AutoModel.from_pretrained(convert_to_lmk(minilm_path, tmp_path / "cls", pooling="cls"),
                                               trust_remote_code=True).eval()
    reference = SentenceTransformer(str(minilm_path), device="cpu")
    model = SentenceTransformer(str(minilm_path), device="cpu")
    forwards = []
    encode_document = model.encode_document
    model.encode_document = lambda *args, **kwargs: forwards.append(1) or encode_document(*args, **kwargs)
    shared = SharedForward(model)
    texts = helpers.stdlib_texts(5) + ["short", ""]
    for length in (64, 512):
        shared.view("model").max_seq_length = reference.max_seq_length = length
        cls, mean = shared.view("cls").encode_document(texts), shared.view("model").encode_document(texts)
        assert np.abs(mean - reference.encode_document(texts)).max() < 1e-6
        assert np.abs(cls - cls_checkpoint.encode_document(texts, max_length=length)).max() < 1e-6
        queries = ["parse a json string", "wrap text"]
        assert np.abs(shared.view("cls").encode_query(queries) - cls_checkpoint.encode_query(queries, max_length=length)).max() < 1e-6
    assert len(forwards) == 2  # one forward per max length, for both poolings
    with pytest.raises(ValueError, match="pooling"):
        shared.view("max")

    documents = {f"d{i}": text for i, text in enumerate(texts[:5])}
    split = corpora.RetrievalData("toy", {f"q{i}": " ".join(t.split()[:6]) for i, t in enumerate(texts[:5])}, documents,
                                   {f"q{i}": {f"d{i}": 1} for i in range(5)})
    rows = evaluate_table({"view": (shared.view("cls"), [64]), "checkpoint": (cls_checkpoint, [64])}, [split], progress=False)
    assert rows[0]["ndcg_at_10"] == rows[1]["ndcg_at_10"] and rows[0]["recall_at_1"] == rows[1]["recall_at_1"]


def test_paired_bootstrap_is_exact_for_a_shift_and_matches_the_normal_interval():
    rng = np.random.default_rng(1)
    base = rng.random(50)
    assert paired_bootstrap(base + 0.25, base) == pytest.approx((0.25, 0.25, 0.25))
    # Many queries: the percentile interval approaches mean +- 1.96 standard errors.
    a, b = rng.random(4000), rng.random(4000)
    difference, low, high = paired_bootstrap(a, b, resamples=4000)
    standard_error = np.std(a - b, ddof=1) / np.sqrt(a.size)
    assert difference == pytest.approx(np.mean(a - b))
    assert low == pytest.approx(difference - 1.96 * standard_error, abs=0.2 * standard_error)
    assert high == pytest.approx(difference + 1.96 * standard_error, abs=0.2 * standard_error)
    with pytest.raises(ValueError, match="scores_b"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1.0], [0.0], confidence=95)
    with pytest.raises(ValueError, match="resamples"):
        paired_bootstrap([1.0], [0.0], resamples=0)


def test_training_rows_carry_mined_negatives_and_sources():
    from lmk_embed_tools.training.recipe import docs_training_rows

    corpus = toy_corpus()
    rows = docs_training_rows(corpus, num_negatives=2, max_rows=20, seed=0)
    assert len(rows) == 20
    assert {r["source"] for r in rows} == set(corpora.TRAIN_SOURCES)  # drawn evenly: every source is there
    for row in rows:
        assert len(row["negatives"]) == 2 and row["positive"] not in row["negatives"]
        assert row["query"] not in row["positive"]


def test_teacher_scores_are_the_teachers_cosines(minilm_path):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.training.recipe import add_teacher_scores

    teacher = SentenceTransformer(str(minilm_path), device="cpu")
    rows = [{"query": "parse a json string", "positive": "JSON decoder: parse JSON documents.",
             "negatives": ["Read ZIP archives.", "Sleep for a while."]},
            {"query": "open a zip archive", "positive": "Read and write ZIP archives.",
             "negatives": ["Parse JSON.", "Format dates."]}]
    add_teacher_scores(rows, teacher, query_max_length=32, passage_max_length=64)
    for row in rows:
        q = teacher.encode(row["query"], normalize_embeddings=True)
        candidates = teacher.encode([row["positive"], *row["negatives"]], normalize_embeddings=True)
        np.testing.assert_allclose(row["teacher_scores"], candidates @ q, atol=1e-5)
        assert row["teacher_scores"][0] == max(row["teacher_scores"])


def test_classmethods_are_kept_whatever_the_memory_layout(tmp_path, monkeypatch):
    # Bound classmethods are made anew on every access; deduplicating them by a freed object's id
    # dropped some at random once their addresses were reused.
    names = [f"lmk_corpus_classmethods_{k}" for k in range(5)]
    for name in names:
        lines = [f'"""Module {name}, a class with many class methods."""', f"class Thing:", '    """A thing with class methods."""']
        for k in range(30):
            lines += ["    @classmethod", f"    def make_{k}(cls, value):",
                      f'        """Make variant number {k} of the {name} thing from a value."""',
                      f"        return cls()  # builds variant {k} of {name}; a body long enough for the page minimum"]
        (tmp_path / f"{name}.py").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    items = source_items("stdlib", modules=names)
    assert sum(i.kind == "method" for i in items) == 5 * 30


def test_pages_are_the_same_whatever_the_hash_seed_and_hold_no_machine_paths():
    # urllib3's Retry prints a frozenset default, whose order follows the process's string-hash seed.
    here = [i.text for i in corpora.rendered_source_items("tools", modules=["urllib3"])]
    script = ("import json; from lmk_embed_tools.training.corpora import rendered_source_items; "
              "print(json.dumps([i.text for i in rendered_source_items('tools', modules=['urllib3'])]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONHASHSEED": "1"}, cwd=helpers.REPO_ROOT)
    assert here and here == json.loads(done.stdout)
    assert any("frozenset({'" in text for text in here)
    sys_page = corpora.render_page(sys)
    assert "sys" in sys_page and sys.prefix not in sys_page and sys.base_prefix not in sys_page


def test_an_elided_set_of_objects_hashed_by_address_keeps_only_its_type(tmp_path, monkeypatch):
    (tmp_path / "lmk_corpus_elided_set.py").write_text(
        '"""A module whose data is a long set of objects that hash by address."""\n'
        "class Dtype:\n    def __init__(self, name):\n        self.name = name\n"
        "    def __repr__(self):\n        return self.name\n"
        "ALL_DTYPES = frozenset(Dtype(f'Int{k}') for k in range(40))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import lmk_corpus_elided_set

    page = corpora.render_page(lmk_corpus_elided_set)
    assert "ALL_DTYPES = frozenset({...})" in page and "Int1" not in page.split("ALL_DTYPES")[1]


def test_how_much_of_a_cut_value_shows_does_not_depend_on_the_install_folders_length(tmp_path, monkeypatch):
    # pydoc cuts a long value to 100 characters; the folder must be replaced before the cut, or a
    # clone in a folder with a longer name shows less of the value (a different page).
    from lmk_embed_tools.training import stdlib_corpus

    pages = []
    for folder in ("/opt/a", "/opt/a-much-longer-folder-name-for-the-same-installation"):
        name = f"lmk_corpus_paths_{len(pages)}"
        (tmp_path / f"{name}.py").write_text(
            f'"""A module whose data names files under its install folder."""\n'
            f"TEMPLATE = {folder + '/share/templates/' + 'card-' * 30 + 'end.md'!r}\n"
            f"FILES = [{folder + '/share/a.txt'!r}, {folder + '/share/b.txt'!r}]\n")
        monkeypatch.setattr(stdlib_corpus, "_machine_paths", lambda folder=folder: [folder])
        monkeypatch.syspath_prepend(str(tmp_path))
        page = stdlib_corpus.render_page(importlib.import_module(name))
        pages.append(page.replace(name, "MODULE").split("DATA")[1])
    assert pages[0] == pages[1]
    assert "TEMPLATE = '.../share/templates/card-card-" in pages[0] and "/opt/a" not in pages[0]
    assert "FILES = ['.../share/a.txt', '.../share/b.txt']" in pages[0]
