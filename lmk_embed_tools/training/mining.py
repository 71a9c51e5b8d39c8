"""Hard negatives mined with BM25 (bm25s), never the positive or one of its near-copies.

For each training item, the BM25 top candidates for its query within the same source are taken,
skipping: the item itself, any page with the same normalised text, and any page that contains the
query verbatim (a module or class page that lists the item: a false negative, not a hard one).
"""

from __future__ import annotations

import random

from .corpora import DocItem, normalized_text

BM25_WORDS = 2000  # index the first words of each page: the model reads at most 512 tokens of it


def mine_negatives(items: list[DocItem], num_negatives: int, top_k: int = 30, seed: int = 0) -> list[list[int]]:
    """For each item, the indices (into `items`) of `num_negatives` hard negatives from the same source.

    An item with too few admissible candidates in its top `top_k` gets random same-source pages
    (still never itself or a near-copy) to fill up.
    """
    import bm25s
    import numpy as np

    if num_negatives < 0:
        raise ValueError(f"`num_negatives` must be >= 0, got {num_negatives}.")
    negatives: list[list[int]] = [[] for _ in items]
    if num_negatives == 0:
        return negatives
    rng = random.Random(seed)
    normalized = [normalized_text(item.text) for item in items]
    by_source: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_source.setdefault(item.source, []).append(index)
    for indices in by_source.values():
        docs = [" ".join(items[i].text.split()[:BM25_WORDS]) for i in indices]
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
        k = min(top_k + 1, len(indices))
        queries = bm25s.tokenize([items[i].synopsis for i in indices], stopwords="en", show_progress=False)
        ranked, _ = retriever.retrieve(queries, k=k, show_progress=False, n_threads=1)
        for row, index in enumerate(indices):
            query = items[index].synopsis

            def admissible(candidate: int) -> bool:
                return (candidate != index and normalized[candidate] != normalized[index]
                        and query not in items[candidate].text and candidate not in negatives[index])

            for position in np.asarray(ranked[row]).tolist():
                if len(negatives[index]) == num_negatives:
                    break
                if admissible(indices[position]):
                    negatives[index].append(indices[position])
            attempts = 0
            while len(negatives[index]) < num_negatives and attempts < 50 * num_negatives:
                attempts += 1
                candidate = rng.choice(indices)
                if admissible(candidate):
                    negatives[index].append(candidate)
    return negatives
