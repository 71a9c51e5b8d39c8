"""Tables of results: every model on every split at every max length, through one code path.

`evaluate_table(models, splits, max_lengths)` scores each model with `evaluate_retrieval` (mteb),
and returns rows `{"model", "split", "max_length", "ndcg_at_10", "recall_at_1"}` (with
`per_query=True`, also each query's scores under `"per_query"`). A model is
any object with `encode_query` / `encode_document`: our AutoModel classes (their `max_length`
is passed per call) or a plain SentenceTransformer such as the untouched base (its
`max_seq_length` is set per evaluation). `compare` puts a paired bootstrap interval on the
difference between two rows, so that a lead smaller than the noise of the queries is seen as such.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from .retrieval import evaluate_retrieval

METRICS = ("ndcg_at_10", "recall_at_1")


def _score(model, split, max_length: int, name: str):
    """(mteb's scores, per-query scores) of `model` on `split` at `max_length` tokens."""
    kwargs = {}
    if hasattr(model, "max_seq_length"):  # SentenceTransformer: its own truncation setting
        model.max_seq_length = max_length
    else:
        kwargs["max_length"] = max_length
    with warnings.catch_warnings():  # long pages are truncated at max_length by design; counted elsewhere
        warnings.filterwarnings("ignore", message=".*truncated.*")
        return evaluate_retrieval(model, split.queries, split.documents, split.relevant, name=name, per_query=True, **kwargs)


def evaluate_table(models: dict[str, tuple], splits, progress: bool = True, per_query: bool = False) -> list[dict]:
    """`models` maps a row name to `(model, max_lengths)`; returns one row per model, split and length.

    With `per_query=True`, each row also holds `"per_query": {metric: {query_id: value}}` (for `compare`).
    """
    from tqdm.auto import tqdm

    jobs = [(name, model, length, split) for name, (model, lengths) in models.items() for split in splits for length in lengths]
    rows = []
    for name, model, length, split in tqdm(jobs, desc="Evaluating", unit="eval", disable=not progress):
        scores, by_query = _score(model, split, length, name=f"table/{name}")
        row = {"model": name, "split": split.name, "max_length": length, **{metric: scores[metric] for metric in METRICS}}
        if per_query:
            row["per_query"] = {metric: {q: values[metric] for q, values in by_query.items()} for metric in METRICS}
        rows.append(row)
    return rows


class SharedForward:
    """Rows that differ only in how one SentenceTransformer's token states are pooled, from one forward.

    `SharedForward(model).view(pooling)` is a model for `evaluate_table` (`encode_query`,
    `encode_document`, `max_seq_length`). The first view to encode a list of texts at a max length
    runs `model` once and keeps every pooling's vectors `[N, D]`; the other views read them back.
    Poolings: "model", the model's own output (MiniLM: mean + normalize), and "cls", the first
    token's state, L2-normalized: what the same encoder converted with CLS pooling returns, to within
    1e-6 (tested), so the demo scores the base and untrained CLS for the price of one. One call holds
    the token states of all its texts until it returns (N x L x D floats: about 250 MB for 320
    documents at 512 tokens), since it is the model's own `encode`, batched as it batches.
    """

    POOLINGS = ("model", "cls")

    def __init__(self, model):
        self.model = model
        self._vectors: dict[tuple, dict] = {}

    def view(self, pooling: str) -> "_PoolingView":
        if pooling not in self.POOLINGS:
            raise ValueError(f"Unknown `pooling` {pooling!r}; expected one of {list(self.POOLINGS)}.")
        return _PoolingView(self, pooling)

    def encode(self, kind: str, texts: list[str], pooling: str, batch_size: int = 32):
        import numpy as np
        import torch

        key = (kind, self.model.max_seq_length, tuple(texts))
        if key not in self._vectors:
            outputs = getattr(self.model, f"encode_{kind}")(list(texts), batch_size=batch_size, output_value=None)
            width = self.model.get_embedding_dimension()
            stack = lambda vectors: np.stack(vectors) if vectors else np.zeros((0, width), dtype=np.float32)  # noqa: E731
            self._vectors[key] = {
                "model": stack([o["sentence_embedding"].float().numpy() for o in outputs]),
                "cls": stack([torch.nn.functional.normalize(o["token_embeddings"][0].float(), dim=-1).numpy() for o in outputs]),
            }
        return self._vectors[key][pooling].copy()  # a caller may change its array in place


class _PoolingView:
    """One pooling of a `SharedForward`, with the interface `evaluate_table` scores."""

    def __init__(self, shared: SharedForward, pooling: str):
        self.shared, self.pooling = shared, pooling

    @property
    def max_seq_length(self) -> int:
        return self.shared.model.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.shared.model.max_seq_length = value

    def encode_query(self, queries: list[str], batch_size: int = 32):
        return self.shared.encode("query", queries, self.pooling, batch_size)

    def encode_document(self, documents: list[str], batch_size: int = 32):
        return self.shared.encode("document", documents, self.pooling, batch_size)


def paired_bootstrap(scores_a, scores_b, resamples: int = 10_000, confidence: float = 0.95, seed: int = 0):
    """`(mean difference, low, high)`: the mean of `a - b` over paired per-query scores `[Q]`, and
    the percentile bootstrap interval of that mean (queries resampled with replacement)."""
    import numpy as np

    a, b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"`scores_a` and `scores_b` must be non-empty 1-D and of one length, got {a.shape} and {b.shape}.")
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must lie in (0, 1), got {confidence}.")
    if not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"`resamples` must be a positive integer, got {resamples!r}.")
    difference = a - b
    draws = np.random.default_rng(seed).integers(0, difference.size, size=(resamples, difference.size))
    means = difference[draws].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(difference.mean()), float(low), float(high)


