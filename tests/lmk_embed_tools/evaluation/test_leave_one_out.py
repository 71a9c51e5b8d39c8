"""Leave one genre out: a genre's choice never reads that genre's scores, and small tasks never choose."""

import numpy as np
import pytest

from lmk_embed_tools.evaluation.leave_one_out import leave_one_genre_out, task_genre

TASKS = {"genre:book": 60, "genre:book-subject": 60, "genre:notes": 60, "deep:scientific": 60, "deep:symbolic": 60,
         "genre:readme": 9}


def rows_for(means: dict[tuple[str, str], float], seed: int = 0, length: int = 4096) -> list[dict]:
    """One row per (candidate, task) with per-query nDCG@10 around the given mean."""
    rng = np.random.default_rng(seed)
    rows = []
    for (name, task), mean in means.items():
        values = np.clip(mean + 0.01 * rng.standard_normal(TASKS[task]), 0, 1)
        per_query = {f"q{i}": float(v) for i, v in enumerate(values)}
        rows.append({"model": name, "split": task, "max_length": length, "ndcg_at_10": float(values.mean()),
                     "per_query": {"ndcg_at_10": per_query}})
    return rows


def test_genres_of_tasks_and_of_their_splits():
    from lmk_embed_tools.training.corpora import OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE

    assert task_genre("genre:book") == task_genre("genre:book-subject") == "book"
    assert task_genre("book deep evidence") == task_genre("book subject") == "book"
    assert task_genre("deep:scientific") == task_genre("deep:symbolic") == task_genre("symbolic deep evidence")
    assert {task_genre(f"{source} deep evidence") for source in (*OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE)} == {"python-docs"}
    assert task_genre("genre:notes") != task_genre("genre:book")


def test_a_genre_is_never_chosen_on_itself():
    # A wins book (both tasks) by far, so A wins the pooled mean; B wins every other genre by a little.
    means = {}
    for task in TASKS:
        on_book = task_genre(task) == "book"
        means[("A", task)], means[("B", task)] = (0.9, 0.1) if on_book else (0.5, 0.55)
    chosen = leave_one_genre_out(rows_for(means), ["A", "B"], max_length=4096)
    assert chosen["genre:book"]["chosen"] == "B" and chosen["genre:book-subject"]["chosen"] == "B"
    assert chosen["genre:book"]["ndcg_at_10"] == pytest.approx(0.1, abs=0.01)
    # Every other genre's choice reads book's tasks, where A's lead decides.
    assert chosen["genre:notes"]["chosen"] == "A"
    for task, choice in chosen.items():
        assert all(task_genre(other) != task_genre(task) for other in choice["chosen_on"])
        assert "genre:readme" not in choice["chosen_on"]  # 9 queries: reported, never chooses
    assert "deep:symbolic" not in chosen["deep:scientific"]["chosen_on"]


def test_the_reported_genre_cannot_move_its_choice():
    """Whatever a genre's own scores are, its choice stays the same."""
    base = {(name, task): 0.5 + (0.05 if name == "B" else 0.0) for name in ("A", "B") for task in TASKS}
    reference = leave_one_genre_out(rows_for(base), ["A", "B"])["genre:notes"]["chosen"]
    for own in (0.0, 0.3, 1.0):
        changed = dict(base)
        changed[("A", "genre:notes")] = own
        assert leave_one_genre_out(rows_for(changed), ["A", "B"])["genre:notes"]["chosen"] == reference


def test_a_candidate_that_is_not_a_row_is_refused():
    means = {(name, task): 0.5 for name in ("A", "B") for task in TASKS}
    with pytest.raises(ValueError, match="candidates"):
        leave_one_genre_out(rows_for(means), ["A", "C"])
