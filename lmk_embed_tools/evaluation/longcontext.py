"""The long-context runner behind `lmk-embed evaluate`: every retriever on every task at every length.

A *job* is (task name, max length, data), where data has mteb-style `queries`, `documents` and
`relevant` dicts: a synthetic task generated for that length (passkey, needle), or one fixed corpus
(a BEIR folder, the stdlib docs, an mteb task) read with a growing truncation length. Corpus
vectors go through the on-disk cache; metrics come from mteb's scorer (`metrics.score_run`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from lmk_embed_tools.retrieval_data import RetrievalData

from .cache import EmbeddingCache
from .metrics import METRICS, score_run, top_k_run

OUR_MODEL_TYPES = ("lmk_embedder", "recurrent_embedder")
POOLED = "all tasks, pooled"  # the task of a comparison made over every task's queries together


def evaluate_jobs(retrievers: list, jobs: list[tuple[str, int, object]], cache_dir=None, progress: bool = True,
                  per_query: bool = False) -> list[dict]:
    """One row per (retriever, job): {"model", "split", "max_length", "effective_max_length", the
    five METRICS, "vectors_per_document" (the index size), "search_seconds" (scoring and ranking
    every query against the encoded corpus: the cost of multi-vector against single-vector)}. With
    `per_query=True` a row also holds "per_query": {metric: {query id: value}}, each query scored
    alone by mteb's scorer (for `table.compare`'s paired intervals)."""
    from tqdm.auto import tqdm

    cache = EmbeddingCache(cache_dir)
    rows = []
    pairs = [(r, job) for job in jobs for r in retrievers]
    for retriever, (task, length, data) in tqdm(pairs, desc="Evaluating", unit="run", disable=not progress):
        query_ids = list(data.queries)
        scores = retriever.scores([data.queries[q] for q in query_ids], data.documents, length, cache)
        started = time.perf_counter()  # search cost = similarity (timed by the retriever) + ranking, no encoding
        run = top_k_run(scores, query_ids, list(data.documents))
        search_seconds = getattr(retriever, "scoring_seconds", 0.0) + time.perf_counter() - started
        metrics = score_run(run, {q: data.relevant[q] for q in query_ids})
        rows.append({
            "model": retriever.name, "split": task, "max_length": length,
            "effective_max_length": retriever.effective_length(length),
            **{m: metrics[m] for m in METRICS},
            "vectors_per_document": getattr(retriever, "vectors_per_document", None) or 1.0,
            "search_seconds": search_seconds,
        })
        if per_query:
            alone = {q: score_run({q: run[q]}, {q: data.relevant[q]}) for q in query_ids}
            rows[-1]["per_query"] = {m: {q: alone[q][m] for q in query_ids} for m in METRICS}
    if progress and cache.folder is not None:
        print(f"corpus-embedding cache: {cache.hits} hits, {cache.misses} misses ({cache.folder})")
    return rows


def paired_comparisons(rows: list[dict], pairs) -> list[dict]:
    """For each ((name, length), (rival, rival length)) in `pairs`, on every task of `rows` (rows of
    `evaluate_jobs(..., per_query=True)`): {"task", "row", "rival", "metric", "difference", "low",
    "high"}, the nDCG@10 difference and its 95% paired bootstrap interval, as `table.compare` gives it.

    A pair found on two tasks or more also gets one entry with task POOLED: the same bootstrap over
    all those tasks' queries together (more queries, a narrower interval than any one task's)."""
    from .table import paired_bootstrap, paired_scores

    found = {(r["model"], r["max_length"], r["split"]): r for r in rows}
    results, pooled = [], {}  # pooled: (row, rival) -> {task: its paired scores}
    for task in dict.fromkeys(r["split"] for r in rows):
        for (name, length), (rival, rival_length) in dict.fromkeys(pairs):  # a repeated pair counts once
            row, other = found.get((name, length, task)), found.get((rival, rival_length, task))
            if row is None or other is None:
                continue  # a synthetic task is generated per length: no row of it at another length
            key = (f"{name}@{length}", f"{rival}@{rival_length}")
            scores = paired_scores(row, other)
            pooled.setdefault(key, {})[task] = scores
            difference, low, high = paired_bootstrap(*scores)
            results.append({"task": task, "row": key[0], "rival": key[1],
                            "metric": "ndcg_at_10", "difference": difference, "low": low, "high": high})
    for (name, rival), by_task in pooled.items():
        if len(by_task) > 1:
            mine = [score for scores, _ in by_task.values() for score in scores]
            theirs = [score for _, scores in by_task.values() for score in scores]
            difference, low, high = paired_bootstrap(mine, theirs)
            results.append({"task": POOLED, "tasks": list(by_task), "queries": len(mine), "row": name, "rival": rival,
                            "metric": "ndcg_at_10", "difference": difference, "low": low, "high": high})
    return results


# ---- loading models and data ------------------------------------------------------------------------


def load_model(spec: str, device: str | None = None):
    """Our checkpoints (LMK or recurrent) through AutoModel, anything else as a SentenceTransformer."""
    config = Path(spec) / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    if model_type in OUR_MODEL_TYPES:
        from transformers import AutoModel

        model = AutoModel.from_pretrained(spec, trust_remote_code=True).eval()
        return model.to(device) if device else model
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(spec, device=device or "cpu", trust_remote_code=True)


def load_beir(folder: str | Path, split: str = "test") -> RetrievalData:
    """A BEIR folder: `queries.jsonl`, `corpus.jsonl` ({"_id", "title", "text"}) and `qrels/{split}.tsv`
    (query-id, corpus-id, score; a header line). Only queries with a judgement are kept."""
    folder = Path(folder)
    paths = {"queries": folder / "queries.jsonl", "corpus": folder / "corpus.jsonl", "qrels": folder / "qrels" / f"{split}.tsv"}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ValueError(f"BEIR folder {str(folder)!r} lacks {', '.join(missing)}")

    def records(path):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    documents = {str(r["_id"]): " ".join(p for p in (r.get("title") or "", r.get("text") or "") if p) for r in records(paths["corpus"])}
    relevant: dict[str, dict[str, int]] = {}
    for index, line in enumerate(paths["qrels"].read_text().splitlines()):
        parts = line.split("\t")
        if len(parts) < 3 or (index == 0 and not parts[2].strip().lstrip("-").isdigit()):
            continue  # the header, or a blank line
        relevant.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries = {str(r["_id"]): r["text"] for r in records(paths["queries"]) if str(r["_id"]) in relevant}
    return RetrievalData(folder.name, queries, documents, {q: relevant[q] for q in queries})


def load_mteb_task(name: str, split: str = "test") -> RetrievalData:
    """An mteb retrieval task by name, when its data is already on this machine (nothing is fetched
    if the Hub is offline: the error then names the task)."""
    import mteb

    try:
        task = mteb.get_task(name)
        task.load_data()
        data = task.dataset["default"][split]
    except Exception as error:  # unknown name, data not cached offline, no such split
        raise ValueError(f"mteb task {name!r} is not available here: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None
    queries = {row["id"]: row["text"] for row in data["queries"]}
    documents = {row["id"]: " ".join(p for p in (row.get("title") or "", row["text"]) if p) for row in data["corpus"]}
    relevant = {q: dict(d) for q, d in data["relevant_docs"].items() if q in queries}
    return RetrievalData(name, {q: queries[q] for q in relevant}, documents, relevant)
