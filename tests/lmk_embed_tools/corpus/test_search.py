"""The landmark index: encode-corpus --output-value landmarks into LanceDB tables, searched there.
Max-sim from the index equals a direct scan, hybrid equals the evaluation's fusion, spans cut the
original text, resumed corpora give the same index, the earlier shard format converts, and bad
input or a damaged index gets one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from lmk_embed_tools import cli
from lmk_embed_tools.corpus import encode_corpus
from lmk_embed_tools.corpus import table as index_table
from lmk_embed_tools.corpus.search import LandmarkIndex, SearchError, search_corpus
from lmk_embed_tools.evaluation.retrievers import fuse_scores, late_interaction_scores
from tests import helpers

pytest.importorskip("lancedb", reason="the `search` extra is not installed (pip install -e '.[search]')")


@pytest.fixture(scope="module")
def pages():
    texts = helpers.stdlib_texts(40)
    return [" ".join(texts[i::9])[: 900 + 300 * (i % 4)] for i in range(9)] + [""]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, lmk_checkpoint, pages):
    root = tmp_path_factory.mktemp("landmark-corpus")
    source = root / "pages.jsonl"
    source.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(pages)))
    out = root / "index"
    encode_corpus(str(lmk_checkpoint), str(source), out, output_value="landmarks", shard_size=4, batch_size=3,
                  show_progress_bar=False)
    return out


@pytest.fixture(scope="module")
def damaged(tmp_path_factory, lmk_checkpoint):
    from tests.lmk_embed_tools.corpus.indexes import write_indexes

    return write_indexes(tmp_path_factory.mktemp("damaged"), lmk_checkpoint).parent


QUERIES = ["json encoder options", "the csv module", "zip archives"]


def test_index_max_sim_equals_a_direct_scan_and_the_ranking(corpus, lmk_model, pages):
    index = LandmarkIndex.from_corpus(corpus)
    landmarks = lmk_model.encode(pages, output_value="landmarks")
    assert index.rows == len(pages) and index.record["landmarks"] == sum(len(item["spans"]) for item in landmarks)
    assert index.vector_index is None  # a small index is scanned exactly
    queries = lmk_model.encode_query(QUERIES)
    expected = late_interaction_scores(queries, [item["embeddings"] for item in landmarks], "max")
    np.testing.assert_allclose(index.max_sim(queries), expected, atol=1e-5)
    for query, row in zip(index.search(queries, top_k=4), expected):
        # The top 4 by max-sim, best first (a random tiny model puts some within float noise of each other).
        np.testing.assert_allclose([hit.score for hit in query], np.sort(row)[::-1][:4], atol=1e-5)
        np.testing.assert_allclose([hit.score for hit in query], row[[hit.row for hit in query]], atol=1e-5)
        assert all(hit.span == tuple(landmarks[hit.row]["spans"][hit.landmark]) for hit in query)
        assert all(hit.id == f"p{hit.row}" for hit in query)
    everything = index.search(queries[:1], top_k=100)[0]  # more than the corpus holds: every document once
    assert sorted(hit.row for hit in everything) == list(range(len(pages)))


def test_fused_scores_mix_max_sim_and_the_document_vector(corpus, lmk_model, pages):
    index = LandmarkIndex.from_corpus(corpus)
    query = lmk_model.encode_query(["json encoder options"])
    expected = 0.7 * index.max_sim(query)[0] + 0.3 * (lmk_model.encode(pages) @ query[0])
    hits = index.search(query, top_k=3, fuse=0.3)[0]
    np.testing.assert_allclose([hit.score for hit in hits], np.sort(expected)[::-1][:3], atol=1e-5)


@pytest.fixture(scope="module")
def minilm_corpus(tmp_path_factory, minilm_lmk_checkpoint, pages):
    """The pages indexed by the real MiniLM (the tiny random model's max-sims are all 1 within float
    noise, which min-max scaling would magnify)."""
    from lmk_embed_tools.corpus.worker import load_model

    root = tmp_path_factory.mktemp("minilm-corpus")
    (root / "pages.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(pages)))
    encode_corpus(str(minilm_lmk_checkpoint), str(root / "pages.jsonl"), root / "index", output_value="landmarks",
                  show_progress_bar=False)
    return LandmarkIndex.from_corpus(root / "index"), load_model({"source": str(minilm_lmk_checkpoint)})


@pytest.mark.parametrize("fusion, weight", [("minmax", None), ("minmax", 0.8), ("rank", None)])
def test_hybrid_equals_the_evaluations_fusion(minilm_corpus, fusion, weight):
    """One hybrid query ranks as `evaluation.retrievers.fuse_scores` ranks the index's own max-sim
    and BM25 scores (every document a candidate here); the weight is the index's unless given."""
    index, model = minilm_corpus
    assert index.hybrid_weight == 0.5
    queries = model.encode_query(QUERIES)
    dense = index.max_sim(queries)
    lexical = index.search(queries, top_k=100, mode="lexical", texts=QUERIES)
    sparse = np.zeros_like(dense)
    assert sum(map(bool, lexical)) >= 2
    for number, hits in enumerate(lexical):
        assert all(hit.score > 0 for hit in hits)
        sparse[number, [hit.row for hit in hits]] = [hit.score for hit in hits]
    expected = fuse_scores(dense, sparse, fusion, 0.5 if weight is None else weight)
    results = index.search(queries, top_k=5, mode="hybrid", texts=QUERIES, fusion=fusion, fuse_weight=weight)
    for row, hits in zip(expected, results):
        np.testing.assert_allclose([hit.score for hit in hits], row[[hit.row for hit in hits]], atol=1e-5)
        np.testing.assert_allclose([hit.score for hit in hits], np.sort(row)[::-1][:5], atol=1e-5)


