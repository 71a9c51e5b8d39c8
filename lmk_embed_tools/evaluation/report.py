"""Writing a long-context evaluation: JSON, per-length tables, a PNG per metric, and card records."""

from __future__ import annotations

import json
from pathlib import Path

from .table import format_length_table, plot_rows

REPORTED = ("ndcg_at_1", "ndcg_at_10")


def write_report(rows: list[dict], folder: str | Path, settings: dict, metrics=REPORTED,
                 comparisons: list[dict] | None = None) -> dict[str, Path]:
    """`results.json` ({"settings", "rows"}, and "comparisons" when given: `lmk-embed evaluate
    --compare`'s paired intervals), `results.txt` (a table per metric, mean over lengths) and
    `results_<metric>.png` (one panel per task, one line per model)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for metric in metrics:
        paths[metric] = plot_rows(rows, folder / f"results_{metric}.png", metric)
    paths["json"] = folder / "results.json"
    report = {"settings": settings, "rows": rows, **({"comparisons": comparisons} if comparisons else {})}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n")
    paths["table"] = folder / "results.txt"
    paths["table"].write_text("\n\n".join(format_length_table(rows, metric) for metric in metrics) + "\n")
    return paths


def card_records(rows: list[dict], model: str, metric: str = "ndcg_at_1") -> tuple[list[dict], list[dict]]:
    """(results, baselines) in `model_cards.record_results`' format: `model`'s rows, then every other model's."""
    results, baselines = [], []
    for row in rows:
        record = {"dataset": row["split"], "metric": metric, "value": row[metric], "max_length": row["max_length"]}
        if row["model"] == model:
            results.append({**record, "dataset_type": "synthetic" if row["split"] in ("passkey", "needle") else "local", "split": "test"})
        else:
            baselines.append({"model": row["model"], **record})
    return results, baselines


def length_curves(rows: list[dict], model: str, metric: str = "ndcg_at_10") -> list[dict]:
    """`model`'s score against max length on every task it was run at two lengths or more, with the
    other models' curves on that task beside it: `model_cards.record_results`' `extrapolation`,
    [{"dataset", "metric", "points": {length: value}, "baselines": {model: {length: value}}}, ...]."""
    curves = {}
    for row in rows:
        curve = curves.setdefault(row["split"], {})
        curve.setdefault(row["model"], {})[str(row["max_length"])] = row[metric]
    return [{"dataset": task, "metric": metric, "points": by_model[model],
             "baselines": {name: points for name, points in by_model.items() if name != model and len(points) > 1}}
            for task, by_model in curves.items() if len(by_model.get(model, {})) > 1]
