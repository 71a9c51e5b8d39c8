"""Recurrent encode time against the block size V, and the V that `block_size="auto"` picks.

    python -m benchmarks.recurrent_block_size [--length 65536] [--block-sizes 256 512 ... 8192] [--repeats 3] [--threads 1]

A Mamba2 of d=256, 8 layers, state 64 (random weights, the model of recurrent_floor.py) embeds one
stdlib-documentation text of --length tokens with `encode(text, block_size=V)` (vertical schedule,
tokenization included) for each V, in one process, interleaved, best of --repeats (so the machine's
noise falls on every V alike). Prints the time and tokens/s per V, the V that `block_size="auto"`
resolves to here (`auto_block_size` for this device, width and batch 1) and its time against the
fastest V; one JSON line at the end; results in benchmarks/results/recurrent_block_size.json and a
PNG of time against V with the auto choice marked (--figure).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
from benchmarks.common import save_figure, save_results

FIGURE = HERE.parent / "runs" / "benchmarks" / "recurrent_time_vs_block_size.png"


def measure(args) -> dict:
    import torch

    from recurrent_floor import D_MODEL, LAYERS, STATE, build

    model, _, text_for, _ = build("auto")
    auto = model.resolve_block_size("auto", batch_size=1)
    text, length = text_for(args.length), args.length

    def encode(block_size: int):
        def run():
            with torch.inference_mode():
                model.encode(text, max_length=length, schedule="vertical", block_size=block_size)

        return run

    with torch.inference_mode():  # warm-up: one-time allocations, thread pools
        model.encode(text_for(4096), max_length=4096, schedule="vertical", block_size=min(args.block_sizes))
    times = {V: [] for V in args.block_sizes}
    for repeat in range(args.repeats):  # interleaved: each round runs every V once
        for V in args.block_sizes:
            start = time.perf_counter()
            encode(V)()
            times[V].append(time.perf_counter() - start)
        print(f"  round {repeat + 1}/{args.repeats}: " + "  ".join(f"V={V} {times[V][-1]:.2f}s" for V in args.block_sizes))
    best = {V: min(values) for V, values in times.items()}
    fastest = min(best, key=best.get)
    print(f"T={length:,} tokens, threads {torch.get_num_threads()}, best of {args.repeats}:")
    for V in args.block_sizes:
        marks = (" <- auto" if V == auto else "") + (" (fastest)" if V == fastest else "")
        print(f"  V={V:>5}  {best[V]:7.2f}s  {length / best[V]:8,.0f} tok/s  (max {max(times[V]):.2f}s){marks}")
    result = {"model": {"d_model": D_MODEL, "layers": LAYERS, "state": STATE}, "tokens": length,
              "threads": torch.get_num_threads(), "repeats": args.repeats, "auto_block_size": auto,
              "fastest_block_size": fastest, "seconds_min": {str(V): best[V] for V in best},
              "seconds_all": {str(V): values for V, values in times.items()}}
    if auto in best:
        result["auto_over_fastest_time"] = best[auto] / best[fastest]
        print(f'block_size="auto" picks V={auto} here: {best[auto] / best[fastest]:.3f}x the fastest V\'s time (V={fastest})')
    else:
        print(f'block_size="auto" picks V={auto} here (not among the measured V)')
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(V) for V in result["seconds_min"])
    best = [result["seconds_min"][str(V)] for V in sizes]
    fig, ax = plt.subplots(figsize=(6, 4))
    for values in zip(*(result["seconds_all"][str(V)] for V in sizes)):  # every round, faintly
        ax.plot(sizes, values, color="tab:blue", alpha=0.25, linewidth=1)
    ax.plot(sizes, best, marker="o", color="tab:blue", label=f"best of {result['repeats']}")
    auto = result["auto_block_size"]
    if str(auto) in result["seconds_min"]:
        ax.plot([auto], [result["seconds_min"][str(auto)]], marker="*", markersize=16, color="tab:red",
                linestyle="none", label=f'block_size="auto" (V={auto})')
    ax.axvline(auto, color="tab:red", alpha=0.3, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(V) for V in sizes])
    ax.set_xlabel("block size V (tokens)")
    ax.set_ylabel("encode time (s)")
    model = result["model"]
    ax.set_title(f"one text of {result['tokens']:,} tokens; Mamba2 d={model['d_model']}, {model['layers']} layers; "
                 f"{result['threads']} thread(s)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=65536, help="tokens in the text (EOS included)")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (on a loaded machine, 1 avoids waiting on preempted threads in every op)")
    parser.add_argument("--figure", type=Path, default=FIGURE)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = measure(args)
    plot(result, args.figure)
    save_results("recurrent_block_size", result)
    print(json.dumps({"tokens": result["tokens"], "auto_block_size": result["auto_block_size"],
                      "fastest_block_size": result["fastest_block_size"]}
                     | {f"tok_per_s_V{V}": round(result["tokens"] / s) for V, s in result["seconds_min"].items()}
                     | ({"auto_over_fastest_time": round(result["auto_over_fastest_time"], 3)}
                        if "auto_over_fastest_time" in result else {})))


if __name__ == "__main__":
    main()
