"""Training data: loading and validating custom files, and the built-in offline stdlib dataset.

Rows have `query`, `positive`, optional `negatives` (a list), optional `teacher_scores` (one per
positive + negatives), optional `teacher_embeddings` (a teacher's vector for the query, the
positive and each negative: 2 + negatives lists of equal length) and optional `task` (the
instruction for recurrent queries). Files are
jsonl, csv or parquet, or a `datasets.Dataset` is passed directly.

Validation happens up front: a wrong type or shape, or a row without `query` or `positive` (a
missing or misspelt field), is reported with the file, the row's line number and the field (all
of them, not just the first); rows where the query, the positive or any negative is empty (the
field is there, its value is blank) are dropped and counted in the log; a source with no valid
row is an error.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

REQUIRED_FIELDS = ("query", "positive")
OPTIONAL_FIELDS = ("negatives", "teacher_scores", "teacher_embeddings", "task")
MAX_REPORTED_ERRORS = 20


class TrainingDataError(ValueError):
    """A problem with the training data (a bad row, a missing field, no valid row); the message names
    the file, and each bad row's line and field. A mistake in the data, not a bug: the CLI reports it
    as a user error."""


@dataclass
class LoadReport:
    """What loading did: rows read, kept, dropped (and why), and ignored columns."""

    source: str
    rows_read: int = 0
    rows_kept: int = 0
    dropped_empty: int = 0
    dropped_few_negatives: int = 0
    negatives_cut: int = 0
    ignored_columns: list[str] = field(default_factory=list)

    def log(self) -> None:
        logger.info(
            "%s: %d rows read, %d kept; dropped %d with an empty query/positive/negative, %d with fewer "
            "negatives than requested; %d rows had extra negatives cut%s",
            self.source, self.rows_read, self.rows_kept, self.dropped_empty, self.dropped_few_negatives,
            self.negatives_cut, f"; ignored columns {self.ignored_columns}" if self.ignored_columns else "",
        )


def _read_rows(source) -> tuple[list[tuple[str, dict]], list[str], str]:
    """Rows with their human line labels ("line 3" / "row 3"), the column names, and a source name."""
    try:
        from datasets import Dataset
    except ImportError:  # pragma: no cover - datasets is in the train extra
        Dataset = ()
    if isinstance(source, Dataset):
        return [(f"row {i + 1}", row) for i, row in enumerate(source)], list(source.column_names), "dataset"
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"Training data file not found: {path}")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows, columns, errors = [], [], []
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    errors.append(f"line {number}: not valid JSON ({error.msg})")
                    continue
                if not isinstance(row, dict):
                    errors.append(f"line {number}: expected a JSON object, got {type(row).__name__}")
                    continue
                columns.extend(k for k in row if k not in columns)
                rows.append((f"line {number}", row))
        if errors:
            raise TrainingDataError(f"{path}: {len(errors)} bad rows:\n  " + "\n  ".join(errors[:MAX_REPORTED_ERRORS]))
        return rows, columns, str(path)
    if suffix in (".csv", ".parquet"):
        from datasets import load_dataset

        dataset = load_dataset(suffix[1:], data_files=str(path), split="train")
        first_line = 2 if suffix == ".csv" else 1  # csv: line 1 is the header
        rows = []
        for i, row in enumerate(dataset):
            if suffix == ".csv":
                for name in ("negatives", "teacher_scores"):
                    if isinstance(row.get(name), str) and row[name].strip():
                        try:  # lists in a csv cell are written as JSON
                            row[name] = json.loads(row[name])
                        except json.JSONDecodeError:
                            pass
            rows.append((f"line {i + first_line}" if suffix == ".csv" else f"row {i + first_line}", row))
        return rows, list(dataset.column_names), str(path)
    raise TrainingDataError(f"Unsupported training data format {suffix!r} for {path}: use .jsonl, .csv or .parquet.")


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def load_training_rows(source, num_negatives: int | None = None) -> tuple[list[dict], LoadReport]:
    """Validate `source` and return clean rows with exactly `num_negatives` negatives each: rows with
    fewer are dropped and rows with more have the extra ones cut (both counted; teacher scores are
    cut alongside). `num_negatives=None` keeps every row's negatives as given: rows with different
    counts train as separate datasets (`to_training_dataset`), so nothing is dropped or cut.
    """
    raw_rows, columns, name = _read_rows(source)
    report = LoadReport(source=name, rows_read=len(raw_rows))
    missing = [f for f in REQUIRED_FIELDS if f not in columns]
    if missing:
        raise TrainingDataError(f"{name}: missing required field(s) {missing}; found columns {columns}.")
    report.ignored_columns = [c for c in columns if c not in REQUIRED_FIELDS + OPTIONAL_FIELDS]

    errors, candidates = [], []
    for label, row in raw_rows:
        problems = [f"missing field `{key}`" for key in REQUIRED_FIELDS if key not in row]
        if problems:  # a missing (or misspelt) field is a mistake, not empty data
            unknown = [k for k in row if k not in REQUIRED_FIELDS + OPTIONAL_FIELDS]
            errors.append(f"{label}: " + "; ".join(problems) + (f" (unknown fields: {unknown})" if unknown else ""))
            continue
        for key in ("query", "positive", "task"):
            if row.get(key) is not None and not isinstance(row[key], str):
                problems.append(f"`{key}` must be a string, got {type(row[key]).__name__}")
        negatives = row.get("negatives")
        if negatives is None:
            negatives = []
        elif not isinstance(negatives, list) or not all(isinstance(n, str) or n is None for n in negatives):
            problems.append("`negatives` must be a list of strings")
        scores = row.get("teacher_scores")
        if scores is not None:
            if not isinstance(scores, list) or not all(isinstance(s, (int, float)) for s in scores):
                problems.append("`teacher_scores` must be a list of numbers")
            elif isinstance(negatives, list) and len(scores) != 1 + len(negatives):
                problems.append(f"`teacher_scores` has {len(scores)} values; expected 1 + {len(negatives)} negatives")
        vectors = row.get("teacher_embeddings")
        if vectors is not None:
            if (not isinstance(vectors, list) or not all(isinstance(v, list) and v for v in vectors)
                    or len({len(v) for v in vectors}) != 1 or not all(isinstance(x, (int, float)) for v in vectors for x in v)):
                problems.append("`teacher_embeddings` must be a list of equally long lists of numbers")
            elif isinstance(negatives, list) and len(vectors) != 2 + len(negatives):
                problems.append(f"`teacher_embeddings` has {len(vectors)} vectors; expected query + positive + "
                                f"{len(negatives)} negatives")
        if scores is not None and vectors is not None:
            problems.append("give `teacher_scores` or `teacher_embeddings`, not both")
        if problems:
            errors.append(f"{label}: " + "; ".join(problems))
            continue
        if _blank(row.get("query")) or _blank(row.get("positive")) or any(_blank(n) for n in negatives):
            report.dropped_empty += 1
            continue
        candidates.append({"query": row["query"], "positive": row["positive"], "negatives": list(negatives),
                           "teacher_scores": scores, "teacher_embeddings": vectors, "task": row.get("task")})
    if errors:
        raise TrainingDataError(
            f"{name}: {len(errors)} bad rows" + (f" (first {MAX_REPORTED_ERRORS})" if len(errors) > MAX_REPORTED_ERRORS else "")
            + ":\n  " + "\n  ".join(errors[:MAX_REPORTED_ERRORS])
        )
    for key in ("teacher_scores", "teacher_embeddings"):
        given = sum(r[key] is not None for r in candidates)
        if 0 < given < len(candidates):
            raise TrainingDataError(f"{name}: `{key}` is given for {given} of {len(candidates)} rows; give it for all or none.")

    rows = []
    for row in candidates:
        if num_negatives is None:
            rows.append(row)
            continue
        if len(row["negatives"]) < num_negatives:
            report.dropped_few_negatives += 1
            continue
        if len(row["negatives"]) > num_negatives:
            report.negatives_cut += 1
            row["negatives"] = row["negatives"][:num_negatives]
            if row["teacher_scores"] is not None:
                row["teacher_scores"] = row["teacher_scores"][: 1 + num_negatives]
            if row["teacher_embeddings"] is not None:
                row["teacher_embeddings"] = row["teacher_embeddings"][: 2 + num_negatives]
        rows.append(row)
    report.rows_kept = len(rows)
    report.log()
    if not rows:
        raise TrainingDataError(
            f"{name}: no valid rows ({report.rows_read} read, {report.dropped_empty} empty, "
            f"{report.dropped_few_negatives} with fewer than {num_negatives} negatives)."
        )
    return rows, report


def to_training_dataset(rows: list[dict], query_prefix=None):
    """A `datasets.Dataset` in sentence-transformers column order: query, positive, negative_1.., label.
    Rows with different numbers of negatives give a `DatasetDict`, one dataset per count
    ("negatives_K"): sentence-transformers draws each batch from one of them, in proportion to their sizes.

    `query_prefix(task)` returns the instruction to put before a query (recurrent family), or None.
    """
    from datasets import Dataset, DatasetDict

    counts = sorted({len(row["negatives"]) for row in rows})
    if len(counts) > 1:
        return DatasetDict({f"negatives_{count}": to_training_dataset([r for r in rows if len(r["negatives"]) == count],
                                                                      query_prefix) for count in counts})

    columns: dict[str, list] = {"query": [], "positive": []}
    num_negatives = len(rows[0]["negatives"])
    for k in range(num_negatives):
        columns[f"negative_{k + 1}"] = []
    has_scores = rows[0]["teacher_scores"] is not None
    has_vectors = rows[0].get("teacher_embeddings") is not None
    if has_scores or has_vectors:
        columns["label"] = []
    for row in rows:
        prefix = query_prefix(row["task"]) if query_prefix else ""
        columns["query"].append(prefix + row["query"])
        columns["positive"].append(row["positive"])
        for k, negative in enumerate(row["negatives"]):
            columns[f"negative_{k + 1}"].append(negative)
        if has_scores:
            columns["label"].append([float(s) for s in row["teacher_scores"]])
        elif has_vectors:  # one flat vector per row: the collator makes a [batch, columns * dim] tensor
            columns["label"].append([float(x) for vector in row["teacher_embeddings"] for x in vector])
    return Dataset.from_dict(columns)


# ---- the built-in offline dataset: Python's standard-library documentation ---------------------


@dataclass(frozen=True)
class DocItem:
    module: str
    name: str
    synopsis: str
    text: str


def _is_held_out(module: str, held_out_fraction: float) -> bool:
    return (zlib.crc32(module.encode()) % 1000) / 1000 < held_out_fraction


@functools.lru_cache(maxsize=4)
def stdlib_doc_items(max_members_per_module: int = 12) -> tuple[DocItem, ...]:
    """Modules, classes and functions of the stdlib with a synopsis line, and their pydoc text.

    The synopsis (first docstring line, >= 3 words) is removed from the text, so a query never
    occurs verbatim in its positive.
    """
    import inspect

    from .stdlib_corpus import import_quietly, module_pages, render_page, synopsis_of

    items = []
    for page in module_pages():
        items.append(DocItem(page.name, page.name, page.synopsis, page.text))
        module = import_quietly(page.name)
        members = []
        for attribute, obj in sorted(vars(module).items()):
            if attribute.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if getattr(obj, "__module__", None) != page.name:
                continue
            synopsis = synopsis_of(obj)
            if len(synopsis.split()) < 3 or synopsis == page.synopsis:
                continue
            members.append(DocItem(page.name, f"{page.name}.{attribute}", synopsis, render_page(obj).replace(synopsis, " ")))
        items.extend(members[:max_members_per_module])
    return tuple(items)


def stdlib_training_rows(num_negatives: int = 1, held_out_fraction: float = 0.2, seed: int = 0,
                         max_members_per_module: int = 12):
    """Train rows and a held-out evaluation split, split by module.

    Train: query = a synopsis, positive = its documentation, negatives = siblings from the same
    module. Held-out: `(queries, corpus, relevant)` dicts for an IR evaluator, from other modules.
    """
    rng = random.Random(seed)
    items = stdlib_doc_items(max_members_per_module)
    by_module: dict[str, list[DocItem]] = {}
    for item in items:
        by_module.setdefault(item.module, []).append(item)
    rows, queries, corpus, relevant = [], {}, {}, {}
    seen_synopses = set()
    for module, members in by_module.items():
        if _is_held_out(module, held_out_fraction):
            for item in members:
                if item.synopsis in seen_synopses:
                    continue
                seen_synopses.add(item.synopsis)
                queries[item.name], corpus[item.name] = item.synopsis, item.text
                relevant[item.name] = {item.name}
            continue
        for item in members:
            if item.synopsis in seen_synopses:  # one positive per query text
                continue
            seen_synopses.add(item.synopsis)
            siblings = [m for m in members if m.name != item.name]
            if len(siblings) < num_negatives:
                continue
            negatives = [m.text for m in rng.sample(siblings, num_negatives)]
            rows.append({"query": item.synopsis, "positive": item.text, "negatives": negatives,
                         "teacher_scores": None, "teacher_embeddings": None, "task": None})
    rng.shuffle(rows)
    return rows, (queries, corpus, relevant)
