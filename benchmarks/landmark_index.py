"""The landmark index on real landmark vectors: FAISS flat in memory (the index before LanceDB)
against LanceDB flat and LanceDB with its IVF index (IVF_SQ by default), side by side in one run.

    python -m benchmarks.landmark_index [--encode-seconds 300] [--sizes 100000 1000000] [--queries 100]
    python -m benchmarks.landmark_index --sizes 10000000 --probe-queries 30 --nprobes 64 128   (10M: no FAISS)
    python -m benchmarks.landmark_index --sizes 1000000 --float16 --faiss-max 0   (float32 and float16 side by side)

Real vectors: MiniLM-LMK (all-MiniLM-L6-v2 converted with g=32, windows of 256 tokens, as
docs/long-inputs.md recommends for an index) encodes whole pydoc pages of the standard library
and of the installed packages (never the man pages, never an evaluation task's pages) for about
`--encode-seconds`. Queries are those modules' synopsis lines, embedded as queries.

Grown to each size: document j beyond the real ones copies real document j mod R (its text and
its landmark count), each landmark moved by Gaussian noise of the measured spread (sigma per
dimension = the RMS distance of a real landmark from its own document's mean landmark, over sqrt(D);
a seeded draw per document) and renormalised; its document vector is the mean of its landmarks.
The vectors are drawn in groups of 2,000 documents, written to every index and scanned for the exact
answers group by group, so no size needs all of them in memory; FAISS flat, which does, runs up to
`--faiss-max` landmarks.

Per size and index, each in a fresh process (so RSS is its own): build time (FAISS: loading the
vectors and adding them; LanceDB: writing the tables and their indexes through the corpus code),
disk size, RSS after open and peak RSS while querying, per-query latency p50/p99 alone (a first pass
over the queries, which reads from disk what the page cache lacks, then the timed second pass) and with 16
concurrent queries, recall@10 of documents against exact max-sim (a numpy scan), and for LanceDB the
hybrid (max-sim + BM25 in one query) latency over dense. With --float16 the same vectors are also
stored as float16 (`encode-corpus --dtype float16`) in a second indexed table, probed the same way,
and its hybrid top 10 is compared with float32's query by query. Prints the table and saves
benchmarks/results/landmark_index.json; the CPU and its flags head the output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import save_results

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "runs" / "landmark_index"
TOP_K = 10


def cpu_line() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    simd = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    return f"{name}; {os.cpu_count()} CPUs; {' '.join(simd)}"


# ---- real landmark vectors ----------------------------------------------------------------------

def module_pages(limit_chars: int = 12_000):
    """(name, synopsis, pydoc page) of the stdlib's public modules, then of installed packages' top
    modules; pages cut to `limit_chars` characters (about 3,000 tokens, 100 landmarks at g=32)."""
    import importlib
    import pkgutil
    import pydoc
    import warnings

    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in ("antigravity", "this"))
    names += sorted({m.name for m in pkgutil.iter_modules() if not m.name.startswith("_") and m.ispkg})
    seen = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
            page = pydoc.render_doc(module, renderer=pydoc.plaintext)
        except BaseException:  # a module that cannot be imported here (platform, missing extras)
            continue
        synopsis = pydoc.splitdoc(module.__doc__ or "")[0].strip()
        if len(page) > 2000:
            yield name, synopsis, page[:limit_chars]


def real_vectors(seconds: float, queries: int, threads: int) -> dict:
    """Encode pages for about `seconds`; cached in runs/landmark_index/real.npz."""
    cache = WORK / "real.npz"
    if cache.exists():
        data = np.load(cache, allow_pickle=True)
        return {key: data[key] for key in data.files}
    import torch

    from lmk_embed_tools.training.convert import convert_to_lmk
    from tests.helpers import minilm_path

    torch.set_num_threads(threads)
    folder = WORK / "minilm-lmk"
    if not folder.exists():
        convert_to_lmk(minilm_path(), folder, granularity=32, long_input="windows", window_length=256)
    from lmk_embed import LMKModel

    model = LMKModel.from_pretrained(folder).eval()
    texts, synopses, landmarks, spans = [], [], [], []
    started = encode_seconds = time.perf_counter()
    for name, synopsis, page in module_pages():
        if synopsis and len(synopsis.split()) >= 3:  # every module's synopsis is a query, encoded or not
            synopses.append(synopsis)
        if time.perf_counter() - started > seconds:
            if len(synopses) >= queries:
                break
            continue
        item = model.encode([page], output_value="landmarks", show_progress_bar=False)[0]
        texts.append(page)
        landmarks.append(np.asarray(item["embeddings"], dtype=np.float32))
        spans.append(np.asarray(item["spans"], dtype=np.int64))
        encode_seconds = time.perf_counter() - started
    asked = synopses[:: max(1, len(synopses) // queries)][:queries]
    query_vectors = np.asarray(model.encode_query(asked, show_progress_bar=False), dtype=np.float32)
    counts = np.array([len(v) for v in landmarks])
    data = {"landmarks": np.concatenate(landmarks), "counts": counts, "spans": np.concatenate(spans),
            "texts": np.array(texts, dtype=object), "queries": query_vectors, "query_texts": np.array(asked, dtype=object),
            "encode_seconds": np.array(encode_seconds)}
    WORK.mkdir(parents=True, exist_ok=True)
    np.savez(cache, **data)
    return data


def spread(landmarks: np.ndarray, counts: np.ndarray) -> float:
    """Per-dimension sigma: the RMS distance of a landmark from its document's mean landmark, / sqrt(D)."""
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    means = np.add.reduceat(landmarks, starts, axis=0) / counts[:, None]
    deviations = landmarks - np.repeat(means, counts, axis=0)
    return float(np.sqrt((deviations ** 2).sum(1).mean() / landmarks.shape[1]))