def test_a_vector_index_gives_the_flat_answers_on_a_small_index(minilm_corpus, tmp_path):
    """Above FLAT_LIMIT the landmarks get an IVF index; every returned document is scored again from
    its own landmarks, so with every partition probed the answers are the flat scan's."""
    flat, model = minilm_corpus
    copy = shutil.copytree(flat.folder, tmp_path / "indexed")
    record = index_table.finish(copy, index_table.read_record(copy), flat_limit=1)
    assert record["vector_index"]["type"] == index_table.VECTOR_INDEX
    indexed = LandmarkIndex.from_corpus(copy)
    queries = model.encode_query(QUERIES)
    for mode in ("dense", "hybrid"):
        expected = flat.search(queries, top_k=5, mode=mode, texts=QUERIES)
        got = indexed.search(queries, top_k=5, mode=mode, texts=QUERIES)
        assert [[(h.row, h.landmark) for h in q] for q in got] == [[(h.row, h.landmark) for h in q] for q in expected]
        np.testing.assert_allclose([h.score for q in got for h in q], [h.score for q in expected for h in q], atol=1e-6)


def test_lexical_search_is_bm25_over_the_stored_text(corpus, pages):
    import re

    hits = search_corpus(corpus, ["json"], top_k=10, mode="lexical")[0]
    assert hits and {hit.row for hit in hits} == {i for i, page in enumerate(pages)
                                                  if re.search(r"(?<![a-z0-9])json(?![a-z0-9])", page.lower())}
    assert [hit.score for hit in hits] == sorted((hit.score for hit in hits), reverse=True)


def test_passages_are_the_spans_of_the_original_text(corpus, lmk_model, pages):
    for mode in ("dense", "lexical", "hybrid"):
        results = search_corpus(corpus, ["json encoder options"], top_k=5, model=lmk_model, mode=mode)
        assert results[0]
        for hit in results[0]:
            assert hit.text == pages[hit.row][hit.span[0]:hit.span[1]] and hit.text.strip()


def test_a_resumed_corpus_gives_the_same_index(corpus, tmp_path, lmk_checkpoint, lmk_model):
    """A lost shard is redone; a shard written twice (a worker retried after its commit) is redone once."""
    copy = shutil.copytree(corpus, tmp_path / "copy")
    documents = index_table.connect(copy).open_table("documents")
    documents.delete("shard = 1")
    documents.add(documents.search().where("shard = 2").limit(None).to_arrow())
    source = index_table.read_record(corpus)["input"]["paths"][0]
    summary = encode_corpus(str(lmk_checkpoint), source, copy, output_value="landmarks", shard_size=4, batch_size=3,
                            show_progress_bar=False)
    assert summary["shards_skipped"] == 1 and summary["shards_written"] == 2 and summary["rows"] == 10
    rows = index_table.connect(copy).open_table("documents").search().select(["row"]).limit(None).to_arrow()
    assert sorted(rows["row"].to_pylist()) == list(range(10))
    queries = lmk_model.encode_query(QUERIES)
    first, again = LandmarkIndex.from_corpus(corpus), LandmarkIndex.from_corpus(copy)
    np.testing.assert_allclose(again.max_sim(queries), first.max_sim(queries), atol=1e-6)
    assert [h.id for h in again.search(queries, top_k=10)[0]] == [h.id for h in first.search(queries, top_k=10)[0]]


