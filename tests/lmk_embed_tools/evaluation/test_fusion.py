"""BM25 fused with a dense row: the fusion math against a direct computation, and the fused rows reuse
their parts' score matrices."""

import numpy as np
import pytest

from lmk_embed_tools.commandline import UsageError
from lmk_embed_tools.evaluation.cache import EmbeddingCache
from lmk_embed_tools.evaluation.retrievers import (BM25Retriever, FusedRetriever, RememberedScores, fuse_scores,
                                                   fused_retrievers)


def direct_rrf(dense, sparse, k=60):
    fused = np.zeros(dense.shape)
    for q in range(dense.shape[0]):
        for d in range(dense.shape[1]):
            for scores in (dense, sparse):
                rank = 1 + sum(other > scores[q, d] for other in scores[q])  # ties share the best rank
                fused[q, d] += 1 / (k + rank)
    return fused


def direct_minmax(dense, sparse, weight):
    fused = np.zeros(dense.shape)
    for q in range(dense.shape[0]):
        for share, scores in ((weight, sparse[q]), (1 - weight, dense[q])):
            spread = scores.max() - scores.min()
            fused[q] += share * ((scores - scores.min()) / spread if spread else np.zeros_like(scores))
    return fused


def test_fusion_matches_a_direct_computation():
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(4, 7)).astype(np.float32)
    sparse = np.round(rng.exponential(size=(4, 7)), 1).astype(np.float32)
    sparse[:, :3] = 0  # BM25 ties: candidates that share no word with the query
    sparse[3] = 2.5  # a query whose scores are all equal
    np.testing.assert_allclose(fuse_scores(dense, sparse, "rank"), direct_rrf(dense, sparse), rtol=1e-6)
    for weight in (0.0, 0.3, 0.5, 1.0):
        np.testing.assert_allclose(fuse_scores(dense, sparse, "minmax", weight), direct_minmax(dense, sparse, weight),
                                   rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(fuse_scores(dense, sparse, "minmax", 1.0)[3], 0)
    with pytest.raises(ValueError, match="method"):
        fuse_scores(dense, sparse, "sum")
    with pytest.raises(ValueError, match=r"\[Q, N\]"):
        fuse_scores(dense, sparse[:, :3], "rank")


class CountingRetriever:
    """A dense row with fixed scores that counts how often it is asked."""

    limit, vectors_per_document, scoring_seconds = 256, 3.0, 0.5

    def __init__(self, name, scores):
        self.name, self.matrix, self.calls = name, scores, 0

    def effective_length(self, max_length):
        return min(max_length, self.limit)

    def scores(self, queries, documents, max_length, cache):
        self.calls += 1
        return self.matrix


def test_fused_rows_reuse_the_rows_scores():
    documents = {"a": "the json module parses text", "b": "zip archives and files", "c": "csv readers and writers"}
    queries = ["parse json", "zip files"]
    dense = CountingRetriever("base windows-max", np.array([[0.1, 0.5, 0.2], [0.3, 0.9, 0.0]], dtype=np.float32))
    rows = fused_retrievers([dense, BM25Retriever()], fuse=["rank", "minmax"], weights=[0.3, 0.5])
    assert [r.name for r in rows] == ["base windows-max", "BM25", "base windows-max + BM25 (rank)",
                                      "base windows-max + BM25 (minmax w=0.3)", "base windows-max + BM25 (minmax w=0.5)"]
    cache = EmbeddingCache(None)
    results = {r.name: r.scores(queries, documents, 512, cache) for r in rows}
    assert dense.calls == 1  # one matrix for its own row and three fused ones
    bm25 = BM25Retriever().scores(queries, documents, 512)
    np.testing.assert_allclose(results["BM25"], bm25)
    np.testing.assert_allclose(results["base windows-max + BM25 (minmax w=0.3)"],
                               fuse_scores(dense.matrix, bm25, "minmax", 0.3))
    fused = rows[2]
    assert fused.effective_length(4096) == 256 and fused.vectors_per_document == 3.0
    assert fused.scoring_seconds >= 0.5  # the parts' search, then the fusion
    rows[0].scores(queries[:1], documents, 512, cache)  # other queries: asked again
    assert dense.calls == 2
    assert fused_retrievers([dense], fuse=[]) == [dense]
    with pytest.raises(ValueError, match="BM25"):
        fused_retrievers([dense], fuse=["rank"])
    with pytest.raises(ValueError, match="weight"):
        FusedRetriever(RememberedScores(dense), RememberedScores(BM25Retriever()), "minmax", 1.5)


def test_fuse_weights_are_checked_once():
    from lmk_embed_tools.evaluation_jobs import check_fuse_weights

    assert check_fuse_weights(None, []) == [0.5]
    assert check_fuse_weights([0.3, 0.5, 0.3], ["minmax"]) == [0.3, 0.5]
    with pytest.raises(UsageError, match="--fuse minmax"):
        check_fuse_weights([0.3], ["rank"])
    with pytest.raises(UsageError, match=r"--fuse-weight: \[1.5\]"):
        check_fuse_weights([1.5], ["minmax"])
