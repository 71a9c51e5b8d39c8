"""Retrievers the long-context runner scores: a dense model, landmark multi-vector, the user's own
windows baselines (windows-mean, windows-max), BM25, and BM25 fused with a dense row.

Each has `name`, `limit` (its position limit in tokens, or None) and
`scores(queries, documents, max_length, cache) -> float32 [Q, N]`. Dense models are any object
with `encode_query` / `encode_document`: our AutoModel classes (max length passed per call) or a
plain SentenceTransformer such as the untouched base (its `max_seq_length` set per call).
"""

from __future__ import annotations

import numbers
import time
import warnings
from contextlib import contextmanager

import numpy as np

from lmk_embed.encoding import position_table_limit
from lmk_embed_tools.corpus.search import FUSIONS, fuse_scores  # the one fusion: `search` and `serve` fuse with it
from lmk_embed_tools.window_vectors import (check_first_window_weight, embed_windows, first_weighted_means, normalize,
                                            window_texts)

from .cache import EmbeddingCache, cache_key, data_hash, model_hash


def _is_sentence_transformer(model) -> bool:
    return hasattr(model, "max_seq_length")


def position_limit(model, **encode_kwargs) -> int | None:
    """The longest input `model` can read with `encode_kwargs`: for our models, what their own `resolve`
    makes of them (the default budget, or None for LMK windows, which read any length); for a
    SentenceTransformer, its backbone's position table (`position_table_limit`, the function our
    models use). Not the tokenizer's `model_max_length`: sentence-transformers sets it to
    `max_seq_length` (256 for all-MiniLM-L6-v2), which is a default, not a limit."""
    if _is_sentence_transformer(model):
        inner = getattr(model[0], "auto_model", None) or getattr(model[0], "model", None)
        if hasattr(inner, "max_positions"):  # one of ours, loaded through SentenceTransformer
            return inner.max_positions()
        return position_table_limit(inner) if inner is not None else None
    request = model.resolve(**encode_kwargs)
    return None if getattr(request, "long_input", None) == "windows" else request.max_length


@contextmanager
def _quiet_truncation():
    with warnings.catch_warnings():  # truncation at max_length is the point of a length curve
        warnings.filterwarnings("ignore", message=".*truncated.*")
        yield


