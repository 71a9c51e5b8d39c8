"""Grouped landmarks: the index holds the mean of each run of k landmarks, scored by max cosine."""

import numpy as np
import pytest

from lmk_embed_tools.evaluation.retrievers import MultiVectorRetriever, group_landmarks, late_interaction_scores


def test_groups_are_the_means_of_consecutive_runs_and_score_by_the_best_one():
    rng = np.random.default_rng(0)
    documents = [rng.normal(size=(n, 8)).astype(np.float32) for n in (7, 3, 1)]
    queries = rng.normal(size=(2, 8)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    grouped = [group_landmarks(d, 3) for d in documents]
    assert [len(g) for g in grouped] == [3, 1, 1]
    assert np.allclose(grouped[0][2], documents[0][6]) and np.allclose(grouped[0][1], documents[0][3:6].mean(0))
    scores = late_interaction_scores(queries, grouped, "max")
    for j, groups in enumerate(grouped):
        unit = groups / np.linalg.norm(groups, axis=1, keepdims=True)
        assert np.allclose(scores[:, j], (queries @ unit.T).max(1), atol=1e-6)
    assert group_landmarks(documents[0], 1) is documents[0]


@pytest.mark.parametrize("group", [0, -1, 1.5, True])
def test_bad_group_is_named(group):
    with pytest.raises(ValueError, match="`group`"):
        MultiVectorRetriever(object(), "x", group=group)


def test_the_mean_of_the_landmarks_pass_is_the_single_vector(minilm_path, tmp_path):
    """With --multi-vector, an lmk-pooled row's single vector comes from the landmarks' pass: the same
    scores as encoding the single vector, in the windows schedule too."""
    from transformers import AutoModel

    from lmk_embed_tools.evaluation.cache import EmbeddingCache
    from lmk_embed_tools.evaluation.retrievers import DenseRetriever
    from lmk_embed_tools.training.convert import convert_to_lmk
    from tests.helpers import stdlib_texts

    folder = convert_to_lmk(str(minilm_path), tmp_path / "lmk", granularity=32, long_input="windows", window_length=128)
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    texts = stdlib_texts(40)
    documents = {f"d{i}": " ".join(texts[i::3]) for i in range(3)}
    queries = ["encode json", "wrap text into lines"]
    dense = DenseRetriever(model, "single", progress=False).scores(queries, documents, 2048, EmbeddingCache(None))
    mean = MultiVectorRetriever(model, "mean", mode="mean", progress=False).scores(queries, documents, 2048,
                                                                                  EmbeddingCache(None))
    assert np.allclose(dense, mean, atol=1e-5)
