"""Retrieval metrics from mteb's own scorer (pytrec_eval underneath); nothing here computes a metric.

`score_run(run, relevant)` is the function `mteb.evaluate` calls on a retrieval task, so numbers
from our long-context runner and from `evaluate_retrieval` (a full mteb run) agree.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from lmk_embed_tools.compat import mteb_retrieval_scores

K_VALUES = (1, 10)
METRICS = ("ndcg_at_1", "ndcg_at_10", "recall_at_1", "recall_at_10", "mrr_at_10")


def score_run(run: Mapping[str, Mapping[str, float]], relevant: Mapping[str, Mapping[str, int]],
              k_values=K_VALUES) -> dict[str, float]:
    """mteb's scores for `run` (query id -> {doc id: score}) against `relevant` (the qrels).

    Returns {"ndcg_at_1", "ndcg_at_10", "recall_at_1", "recall_at_10", "mrr_at_10", ...}."""
    scores = mteb_retrieval_scores(dict(run), dict(relevant), list(k_values))  # the one scorer for every number
    return {key: float(value) for key, value in scores.items() if isinstance(value, (int, float))}


def top_k_run(scores: np.ndarray, query_ids: list[str], doc_ids: list[str], k: int = 100) -> dict[str, dict[str, float]]:
    """The run (query id -> {doc id: score}) of the `k` best documents per query, from `scores` [Q, N].

    mteb keeps the top 100 (and breaks ties by doc id, like pytrec_eval); so do we. A score of -inf is a
    document the retriever did not return (a search's top k): it is left out of the run, and a query
    with none returned keeps an empty run (it scores 0)."""
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return {q: {doc_ids[j]: float(scores[i, j]) for j in best[i] if scores[i, j] > -np.inf}
            for i, q in enumerate(query_ids)}