def paired_scores(row: dict, rival: dict, metric: str = "ndcg_at_10") -> tuple[list[float], list[float]]:
    """Two rows' per-query `metric` scores on the same split, in one query order: `([Q], [Q])`."""
    if metric not in METRICS:
        raise ValueError(f"Unknown `metric` {metric!r}; expected one of {list(METRICS)}.")
    for name, r in (("row", row), ("rival", rival)):
        if "per_query" not in r:
            raise ValueError(f"`{name}` ({r.get('model')}) has no per-query scores; use evaluate_table(..., per_query=True).")
    if row["split"] != rival["split"]:
        raise ValueError(f"`row` and `rival` come from different splits ({row['split']!r} vs {rival['split']!r}).")
    mine, theirs = row["per_query"][metric], rival["per_query"][metric]
    if set(mine) != set(theirs):
        raise ValueError(f"`row` and `rival` were scored on different queries of {row['split']!r}.")
    queries = sorted(mine)
    return [mine[q] for q in queries], [theirs[q] for q in queries]


def compare(row: dict, rival: dict, metric: str = "ndcg_at_10", **bootstrap) -> tuple[float, float, float]:
    """`paired_bootstrap` of two rows of `evaluate_table(..., per_query=True)` on the same split."""
    return paired_bootstrap(*paired_scores(row, rival, metric), **bootstrap)


def format_table(rows: list[dict], metric: str = "ndcg_at_10") -> str:
    """A plain-text table: one line per (model, max length), one column per split."""
    splits = list(dict.fromkeys(r["split"] for r in rows))
    keys = list(dict.fromkeys((r["model"], r["max_length"]) for r in rows))
    cell = {(r["model"], r["max_length"], r["split"]): r[metric] for r in rows}
    width = max(len(m) for m, _ in keys) + 2
    header = f"{'model':<{width}}{'max len':>8}" + "".join(f"{s[:30]:>32}" for s in splits)
    lines = [f"{metric}", header, "-" * len(header)]
    for model, length in keys:
        values = "".join(f"{cell[(model, length, s)]:>32.4f}" if (model, length, s) in cell else f"{'':>32}" for s in splits)
        lines.append(f"{model:<{width}}{length:>8}{values}")
    return "\n".join(lines)


def format_length_table(rows: list[dict], metric: str = "ndcg_at_1") -> str:
    """LongEmbed's layout: one line per (split, model), one column per max length, then their mean."""
    lengths = sorted({r["max_length"] for r in rows})
    keys = list(dict.fromkeys((r["split"], r["model"]) for r in rows))
    cell = {(r["split"], r["model"], r["max_length"]): r[metric] for r in rows}
    width = max(len(f"{s} | {m}") for s, m in keys) + 2
    header = f"{'task | model':<{width}}" + "".join(f"{n:>8}" for n in lengths) + f"{'mean':>8}"
    lines = [metric, header, "-" * len(header)]
    for split, model in keys:
        values = [cell.get((split, model, n)) for n in lengths]
        present = [v for v in values if v is not None]
        mean = sum(present) / len(present) if present else float("nan")
        lines.append(f"{split + ' | ' + model:<{width}}" + "".join(f"{v:>8.3f}" if v is not None else f"{'':>8}" for v in values)
                     + f"{mean:>8.3f}")
    return "\n".join(lines)


def save_table(rows: list[dict], folder: str | Path, stem: str = "results", metric: str = "ndcg_at_10") -> dict[str, Path]:
    """`stem.json` (the rows) and `stem.png` (`metric` against max length, one panel per split)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / f"{stem}.json"
    json_path.write_text(json.dumps(rows, indent=2) + "\n")
    png_path = folder / f"{stem}.png"
    plot_rows(rows, png_path, metric)
    return {"json": json_path, "png": png_path}


def plot_rows(rows: list[dict], path: str | Path, metric: str = "ndcg_at_10") -> Path:
    """`metric` against max length: one panel per split, one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = list(dict.fromkeys(r["split"] for r in rows))
    figure, axes = plt.subplots(1, len(splits), figsize=(5 * len(splits), 4), squeeze=False)
    for axis, split in zip(axes[0], splits):
        for model in dict.fromkeys(r["model"] for r in rows):
            points = sorted((r["max_length"], r[metric]) for r in rows if r["split"] == split and r["model"] == model)
            if points:
                axis.plot(*zip(*points), marker="o", label=model)
        axis.set_title(split, fontsize=9)
        axis.set_xlabel("max length (tokens)")
        axis.set_ylabel(metric.replace("_at_", "@"))
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
