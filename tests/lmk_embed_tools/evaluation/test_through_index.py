"""`evaluate --through-index`: a task's pages encoded by encode-corpus into a landmark index and ranked
by the search users run. On a corpus of more pages than a hybrid's two legs take (`FUSION_DEPTH` each,
set to 10 here so that 30 pages cut them; 50 would need over 100), the evaluation's rows rank each query as `lmk-embed search` does (dense,
lexical, hybrid min-max at two weights and rank fusion), and the reported metrics are mteb's on that
ranking; the in-memory rows stay beside them. The index records BM25's one tokenizer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from lmk_embed_tools import cli
from lmk_embed_tools.corpus import table as index_table
from lmk_embed_tools.corpus import search
from lmk_embed_tools.evaluation.metrics import score_run, top_k_run

pytest.importorskip("lancedb", reason="the `search` extra is not installed (pip install -e '.[search]')")

QUERIES = {"q0": "json encoder options", "q1": "wrapping text to a width", "q2": "ordered dictionary of counts",
           "q3": "push and pop on a heap queue", "q4": "read rows of a csv file", "q5": "named tuple fields"}


def stdlib_pages(count: int) -> list[str]:
    """`count` pages of about 500 characters: consecutive lines of a few stdlib modules' pydoc pages."""
    import collections
    import csv
    import heapq
    import json as json_module
    import pydoc
    import textwrap

    lines = [line for module in (json_module, textwrap, collections, heapq, csv)
             for line in pydoc.render_doc(module, renderer=pydoc.plaintext).splitlines() if line.strip()]
    pages, page = [], ""
    for line in lines:
        page = f"{page}\n{line}" if page else line
        if len(page) >= 500:
            pages.append(page)
            page = ""
    assert len(pages) >= count
    return pages[:count]


@pytest.fixture(scope="module", autouse=True)
def fusion_depth():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search, "FUSION_DEPTH", 10)
        yield search.FUSION_DEPTH


@pytest.fixture(scope="module")
def task(tmp_path_factory, fusion_depth):
    """A BEIR folder of more pages than both legs of a hybrid take together: candidates are cut."""
    pages = stdlib_pages(2 * fusion_depth + 10)
    folder = tmp_path_factory.mktemp("through-index") / "task"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(pages)))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in QUERIES.items()))
    relevant = {q: {f"d{(7 * n) % len(pages)}": 1, f"d{(11 * n + 3) % len(pages)}": 1} for n, q in enumerate(QUERIES)}
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, docs in relevant.items() for d in docs))
    return folder, pages, relevant


SEARCHES = {"dense": [], "lexical": ["--mode", "lexical"], "minmax w=0.5": ["--mode", "hybrid"],
            "minmax w=0.8": ["--mode", "hybrid", "--fuse-weight", "0.8"], "rank": ["--mode", "hybrid", "--fusion", "rank"]}


@pytest.fixture(scope="module")
def searched(task, minilm_lmk_checkpoint):
    """The pages indexed by `lmk-embed encode-corpus`, then `lmk-embed search --json` per mode: {search: {query id: ids}}."""
    import contextlib
    import io

    from lmk_embed_tools.evaluation.indexed import TaskIndex
    from lmk_embed_tools.evaluation.longcontext import load_model

    folder, pages, _ = task
    index = folder.parent / "index"
    length = TaskIndex(minilm_lmk_checkpoint, load_model(str(minilm_lmk_checkpoint))).effective_length(512)
    source = folder.parent / "pages.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(pages)))
    assert cli.main(["encode-corpus", str(minilm_lmk_checkpoint), str(source), str(index), "--output-value", "landmarks",
                     "--max-length", str(length), "--no-progress"]) == 0
    by_text, found = {text: q for q, text in QUERIES.items()}, {}
    for name, flags in SEARCHES.items():
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert cli.main(["search", str(index), *QUERIES.values(), "--json", "--top-k", "10", *flags]) == 0
        found[name] = {q: [] for q in QUERIES}
        for line in map(json.loads, printed.getvalue().splitlines()):
            found[name][by_text[line["query"]]].append(line["id"])
    return index, found


def ranked(scores: np.ndarray, doc_ids: list[str]) -> dict[str, list[str]]:
    """Each query's run, best first, as mteb's scorer reads it."""
    run = top_k_run(scores, list(QUERIES), doc_ids)
    return {q: [d for d, _ in sorted(docs.items(), key=lambda item: -item[1])] for q, docs in run.items()}


