"""One lever of `training.recipe.RECIPE` changed, at the full budget, LMK only, on this CPU.

    python training/recipes/cpu_ablation.py teacher_max_length=128 [--steps 400] [--out runs]

Uses `make train-full`'s own data, training and evaluation code (`demo.build_data`, `demo.finetune`,
`evaluation.evaluate_table`) with the same seeds and splits (320 queries each), so its row compares
directly with the trained LMK row of `training/recipes/full_results.json`. Scores the trained LMK at
512 tokens on every split and appends the entry to `training/recipes/cpu_ablation_results.json`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RESULTS = Path(__file__).with_name("cpu_ablation_results.json")


def parse_override(text: str, recipe: dict) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or key not in recipe:
        raise SystemExit(f"override must be KEY=VALUE with KEY one of {sorted(recipe)}, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def main(argv=None) -> int:
    import demo
    from training.recipe import RECIPE

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="+", help="KEY=VALUE changes to RECIPE, e.g. teacher_max_length=128")
    parser.add_argument("--steps", type=int, default=demo.BUDGETS["full"]["steps"])
    parser.add_argument("--out", default="runs", help="runs land in OUT/ablation-..., sharing OUT/corpora")
    args = parser.parse_args(argv)
    overrides = dict(parse_override(text, RECIPE) for text in args.overrides)
    recipe = {**RECIPE, **overrides}
    name = ", ".join(f"{k}={v}" for k, v in overrides.items()) + f" ({args.steps} steps)"
    out = (ROOT / args.out / ("ablation-" + "-".join(f"{k}{v}" for k, v in overrides.items()))).resolve()
    budget = {**demo.BUDGETS["full"], "steps": args.steps}

    from evaluation.table import evaluate_table, format_table
    from transformers import AutoModel

    start = time.perf_counter()
    splits, train_file = demo.build_data(out, budget, recipe)
    base = demo.convert_bases(out / "checkpoints", recipe)["lmk"]
    trained = demo.finetune(base, "lmk", train_file, out, args.steps, recipe)
    model = AutoModel.from_pretrained(trained, trust_remote_code=True).eval()
    rows = evaluate_table({f"trained LMK, {name}": (model, [512])}, splits)
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[name] = {"recipe": recipe, "rows": rows, "seconds": round(time.perf_counter() - start)}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