def test_search_command_prints_ranked_passages(corpus, capsys):
    for mode in ("dense", "hybrid"):
        assert cli.main(["search", str(corpus), "json encoder options", "--top-k", "2", "--json", "--mode", mode,
                         "--fusion", "rank"]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [line["rank"] for line in lines] == [1, 2] and all(line["text"] for line in lines)


def test_bad_input_gets_one_line(corpus, tmp_path, lmk_checkpoint, capsys):
    plain = tmp_path / "plain"
    source = index_table.read_record(corpus)["input"]["paths"][0]
    encode_corpus(str(lmk_checkpoint), source, plain, show_progress_bar=False)
    capsys.readouterr()
    for argv, message in (([str(plain), "q"], "holds document vectors only"),
                          ([str(tmp_path / "nowhere"), "q"], "is not a folder written by encode-corpus"),
                          ([str(tmp_path), "q"], "holds no landmark index"),
                          ([str(corpus), "q", "--fuse", "2"], "--fuse must be between 0 and 1"),
                          ([str(corpus), "q", "--fuse-weight", "-1"], "--fuse-weight must be between 0 and 1")):
        assert cli.main(["search", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as exited:
        cli.main(["search", str(corpus), "q", "--top-k", "0"])
    assert exited.value.code == 2
    index = LandmarkIndex.from_corpus(corpus)
    with pytest.raises(SearchError, match="`top_k` must be a positive integer"):
        index.search(np.zeros((1, 32), dtype=np.float32), top_k=0)
    with pytest.raises(SearchError, match="`fusion` must be one of"):
        index.search(np.ones((1, 32), dtype=np.float32), mode="hybrid", texts=["q"], fusion="sum")
    with pytest.raises(SearchError, match="`texts` must give the 1 query texts"):
        index.search(np.ones((1, 32), dtype=np.float32), mode="lexical")


def test_passages_come_from_the_index_wherever_it_is_searched(tmp_path, lmk_checkpoint, lmk_model, monkeypatch):
    """The index is a record: INPUT given as a relative path, searched from another folder that has a
    file of the same name, then INPUT edited; the passages are still cut from the encoded text."""
    texts = ["json encoder options and decoders for python objects", "the csv module reads and writes rows"]
    (tmp_path / "made").mkdir()
    (tmp_path / "made" / "pages.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                                          for i, t in enumerate(texts)))
    monkeypatch.chdir(tmp_path / "made")
    encode_corpus(str(lmk_checkpoint), "pages.jsonl", tmp_path / "index", output_value="landmarks", shard_size=1,
                  show_progress_bar=False)
    (tmp_path / "elsewhere").mkdir()
    elsewhere = "".join(json.dumps({"id": i, "text": t.upper()[::-1]}) + "\n" for i, t in enumerate(texts))
    (tmp_path / "elsewhere" / "pages.jsonl").write_text(elsewhere)
    (tmp_path / "made" / "pages.jsonl").write_text(elsewhere)  # INPUT edited after indexing
    monkeypatch.chdir(tmp_path / "elsewhere")
    hits = search_corpus(tmp_path / "index", ["json encoder"], top_k=2, model=lmk_model)[0]
    assert len(hits) == 2 and all(hit.text == texts[hit.row][hit.span[0]:hit.span[1]] and hit.text for hit in hits)
    assert {hit.id for hit in hits} == {0, 1}  # integer ids stay integers
    record = index_table.read_record(tmp_path / "index")
    assert record["input"]["paths"] == [str(tmp_path / "made" / "pages.jsonl")]  # where it came from, absolute


def test_an_empty_corpus_searches_to_no_hits(tmp_path, lmk_checkpoint, lmk_model, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    encode_corpus(str(lmk_checkpoint), str(tmp_path / "empty.jsonl"), tmp_path / "index", output_value="landmarks",
                  show_progress_bar=False)
    index = LandmarkIndex.from_corpus(tmp_path / "index")
    assert index.rows == 0 and index.search(lmk_model.encode_query(["q"]), top_k=3) == [[]]
    assert index.max_sim(lmk_model.encode_query(["q"])).shape == (1, 0)
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "index"), "json", "--mode", "hybrid"]) == 0
    assert capsys.readouterr().out.strip() == "query: json"


# Every damaged copy of `write_indexes` is refused in one line: tests/lmk_embed_tools/test_cli_error_table.py.


def test_the_shard_format_converts_to_the_same_index(damaged, tmp_path, lmk_checkpoint, lmk_model, capsys):
    old, new = damaged / "index-shards", tmp_path / "converted"
    assert cli.main(["index", "convert", str(old), str(new)]) == 0
    assert "4 documents" in capsys.readouterr().out
    queries = lmk_model.encode_query(["csv rows", "zip archives"])
    original, converted = LandmarkIndex.from_corpus(damaged / "index"), LandmarkIndex.from_corpus(new)
    for mode in ("dense", "hybrid"):
        expected = original.search(queries, top_k=4, mode=mode, texts=["csv rows", "zip archives"])
        got = converted.search(queries, top_k=4, mode=mode, texts=["csv rows", "zip archives"])
        assert [[(h.id, h.span) for h in q] for q in got] == [[(h.id, h.span) for h in q] for q in expected]
    (old / "part-00001.parquet").write_bytes((old / "part-00001.parquet").read_bytes()[:100])  # damaged: refused
    assert cli.main(["index", "convert", str(old), str(tmp_path / "again")]) == 2
    assert "part-00001.parquet: its bytes do not match the sha256" in capsys.readouterr().err
    with pytest.raises(Exception, match="lmk-embed index convert"):  # encode-corpus into it names the command too
        encode_corpus(str(lmk_checkpoint), str(damaged / "index-input.jsonl"), old, output_value="landmarks",
                      shard_size=1, show_progress_bar=False)


def test_the_query_model_must_be_the_one_that_encoded_the_index(corpus, tmp_path, lmk_checkpoint, lmk_model):
    from tests.lmk_embed_tools.corpus.indexes import other_checkpoint

    other = other_checkpoint(lmk_checkpoint, tmp_path / "other")
    recorded = index_table.read_record(corpus)["model"]["sha256"]
    with pytest.raises(SearchError, match="is not the model that encoded INDEX") as refused:
        search_corpus(corpus, ["json"], model=str(other))
    assert recorded in str(refused.value) and str(other) in str(refused.value)
    copy = shutil.copytree(lmk_checkpoint, tmp_path / "copy")  # the same files elsewhere: the same model
    assert search_corpus(corpus, ["json"], top_k=1, model=str(copy))[0][0].text
    with pytest.raises(SearchError, match=r"query vectors of shape \[1, 64\] for an index of width 32"):
        LandmarkIndex.from_corpus(corpus).search(np.zeros((1, 64), dtype=np.float32))


def test_pickled_weights_are_part_of_the_model_identity(tmp_path, lmk_checkpoint):
    import torch
    from safetensors.torch import load_file

    from lmk_embed_tools.corpus.encode import describe_model

    digests = []
    for shift in (0.0, 0.01):
        copy = shutil.copytree(lmk_checkpoint, tmp_path / f"pickled-{shift}", ignore=shutil.ignore_patterns("*.safetensors"))
        weights = load_file(next(lmk_checkpoint.glob("*.safetensors")))
        torch.save({k: v + shift if v.is_floating_point() else v for k, v in weights.items()}, copy / "pytorch_model.bin")
        digests.append(describe_model(str(copy))[0]["sha256"])
    assert digests[0] != digests[1]


def test_empty_and_blank_queries_are_refused(corpus, lmk_model):
    for queries, message in (([""], "query 1 is empty or blank"), (["json", " \n"], "query 2 is empty or blank"),
                             ("json", "`queries` must be a non-empty list of strings"), ([3], "query 1 must be a string, got int")):
        with pytest.raises(SearchError, match=message):
            search_corpus(corpus, queries, model=lmk_model)


def test_a_late_chunk_index_holds_and_ranks_the_late_chunks(tmp_path, lmk_checkpoint, lmk_model, pages, capsys):
    """`--output-value late_chunks`: the same index, whose vectors are `encode(output_value="late_chunks")`
    (any checkpoint, no training), searched by max-sim, with the chunks' spans as passages."""
    source = tmp_path / "pages.jsonl"
    source.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(pages)))
    assert cli.main(["encode-corpus", str(lmk_checkpoint), str(source), str(tmp_path / "index"),
                     "--output-value", "late_chunks", "--shard-size", "4", "--no-progress"]) == 0
    index = LandmarkIndex.from_corpus(tmp_path / "index")
    chunks = lmk_model.encode(pages, output_value="late_chunks")
    assert index.record["settings"]["output_value"] == "late_chunks"
    assert index.record["landmarks"] == sum(len(item["spans"]) for item in chunks)
    queries = lmk_model.encode_query(QUERIES)
    expected = late_interaction_scores(queries, [item["embeddings"] for item in chunks], "max")
    np.testing.assert_allclose(index.max_sim(queries), expected, atol=1e-5)
    for query in index.search(queries, top_k=3):
        assert all(hit.span == tuple(chunks[hit.row]["spans"][hit.landmark]) for hit in query)
    landmarks = lmk_model.encode(pages, output_value="landmarks")
    assert not np.allclose(landmarks[0]["embeddings"], chunks[0]["embeddings"], atol=1e-3)  # another unit
