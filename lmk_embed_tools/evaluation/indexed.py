"""Rows ranked through the landmark index (`lmk-embed evaluate --through-index`): a task's pages encoded
by `encode-corpus --output-value landmarks` into a temporary LanceDB index, and each query ranked by
`LandmarkIndex.search`, the search `lmk-embed search` and `serve` run (`search_corpus` embeds the
queries with `encode_query` and calls it; so do these rows). The numbers are those of the search users run:

- "NAME max-sim [index]": mode dense, each page scored by its best landmark;
- "BM25 [index]": mode lexical, LanceDB's full-text index with the index's one BM25 tokenizer
  (`corpus.table.LEXICAL_TOKENIZER`, recorded in the index);
- "NAME max-sim + BM25 [index] (minmax w=W)" or "(rank)": mode hybrid, both legs' candidates
  (`search.FUSION_DEPTH` each) fused with `search.fuse_scores`, the one fusion.

A query's run holds the `TOP_K` pages the search returns, in its order (`lmk-embed search --top-k 10`,
the deepest cutoff the metrics read): the scores given to mteb's scorer are `TOP_K` down to 1 by rank, so
its tie-break by id cannot reorder them, and every page the search did not return scores -inf
(`metrics.top_k_run` leaves it out). The in-memory rows (BM25 by bm25s over every page, fusion over
every page) stay beside these for one release, to show the difference.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from .cache import data_hash
from .metrics import K_VALUES
from .retrievers import FUSIONS, check_fuse_weight, position_limit

TOP_K = max(K_VALUES)  # what `lmk-embed search` returns by default, and the deepest cutoff the metrics read
INDEX = "[index]"


def has_landmarks(model) -> bool:
    """Whether `model` is an LMK checkpoint whose encode() gives landmarks (what the index holds)."""
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) == "lmk_embedder" and config.pooling in ("lmk", "mean@k")


class TaskIndex:
    """One checkpoint's landmark index of the current task's pages, built by `encode_corpus` once per
    (pages, max length) and shared by the rows that search it; the previous task's index is deleted."""

    def __init__(self, model_path: str, model, batch_size: int = 8):
        self.model_path, self.model, self.batch_size = str(model_path), model, batch_size
        self.limit = position_limit(model)
        self._key, self._folder, self._index, self._queries = None, None, None, (None, None)

    def effective_length(self, max_length: int) -> int:
        return max_length if self.limit is None else min(max_length, self.limit)

    def index(self, documents: dict[str, str], max_length: int):
        """The opened `LandmarkIndex` of `documents` (ids as strings) read to `max_length` tokens."""
        from lmk_embed_tools.corpus import encode_corpus
        from lmk_embed_tools.corpus.search import LandmarkIndex

        key = (data_hash(documents), self.effective_length(max_length))
        if self._key != key:
            self.close()
            self._folder = tempfile.TemporaryDirectory(prefix="lmk-evaluate-index-")
            pages = Path(self._folder.name) / "pages.jsonl"
            pages.write_text("".join(json.dumps({"id": str(doc_id), "text": text}) + "\n"
                                     for doc_id, text in documents.items()))
            encode_corpus(self.model_path, str(pages), Path(self._folder.name) / "index", output_value="landmarks",
                          max_length=key[1], batch_size=self.batch_size, show_progress_bar=False)
            self._key, self._index = key, LandmarkIndex.from_corpus(Path(self._folder.name) / "index")
        return self._index

    def query_vectors(self, queries: list[str]) -> np.ndarray:
        """[Q, D] as `search_corpus` embeds queries (`encode_query`), once per task for all its rows."""
        if self._queries[0] != tuple(queries):
            self._queries = (tuple(queries), np.asarray(self.model.encode_query(list(queries)), dtype=np.float32))
        return self._queries[1]

    def close(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
        self._key, self._folder, self._index = None, None, None


class IndexedRetriever:
    """One row searched through a `TaskIndex`: `mode` "dense", "lexical" or "hybrid" (with `fusion`
    and BM25's min-max `weight`). `scores` -> [Q, N] float32: TOP_K..1 for the pages the search
    returned, in its order, -inf for the others."""

    vectors_per_document = None

    def __init__(self, task_index: TaskIndex, name: str, mode: str, fusion: str = "minmax", weight: float = 0.5):
        if fusion not in FUSIONS:
            raise ValueError(f"`fusion` must be one of {list(FUSIONS)}, got {fusion!r}")
        self.task_index, self.name, self.mode, self.fusion = task_index, name, mode, fusion
        self.weight = check_fuse_weight(weight)
        self.limit = None if mode == "lexical" else task_index.limit

    def effective_length(self, max_length: int):
        return None if self.mode == "lexical" else self.task_index.effective_length(max_length)

    def hits(self, queries: list[str], documents: dict[str, str], max_length: int):
        """Per query, the search's `Hit`s, best first, as `lmk-embed search --top-k TOP_K` returns them."""
        index = self.task_index.index(documents, max_length)
        vectors = self.task_index.query_vectors(queries)
        started = time.perf_counter()
        found = index.search(vectors, top_k=TOP_K, mode=self.mode, texts=list(queries), fusion=self.fusion,
                             fuse_weight=self.weight)
        self.scoring_seconds = time.perf_counter() - started
        self.vectors_per_document = index.record["landmarks"] / max(index.rows, 1)
        return found

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache=None) -> np.ndarray:
        scores = np.full((len(queries), len(documents)), -np.inf, dtype=np.float32)
        for number, hits in enumerate(self.hits(queries, documents, max_length)):
            # a hit's row is its page's place in `documents` (the index's input was written in that order)
            scores[number, [hit.row for hit in hits]] = np.arange(len(hits), 0, -1, dtype=np.float32)
        return scores


def indexed_retrievers(models: dict, paths: dict, *, bm25: bool = False, fuse=(), fuse_weights=(0.5,),
                       batch_size: int = 8) -> list[IndexedRetriever]:
    """The rows ranked through the index ({row name: model} and {row name: its checkpoint folder}): per
    LMK checkpoint with landmarks "NAME max-sim [index]", then "BM25 [index]" (with `bm25` or `fuse`, from
    the first checkpoint's index: BM25 reads only the text) and per method in `fuse` each max-sim row
    fused with it (min-max once per weight in `fuse_weights`). ValueError when no model has landmarks."""
    indexes = {name: TaskIndex(paths[name], model, batch_size) for name, model in models.items() if has_landmarks(model)}
    if not indexes:
        raise ValueError(f"--through-index encodes a landmark index: none of {list(models)} is an LMK checkpoint "
                         "with landmarks (pooling 'lmk' or 'mean@k')")
    rows = [IndexedRetriever(index, f"{name} max-sim {INDEX}", "dense") for name, index in indexes.items()]
    if bm25 or fuse:
        rows.append(IndexedRetriever(next(iter(indexes.values())), f"BM25 {INDEX}", "lexical"))
    for method in fuse:
        for name, index in indexes.items():
            for weight in (fuse_weights if method == "minmax" else [0.5]):
                suffix = f"(minmax w={weight:g})" if method == "minmax" else "(rank)"
                rows.append(IndexedRetriever(index, f"{name} max-sim + BM25 {INDEX} {suffix}", "hybrid", method, weight))
    return rows


__all__ = ["INDEX", "IndexedRetriever", "TOP_K", "TaskIndex", "has_landmarks", "indexed_retrievers"]
