"""Recurrent vertical encode on one GPU: throughput and peak memory against V and T. Not part of CI.

    python -m benchmarks.gpu_recurrent            # Mamba2-1.3B-shaped random model, bf16, on cuda
    python -m benchmarks.gpu_recurrent --smoke    # a tiny float32 model, runs anywhere in seconds

The model is Mamba2-1.3B-shaped with random weights (d=2048, 48 layers, state 128, head_dim 64,
one group) in bf16. For V in {512, 1024, 2048, 4096} and T up to 131,072 it times our vertical
forward on random token ids (one sequence) and reads the peak memory (CUDA: max allocated; CPU:
peak RSS). The SSD scan runs mamba_ssm's fused kernel when it imports on CUDA, our torch scan
otherwise; the JSON says which ("scan"). Prints one JSON line. Stops starting new points once
--budget-s has passed, so a full run stays under 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings


def build(smoke: bool, device: str, dtype):
    from benchmarks.common import random_mamba2

    if smoke:
        shape = dict(hidden_size=64, num_hidden_layers=2, state_size=16, head_dim=16, num_heads=8, vocab_size=1000)
    else:  # Mamba2-1.3B: 2048 wide, 48 layers, expand 2 -> 64 heads of 64
        shape = dict(hidden_size=2048, num_hidden_layers=48, state_size=128, head_dim=64, num_heads=64, vocab_size=50288)
    model = random_mamba2(**shape, bos_token_id=0, eos_token_id=0)
    return model.to(device=device, dtype=dtype), shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny float32 model, short T: checks the script runs")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--budget-s", type=float, default=240.0, help="start no new point after this many seconds")
    args = parser.parse_args()

    import torch

    from lmk_embed import modeling_recurrent

    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float32 if args.smoke or device == "cpu" else torch.bfloat16
    lengths = args.lengths or ([256, 1024] if args.smoke else [8192, 32768, 131072])
    block_sizes = args.block_sizes or ([64, 128] if args.smoke else [512, 1024, 2048, 4096])
    model, shape = build(args.smoke, device, dtype)
    scan = "mamba_ssm" if modeling_recurrent.mamba_chunk_scan_combined is not None and device == "cuda" else "torch"

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def peak_mb() -> float:
        if device == "cuda":
            return torch.cuda.max_memory_allocated() / 2**20
        from benchmarks.common import peak_rss_mb

        return peak_rss_mb()

    points = []
    with torch.inference_mode():
        ids = torch.randint(1, shape["vocab_size"], (1, max(lengths)), device=device)
        model(ids[:, : 2 * max(block_sizes)], schedule="vertical", block_size=max(block_sizes))  # warm-up
        for length in lengths:
            for block_size in block_sizes:
                if time.perf_counter() - started > args.budget_s:
                    points.append({"tokens": length, "block_size": block_size, "skipped": "time budget"})
                    continue
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                sync()
                start = time.perf_counter()
                model(ids[:, :length], schedule="vertical", block_size=block_size)
                sync()
                seconds = time.perf_counter() - start
                points.append({"tokens": length, "block_size": block_size, "seconds": round(seconds, 4),
                               "tokens_per_s": round(length / seconds, 1), "peak_mb": round(peak_mb(), 1)})
    print(json.dumps({
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "dtype": str(dtype).removeprefix("torch."),
        "scan": scan, "smoke": args.smoke, "model": shape, "torch": torch.__version__,
        "seconds_total": round(time.perf_counter() - started, 1), "points": points,
    }))


if __name__ == "__main__":
    main()
