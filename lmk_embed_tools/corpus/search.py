"""Landmarks as a retrieval index: search the LanceDB tables of `encode-corpus --output-value landmarks`.

A document scores its best landmark (max-sim, late interaction): LanceDB scores the `landmarks`
multivector column by max-sim over cosine, exactly (a flat scan) below `table.FLAT_LIMIT` landmark
vectors, and through an IVF index (IVF_SQ) with exact re-ranking above. Each returned document's score is
computed again here from its own landmark vectors, which also names the landmark and its character
span, so a user sees the passage that matched. With `fuse` > 0 the dense score is `(1 - fuse) *
max-sim + fuse * cos(query, document vector)`: candidates come from both the landmark and the
document-vector search, then each is scored exactly.

`lexical` is LanceDB's BM25 over the stored text (its native full-text index). `hybrid` runs both
legs at once and fuses them over the union of their candidates: min-max convex fusion by default
(BM25's share is the index's `hybrid_weight`, overridable per call), or reciprocal rank fusion,
with `fuse_scores`, the one fusion (the evaluation's fused rows import it; a candidate the BM25 leg
did not return scores 0 there, as every document without a query term does). `lmk-embed evaluate
--through-index` ranks a task's pages with this same search (`evaluation.indexed`).

The index is a record: the table holds each document's text, so a passage is cut from the text that
was encoded, wherever the search runs. Opening reads the record, the model identity and the table's
version (`verify`); the vectors are read by the queries that need them, never all at open.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import table as index_table
from . import verify
from .verify import SearchError

MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("minmax", "rank")
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al. 2009)
FUSION_DEPTH = 30  # how many documents each leg of a hybrid query reads (50 gave the same nDCG@10 for more reads)
_CANDIDATE_COLUMNS = ["row", "id", "embedding", "landmarks", "landmark_spans"]
# LanceDB adds its score column to a projection; naming it keeps the projection explicit.
_SCORE = _CANDIDATE_COLUMNS + ["_score"]


@dataclass
class Hit:
    """One ranked document: its id, score, best landmark (index within the document) and that
    landmark's [start, end) characters in the document's text; `row` its place in INPUT; `text` is
    the passage, when read."""

    id: object
    score: float
    landmark: int
    span: tuple[int, int]
    row: int
    text: str | None = None


def fuse_scores(dense: np.ndarray, sparse: np.ndarray, method: str, weight: float = 0.5, k: int = RRF_K) -> np.ndarray:
    """dense [Q, N] and sparse (BM25) [Q, N] scores of the same N candidates per query -> fused [Q, N] float32.

    minmax: `weight` * s + (1 - `weight`) * d, each side scaled to [0, 1] over the candidates (all
    equal: 0). rank: reciprocal rank fusion, 1 / (k + dense rank) + 1 / (k + sparse rank), ranks from
    1 and tied scores sharing the best rank (BM25 gives many candidates 0); `weight` is not used.
    The one fusion: a hybrid search fuses its candidates with it, and the evaluation's in-memory
    fused rows (`evaluation.retrievers.FusedRetriever`) fuse every page with it."""
    if dense.shape != sparse.shape or dense.ndim != 2:
        raise ValueError(f"dense and sparse scores must both be [Q, N], got {dense.shape} and {sparse.shape}")
    if method not in FUSIONS:
        raise ValueError(f"`method` must be one of {list(FUSIONS)}, got {method!r}")
    if method == "rank":
        def ranks(scores):
            ordered = np.sort(-scores, axis=1)
            return 1 + np.stack([np.searchsorted(row, -values, side="left") for row, values in zip(ordered, scores)])

        return (1.0 / (k + ranks(dense)) + 1.0 / (k + ranks(sparse))).astype(np.float32)

    def scaled(scores):
        low, high = scores.min(1, keepdims=True), scores.max(1, keepdims=True)
        return np.where(high > low, (scores - low) / np.where(high > low, high - low, 1), 0.0)

    return (weight * scaled(sparse) + (1 - weight) * scaled(dense)).astype(np.float32)


def check_search_options(top_k, fuse, mode, fusion, fuse_weight) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
        raise SearchError(f"`top_k` must be a positive integer, got {top_k!r}")
    for name, value in (("fuse", fuse), ("fuse_weight", fuse_weight)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0.0 <= value <= 1.0):
            raise SearchError(f"`{name}` must be between 0 and 1, got {value!r}")
    for name, value, choices in (("mode", mode, MODES), ("fusion", fusion, FUSIONS)):
        if value not in choices:
            raise SearchError(f"`{name}` must be one of {list(choices)}, got {value!r}")


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def _cosines(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """cos(each row of vectors [N, D], the unit `query` [D]) -> [N], without a normalised copy."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
    return (vectors @ query) / np.maximum(norms, 1e-12)