class DenseRetriever:
    """Cosine similarity of `encode_query` and `encode_document` vectors (`encode_kwargs` go to both,
    e.g. granularity=64 or schedule="vertical")."""

    def __init__(self, model, name: str, batch_size: int = 8, progress: bool = True, **encode_kwargs):
        self.model, self.name, self.batch_size, self.progress = model, name, batch_size, progress
        self.encode_kwargs = encode_kwargs
        self.limit = position_limit(model, **encode_kwargs)
        self._digest = None

    def effective_length(self, max_length: int) -> int:
        return max_length if self.limit is None else min(max_length, self.limit)

    def _encode(self, method: str, texts: list[str], max_length: int, **extra):
        kwargs = dict(batch_size=self.batch_size, **self.encode_kwargs, **extra)
        if _is_sentence_transformer(self.model):
            self.model.max_seq_length = max_length
        else:
            kwargs["max_length"] = max_length
        with _quiet_truncation():
            return getattr(self.model, method)(texts, show_progress_bar=self.progress and len(texts) > self.batch_size,
                                               **kwargs)

    def settings(self, max_length: int, **extra) -> dict:
        return {"class": type(self.model).__qualname__, "max_length": self.effective_length(max_length),
                **self.encode_kwargs, **extra}

    def corpus_key(self, documents: dict[str, str], max_length: int, **extra) -> str:
        if self._digest is None:
            self._digest = model_hash(self.model)
        return cache_key(self._digest, self.settings(max_length, **extra), data_hash(documents))

    def corpus_vectors(self, documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> np.ndarray:
        """[N, D] unit vectors of the documents, from the cache when the same model, settings and data were seen."""
        key = self.corpus_key(documents, max_length)
        length = self.effective_length(max_length)
        return cache.get_or_compute(key, lambda: normalize(np.asarray(
            self._encode("encode_document", list(documents.values()), length), dtype=np.float32)))

    def query_vectors(self, queries: list[str], max_length: int) -> np.ndarray:
        return normalize(np.asarray(self._encode("encode_query", queries, self.effective_length(max_length)), dtype=np.float32))

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> np.ndarray:
        corpus, query = self.corpus_vectors(documents, max_length, cache), self.query_vectors(queries, max_length)
        started = time.perf_counter()
        scores = query @ corpus.T
        self.scoring_seconds = time.perf_counter() - started  # the index side's cost, against multi-vector
        return scores


class MultiVectorRetriever(DenseRetriever):
    """Late interaction over an LMK model's landmark vectors, from the same single encoder pass.

    `mode="max"`: max over landmarks of cos(query, landmark). `mode="mean"`: cos(query, their mean), the
    single vector of lmk pooling, in every schedule. `mode="hybrid"`: `alpha` * that max
    + (1 - alpha) * cos(query, single-vector LMK embedding) (the mean of the landmark states).
    `group` k > 1 pools each run of k consecutive landmarks first (k (g+1) + 1 tokens: the landmarks
    of one window of that length), so the index holds one vector per span of k chunks."""

    def __init__(self, model, name: str, mode: str = "max", alpha: float = 0.5, group: int = 1, **kwargs):
        if mode not in ("max", "mean", "hybrid"):
            raise ValueError(f"`mode` must be 'max', 'mean' or 'hybrid', got {mode!r}")
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"`group` must be a positive integer, got {group!r}")
        super().__init__(model, name, **kwargs)
        self.mode, self.alpha, self.group = mode, alpha, group
        self.vectors_per_document = None

    def landmark_vectors(self, documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> list[np.ndarray]:
        """Per document, its raw (unnormalised) landmark states [n_i, D]; cached like corpus vectors."""
        key = self.corpus_key(documents, max_length, output_value="landmarks", normalize=False)

        def compute():
            out = self._encode("encode_document", list(documents.values()), self.effective_length(max_length),
                               output_value="landmarks", normalize=False)
            return [np.asarray(item["embeddings"], dtype=np.float32) for item in out]

        return cache.get_or_compute(key, compute)

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> np.ndarray:
        landmarks = [group_landmarks(v, self.group) for v in self.landmark_vectors(documents, max_length, cache)]
        self.vectors_per_document = float(np.mean([len(v) for v in landmarks]))
        query = self.query_vectors(queries, max_length)
        started = time.perf_counter()
        scores = late_interaction_scores(query, landmarks, self.mode, self.alpha)
        self.scoring_seconds = time.perf_counter() - started
        return scores


def group_landmarks(landmarks: np.ndarray, group: int) -> np.ndarray:
    """[n, D] raw landmark states -> [ceil(n / group), D]: the mean of each run of `group` consecutive
    landmarks (the last run may be shorter); `group` 1 returns them as they are."""
    if group == 1:
        return landmarks
    return np.stack([landmarks[start:start + group].mean(0) for start in range(0, len(landmarks), group)])


def late_interaction_scores(queries: np.ndarray, landmarks: list[np.ndarray], mode: str = "max",
                            alpha: float = 0.5) -> np.ndarray:
    """queries [Q, D] (unit), landmarks: per document [n_i, D] raw states -> scores [Q, N].

    max: max_i cos(q, l_i); mean: cos(q, mean_i l_i) (single-vector LMK); hybrid: alpha*max + (1-alpha)*mean."""
    if any(len(v) == 0 for v in landmarks):
        raise ValueError("every document needs at least one landmark vector")
    flat = normalize(np.concatenate(landmarks))
    starts = np.cumsum([0] + [len(v) for v in landmarks[:-1]])
    similarity = queries @ flat.T  # [Q, total landmarks]; a document's landmarks are contiguous
    best = np.maximum.reduceat(similarity, starts, axis=1)  # per document, its best landmark
    if mode == "max":
        return best
    mean = queries @ normalize(np.stack([v.mean(0) for v in landmarks])).T
    if mode == "mean":
        return mean
    return alpha * best + (1 - alpha) * mean


def default_window(model) -> int:
    """The window of the windows baselines: a SentenceTransformer's own `max_seq_length` (the length its
    authors set: 256 for all-MiniLM-L6-v2), else the positions our LMK model was pretrained with, else
    its default length."""
    if _is_sentence_transformer(model):
        return int(model.max_seq_length)
    original = getattr(model, "original_positions", None)
    window = original() if original is not None else model.default_max_length()
    if window is None:
        raise ValueError(f"{type(model).__name__} reports no length: give the window (--window).")
    return int(window)


def window_content(model, window: int) -> int:
    """The content tokens one window of `window` tokens holds for `model`: less [CLS] and [SEP] (or the
    tokenizer's own special tokens), and for landmark layouts less one landmark per g tokens too."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) == "lmk_embedder" and config.pooling in ("lmk", "multi_cls"):
        return max((window - 1) * config.granularity // (config.granularity + 1), 1)
    tokenizer = model.tokenizer
    specials = tokenizer.num_special_tokens_to_add() if _is_sentence_transformer(model) else 2
    return max(window - specials, 1)


class WindowsRetriever(DenseRetriever):
    """The baseline a user builds with any embedding model: each document's first `max_length` tokens
    cut into windows of `window` tokens (special tokens included), each window embedded alone.

    `mode="mean"`: a document is the mean of its unit window vectors (LongEmbed's PCW), or with
    `first_window_weight` b > 0 that mean and its first window mixed (`first_weighted_means`);
    `mode="max"`: a document scores its best window (a multi-vector index of windows)."""

    def __init__(self, model, name: str, mode: str = "mean", window: int | None = None, first_window_weight: float = 0.0,
                 **kwargs):
        if mode not in ("mean", "max"):
            raise ValueError(f"`mode` must be 'mean' or 'max', got {mode!r}")
        self.first_window_weight = check_first_window_weight(first_window_weight)
        if mode == "max" and self.first_window_weight:
            raise ValueError("`first_window_weight` weighs the windows' mean: it needs mode='mean'.")
        super().__init__(model, name, **kwargs)
        self.mode, self.window = mode, int(window or default_window(model))
        if self.limit is not None and self.window > self.limit:
            raise ValueError(f"window {self.window} exceeds {name}'s limit of {self.limit} tokens")
        self.limit = None  # the windows read any length
        self.vectors_per_document = None

    def settings(self, max_length: int, **extra) -> dict:
        return {**super().settings(max_length, **extra), "window": self.window}

    def window_vectors(self, documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> list[np.ndarray]:
        """Per document, its unit window vectors [n_i, D]; cached (both modes share them)."""
        key = self.corpus_key(documents, max_length, windows=True)
        tokenizer, content = self.model.tokenizer, window_content(self.model, self.window)

        # Each window holds `content` tokens: with its special tokens (and landmarks), `window` in all.
        return cache.get_or_compute(key, lambda: embed_windows(
            lambda flat: self._encode("encode_document", flat, self.window), tokenizer, list(documents.values()),
            content, max_length))

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> np.ndarray:
        windows = self.window_vectors(documents, max_length, cache)
        self.vectors_per_document = float(np.mean([len(v) for v in windows])) if self.mode == "max" else 1.0
        query = self.query_vectors(queries, self.window)
        started = time.perf_counter()
        if self.mode == "mean":
            scores = query @ first_weighted_means(windows, self.first_window_weight).T
        else:
            scores = late_interaction_scores(query, windows, self.mode)
        self.scoring_seconds = time.perf_counter() - started
        return scores


class LateChunksRetriever(WindowsRetriever):
    """Late chunking (Günther et al., arXiv 2409.04701), a row any model gets with no training: each
    document's first `max_length` tokens read in windows of `window` tokens, and each window's token
    states mean-pooled over spans of `chunk` content tokens; a document scores its best span.

    Our LMK models give the spans through `encode(output_value="late_chunks")` (windows of whole
    chunks, g = `chunk`); a SentenceTransformer (the untouched base) through its own token embeddings
    (`output_value="token_embeddings"`) of each window, [CLS] and [SEP] left out of the spans."""

    def __init__(self, model, name: str, chunk: int = 64, window: int | None = None, **kwargs):
        super().__init__(model, name, mode="max", window=window, **kwargs)
        if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
            raise ValueError(f"`chunk` must be a positive integer, got {chunk!r}")
        self.chunk = int(chunk)

    def settings(self, max_length: int, **extra) -> dict:
        return {**super().settings(max_length, **extra), "late_chunks": self.chunk}

    def window_vectors(self, documents: dict[str, str], max_length: int, cache: EmbeddingCache) -> list[np.ndarray]:
        """Per document, its unit span vectors [n_i, D]; cached."""
        key = self.corpus_key(documents, max_length, windows=True)
        return cache.get_or_compute(key, lambda: self._span_vectors(list(documents.values()), max_length))

    def _span_vectors(self, texts: list[str], max_length: int) -> list[np.ndarray]:
        if not _is_sentence_transformer(self.model):
            out = self._encode("encode_document", texts, max_length, output_value="late_chunks", long_input="windows",
                               window_length=self.window, granularity=self.chunk, normalize=True)
            return [np.asarray(item["embeddings"], dtype=np.float32) for item in out]
        content = window_content(self.model, self.window)
        pieces = [window_texts(self.model.tokenizer, text, content, max_length) for text in texts]
        states = self._encode("encode_document", [p for windows in pieces for p in windows], self.window,
                              output_value="token_embeddings")
        spans, cursor = [], 0
        for windows in pieces:
            vectors = []
            for tokens in states[cursor:cursor + len(windows)]:
                tokens = np.asarray(tokens.float().cpu(), dtype=np.float32)
                inner = tokens[1:-1]  # the window's content tokens, without [CLS] and [SEP]
                vectors += [inner[start:start + self.chunk].mean(0) for start in range(0, len(inner), self.chunk)]
                if not len(inner):  # an empty text: its one vector is the mean of its states, as for our models
                    vectors.append(tokens.mean(0))
            cursor += len(windows)
            spans.append(normalize(np.stack(vectors)))
        return spans


class BM25Retriever:
    """BM25 (bm25s, English stopwords) over whole documents: the sanity baseline; it reads every token."""

    limit = None

    def __init__(self, name: str = "BM25"):
        self.name = name

    def effective_length(self, max_length: int) -> None:
        return None

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache=None) -> np.ndarray:
        import bm25s

        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize(list(documents.values()), stopwords="en", show_progress=False), show_progress=False)
        started = time.perf_counter()  # the index is built above; this is the search
        tokenized = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        scores = np.stack([retriever.get_scores(tokens) for tokens in tokenized]).astype(np.float32)
        self.scoring_seconds = time.perf_counter() - started
        return scores


def check_fuse_weight(weight) -> float:
    """`weight` (BM25's share in min-max fusion) as a float, or a ValueError naming it: a number in [0, 1]."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not 0.0 <= weight <= 1.0:
        raise ValueError(f"`weight` must be a number in [0, 1], got {weight!r}.")
    return float(weight)


class RememberedScores:
    """A retriever that keeps its last score matrix (by max length, queries and documents), so that a
    fused row reads its parts' scores as their own rows computed them: nothing is encoded twice."""

    def __init__(self, retriever):
        self.retriever, self._last = retriever, (None, None)

    def __getattr__(self, name):  # name, limit, effective_length, vectors_per_document, scoring_seconds
        return getattr(self.retriever, name)

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache) -> np.ndarray:
        key = (max_length, tuple(queries), data_hash(documents))
        if self._last[0] != key:
            self._last = (key, self.retriever.scores(queries, documents, max_length, cache))
        return self._last[1]


class FusedRetriever:
    """A dense row and BM25 fused per query (`fuse_scores`): "NAME + BM25 (rank)" or "(minmax w=W)".
    Give it `RememberedScores` parts (as `build_retrievers` does) to reuse their rows' scores."""

    def __init__(self, dense, sparse, method: str = "minmax", weight: float = 0.5):
        if method not in FUSIONS:
            raise ValueError(f"`method` must be one of {FUSIONS}, got {method!r}")
        self.dense, self.sparse, self.method, self.weight = dense, sparse, method, check_fuse_weight(weight)
        self.name = f"{dense.name} + {sparse.name} ({method}" + (f" w={self.weight:g})" if method == "minmax" else ")")
        self.limit = dense.limit
        self.vectors_per_document = None

    def effective_length(self, max_length: int):
        return self.dense.effective_length(max_length)

    def scores(self, queries: list[str], documents: dict[str, str], max_length: int, cache) -> np.ndarray:
        dense = self.dense.scores(queries, documents, max_length, cache)
        sparse = self.sparse.scores(queries, documents, max_length, cache)
        self.vectors_per_document = getattr(self.dense, "vectors_per_document", None)
        started = time.perf_counter()
        scores = fuse_scores(dense, sparse, self.method, self.weight)
        self.scoring_seconds = (getattr(self.dense, "scoring_seconds", 0.0) + getattr(self.sparse, "scoring_seconds", 0.0)
                                + time.perf_counter() - started)
        return scores


def fused_retrievers(retrievers: list, fuse=(), weights=(0.5,)) -> list:
    """`retrievers` (BM25 among them) and, per `fuse` method, a fused row for every other row (min-max
    once per weight in `weights`); every part remembers its scores for the fused rows."""
    if not fuse:
        return retrievers
    remembered = [RememberedScores(r) for r in retrievers]
    bm25 = next((r for r in remembered if isinstance(r.retriever, BM25Retriever)), None)
    if bm25 is None:
        raise ValueError("fusion needs the BM25 row among the retrievers")
    fused = [FusedRetriever(r, bm25, method, weight) for method in fuse for r in remembered if r is not bm25
             for weight in (weights if method == "minmax" else [0.5])]
    return remembered + fused


def build_retrievers(models: dict, *, batch_size: int = 8, granularities=None, multi_vector: bool = False,
                     schedule: str | None = None, bm25: bool = False, long_inputs=None, windows=None,
                     window=None, window_lengths=None, landmark_groups=(1,), fuse=(),
                     fuse_weights=(0.5,), late_chunks=None, chunk_tokens: int = 64) -> list:
    """The rows of a length curve: a `DenseRetriever` per model ({row name: model}); for LMK models one
    per inference granularity in `granularities` and per long-input schedule in `long_inputs`
    (landmark-pooled models; the row name then ends in it; `windows` once per W in `window_lengths`)
    and, with `multi_vector`, landmark max and
    hybrid rows from the same pass (max once per group size in `landmark_groups`); recurrent models take `schedule`. The models named in `windows` (or
    every model, for `windows=True`) also get the windows-mean and windows-max rows (windows of `window`
    tokens, default `default_window`; with several, the first names the rows plainly and the others add
    " W=..."). The models named in `late_chunks` (or every model, for True) get a late-chunking row:
    spans of `chunk_tokens` tokens in windows of the first `window`, max over the spans.
    BM25 after them when asked for (or fused); then, per method in `fuse`, every other row fused with
    BM25 (`fused_retrievers`, min-max once per weight in `fuse_weights`)."""
    retrievers = []
    for name, model in models.items():
        is_lmk = getattr(getattr(model, "config", None), "model_type", None) == "lmk_embedder"
        extra = {"schedule": schedule} if schedule and not is_lmk and hasattr(model, "config") else {}
        schedules = [(s, None) for s in long_inputs] if is_lmk and long_inputs and model.config.pooling == "lmk" else [(None, None)]
        if window_lengths:
            schedules = [(s, w) for s, _ in schedules for w in (window_lengths if s == "windows" else [None])]
        for g in (granularities if is_lmk and granularities else [None]):
            for long_input, window_length in schedules:
                label, options = (f"{name} g={g}", {"granularity": g}) if g else (name, {})
                if long_input:
                    label, options = f"{label} {long_input}", {**options, "long_input": long_input}
                if window_length:
                    label, options = f"{label} W={window_length}", {**options, "window_length": window_length}
                same_window = not is_lmk or "window_length" in options or \
                    getattr(model.config, "index_window_length", None) in (None, model.config.window_length)
                if is_lmk and multi_vector and model.config.pooling == "lmk" and same_window:
                    # lmk pooling is the mean of the landmark states: the single vector from the landmarks' pass
                    # (unless landmarks read another window than the vector: `index_window_length`)
                    retrievers.append(MultiVectorRetriever(model, label, mode="mean", batch_size=batch_size, **options))
                else:
                    retrievers.append(DenseRetriever(model, label, batch_size=batch_size, **options, **extra))
                if is_lmk and multi_vector and model.config.pooling in ("lmk", "mean@k"):
                    for group in landmark_groups:
                        suffix = f" k={group}" if group > 1 else ""
                        retrievers.append(MultiVectorRetriever(model, f"{label} multi-vector max{suffix}", group=group,
                                                               batch_size=batch_size, **options))
                    retrievers.append(MultiVectorRetriever(model, f"{label} multi-vector hybrid", mode="hybrid",
                                                           batch_size=batch_size, **options))
        sizes = list(window) if isinstance(window, (list, tuple)) else [window]
        if windows is True or (windows and name in windows):
            for index, size in enumerate(sizes):
                suffix = f" W={size}" if index else ""
                for mode in ("mean", "max"):
                    retrievers.append(WindowsRetriever(model, f"{name} windows-{mode}{suffix}", mode=mode, window=size,
                                                       batch_size=batch_size))
        if late_chunks is True or (late_chunks and name in late_chunks):
            retrievers.append(LateChunksRetriever(model, f"{name} late chunks {chunk_tokens}", chunk=chunk_tokens,
                                                  window=sizes[0], batch_size=batch_size))
    if bm25 or fuse:
        retrievers.append(BM25Retriever())
    return fused_retrievers(retrievers, fuse, fuse_weights)
