"""Long-page training: the page target is the base's windows-mean of the page the student reads, a
window target is the base's vector of the same span, and the loss pools pages as `encode()` does."""

import math

import numpy as np
import pytest
import torch

from lmk_embed_tools.training.long_pages import (InfoNCEWithWindowDistillation, add_page_targets, content_budget,
                                                 cut_windows, deep_sentence_rows, sentences, special_template, teacher_window_vectors,
                                                 window_content_ids)
from tests.helpers import stdlib_texts


@pytest.fixture(scope="module")
def teacher(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


@pytest.fixture(scope="module")
def minilm_windows(tmp_path_factory, minilm_path):
    """The real MiniLM converted to LMK (g=16) reading long texts in windows."""
    from lmk_embed_tools.training.convert import convert_to_lmk

    return convert_to_lmk(str(minilm_path), tmp_path_factory.mktemp("minilm-windows"), granularity=16, long_input="windows")


@pytest.fixture(scope="module")
def page():
    return " ".join(stdlib_texts(60))


@pytest.mark.parametrize("max_length,g", [(1024, 32), (512, 32), (300, 7), (64, 256)])
def test_content_budget_is_the_most_that_fits_at_every_g(max_length, g):
    content = content_budget(max_length, g)
    assert content + math.ceil(content / g) + 1 <= max_length
    assert (content + 1) + math.ceil((content + 1) / g) + 1 > max_length


def test_window_targets_are_the_base_vector_of_the_same_span(teacher, minilm_windows, page):
    from transformers import AutoModel

    lmk = AutoModel.from_pretrained(minilm_windows, trust_remote_code=True).eval()
    features = lmk.prepare_features([page, "a short text that fits one window"], max_length=None,
                                    long_input="windows", window_length=128, granularity=16)
    assert "window_document" in features and len(features["window_document"]) > 3
    ids = window_content_ids(features["input_ids"], features["attention_mask"], features["landmark_mask"])
    vectors = teacher_window_vectors(teacher, ids, special_template(teacher.tokenizer))
    # The reference: each window's text, through the teacher's own encode (its tokenizer, its pooling).
    # Compared where decoding gives back the same ids (WordPiece cannot always round-trip punctuation).
    texts = [teacher.tokenizer.decode(row) for row in ids]
    same = [i for i, t in enumerate(texts) if teacher.tokenizer(t, add_special_tokens=False)["input_ids"] == ids[i]]
    assert len(same) >= len(ids) // 2
    expected = teacher.encode([texts[i] for i in same], convert_to_tensor=True, normalize_embeddings=True)
    assert torch.allclose(vectors[same], expected, atol=1e-5)
    assert sum(len(row) for row in ids) == len(teacher.tokenizer(page, add_special_tokens=False)["input_ids"]) + 7


def test_page_target_is_the_base_windows_mean_of_the_read_page(teacher, page):
    rows = [{"query": "what does the json module do", "positive": page, "negatives": []}]
    add_page_targets(rows, teacher, query_tokens=16, content_tokens=600, window=128)
    tokenizer = teacher.tokenizer
    ids = tokenizer(page, add_special_tokens=False)["input_ids"][:600]
    assert tokenizer(rows[0]["positive"], add_special_tokens=False)["input_ids"] == ids
    windows = [tokenizer.decode(ids[i:i + 126]) for i in range(0, len(ids), 126)]  # 128 less [CLS], [SEP]
    window_vectors = teacher.encode(windows, normalize_embeddings=True)
    mean = window_vectors.mean(0)
    target = np.asarray(rows[0]["teacher_embeddings"])
    assert target.shape == (2, window_vectors.shape[1])
    assert np.allclose(target[1], mean / np.linalg.norm(mean), atol=1e-5)


def test_sentences_are_prose_and_found_where_they_are():
    text = "Returns x.\n\nThis module reads and writes files in the format used by many tools.\n\nf(a, b, c)\n\n" \
           "It also converts them into dictionaries for later use by other programs!"
    found = sentences(text)
    assert [s for _, s in found] == ["This module reads and writes files in the format used by many tools.",
                                     "It also converts them into dictionaries for later use by other programs!"]
    for at, sentence in found:
        assert text[at:].replace("\n", " ").startswith(sentence)


def test_deep_sentence_rows_remove_the_query_from_its_page(teacher):
    from lmk_embed_tools.training.corpora import DocItem

    body = " ".join(stdlib_texts(60))[:3000]
    deep = "The lighthouse keeper records every passing ship in a leather bound ledger."
    text = body + "\n\n" + deep + "\n\n" + body[:200]
    item = DocItem(source="torch", module="torch.fake", name="json.Lighthouse", kind="class", synopsis="A lighthouse.", text=text)
    rows = deep_sentence_rows({"torch": [item]}, teacher.tokenizer, content_tokens=4000, min_depth=300)
    assert len(rows) == 1
    row = rows[0]
    assert row["query"] not in row["positive"]
    depth = len(teacher.tokenizer(text[:text.find(row["query"])], add_special_tokens=False)["input_ids"])
    assert depth >= 300
    assert deep_sentence_rows({"torch": [item]}, teacher.tokenizer, content_tokens=4000, min_depth=300) == rows


def test_window_loss_pools_pages_as_encode_does_and_trains(teacher, minilm_windows, page):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_windows), trust_remote_code=True, device="cpu")
    loss = InfoNCEWithWindowDistillation(st, teacher, temperature=0.1, weight=1.0, window_weight=1.0)
    texts = [page, page[len(page) // 2:]]
    features = st.transformers_model.prepare_features(texts, max_length=None, long_input="windows", window_length=128)
    pages, windows = loss.column(features)
    expected = st.transformers_model.encode(texts, long_input="windows", window_length=128, max_length=None,
                                            normalize=False, convert_to_tensor=True)
    assert torch.allclose(pages, expected, atol=1e-5)
    queries = st.transformers_model.prepare_features(["json", "text"], max_length=32)
    labels = torch.randn(2, 2 * 384)
    value = loss([queries, features], labels)
    value.backward()
    assert torch.isfinite(value)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in st.parameters())


def test_training_reads_windows_only_when_asked(minilm_windows, page):
    """Training batches read one pass by default (the recipe's 512-token passages), and the checkpoint's
    windows schedule when the call asks for it, cut exactly as `encode()` cuts them."""
    from transformers import AutoModel

    lmk = AutoModel.from_pretrained(minilm_windows, trust_remote_code=True)
    one_pass = lmk.prepare_features([page], max_length=512, training=True, granularity=32)
    assert "window_document" not in one_pass and one_pass["input_ids"].shape[1] == 512
    windows = lmk.prepare_features([page], max_length=1024, training=True, granularity=32, long_input="windows",
                                   window_length=256)
    inference = lmk.prepare_features([page], max_length=1024, training=False, granularity=32, long_input="windows",
                                     window_length=256)
    assert windows["input_ids"].shape[1] <= 256 and len(windows["window_document"]) == 5
    assert torch.equal(windows["input_ids"], inference["input_ids"])


def test_the_window_term_weighs_only_pages_read_in_more_than_one_window(teacher, minilm_windows, page):
    """A column of pages that each fit one window gets no window term: the loss is the recipe's
    InfoNCE + page distillation exactly; a page cut into windows adds the term on its windows only."""
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.training.finetune import InfoNCEWithEmbeddingDistillation

    assert cut_windows({"input_ids": torch.zeros(3, 4), "window_document": torch.tensor([0, 0, 1])}).tolist() == [True, True, False]
    assert not cut_windows({"input_ids": torch.zeros(2, 4)}).any()
    st = SentenceTransformer(str(minilm_windows), trust_remote_code=True, device="cpu").eval()
    windowed = InfoNCEWithWindowDistillation(st, teacher, temperature=0.1, weight=1.0, window_weight=5.0)
    plain = InfoNCEWithEmbeddingDistillation(st, temperature=0.1, weight=1.0, gather_across_devices=False)
    embedder = st.transformers_model
    queries = embedder.prepare_features(["json", "text"], max_length=32)
    labels = torch.randn(2, 2 * 384)
    short = embedder.prepare_features(["The json module encodes JSON.", "Text wrapping and filling."], max_length=None,
                                      long_input="windows", window_length=128)
    with torch.no_grad():
        assert torch.allclose(windowed([queries, short], labels), plain([queries, short], labels), atol=1e-5)
        mixed = embedder.prepare_features([page, "Text wrapping and filling."], max_length=None, long_input="windows",
                                          window_length=128)
        assert cut_windows(mixed).sum() == len(mixed["window_document"]) - 1
        assert windowed([queries, mixed], labels) > plain([queries, mixed], labels) + 1e-3