def grown(real: dict, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(landmark counts, template of each document) of the real documents, then copies of them, until
    `size` landmarks; the vectors are drawn group by group (`document_groups`), never all at once."""
    counts, templates, total, j = [], [], 0, 0
    while total < size:
        t = j % len(real["counts"])
        counts.append(int(real["counts"][t]))
        templates.append(t)
        total += counts[-1]
        j += 1
    return np.array(counts), np.array(templates)


def document_groups(real: dict, templates: np.ndarray, sigma: float, group: int = 2000, seed: int = 0):
    """(first, last, [landmarks [n_d, D] of documents first..last-1]) in groups of `group` documents:
    document j is real document templates[j], past the real ones moved by Gaussian noise of `sigma` a
    dimension (its own seeded draw) and renormalised."""
    starts = np.concatenate([[0], np.cumsum(real["counts"])])
    for first in range(0, len(templates), group):
        last = min(first + group, len(templates))
        blocks = []
        for j in range(first, last):
            t = templates[j]
            block = real["landmarks"][starts[t] : starts[t + 1]].astype(np.float32)
            if j >= len(real["counts"]):
                rng = np.random.default_rng((seed, j))
                block = block + sigma * rng.standard_normal(block.shape, dtype=np.float32)
                block /= np.linalg.norm(block, axis=1, keepdims=True)
            blocks.append(block)
        yield first, last, blocks


def max_sim(queries: np.ndarray, blocks: list[np.ndarray]) -> np.ndarray:
    """[Q, len(blocks)] exact max-sim of each document (a numpy scan)."""
    counts = np.array([len(block) for block in blocks])
    scores = queries @ np.concatenate(blocks).T
    return np.maximum.reduceat(scores, np.concatenate([[0], np.cumsum(counts)[:-1]]), axis=1)


# ---- building -----------------------------------------------------------------------------------

class LanceDBWriter:
    """The corpus code's tables (`corpus.table`), one shard a group of documents; `close` builds the
    full-text index and, with `vector_index`, the vector index."""

    def __init__(self, folder: Path, documents: int, dimension: int, vector_index: str | None, dtype: str = "float32"):
        import pyarrow as pa

        from lmk_embed_tools.corpus import table

        self.table, self.folder, self.vector_index, self.seconds, self.shards = table, folder, vector_index, 0.0, 0
        self.dtype = dtype
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        started = time.perf_counter()
        self.record = {"format": table.FORMAT, "model": {"source": "benchmark"}, "settings": {"model": {}},
                       "input": {"rows": documents}, "dimension": dimension, "hybrid_weight": 0.5, "complete": False}
        table.create(folder, self.record, dimension, dtype, pa.string())
        self.seconds += time.perf_counter() - started

    def add(self, first: int, last: int, blocks: list[np.ndarray], templates: np.ndarray, real: dict) -> None:
        import pyarrow as pa

        started = time.perf_counter()
        real_starts = np.concatenate([[0], np.cumsum(real["counts"])])
        items = [{"embeddings": block, "spans": real["spans"][real_starts[templates[d]] : real_starts[templates[d] + 1]]}
                 for d, block in zip(range(first, last), blocks)]
        documents = np.stack([block.mean(0) for block in blocks])
        documents /= np.linalg.norm(documents, axis=1, keepdims=True)
        shard = {"index": self.shards, "start": first, "stop": last}
        self.shards += 1
        rows = self.table.shard_rows(shard, [f"d{d}" for d in range(first, last)],
                                     [str(real["texts"][templates[d]]) for d in range(first, last)],
                                     documents, items, self.dtype, pa.string())
        self.table.write_shard(self.folder, shard, rows, {"truncated": 0, "empty": 0, "tokens": 0})
        self.seconds += time.perf_counter() - started

    def close(self) -> float:
        started = time.perf_counter()
        self.table.finish(self.folder, self.record, flat_limit=0 if self.vector_index else float("inf"),
                          index_type=self.vector_index)
        return self.seconds + time.perf_counter() - started


def disk_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


# ---- querying, in a fresh process ---------------------------------------------------------------

def faiss_searcher(folder: Path):
    import faiss

    vectors = np.load(folder / "landmarks.npy")
    counts = np.load(folder / "counts.npy")
    owner = np.repeat(np.arange(len(counts)), counts)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    del vectors

    def search(query, text=None, hybrid=False):
        asked = 64
        while True:  # landmarks best first; a document's first landmark is its best: grow until 10 documents
            _, found = index.search(query[None], min(asked, index.ntotal))
            documents = list(dict.fromkeys(owner[found[0][found[0] >= 0]].tolist()))
            if len(documents) >= TOP_K or asked >= index.ntotal:
                return documents[:TOP_K]
            asked *= 4

    return search


def lancedb_searcher(folder: Path, nprobes: int | None = None):
    from lmk_embed_tools.corpus.search import LandmarkIndex

    index = LandmarkIndex.from_corpus(folder)
    if nprobes and index.vector_index:
        index.vector_index = {**index.vector_index, "nprobes": nprobes}

    def search(query, text=None, hybrid=False):
        hits = index.search(query[None], top_k=TOP_K, mode="hybrid" if hybrid else "dense", texts=[text])[0]
        return [int(hit.row) for hit in hits]

    return search


def timed(search, queries, texts, hybrid=False, workers=1):
    from concurrent.futures import ThreadPoolExecutor

    def one(i):
        started = time.perf_counter()
        answer = search(queries[i], texts[i], hybrid)
        return answer, time.perf_counter() - started

    if workers == 1:
        results = [one(i) for i in range(len(queries))]
    else:
        with ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(one, range(len(queries))))
    latencies = np.array([seconds for _, seconds in results]) * 1e3
    return [answer for answer, _ in results], {"p50_ms": float(np.percentile(latencies, 50)),
                                                "p99_ms": float(np.percentile(latencies, 99))}


def probe(system: str, folder: Path, queries_file: Path, nprobes: int | None) -> dict:
    from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb

    data = np.load(queries_file, allow_pickle=True)
    queries, texts = data["queries"], [str(t) for t in data["query_texts"]]
    if system == "faiss flat":  # imports are not the open's cost
        import faiss  # noqa: F401
    else:
        import lancedb  # noqa: F401  (the corpus code imports it lazily, at the first open)

        import lmk_embed_tools.corpus.search  # noqa: F401
    before = rss_mb()
    started = time.perf_counter()
    search = faiss_searcher(folder) if system == "faiss flat" else lancedb_searcher(folder, nprobes)
    result = {"open_s": time.perf_counter() - started, "rss_open_mb": rss_mb(), "rss_open_rise_mb": rss_mb() - before}
    reset_peak_rss()
    # A table larger than the page cache answers a query's first touch from disk: the first pass is
    # reported apart, and every mode is timed on its second pass (the same pages, warm).
    _, result["first_pass"] = timed(search, queries, texts)
    answers, result["single"] = timed(search, queries, texts)
    _, result["concurrent16"] = timed(search, queries, texts, workers=16)
    if system != "faiss flat":
        timed(search, queries, texts, hybrid=True)
        result["hybrid_answers"], result["hybrid"] = timed(search, queries, texts, hybrid=True)
    result["rss_peak_mb"] = peak_rss_mb()
    result["answers"] = answers
    return result


def run_probe(system: str, folder: Path, queries_file: Path, threads: int, nprobes: int | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "benchmarks.landmark_index", "--probe", system, str(folder), str(queries_file),
               str(nprobes or 0)]
    output = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if output.returncode:
        raise RuntimeError(f"{system} probe failed: {output.stderr[-2000:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])


# ---- the run ------------------------------------------------------------------------------------

def measure_size(size: int, real: dict, sigma: float, args) -> dict:
    counts, templates = grown(real, size)
    queries = real["queries"][: args.probe_queries]
    folder = WORK / f"n{size}"
    faiss_folder = folder / "faiss"
    faiss_folder.mkdir(parents=True, exist_ok=True)
    queries_file = folder / "queries.npz"
    np.savez(queries_file, queries=queries, query_texts=real["query_texts"][: args.probe_queries])
    systems = {"faiss flat": faiss_folder, "lancedb flat": folder / "flat", "lancedb indexed": folder / "indexed"}
    dimension = real["landmarks"].shape[1]
    writers = {"lancedb indexed": LanceDBWriter(folder / "indexed", len(counts), dimension, args.index_type)}
    if args.float16:  # the same vectors stored as float16 (`encode-corpus --dtype float16`)
        systems["lancedb indexed float16"] = folder / "indexed-float16"
        writers["lancedb indexed float16"] = LanceDBWriter(folder / "indexed-float16", len(counts), dimension,
                                                           args.index_type, "float16")
    if size <= args.lancedb_flat_max:  # its scan grows linearly (670 ms a query at 100k here): left out above
        writers["lancedb flat"] = LanceDBWriter(folder / "flat", len(counts), dimension, None)
    else:
        systems.pop("lancedb flat")
    vectors = None
    if size <= args.faiss_max:  # FAISS flat holds every vector in memory: 1.5 GB a million
        vectors = np.lib.format.open_memmap(faiss_folder / "landmarks.npy", mode="w+", dtype=np.float32,
                                            shape=(int(counts.sum()), dimension))
        np.save(faiss_folder / "counts.npy", counts)
    else:
        systems.pop("faiss flat")
    best, written = np.empty((len(queries), len(counts)), dtype=np.float32), 0
    for first, last, blocks in document_groups(real, templates, sigma):
        best[:, first:last] = max_sim(queries, blocks)
        for writer in writers.values():
            writer.add(first, last, blocks, templates, real)
        if vectors is not None:
            block = np.concatenate(blocks)
            vectors[written : written + len(block)] = block
            written += len(block)
    truth = np.argsort(-best, axis=1)[:, :TOP_K]
    if vectors is not None:
        vectors.flush()
        del vectors
    builds = {system: writer.close() for system, writer in writers.items()}
    rows = {}
    for system, path in systems.items():
        result = run_probe(system, path, queries_file, args.threads)
        result["build_s"] = result["open_s"] if system == "faiss flat" else builds[system]
        result["disk_mb"] = disk_mb(path)
        result["recall@10"] = float(np.mean([len(set(a) & set(t.tolist())) / TOP_K
                                             for a, t in zip(result.pop("answers"), truth)]))
        rows[system] = result
        if system == "lancedb indexed float16":  # the hybrid's top 10 against float32's, query by query
            result["hybrid_overlap@10"] = float(np.mean([len(set(a) & set(b)) / TOP_K for a, b in zip(
                result["hybrid_answers"], rows["lancedb indexed"]["hybrid_answers"])]))
        print(f"  {size:>10,} {system:<15} build {result['build_s']:7.1f} s  disk {result['disk_mb']:8.0f} MB  "
              f"open {result['open_s']:6.2f} s  RSS open {result['rss_open_mb']:6.0f} MB  peak {result['rss_peak_mb']:6.0f} MB  "
              f"first pass p50/p99 {result['first_pass']['p50_ms']:7.1f}/{result['first_pass']['p99_ms']:7.1f} ms  "
              f"p50/p99 {result['single']['p50_ms']:7.1f}/{result['single']['p99_ms']:7.1f} ms  "
              f"16 conc. {result['concurrent16']['p50_ms']:7.1f}/{result['concurrent16']['p99_ms']:7.1f} ms  "
              f"recall@10 {result['recall@10']:.3f}"
              + (f"  hybrid p50 {result['hybrid']['p50_ms']:.1f} ms ({result['hybrid']['p50_ms'] / result['single']['p50_ms']:.2f}x dense)"
                 if "hybrid" in result else "")
              + (f"  hybrid top-10 overlap with float32 {result['hybrid_overlap@10']:.3f}"
                 if "hybrid_overlap@10" in result else ""), flush=True)
    for result in rows.values():  # per-query answers are compared above, never saved
        result.pop("hybrid_answers", None)
    if args.nprobes:
        for nprobes in args.nprobes:
            result = run_probe("lancedb indexed", folder / "indexed", queries_file, args.threads, nprobes)
            recall = float(np.mean([len(set(a) & set(t.tolist())) / TOP_K for a, t in zip(result.pop("answers"), truth)]))
            result.pop("hybrid_answers", None)
            rows[f"lancedb indexed nprobes={nprobes}"] = {**result, "recall@10": recall}
            print(f"  {size:>10,} indexed nprobes={nprobes:<4} p50/p99 {result['single']['p50_ms']:7.1f}/"
                  f"{result['single']['p99_ms']:7.1f} ms  recall@10 {recall:.3f}", flush=True)
    for system in [name for name in rows if name.startswith("lancedb") and "faiss flat" in rows]:
        flat = rows["faiss flat"]["single"]["p50_ms"]
        print(f"  ratio: {system} / faiss flat, p50 {rows[system]['single']['p50_ms'] / flat:.3f}x", flush=True)
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return {"documents": int(len(counts)), "landmarks": int(counts.sum()), "systems": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encode-seconds", type=float, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--index-type", default="IVF_SQ", choices=["IVF_PQ", "IVF_SQ", "IVF_FLAT"])
    parser.add_argument("--nprobes", type=int, nargs="*", default=[], help="also query the index with these nprobes")
    parser.add_argument("--lancedb-flat-max", type=int, default=200_000,
                        help="largest size at which LanceDB flat runs (its scan is linear in the size)")
    parser.add_argument("--faiss-max", type=int, default=2_000_000,
                        help="largest size at which FAISS flat runs (it holds every vector: 1.5 GB a million)")
    parser.add_argument("--probe-queries", type=int, default=100, help="queries each probe times")
    parser.add_argument("--float16", action="store_true",
                        help="also store the vectors as float16 in a second indexed table, probed the same way")
    parser.add_argument("--keep", action="store_true", help="keep the tables under runs/landmark_index")
    parser.add_argument("--probe", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        system, folder, queries, nprobes = args.probe
        print(json.dumps(probe(system, Path(folder), Path(queries), int(nprobes) or None)))
        return
    print(cpu_line(), flush=True)
    real = real_vectors(args.encode_seconds, args.queries, args.threads)
    sigma = spread(real["landmarks"], real["counts"])
    print(f"real: {len(real['counts'])} pages, {len(real['landmarks']):,} landmarks ({real['landmarks'].shape[1]}-dim, "
          f"{real['counts'].mean():.0f} a page), encoded in {float(real['encode_seconds']):.0f} s; "
          f"{len(real['queries'])} queries; noise sigma {sigma:.4f} a dimension", flush=True)
    results = {"cpu": cpu_line(), "real_pages": int(len(real["counts"])), "real_landmarks": int(len(real["landmarks"])),
               "sigma": sigma, "sizes": {}}
    for size in args.sizes:
        results["sizes"][str(size)] = measure_size(size, real, sigma, args)
        save_results("landmark_index", results)


if __name__ == "__main__":
    main()
