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