def test_the_evaluations_rows_rank_as_search_ranks(task, searched, minilm_lmk_checkpoint):
    from lmk_embed_tools.evaluation.indexed import indexed_retrievers
    from lmk_embed_tools.evaluation.longcontext import load_model
    from lmk_embed_tools.evaluation.cache import EmbeddingCache
    from lmk_embed_tools.evaluation.retrievers import BM25Retriever, FusedRetriever, MultiVectorRetriever

    _, pages, _ = task
    _, found = searched
    documents = {f"d{i}": text for i, text in enumerate(pages)}
    model = load_model(str(minilm_lmk_checkpoint))
    rows = indexed_retrievers({"lmk": model}, {"lmk": str(minilm_lmk_checkpoint)}, fuse=("minmax", "rank"),
                              fuse_weights=(0.5, 0.8))
    names = {"lmk max-sim [index]": "dense", "BM25 [index]": "lexical",
             "lmk max-sim + BM25 [index] (minmax w=0.5)": "minmax w=0.5",
             "lmk max-sim + BM25 [index] (minmax w=0.8)": "minmax w=0.8", "lmk max-sim + BM25 [index] (rank)": "rank"}
    assert [row.name for row in rows] == list(names)
    queries = list(QUERIES.values())
    for row in rows:
        assert ranked(row.scores(queries, documents, 512), list(documents)) == found[names[row.name]], row.name
    assert sum(map(bool, found["lexical"].values())) >= 3 and all(len(ids) == 10 for ids in found["minmax w=0.5"].values())
    # The in-memory fused row (bm25s and min-max over every page), kept one release, ranks otherwise.
    in_memory = FusedRetriever(MultiVectorRetriever(model, "lmk multi-vector max"), BM25Retriever(), "minmax", 0.5)
    assert ranked(in_memory.scores(queries, documents, 512, EmbeddingCache(None)), list(documents)) != found["minmax w=0.5"]


def test_evaluate_reports_mtebs_scores_of_searchs_ranking(task, searched, minilm_lmk_checkpoint, tmp_path):
    from lmk_embed_tools.evaluation_jobs import evaluate_arguments, evaluation_rows

    folder, _, relevant = task
    _, found = searched
    args = evaluate_arguments([str(minilm_lmk_checkpoint), "--names", "lmk", "--task", str(folder), "--max-lengths", "512",
                               "--multi-vector", "--through-index", "--fuse", "minmax", "--out",
                               str(tmp_path / "out")])
    rows, _, _ = evaluation_rows(args)
    by_name = {row["model"]: row for row in rows}
    for name, search in (("lmk max-sim + BM25 [index] (minmax w=0.5)", "minmax w=0.5"), ("BM25 [index]", "lexical"),
                         ("lmk max-sim [index]", "dense")):
        run = {q: {doc: float(10 - rank) for rank, doc in enumerate(ids)} for q, ids in found[search].items()}
        expected = score_run(run, relevant)
        for metric in ("ndcg_at_10", "recall_at_10", "mrr_at_10"):
            assert by_name[name][metric] == pytest.approx(expected[metric], abs=1e-9), (name, metric)
    # The in-memory rows stay beside; exact max-sim ranks the same top 10 in memory and in the index.
    assert {"lmk multi-vector max + BM25 (minmax w=0.5)", "BM25"} <= set(by_name)
    for metric in ("ndcg_at_10", "recall_at_10"):
        assert by_name["lmk max-sim [index]"][metric] == pytest.approx(by_name["lmk multi-vector max"][metric], abs=1e-9)


def test_through_index_needs_a_checkpoint_with_landmarks(task, minilm_path, capsys):
    folder, _, _ = task
    assert cli.main(["evaluate", str(minilm_path), "--task", str(folder), "--max-lengths", "128", "--through-index",
                     "--no-cache", "--out", str(folder.parent / "refused")]) == 2
    assert "--through-index encodes a landmark index" in capsys.readouterr().err


def test_the_index_records_bm25s_one_tokenizer(searched, task):
    from lmk_embed_tools.corpus.search import LandmarkIndex

    index_folder, _ = searched
    _, pages, _ = task
    index = LandmarkIndex.from_corpus(index_folder)
    assert index.record["lexical"] == index_table.LEXICAL_TOKENIZER and index_table.LEXICAL_TOKENIZER["stem"]
    # Stemmed: "decoding" finds the pages that say "decode" or "decoded" (and never "decoding") too.
    hits = index.search(np.ones((1, index.dimension), np.float32), top_k=len(pages), mode="lexical", texts=["decoding"])[0]
    others = {row for row, page in enumerate(pages) if re.search(r"\bdecoded?\b", page.lower())
              and "decoding" not in page.lower()}
    assert others and others <= {hit.row for hit in hits}


def test_a_run_leaves_out_what_the_search_did_not_return():
    scores = np.array([[3.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]], dtype=np.float32)
    assert top_k_run(scores, ["a", "b"], ["x", "y", "z"]) == {"a": {"x": 3.0, "z": 1.0}, "b": {}}
    # A query with nothing returned scores 0, and counts in the mean.
    assert score_run({"a": {"x": 1.0}, "b": {}}, {"a": {"x": 1}, "b": {"y": 1}})["ndcg_at_10"] == pytest.approx(0.5)
