"""Long-page training: the page target is the base's windows-mean of the page the student reads, a
window target is the base's vector of the same span, and the loss pools pages as `encode()` does."""

import math

import numpy as np
import pytest
import torch

from lmk_embed_tools.training.long_pages import (LongPageLoss, add_page_targets, chunk_index, content_budget,
                                                 cut_windows, deep_sentence_rows, max_sim_scores, sentences, special_template,
                                                 teacher_late_chunks, teacher_window_vectors, window_content_ids)
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
    # About 1,800 tokens: 16 windows of 128. The whole 60 paragraphs (25,000 tokens) took the window
    # loss's backward pass past 6 GB of the test process.
    return " ".join(stdlib_texts(60))[:6000]


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
    loss = LongPageLoss(st, teacher, temperature=0.1, weight=1.0, window_weight=1.0)
    texts = [page, page[len(page) // 2:]]
    features = st.transformers_model.prepare_features(texts, max_length=None, long_input="windows", window_length=128)
    pages, states, owner = loss.column(features)
    assert owner.tolist() == features["window_document"].tolist() and len(states) == len(owner)
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
    windowed = LongPageLoss(st, teacher, temperature=0.1, weight=1.0, window_weight=5.0)
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


def test_chunk_index_numbers_content_tokens_by_the_landmark_that_closes_them():
    # [CLS] a b [LMK] c [LMK] [PAD]
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    landmarks = torch.tensor([[0, 0, 0, 1, 0, 1, 0]])
    assert chunk_index(attention, landmarks).tolist() == [[-1, 0, 0, -1, 1, -1, -1]]


def test_teacher_late_chunks_are_the_base_token_states_pooled_over_each_chunk(teacher, minilm_path):
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(minilm_path).eval()
    ids = teacher.tokenizer(" ".join(stdlib_texts(4)), add_special_tokens=False)["input_ids"][:70]
    chunks = torch.arange(len(ids)) // 16  # chunks of 16, the last one shorter
    targets = teacher_late_chunks(teacher, [ids, ids[:20]], [chunks, chunks[:20]], special_template(teacher.tokenizer))
    row = torch.tensor([[teacher.tokenizer.cls_token_id, *ids, teacher.tokenizer.sep_token_id]])
    with torch.no_grad():
        states = backbone(input_ids=row, attention_mask=torch.ones_like(row)).last_hidden_state[0, 1:-1]
    expected = torch.stack([part.mean(0) for part in torch.split(states, 16)])
    assert targets[0].shape == (5, 384) and targets[1].shape == (2, 384)
    torch.testing.assert_close(targets[0], expected, atol=1e-5, rtol=0)


def test_max_sim_scores_are_each_documents_best_landmark():
    from lmk_embed_tools.evaluation.retrievers import late_interaction_scores

    generator = torch.Generator().manual_seed(0)
    queries = torch.nn.functional.normalize(torch.randn(3, 8, generator=generator), dim=-1)
    documents = [torch.randn(n, 8, generator=generator) for n in (1, 4, 2)]
    expected = late_interaction_scores(queries.numpy(), [d.numpy() for d in documents], "max")
    np.testing.assert_allclose(max_sim_scores(queries, documents).numpy(), expected, atol=1e-6)


def test_the_landmark_term_is_the_distance_of_each_landmark_to_the_base_late_chunk(teacher, minilm_path, minilm_windows):
    """For passages that fit one window: the landmark term adds the mean over landmarks of 1 - cos(landmark
    state, the base's late chunk), each computed here directly (encode's landmarks; transformers' forward)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    st = SentenceTransformer(str(minilm_windows), trust_remote_code=True, device="cpu").eval()
    embedder, backbone = st.transformers_model, AutoModel.from_pretrained(minilm_path).eval()
    passages = [" ".join(stdlib_texts(5))[:700], "The csv module reads and writes tabular data."]
    queries = embedder.prepare_features(["json", "csv"], max_length=32, granularity=16)
    features = embedder.prepare_features(passages, max_length=None, long_input="windows", granularity=16)
    distances = []
    for text in passages:
        landmarks = embedder.encode(text, output_value="landmarks", normalize=False, granularity=16, convert_to_tensor=True)
        encoded = teacher.tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            states = backbone(**encoded).last_hidden_state[0, 1:-1]
        late = torch.stack([part.mean(0) for part in torch.split(states, 16)])
        distances.append(1 - torch.nn.functional.cosine_similarity(landmarks["embeddings"], late, dim=-1))
    expected = torch.cat(distances).mean()
    with torch.no_grad():
        plain = LongPageLoss(st, teacher, temperature=0.1, weight=0.0, window_weight=0.0)([queries, features], None)
        taught = LongPageLoss(st, teacher, temperature=0.1, weight=0.0, window_weight=0.0,
                              landmark_weight=2.0)([queries, features], None)
    assert float(expected) > 0.05
    torch.testing.assert_close(taught - plain, 2 * expected, atol=1e-4, rtol=0)


def test_the_max_sim_term_scores_every_passage_by_its_best_landmark_and_trains(teacher, minilm_windows, page):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_windows), trust_remote_code=True, device="cpu")
    embedder = st.transformers_model
    queries = embedder.prepare_features(["json encoding", "text wrapping"], max_length=32, granularity=16)
    positives = embedder.prepare_features([page[:3000], "Text wrapping and filling."], max_length=None,
                                          long_input="windows", window_length=128, granularity=16)
    negatives = embedder.prepare_features(["Zip archives.", page[3000:4000]], max_length=None, long_input="windows",
                                          window_length=128, granularity=16)
    plain = LongPageLoss(st, None, temperature=0.1, weight=0.0, window_weight=0.0)
    maxsim = LongPageLoss(st, None, temperature=0.1, weight=0.0, window_weight=0.0, maxsim_weight=1.0)
    with torch.no_grad():
        st.eval()
        query = embedder.encode(["json encoding", "text wrapping"], normalize=False, convert_to_tensor=True, max_length=32,
                                granularity=16)
        documents = [embedder.encode(text, output_value="landmarks", normalize=False, convert_to_tensor=True,
                                     long_input="windows", window_length=128, granularity=16, max_length=None)["embeddings"]
                     for text in [page[:3000], "Text wrapping and filling.", "Zip archives.", page[3000:4000]]]
        scores = max_sim_scores(query, documents) / 0.1
        expected = torch.nn.functional.cross_entropy(scores, torch.arange(2))
        difference = maxsim([queries, positives, negatives], None) - plain([queries, positives, negatives], None)
    torch.testing.assert_close(difference, expected, atol=1e-4, rtol=0)
    st.train()
    value = maxsim([queries, positives, negatives], None)
    value.backward()
    assert torch.isfinite(value)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in st.parameters())
    with pytest.raises(ValueError, match="need a teacher"):
        LongPageLoss(st, None, temperature=0.1, weight=0.0, window_weight=0.0, landmark_weight=1.0)


def test_window_sentence_rows_remove_a_sentence_from_its_window_with_a_bm25_negative(teacher):
    from lmk_embed_tools.training.corpora import DocItem
    from lmk_embed_tools.training.long_pages import shares_words, window_sentence_rows

    filler = " ".join(stdlib_texts(80))
    facts = ["The lighthouse keeper records every passing ship in a leather bound ledger.",
             "Each harbour pilot signs the ledger before the ships leave the bay at dawn.",
             "The ledger is kept in a dry cabinet beside the lamp room of the tower."]
    items = [DocItem(source="torch", module=f"torch.m{i}", name=f"torch.Page{i}", kind="class", synopsis=f"Page {i}.",
                     text=filler[i * 500:i * 500 + 1500] + "\n\n" + fact + "\n\n" + filler[:800])
             for i, fact in enumerate(facts)]
    rows = window_sentence_rows({"torch": items}, teacher.tokenizer, window_tokens=120, per_page=3)
    assert rows and len({row["query"] for row in rows}) == len(rows)
    pages = [item.text for item in items]
    for row in rows:
        assert row["query"] not in " ".join(row["positive"].split())  # removed from its window
        assert sum(" ".join(row["query"].split()) in " ".join(page.split()) for page in pages) >= 1
        assert len(teacher.tokenizer(row["positive"], add_special_tokens=False)["input_ids"]) <= 120
        assert len(row["negatives"]) == 1 and not shares_words(row["query"], row["negatives"][0])
        assert row["negatives"][0] not in [row["positive"]]
    assert window_sentence_rows({"torch": items}, teacher.tokenizer, window_tokens=120, per_page=3) == rows
