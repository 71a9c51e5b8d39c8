"""Landmarks as a retrieval index: search an `encode-corpus --output-value landmarks` folder.

Every landmark vector of every document goes into one FAISS inner-product index (unit vectors, so
inner product is cosine). A document scores its best landmark (max-sim, late interaction), and
each hit names the landmark and its character span, so a user sees the passage that matched.

Max-sim from a landmark index is exact with a flat index: the landmarks come back best first, and a
document's first landmark in that order is its best one, so the first k distinct documents are the
top k by max-sim. The search asks for more landmarks until k distinct documents are found (or every
landmark was seen). With `fuse` > 0 the score is `(1 - fuse) * max-sim + fuse * cos(query,
document vector)`: candidates come from both the landmark and the document index, then each is
scored exactly. FAISS was chosen by measurement (`python -m benchmarks.landmark_index`,
docs/corpus-encoding.md).

The index is a record: the shards hold each document's text, so a passage is cut from the text
that was encoded, wherever the search runs and whatever became of INPUT. Opening checks the
manifest, the shards and the query model against each other (`verify`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import verify
from .verify import SearchError


def require_faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("Searching landmarks needs faiss: pip install 'lmk-embed[search]' (faiss-cpu).") from None
    return faiss


@dataclass
class Hit:
    """One ranked document: its id, score, best landmark (index within the document) and that
    landmark's [start, end) characters in the document's text; `text` is the passage, when read."""

    id: object
    score: float
    landmark: int
    span: tuple[int, int]
    row: int
    text: str | None = None


def first_distinct_documents(search, owner: np.ndarray, wanted: int, total: int) -> dict[int, tuple[float, int]]:
    """{document: (score, landmark)} of the first `wanted` distinct documents in a landmark ranking.

    `search(k) -> (scores [k], landmark ids [k])` ranks the best k landmarks (any index: FAISS, usearch);
    `owner` [L] maps a landmark to its document. A document's first landmark is its best, so with an
    exact index these are the top documents by max-sim. The search asks for 4x more landmarks until
    `wanted` documents come back or all `total` landmarks were seen."""
    asked = max(4 * wanted, 64)
    while True:
        asked = min(asked, total)
        best: dict[int, tuple[float, int]] = {}
        for score, landmark in zip(*search(asked)):
            if landmark < 0:  # an approximate index may return fewer than asked
                continue
            document = int(owner[landmark])
            if document not in best:
                best[document] = (float(score), int(landmark))
                if len(best) == wanted:
                    return best
        if asked == total:
            return best
        asked *= 4


class LandmarkIndex:
    """The landmarks of a corpus in a FAISS index.

    vectors: float32 [L, D] unit landmark vectors, documents contiguous; owner [L]: each landmark's
    document (0..N-1); first [N]: each document's first landmark; spans int64 [L, 2];
    document_vectors float32 [N, D]; ids: the N document ids; texts: the N texts the spans index
    (None: hits get no passage). N may be 0 (an empty corpus searches to no hits). manifest: the
    folder's manifest.json, when read from one.
    """

    def __init__(self, ids: list, vectors: np.ndarray, owner: np.ndarray, spans: np.ndarray,
                 document_vectors: np.ndarray, folder: Path | None = None, texts: list[str] | None = None,
                 manifest: dict | None = None):
        faiss = require_faiss()
        self.ids, self.owner, self.spans, self.folder, self.texts = ids, owner, spans, folder, texts
        self.manifest = manifest
        self.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self.document_vectors = np.ascontiguousarray(document_vectors, dtype=np.float32)
        self.first = np.searchsorted(owner, np.arange(len(ids)))
        self.landmarks = faiss.IndexFlatIP(self.vectors.shape[1])
        self.landmarks.add(self.vectors)
        self.documents = faiss.IndexFlatIP(self.document_vectors.shape[1])
        self.documents.add(self.document_vectors)

    @classmethod
    def from_corpus(cls, folder) -> "LandmarkIndex":
        """Read every shard of a complete `encode-corpus --output-value landmarks` folder, each
        checked against the manifest (`verify`); a damaged index raises `SearchError`."""
        folder = Path(folder)
        manifest = verify.read_index_manifest(folder)
        dim = manifest["dimension"]
        ids, texts = [], []
        vectors, spans, owner, documents = [np.empty((0, dim), np.float32)], [np.empty((0, 2), np.int64)], \
            [np.empty(0, np.int64)], [np.empty((0, dim), np.float32)]  # an empty corpus is an empty index
        for record in verify.check_shard_list(folder, manifest):
            table = verify.read_shard(folder, record, dim)
            counts = np.diff(table.column("landmarks").combine_chunks().offsets.to_numpy())
            flat = table.column("landmarks").combine_chunks().flatten().flatten().to_numpy(zero_copy_only=False)
            vectors.append(flat.reshape(-1, dim).astype(np.float32))
            span_flat = table.column("landmark_spans").combine_chunks().flatten().flatten().to_numpy(zero_copy_only=False)
            spans.append(span_flat.reshape(-1, 2))
            owner.append(np.repeat(np.arange(len(ids), len(ids) + table.num_rows), counts))
            documents.append(table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
                             .reshape(-1, dim).astype(np.float32))
            ids += table.column("id").to_pylist()
            texts += table.column("text").to_pylist()
        return cls(ids, _unit(np.concatenate(vectors)), np.concatenate(owner), np.concatenate(spans),
                   _unit(np.concatenate(documents)), folder, texts, manifest)

    def _queries(self, queries: np.ndarray) -> np.ndarray:
        """[Q, D] unit float32 queries, their width checked against the index's."""
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if queries.ndim != 2 or queries.shape[1] != self.vectors.shape[1]:
            raise SearchError(f"query vectors of shape {list(queries.shape)} for an index of width "
                              f"{self.vectors.shape[1]}: embed queries with the model that encoded the corpus")
        return _unit(queries)

    def max_sim(self, queries: np.ndarray) -> np.ndarray:
        """Exact max-sim of every document, by a direct scan: queries [Q, D] -> [Q, N] (the reference)."""
        queries = self._queries(queries)
        if not self.ids:
            return np.zeros((len(queries), 0), dtype=np.float32)
        similarity = queries @ self.vectors.T
        return np.maximum.reduceat(similarity, self.first, axis=1)

    def search(self, queries: np.ndarray, top_k: int = 10, fuse: float = 0.0) -> list[list[Hit]]:
        """queries: [Q, D] query vectors -> per query its `top_k` documents, best first."""
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k <= 0:
            raise SearchError(f"`top_k` must be a positive integer, got {top_k!r}")
        if not 0.0 <= fuse <= 1.0:
            raise SearchError(f"`fuse` must be between 0 and 1, got {fuse!r}")
        queries = self._queries(queries)
        if not self.ids:
            return [[] for _ in queries]
        top_k = min(top_k, len(self.ids))
        return [self._search_one(query, top_k, fuse) for query in queries]

    def _best_landmarks(self, query: np.ndarray, wanted: int) -> dict[int, tuple[float, int]]:
        """{document: (max-sim, its best landmark)} of the first `wanted` distinct documents."""
        def search(asked: int):
            scores, found = self.landmarks.search(query[None], asked)
            return scores[0], found[0]

        return first_distinct_documents(search, self.owner, wanted, self.landmarks.ntotal)

    def _search_one(self, query: np.ndarray, top_k: int, fuse: float) -> list[Hit]:
        best = self._best_landmarks(query, top_k)
        if fuse > 0:
            _, found = self.documents.search(query[None], top_k)
            for document in found[0].tolist():
                if document not in best:  # exact max-sim of a candidate the landmark search did not reach
                    start, stop = self.first[document], self._stop(document)
                    similarity = self.vectors[start:stop] @ query
                    best[document] = (float(similarity.max()), int(start + similarity.argmax()))
        scored = []
        for document, (max_sim, landmark) in best.items():
            score = max_sim if fuse == 0 else (1 - fuse) * max_sim + fuse * float(self.document_vectors[document] @ query)
            scored.append((score, document, landmark))
        scored.sort(key=lambda item: -item[0])
        return [Hit(self.ids[d], s, int(landmark - self.first[d]), tuple(int(x) for x in self.spans[landmark]), d)
                for s, d, landmark in scored[:top_k]]

    def _stop(self, document: int) -> int:
        return int(self.first[document + 1]) if document + 1 < len(self.first) else len(self.owner)

    def passages(self, hits: list[Hit]) -> list[Hit]:
        """Fill each hit's `text` with its span of the document, from the text stored in the index."""
        if self.texts is None:
            raise SearchError("this index was built without its texts: give `texts` to show passages")
        for hit in hits:
            hit.text = self.texts[hit.row][hit.span[0]:hit.span[1]]
        return hits


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def search_corpus(folder, queries: list[str], top_k: int = 10, fuse: float = 0.0, model=None,
                  with_text: bool = True) -> list[list[Hit]]:
    """Search a landmark corpus with text queries, embedded with `encode_query`; each hit carries its passage.

    `model`: None (the model the manifest names), a folder or Hub id, each refused unless it is the
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
    identity = None
    if model is None or isinstance(model, (str, Path)):  # refused before any shard or weight is read
        identity = verify.query_model(verify.read_index_manifest(Path(folder)), Path(folder),
                                      None if model is None else str(model))
    index = LandmarkIndex.from_corpus(folder)
    if identity is not None:
        from .worker import load_model

        model = load_model(identity)
    results = index.search(np.asarray(model.encode_query(list(queries)), dtype=np.float32), top_k=top_k, fuse=fuse)
    return [index.passages(hits) for hits in results] if with_text else results


def format_hits(query: str, hits: list[Hit]) -> str:
    lines = [f"query: {query}"]
    for rank, hit in enumerate(hits, 1):
        passage = " ".join((hit.text or "").split())
        lines.append(f"{rank:>3}. {hit.score:.4f}  {json.dumps(hit.id)}  landmark {hit.landmark} "
                     f"[{hit.span[0]}:{hit.span[1]}]  {passage[:160]}")
    return "\n".join(lines)


__all__ = ["Hit", "SearchError", "LandmarkIndex", "first_distinct_documents", "format_hits", "search_corpus"]
