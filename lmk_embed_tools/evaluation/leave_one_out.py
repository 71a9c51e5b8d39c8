"""Choices that survive genres: every choice reported on a genre is made without that genre.

A choice is one row among candidate rows of the same run (for example the dense side and BM25's
weight of a fused row). For each reported genre, the candidate with the best mean nDCG@10 over the
*other* genres' tasks is chosen (each task weighs the same), and the genre's own score is read
under that choice. Tasks with fewer than `min_queries` queries are reported but never choose.

    rows = evaluate_jobs(...)             # per_query=True, one row per (retriever, task, length)
    chosen = leave_one_genre_out(rows, candidates, max_length=4096)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MIN_QUERIES = 50
# The Python documentation tasks are one genre, the one training reads: the deep-evidence sources of
# the documentation corpora (`training.corpora`: the out-of-domain sources and the validation source).
PYTHON_DOCS = "python-docs"
PYTHON_DOCS_SOURCES = ("scientific", "symbolic", "systems")
SPLIT_SUFFIXES = (" deep evidence", " subject")


def task_genre(task: str) -> str:
    """The genre of a task, by its `--task` spec or its split's name: genre:book, genre:book-subject,
    "book deep evidence" and "book subject" are all "book"; deep:scientific and "scientific deep
    evidence" (Python documentation pages) are "python-docs"; any other task is a genre of its own."""
    name = task.removeprefix("genre:").removeprefix("deep:").removesuffix("-subject")
    for suffix in SPLIT_SUFFIXES:
        name = name.removesuffix(suffix)
    return PYTHON_DOCS if task.startswith("deep:") or name in PYTHON_DOCS_SOURCES else name


def _scores(rows: list[dict], max_length: int | None) -> tuple[dict[tuple[str, str], dict], dict[str, int]]:
    """{(row name, task): per-query nDCG@10} and {task: queries} of the rows at `max_length`."""
    scores, queries = {}, {}
    for row in rows:
        if max_length is not None and row["max_length"] != max_length:
            continue
        per_query = row.get("per_query", {}).get("ndcg_at_10")
        if per_query is None:
            raise ValueError(f"row {row['model']!r} on {row['split']!r} has no per-query scores: evaluate with per_query=True")
        scores[(row["model"], row["split"])] = per_query
        queries[row["split"]] = len(per_query)
    return scores, queries


def leave_one_genre_out(rows: list[dict], candidates: list[str], *, max_length: int | None = None,
                        min_queries: int = MIN_QUERIES, genre_of: Callable[[str], str] = task_genre) -> dict[str, dict]:
    """{task: {"chosen", "chosen_on", "ndcg_at_10", "per_query"}} for every task that every candidate
    was scored on: `chosen` is the candidate (a row name) with the best mean over the tasks of other
    genres with at least `min_queries` queries (`chosen_on`; the first candidate wins a tie), and
    `ndcg_at_10` / `per_query` are the task's own scores under it. A task whose other genres hold no
    eligible task gets `chosen` None."""
    if not candidates:
        raise ValueError("`candidates` is empty: name the rows to choose among")
    scores, queries = _scores(rows, max_length)
    tasks = [task for task in queries if all((name, task) in scores for name in candidates)]
    missing = [name for name in candidates if not any((name, task) in scores for task in queries)]
    if missing:
        raise ValueError(f"`candidates` {missing} are not rows of this run")
    chosen = {}
    for task in tasks:
        eligible = [other for other in tasks if genre_of(other) != genre_of(task) and queries[other] >= min_queries]
        if not eligible:
            chosen[task] = {"chosen": None, "chosen_on": [], "ndcg_at_10": None, "per_query": None}
            continue
        means = [np.mean([np.mean(list(scores[(name, other)].values())) for other in eligible]) for name in candidates]
        best = candidates[int(np.argmax(means))]
        own = scores[(best, task)]
        chosen[task] = {"chosen": best, "chosen_on": eligible, "ndcg_at_10": float(np.mean(list(own.values()))),
                        "per_query": own}
    return chosen
