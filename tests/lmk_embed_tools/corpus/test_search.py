"""The landmark index: encode-corpus --output-value landmarks, searched with FAISS. Max-sim from the
index equals a direct scan, spans cut the original text, resumed corpora give the same index, and
bad input gets one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lmk_embed_tools import cli
from lmk_embed_tools.corpus import encode_corpus
from lmk_embed_tools.corpus.search import LandmarkIndex, SearchError, search_corpus
from lmk_embed_tools.evaluation.retrievers import late_interaction_scores
from tests import helpers


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


def test_index_max_sim_equals_a_direct_scan_and_the_ranking(corpus, lmk_model, pages):
    index = LandmarkIndex.from_corpus(corpus)
    landmarks = lmk_model.encode(pages, output_value="landmarks")
    assert index.ids == [f"p{i}" for i in range(len(pages))]
    assert len(index.vectors) == sum(len(item["spans"]) for item in landmarks)
    queries = lmk_model.encode_query(["json encoder options", "the csv module", "zip archives"])
    expected = late_interaction_scores(queries, [item["embeddings"] for item in landmarks], "max")
    np.testing.assert_allclose(index.max_sim(queries), expected, atol=1e-5)
    for query, row in zip(index.search(queries, top_k=4), expected):
        # The top 4 by max-sim, best first (a random tiny model puts some within float noise of each other).
        np.testing.assert_allclose([hit.score for hit in query], np.sort(row)[::-1][:4], atol=1e-5)
        np.testing.assert_allclose([hit.score for hit in query], row[[hit.row for hit in query]], atol=1e-5)
        assert all(hit.span == tuple(landmarks[hit.row]["spans"][hit.landmark]) for hit in query)
    everything = index.search(queries[:1], top_k=100)[0]  # more than the corpus holds: every document once
    assert sorted(hit.row for hit in everything) == list(range(len(pages)))


def test_fused_scores_mix_max_sim_and_the_document_vector(corpus, lmk_model):
    index = LandmarkIndex.from_corpus(corpus)
    query = lmk_model.encode_query(["json encoder options"])
    expected = 0.7 * index.max_sim(query)[0] + 0.3 * (index.document_vectors @ query[0])
    hits = index.search(query, top_k=3, fuse=0.3)[0]
    np.testing.assert_allclose([hit.score for hit in hits], np.sort(expected)[::-1][:3], atol=1e-5)


def test_passages_are_the_spans_of_the_original_text(corpus, lmk_model, pages):
    results = search_corpus(corpus, ["json encoder options"], top_k=5, model=lmk_model)
    for hit in results[0]:
        assert hit.text == pages[hit.row][hit.span[0]:hit.span[1]] and hit.text.strip()


def test_a_resumed_corpus_gives_the_same_index(corpus, tmp_path, lmk_checkpoint):
    import shutil

    copy = shutil.copytree(corpus, tmp_path / "copy")
    (copy / "part-00001.parquet").unlink()
    source = json.loads((corpus / "manifest.json").read_text())["input"]["paths"][0]
    summary = encode_corpus(str(lmk_checkpoint), source, copy, output_value="landmarks", shard_size=4, batch_size=3,
                            show_progress_bar=False)
    assert summary["shards_skipped"] == 2 and summary["shards_written"] == 1
    first, again = LandmarkIndex.from_corpus(corpus), LandmarkIndex.from_corpus(copy)
    np.testing.assert_allclose(again.vectors, first.vectors, atol=1e-6)
    assert again.ids == first.ids and (again.spans == first.spans).all()


def test_search_command_prints_ranked_passages(corpus, capsys):
    assert cli.main(["search", str(corpus), "json encoder options", "--top-k", "2", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["rank"] for line in lines] == [1, 2] and all(line["text"] for line in lines)


def test_bad_input_gets_one_line(corpus, tmp_path, lmk_checkpoint, capsys):
    plain = tmp_path / "plain"
    source = json.loads((corpus / "manifest.json").read_text())["input"]["paths"][0]
    encode_corpus(str(lmk_checkpoint), source, plain, show_progress_bar=False)
    capsys.readouterr()
    for argv, message in (([str(plain), "q"], "holds document vectors only"),
                          ([str(tmp_path / "nowhere"), "q"], "is not a folder written by encode-corpus"),
                          ([str(corpus), "q", "--fuse", "2"], "--fuse must be between 0 and 1")):
        assert cli.main(["search", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as exited:
        cli.main(["search", str(corpus), "q", "--top-k", "0"])
    assert exited.value.code == 2
    with pytest.raises(SearchError, match="`top_k` must be a positive integer"):
        LandmarkIndex.from_corpus(corpus).search(np.zeros((1, 32), dtype=np.float32), top_k=0)


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
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["input"]["paths"] == [str(tmp_path / "made" / "pages.jsonl")]  # where it came from, absolute


def test_an_empty_corpus_searches_to_no_hits(tmp_path, lmk_checkpoint, lmk_model, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    encode_corpus(str(lmk_checkpoint), str(tmp_path / "empty.jsonl"), tmp_path / "index", output_value="landmarks",
                  show_progress_bar=False)
    index = LandmarkIndex.from_corpus(tmp_path / "index")
    assert index.ids == [] and index.search(lmk_model.encode_query(["q"]), top_k=3) == [[]]
    assert index.max_sim(lmk_model.encode_query(["q"])).shape == (1, 0)
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "index"), "json"]) == 0
    assert capsys.readouterr().out.strip() == "query: json"


def test_a_damaged_index_raises_a_search_error_naming_the_shard(corpus, tmp_path):
    import shutil

    copy = shutil.copytree(corpus, tmp_path / "swapped")
    first, second = copy / "part-00000.parquet", copy / "part-00001.parquet"
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)
    with pytest.raises(SearchError, match="part-00000.parquet: its bytes do not match the sha256 in manifest.json"):
        LandmarkIndex.from_corpus(copy)


def test_shards_without_their_text_are_refused(corpus, tmp_path):
    """A shard written before the index stored its text (no `text` column) cannot show passages."""
    import shutil

    import pyarrow.parquet as pq

    from lmk_embed_tools.corpus.shards import file_sha256

    copy = shutil.copytree(corpus, tmp_path / "older")
    pq.write_table(pq.read_table(copy / "part-00001.parquet").drop_columns(["text"]), copy / "part-00001.parquet")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][1]["sha256"] = file_sha256(copy / "part-00001.parquet")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SearchError, match=r"part-00001.parquet: no \['text'\] column"):
        LandmarkIndex.from_corpus(copy)


def test_the_query_model_must_be_the_one_that_encoded_the_index(corpus, tmp_path, lmk_checkpoint, lmk_model):
    import shutil

    from tests.lmk_embed_tools.corpus.indexes import other_checkpoint

    other = other_checkpoint(lmk_checkpoint, tmp_path / "other")
    recorded = json.loads((corpus / "manifest.json").read_text())["model"]["sha256"]
    with pytest.raises(SearchError, match="is not the model that encoded INDEX") as refused:
        search_corpus(corpus, ["json"], model=str(other))
    assert recorded in str(refused.value) and str(other) in str(refused.value)
    copy = shutil.copytree(lmk_checkpoint, tmp_path / "copy")  # the same files elsewhere: the same model
    assert search_corpus(corpus, ["json"], top_k=1, model=str(copy))[0][0].text
    with pytest.raises(SearchError, match=r"query vectors of shape \[1, 64\] for an index of width 32"):
        LandmarkIndex.from_corpus(corpus).search(np.zeros((1, 64), dtype=np.float32))


def test_pickled_weights_are_part_of_the_model_identity(tmp_path, lmk_checkpoint):
    import shutil

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