class Candidates:
    """Rows read from the table for one query, each scored exactly: max-sim, its best landmark,
    cos(query, document vector), and BM25 where the lexical leg returned it."""

    def __init__(self, query: np.ndarray):
        self.query, self.rows = query, {}

    def add(self, table, bm25: bool = False) -> None:
        rows, ids = table["row"].to_pylist(), table["id"].to_pylist()
        landmarks = table["landmarks"].combine_chunks()
        bounds = landmarks.offsets.to_numpy()
        bounds = bounds - bounds[0]  # a sliced list array keeps its parent's offsets; flatten() does not
        similarity = _cosines(landmarks.flatten().flatten().to_numpy(zero_copy_only=False)
                              .reshape(-1, self.query.shape[0]), self.query)
        spans = table["landmark_spans"].combine_chunks().flatten().flatten().to_numpy(zero_copy_only=False).reshape(-1, 2)
        documents = _cosines(table["embedding"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
                             .reshape(-1, self.query.shape[0]), self.query)
        scores = table["_score"].to_pylist() if bm25 else None
        for i, row in enumerate(rows):
            if row not in self.rows:
                start, stop = int(bounds[i]), int(bounds[i + 1])
                best = start + int(np.argmax(similarity[start:stop])) if stop > start else None
                self.rows[row] = {
                    "id": ids[i], "max_sim": float(similarity[best]) if best is not None else 0.0,
                    "landmark": best - start if best is not None else 0,
                    "span": tuple(spans[best]) if best is not None else (0, 0),
                    "cosine": float(documents[i]), "bm25": 0.0}
            if bm25:
                self.rows[row]["bm25"] = float(scores[i])

    def dense(self, fuse: float) -> dict[int, float]:
        return {row: (1 - fuse) * c["max_sim"] + fuse * c["cosine"] if fuse else c["max_sim"]
                for row, c in self.rows.items()}

    def hits(self, scores: dict[int, float], top_k: int) -> list[Hit]:
        ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        return [Hit(self.rows[row]["id"], float(score), self.rows[row]["landmark"],
                    tuple(int(x) for x in self.rows[row]["span"]), int(row)) for row, score in ranked]


class LandmarkIndex:
    """An opened landmark index: its record and its `documents` table, at the version it was
    finished at. `search` embeds nothing: give query vectors (and the query texts for lexical or
    hybrid search)."""

    def __init__(self, folder, record: dict, documents):
        self.folder, self.record, self.documents = Path(folder), record, documents
        self.dimension = int(record["dimension"])
        self.rows = int(record["rows"])
        self.hybrid_weight = float(record.get("hybrid_weight", index_table.DEFAULT_HYBRID_WEIGHT))
        self.vector_index = record.get("vector_index")
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="lexical")  # hybrids' BM25 legs

    @classmethod
    def from_corpus(cls, folder) -> "LandmarkIndex":
        """Open a complete index (`verify.open_documents`); a damaged one raises `SearchError`."""
        record = verify.read_index_manifest(Path(folder))
        return cls(folder, record, verify.open_documents(Path(folder), record))

    def _queries(self, queries: np.ndarray) -> np.ndarray:
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if queries.ndim != 2 or queries.shape[1] != self.dimension:
            raise SearchError(f"query vectors of shape {list(queries.shape)} for an index of width "
                              f"{self.dimension}: embed queries with the model that encoded the corpus")
        return _unit(queries)

    def search(self, queries: np.ndarray, top_k: int = 10, fuse: float = 0.0, mode: str = "dense",
               texts: list[str] | None = None, fusion: str = "minmax", fuse_weight: float | None = None
               ) -> list[list[Hit]]:
        """queries: [Q, D] query vectors (and `texts`, the Q query texts, for lexical and hybrid)
        -> per query its `top_k` documents, best first. `fuse_weight`: BM25's share in min-max
        fusion (None: the index's `hybrid_weight`)."""
        check_search_options(top_k, fuse, mode, fusion, fuse_weight)
        queries = self._queries(queries)
        if mode != "dense" and (texts is None or len(texts) != len(queries)):
            raise SearchError(f"`texts` must give the {len(queries)} query texts for mode {mode!r}")
        if not self.rows:
            return [[] for _ in queries]
        weight = self.hybrid_weight if fuse_weight is None else float(fuse_weight)
        return [self._search_one(query, top_k, fuse, mode, None if texts is None else texts[number], fusion, weight)
                for number, query in enumerate(queries)]

    def _search_one(self, query, top_k, fuse, mode, text, fusion, weight) -> list[Hit]:
        candidates = Candidates(query)
        if mode == "dense":
            for table in self._dense_legs(query, top_k, fuse):
                candidates.add(table)
            return candidates.hits(candidates.dense(fuse), top_k)
        if mode == "lexical":
            candidates.add(self._read(self._lexical(text, top_k, _SCORE)), bm25=True)
            return candidates.hits({row: c["bm25"] for row, c in candidates.rows.items()}, top_k)
        depth = max(top_k, FUSION_DEPTH)
        # Both legs at once, as LanceDB's hybrid runs them. The BM25 leg, the faster, reads its candidates'
        # vectors itself while the landmark leg runs; afterwards only the dense leg's other candidates are
        # read (by `row`, indexed). Every candidate is scored exactly here, from its own vectors.
        lexical = self._pool.submit(self._read, self._lexical(text, depth, _SCORE))
        found = [self._read(self._landmark_query(query, depth, refine=False, columns=["row"]))]
        if fuse:
            found.append(self._read(self._document_query(query, depth, ["row"])))
        candidates.add(lexical.result(), bm25=True)
        rows = sorted({row for table in found for row in table["row"].to_pylist()} - set(candidates.rows))
        if rows:
            candidates.add(self._read(self.documents.search().where(f"row IN ({', '.join(map(str, rows))})")
                                      .select(_CANDIDATE_COLUMNS).limit(len(rows))))
        rows = list(candidates.rows)
        dense = candidates.dense(fuse)
        fused = fuse_scores(np.array([[dense[row] for row in rows]]),
                            np.array([[candidates.rows[row]["bm25"] for row in rows]]), fusion, weight)[0]
        return candidates.hits(dict(zip(rows, fused.tolist())), top_k)

    def _dense_legs(self, query: np.ndarray, depth: int, fuse: float):
        legs = [self._landmark_query(query, depth)]
        if fuse:
            legs.append(self._document_query(query, depth, _CANDIDATE_COLUMNS))
        return [self._read(leg) for leg in legs]

    def _landmark_query(self, query: np.ndarray, depth: int, refine: bool = True, columns=_CANDIDATE_COLUMNS):
        """The `depth` documents of the best landmarks, with `columns` (LanceDB adds `_distance`)."""
        builder = self.documents.search(query, vector_column_name="landmarks").distance_type("cosine").limit(depth)
        if self.vector_index:
            builder = builder.nprobes(self.vector_index["nprobes"])
            if refine:  # the exact order of the top `depth`; a hybrid's candidates are all re-scored anyway
                builder = builder.refine_factor(self.vector_index["refine_factor"])
        return builder.select(list(columns) + ["_distance"])

    def _document_query(self, query: np.ndarray, depth: int, columns):
        return (self.documents.search(query, vector_column_name="embedding").distance_type("cosine").limit(depth)
                .select(list(columns) + ["_distance"]))

    def _lexical(self, text: str, depth: int, columns=("row", "_score")):
        return self.documents.search(text, query_type="fts", fts_columns="text").limit(depth).select(list(columns))

    def _read(self, builder):
        try:
            return builder.to_arrow()
        except Exception as error:  # Lance's IO and format errors: a data file missing, cut or replaced
            raise SearchError(f"{self.folder}: cannot read the index's table ({_lance_message(error)}); it was damaged "
                              "after encoding: encode the corpus again") from None

    def max_sim(self, queries: np.ndarray) -> np.ndarray:
        """Exact max-sim of every document, by a direct scan of every row: queries [Q, D] -> [Q, N]
        in input order (the reference the tests and the benchmark compare with; it reads every vector)."""
        queries = self._queries(queries)
        scores = np.zeros((len(queries), self.rows), dtype=np.float32)
        for batch in self._read(self.documents.search().select(["row", "landmarks"]).limit(None)).to_batches():
            for row, landmarks in zip(batch["row"].to_pylist(), batch["landmarks"].to_pylist()):
                vectors = _unit(np.asarray(landmarks, dtype=np.float32).reshape(-1, self.dimension))
                scores[:, row] = (queries @ vectors.T).max(1) if len(vectors) else 0.0
        return scores

    def passages(self, hits: list[Hit]) -> list[Hit]:
        """Fill each hit's `text` with its span of the document, from the text stored in the index."""
        if not hits:
            return hits
        rows = ", ".join(str(hit.row) for hit in hits)
        table = self._read(self.documents.search().where(f"row IN ({rows})").select(["row", "text"]).limit(len(hits)))
        texts = dict(zip(table["row"].to_pylist(), table["text"].to_pylist()))
        for hit in hits:
            hit.text = texts[hit.row][hit.span[0]:hit.span[1]]
        return hits


