"""The late-chunking row: the base's token states in windows, mean-pooled over spans, a document scored
by its best span. Checked against transformers' own forward on the windows' token ids, and for our
checkpoints against `encode(output_value="late_chunks")`."""

import numpy as np
import pytest
import torch

from lmk_embed_tools.evaluation.cache import EmbeddingCache
from lmk_embed_tools.evaluation.retrievers import LateChunksRetriever, build_retrievers, late_interaction_scores
from tests import helpers

WINDOW, CHUNK = 130, 32  # 128 content tokens a window: four spans


@pytest.fixture(scope="module")
def base(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def unit(vectors):
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def test_the_base_row_equals_its_token_states_pooled_over_spans(base, minilm_path):
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(minilm_path).eval()
    text = " ".join(helpers.stdlib_texts(12))
    documents, queries = {"a": text, "b": helpers.SAMPLE_TEXT}, ["how do I parse json?", "read a csv file"]
    retriever = LateChunksRetriever(base, "late", chunk=CHUNK, window=WINDOW, progress=False)
    spans = retriever.window_vectors(documents, 1000, EmbeddingCache(None))
    expected = []
    for document in documents.values():
        ids = base.tokenizer(document, add_special_tokens=False)["input_ids"][:1000]
        vectors = []
        for start in range(0, len(ids), WINDOW - 2):
            row = torch.tensor([[base.tokenizer.cls_token_id, *ids[start:start + WINDOW - 2], base.tokenizer.sep_token_id]])
            with torch.no_grad():
                states = backbone(input_ids=row, attention_mask=torch.ones_like(row)).last_hidden_state[0, 1:-1]
            vectors += [part.mean(0).numpy() for part in torch.split(states, CHUNK)]
        expected.append(unit(np.stack(vectors)))
    assert [len(v) for v in spans] == [len(v) for v in expected] and len(spans[0]) == 1000 // CHUNK + 1
    for ours, theirs in zip(spans, expected):
        np.testing.assert_allclose(ours, theirs, atol=1e-4)
    scores = retriever.scores(queries, documents, 1000, EmbeddingCache(None))
    query = unit(base.encode(queries))
    np.testing.assert_allclose(scores, late_interaction_scores(query, expected, "max"), atol=1e-4)


def test_our_checkpoints_row_is_their_late_chunks(minilm_lmk_checkpoint):
    from lmk_embed import LMKModel

    model = LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()
    text = " ".join(helpers.stdlib_texts(12))
    retriever = LateChunksRetriever(model, "late", chunk=CHUNK, window=WINDOW, progress=False)
    spans = retriever.window_vectors({"a": text}, 1000, EmbeddingCache(None))[0]
    expected = model.encode_document(text, output_value="late_chunks", long_input="windows", window_length=WINDOW,
                                     granularity=CHUNK, max_length=1000)["embeddings"]
    np.testing.assert_allclose(spans, expected, atol=1e-6)


def test_rows_for_several_windows_and_late_chunks_are_named(base):
    rows = build_retrievers({"base": base}, windows=True, window=[256, 64, 128], late_chunks=True, chunk_tokens=64)
    assert [r.name for r in rows] == ["base", "base windows-mean", "base windows-max", "base windows-mean W=64",
                                      "base windows-max W=64", "base windows-mean W=128", "base windows-max W=128",
                                      "base late chunks 64"]
    assert rows[-1].window == 256 and rows[-1].chunk == 64 and rows[4].window == 64
    with pytest.raises(ValueError, match="`chunk` must be a positive integer"):
        LateChunksRetriever(base, "late", chunk=0)
