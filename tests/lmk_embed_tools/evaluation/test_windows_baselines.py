"""The user's own long-document baselines: windows-mean (PCW) and windows-max, over any model."""

import json

import numpy as np
import pytest

from lmk_embed_tools.evaluation.cache import EmbeddingCache
from lmk_embed_tools.evaluation.retrievers import WindowsRetriever, window_content
from lmk_embed_tools.window_vectors import check_first_window_weight, first_weighted_means, window_texts
from tests import helpers


@pytest.fixture(scope="module")
def base(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def unit(vectors):
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def test_windows_mean_of_a_one_window_text_is_the_plain_vector(base):
    documents = {"a": helpers.SAMPLE_TEXT, "b": "The csv module reads and writes tabular data."}
    queries = ["how do I parse json?", "read a csv file"]
    base.max_seq_length = 256
    plain = unit(base.encode(queries)) @ unit(base.encode(list(documents.values()))).T
    for mode in ("mean", "max"):
        scores = WindowsRetriever(base, "w", mode=mode, progress=False).scores(queries, documents, 4096, EmbeddingCache(None))
        np.testing.assert_allclose(scores, plain, atol=1e-5)


def test_windows_cover_the_budget_and_are_scored_as_the_mean_or_the_best(base):
    text = " ".join(helpers.stdlib_texts(8))
    tokens = len(base.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert tokens > 1000
    assert window_content(base, 130) == 128
    pieces = window_texts(base.tokenizer, text, 128, 1000)
    assert len(pieces) == 8  # ceil(1000 / 128)
    assert all(len(base.tokenizer(p, add_special_tokens=False)["input_ids"]) <= 132 for p in pieces)
    assert text.startswith(pieces[0]) and pieces[1] in text
    documents, queries = {"long": text, "short": "Zip archives."}, ["the json module", "zip files"]
    retriever = WindowsRetriever(base, "w", mode="max", window=130, progress=False)
    scores = retriever.scores(queries, documents, 1000, EmbeddingCache(None))
    base.max_seq_length = 130
    windows = unit(base.encode(pieces))
    query = unit(base.encode(queries))
    np.testing.assert_allclose(scores[:, 0], (query @ windows.T).max(1), atol=1e-5)
    assert retriever.vectors_per_document == 4.5
    mean = WindowsRetriever(base, "w", mode="mean", window=130, progress=False).scores(queries, documents, 1000,
                                                                                       EmbeddingCache(None))
    np.testing.assert_allclose(mean[:, 0], query @ unit(windows.mean(0)), atol=1e-5)
    weighted = WindowsRetriever(base, "w", mode="mean", window=130, first_window_weight=0.75, progress=False)
    scores = weighted.scores(queries, documents, 1000, EmbeddingCache(None))
    np.testing.assert_allclose(scores[:, 0], query @ unit(0.75 * windows[0] + 0.25 * unit(windows.mean(0))), atol=1e-5)


def test_first_weighted_means_mix_the_first_window_and_the_mean():
    windows = [unit(np.array([[1.0, 0.0], [0.0, 1.0]])), unit(np.array([[3.0, 4.0]]))]
    np.testing.assert_allclose(first_weighted_means(windows, 0.0), [unit(np.array([1.0, 1.0])), [0.6, 0.8]])
    np.testing.assert_allclose(first_weighted_means(windows, 1.0), [[1.0, 0.0], [0.6, 0.8]])
    assert check_first_window_weight(np.float32(0.5)) == 0.5
    with pytest.raises(ValueError, match="at least one window"):
        first_weighted_means([np.zeros((0, 2))], 0.5)


@pytest.mark.parametrize("mode, weight", [("mean", 1.5), ("mean", -0.5), ("mean", "0.5"), ("max", 0.5)])
def test_a_bad_first_window_weight_is_named(base, mode, weight):
    with pytest.raises(ValueError, match="first_window_weight"):
        WindowsRetriever(base, "w", mode=mode, first_window_weight=weight, progress=False)


def test_our_lmk_windows_hold_their_landmarks_without_truncation(minilm_lmk_checkpoint):
    from lmk_embed import LMKModel

    model = LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()
    content = window_content(model, 512)  # g=32: [CLS] + c + ceil(c / 32) landmarks <= 512
    assert content == 495
    pieces = window_texts(model.tokenizer, " ".join(helpers.stdlib_texts(8)), content, 2048)
    unbounded = model.resolve(long_input="windows").layout  # no budget: nothing cut
    lengths = model.tokenizer.layout(pieces, unbounded).attention_mask.sum(1)
    assert len(pieces) == 5 and lengths.max() <= 512 and lengths[0] >= 505  # full windows, none truncated


def test_evaluate_adds_both_rows_for_every_model_and_lmk_schedules(minilm_lmk_checkpoint, minilm_path, tmp_path):
    from lmk_embed_tools import cli

    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    texts = helpers.stdlib_texts(12)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t * 3}) + "\n" for i, t in enumerate(texts)))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t[:60]}) + "\n" for i, t in enumerate(texts[:4])))
    (folder / "qrels" / "test.tsv").write_text("q\td\ts\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(4)))
    out = tmp_path / "out"
    assert cli.main(["evaluate", str(minilm_lmk_checkpoint), str(minilm_path), "--names", "lmk", "base", "--task",
                     str(folder), "--max-lengths", "1024", "--windows", "--long-input", "one-pass", "windows",
                     "--out", str(out), "--no-cache"]) == 0
    rows = {r["model"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"lmk one-pass", "lmk windows", "lmk windows-mean", "lmk windows-max", "base", "base windows-mean",
                         "base windows-max"}
    assert rows["lmk windows"]["effective_max_length"] == 1024 and rows["lmk one-pass"]["effective_max_length"] == 512
    assert rows["base windows-max"]["vectors_per_document"] > 1


def test_a_checkpoint_that_reads_in_windows_is_not_capped(minilm_lmk_checkpoint):
    from lmk_embed import LMKModel
    from lmk_embed_tools.evaluation.retrievers import DenseRetriever

    model = LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()
    assert DenseRetriever(model, "one pass", progress=False).effective_length(4096) == 512
    assert DenseRetriever(model, "windows", progress=False, long_input="windows").effective_length(4096) == 4096
    model.config.long_input = "windows"  # the recipe's checkpoints: windows by default
    assert DenseRetriever(model, "default", progress=False).effective_length(4096) == 4096