def _lance_message(error: Exception) -> str:
    """Lance's error on one line, without the Rust source locations it appends."""
    return re.sub(r",? /\S+\.rs:\d+:\d+", "", " ".join(str(error).split()))[:240]


def search_corpus(folder, queries: list[str], top_k: int = 10, fuse: float = 0.0, model=None,
                  with_text: bool = True, mode: str = "dense", fusion: str = "minmax",
                  fuse_weight: float | None = None) -> list[list[Hit]]:
    """Search a landmark index with text queries, embedded with `encode_query`; each hit carries its passage.

    `model`: None (the model the index names), a folder or Hub id, each refused unless it is the
    model that encoded the corpus (`verify.query_model`); or an already loaded model, trusted to be
    that model (only its width is checked).
    """
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)) or not queries:
        raise SearchError(f"`queries` must be a non-empty list of strings, got {queries!r:.80}")
    for number, query in enumerate(queries, 1):
        if not isinstance(query, str):
            raise SearchError(f"query {number} must be a string, got {type(query).__name__}")
        if not query.strip():  # it would embed as the bare prompt and "match" some document
            raise SearchError(f"query {number} is empty or blank: give text to search for")
    check_search_options(top_k, fuse, mode, fusion, fuse_weight)
    identity = None
    if model is None or isinstance(model, (str, Path)):  # refused before any vector or weight is read
        identity = verify.query_model(verify.read_index_manifest(Path(folder)), Path(folder),
                                      None if model is None else str(model))
    index = LandmarkIndex.from_corpus(folder)
    if identity is not None:
        from lmk_embed_tools import quiet_model_loading

        from .worker import load_model

        with quiet_model_loading():  # a refusal of a damaged table must be the only line printed
            model = load_model(identity)
    vectors = np.asarray(model.encode_query(list(queries)), dtype=np.float32)
    results = index.search(vectors, top_k=top_k, fuse=fuse, mode=mode, texts=list(queries), fusion=fusion,
                           fuse_weight=fuse_weight)
    return [index.passages(hits) for hits in results] if with_text else results


def format_hits(query: str, hits: list[Hit]) -> str:
    lines = [f"query: {query}"]
    for rank, hit in enumerate(hits, 1):
        passage = " ".join((hit.text or "").split())
        lines.append(f"{rank:>3}. {hit.score:.4f}  {json.dumps(hit.id)}  landmark {hit.landmark} "
                     f"[{hit.span[0]}:{hit.span[1]}]  {passage[:160]}")
    return "\n".join(lines)


__all__ = ["FUSIONS", "Hit", "LandmarkIndex", "MODES", "SearchError", "format_hits", "fuse_scores", "search_corpus"]
