"""Which vector library holds the landmark index: FAISS (flat, HNSW) against usearch (HNSW), by build
time, query time and recall of the top documents against exact max-sim (a direct numpy scan).

    python -m benchmarks.landmark_index [--documents 2000 8000] [--landmarks 50] [--queries 200]

The corpus is synthetic but shaped like a landmark index: each document is a direction, and its
landmarks are unit vectors scattered around it (dimension 384, MiniLM's); a query is a noisy copy of
one landmark. Every index answers the same question the search answers: the top 10 documents by
their best landmark, found by asking for landmarks until 10 distinct documents come back. Prints,
per corpus size, each index's build and per-query time, its ratio to FAISS flat, and its recall@10.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lmk_embed_tools.corpus.search import first_distinct_documents

TOP_K = 10
DIM = 384


def corpus(documents: int, landmarks: int, queries: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((documents, DIM)).astype(np.float32)
    vectors = np.repeat(centers, landmarks, axis=0) + 1.2 * rng.standard_normal((documents * landmarks, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    owner = np.repeat(np.arange(documents), landmarks)
    picked = rng.integers(0, len(vectors), queries)
    query = vectors[picked] + 0.05 * rng.standard_normal((queries, DIM)).astype(np.float32)
    query /= np.linalg.norm(query, axis=1, keepdims=True)
    return vectors, owner, query


def build_faiss_flat(vectors):
    import faiss

    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    return lambda q, k: tuple(row[0] for row in index.search(q[None], k))


def build_faiss_hnsw(vectors):
    import faiss

    index = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 80
    index.add(vectors)
    index.hnsw.efSearch = 128
    return lambda q, k: tuple(row[0] for row in index.search(q[None], k))


def build_usearch(vectors):
    from usearch.index import Index

    index = Index(ndim=DIM, metric="ip", dtype="f32", connectivity=32, expansion_add=80, expansion_search=128)
    index.add(np.arange(len(vectors)), vectors)
    def search(q, k):
        found = index.search(q, k)
        return -found.distances, found.keys.astype(np.int64)  # ip distance: 1 - inner product

    return search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--landmarks", type=int, default=50, help="landmarks per document")
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    builders = {"faiss flat": build_faiss_flat, "faiss hnsw": build_faiss_hnsw, "usearch hnsw": build_usearch}
    for documents in args.documents:
        vectors, owner, queries = corpus(documents, args.landmarks, args.queries)
        starts = np.arange(0, len(vectors), args.landmarks)
        exact = np.maximum.reduceat(queries @ vectors.T, starts, axis=1)
        truth = [set(np.argsort(-row)[:TOP_K].tolist()) for row in exact]
        print(f"{documents} documents, {len(vectors)} landmarks, {args.queries} queries, top {TOP_K} documents:")
        rows = {}
        for name, build in builders.items():
            started = time.perf_counter()
            search = build(vectors)
            built = time.perf_counter() - started
            started = time.perf_counter()
            answers = [list(first_distinct_documents(lambda k, q=query: search(q, k), owner, TOP_K, len(vectors)))
                       for query in queries]
            per_query = (time.perf_counter() - started) / len(queries)
            recall = float(np.mean([len(truth[i] & set(a)) / TOP_K for i, a in enumerate(answers)]))
            rows[name] = (built, per_query, recall)
        flat = rows["faiss flat"]
        for name, (built, per_query, recall) in rows.items():
            print(f"  {name:<13} build {built:7.2f}s ({built / flat[0]:6.1f}x flat)  query {per_query * 1e3:7.2f} ms "
                  f"({per_query / flat[1]:5.2f}x flat)  recall@{TOP_K} {recall:.3f}", flush=True)


if __name__ == "__main__":
    main()
