"""`lmk-embed`: convert backbones into checkpoints, train, write model cards and publish.

    lmk-embed convert-lmk SOURCE OUTPUT [--pooling lmk] [--granularity 128] [--max-positions N] ...
    lmk-embed convert-recurrent SOURCE OUTPUT [--schedule auto] [--block-size auto] ...
    lmk-embed train [--config run.yaml] [--field value ...]
    lmk-embed card CHECKPOINT
    lmk-embed evaluate MODEL [MODEL ...] --task passkey needle ... [--max-lengths 256 ...] [--out DIR]
    lmk-embed analyze attention|locality CHECKPOINT [...] [--out DIR]
    lmk-embed push CHECKPOINT REPO_ID [--dry-run] ...
    lmk-embed encode-corpus MODEL INPUT OUTPUT_DIR [--engine local|ray] [--num-workers N] [--backend onnx] ...
    lmk-embed search INDEX "query" [--top-k 10] [--fuse 0.5]
    lmk-embed export-onnx CHECKPOINT [--quantize int8]

A bad argument, a missing file or an invalid config value prints one line naming it, and the
command exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from dataclasses import fields
from pathlib import Path


class UsageError(Exception):
    """A mistake in the command line or its files: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (argparse's default adds the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _block_size(text: str) -> int | str:
    return "auto" if text == "auto" else _positive_int(text)


def _check_source(source: str, name: str = "`source`") -> None:
    """A source (model or tokenizer) is a local folder or a Hub id; name the problem when it is neither."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    path = Path(source)
    if path.is_dir():
        return
    if path.exists():
        raise UsageError(f"{name} {source!r} is a file; give the checkpoint's folder")
    try:
        validate_repo_id(source)
    except HFValidationError:
        raise UsageError(f"{name} {source!r} is neither a folder nor a Hub id (org/name)") from None


def _check_output(output, name: str) -> None:
    """An output folder may exist (it is reused or refused by the command itself), but not as a file."""
    if Path(output).exists() and not Path(output).is_dir():
        raise UsageError(f"{name} {str(output)!r} is a file; give a folder to write to")


def _load_source(convert, args, **options):
    """Run a converter; a source that cannot be fetched is the user's to fix, so say it in one line."""
    from lmk_embed_tools.training.convert import ConversionError

    _check_source(args.source)
    _check_output(args.output, "OUTPUT")
    if getattr(args, "tokenizer", None):
        _check_source(args.tokenizer, "--tokenizer")
    try:
        return convert(args.source, args.output, **options)
    except ConversionError as error:  # a source we cannot convert: the message names the file and field
        raise UsageError(str(error)) from None
    except OSError as error:
        if Path(args.source).is_dir():
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"cannot load `source` {args.source!r} (not a local folder): {first_line}") from None


# ---- convert-lmk -------------------------------------------------------------------------------


def _add_convert_lmk(subparsers) -> None:
    from lmk_embed.configuration_lmk import LONG_INPUTS, POOLINGS, POSITION_EXTENSIONS, SPLITTERS, LMKConfig

    parser = subparsers.add_parser("convert-lmk", help="Turn an encoder (folder or Hub id) into an LMK checkpoint.")
    parser.add_argument("source", help="encoder checkpoint: a local folder, or a Hub id where the Hub is reachable")
    parser.add_argument("output", help="folder to write the LMK checkpoint to")
    # Defaults are LMKConfig's (None here: the config fills them in).
    parser.add_argument("--pooling", default=None, choices=POOLINGS, help=f"default {LMKConfig.pooling}")
    parser.add_argument("--granularity", type=_positive_int, default=None, help=f"default {LMKConfig.granularity}")
    parser.add_argument("--splitter", default=None, choices=SPLITTERS, help=f"default {LMKConfig.splitter}")
    parser.add_argument("--granularities", type=_positive_int, nargs="+", default=None,
                        help=f"the variable splitter's set (default {list(LMKConfig.granularities)})")
    parser.add_argument("--landmark-token", default=None, help=f"sep, eos, or a literal token (default {LMKConfig.landmark_token})")
    parser.add_argument("--max-length", type=_positive_int, default=None)
    parser.add_argument("--no-normalize", action="store_true", help="do not L2-normalise embeddings by default")
    parser.add_argument("--seed", type=int, default=None, help=f"default {LMKConfig.splitter_seed}")
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.add_argument("--max-positions", type=_positive_int, default=None, metavar="N",
                        help="extend the backbone to N positions; inputs that fit the original ones keep the base's vectors")
    parser.add_argument("--position-extension", default=None, choices=POSITION_EXTENSIONS,
                        help="how positions past the original table are read: interpolate (default), recurrent or "
                             "group for absolute tables; dynamic (NTK rope scaling, the default) for rotary backbones")
    parser.add_argument("--long-input", default=None, choices=LONG_INPUTS,
                        help=f"how texts longer than one window are read by default (default {LMKConfig.long_input}; "
                             "windows: landmark windows at the original positions, lmk pooling only)")
    parser.add_argument("--window-length", type=_positive_int, default=None,
                        help="tokens per window for --long-input windows (default: the original positions)")
    parser.set_defaults(handler=_run_convert_lmk)


def _run_convert_lmk(args) -> int:
    from lmk_embed_tools.training.convert import convert_to_lmk

    path = _load_source(
        convert_to_lmk,
        args,
        pooling=args.pooling,
        granularity=args.granularity,
        splitter=args.splitter,
        granularities=args.granularities,
        normalize=False if args.no_normalize else None,
        landmark_token=args.landmark_token,
        max_length=args.max_length,
        seed=args.seed,
        base_model=args.base_model,
        max_positions=args.max_positions,
        position_extension=args.position_extension,
        long_input=args.long_input,
        window_length=args.window_length,
    )
    print(f"LMK checkpoint written to {path}")
    return 0


# ---- convert-recurrent -------------------------------------------------------------------------


def _add_convert_recurrent(subparsers) -> None:
    from lmk_embed.configuration_recurrent import SCHEDULES

    parser = subparsers.add_parser("convert-recurrent", help="Turn a recurrent causal LM into an embedder checkpoint.")
    parser.add_argument("source", help="a Mamba2 / xLSTM / RWKV causal-LM checkpoint: a local folder, or a Hub id")
    parser.add_argument("output", help="folder to write the embedder checkpoint to")
    parser.add_argument("--schedule", default="auto", choices=SCHEDULES)
    parser.add_argument("--block-size", type=_block_size, default="auto",
                        help="V: tokens per vertical block, or 'auto' (chosen per call from device, width and batch)")
    parser.add_argument("--add-bos-token", action="store_true")
    parser.add_argument("--max-length", type=_positive_int, default=None)
    parser.add_argument("--default-task", default=None, help="the instruction for queries without a task")
    parser.add_argument("--no-normalize", action="store_true")
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.add_argument(
        "--tokenizer", default=None,
        help="tokenizer folder or Hub id, for sources that ship none (mamba_ssm releases: EleutherAI/gpt-neox-20b)",
    )
    parser.set_defaults(handler=_run_convert_recurrent)


def _run_convert_recurrent(args) -> int:
    from lmk_embed_tools.training.convert import convert_to_recurrent

    path = _load_source(
        convert_to_recurrent, args, schedule=args.schedule, block_size=args.block_size, add_bos_token=args.add_bos_token,
        max_length=args.max_length, default_task=args.default_task, normalize=not args.no_normalize,
        base_model=args.base_model, tokenizer=args.tokenizer,
    )
    print(f"Recurrent embedder checkpoint written to {path}")
    return 0


# ---- train ---------------------------------------------------------------------------------------


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered not in {"true", "false", "yes", "no", "1", "0"}:
        raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")
    return lowered in {"true", "yes", "1"}


def add_dataclass_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per field of the dataclass `cls` (`--field_name`, also spelt `--field-name`).

    Defaults are suppressed, so a parsed namespace holds only the flags given: they then override a
    config file field by field. A Literal field's values become the flag's choices; a bool flag alone
    means true."""
    hints = typing.get_type_hints(cls)
    for field in fields(cls):
        kind = hints[field.name]
        options = [t for t in typing.get_args(kind) if t is not type(None)]
        if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(options) == 1:
            kind = options[0]  # X | None: the flag takes an X
        kwargs = {"dest": field.name, "default": argparse.SUPPRESS, "help": field.metadata.get("help")}
        if typing.get_origin(kind) is typing.Literal:
            kwargs.update(choices=typing.get_args(kind), type=type(typing.get_args(kind)[0]))
        elif typing.get_origin(kind) is list:
            kwargs.update(nargs="+", type=typing.get_args(kind)[0])
        elif kind is bool:
            kwargs.update(nargs="?", const=True, type=_boolean)
        else:
            kwargs.update(type=kind)
        spellings = dict.fromkeys([f"--{field.name}", f"--{field.name.replace('_', '-')}"])
        parser.add_argument(*spellings, **kwargs)


def _add_train(subparsers) -> None:
    from lmk_embed_tools.training import TrainConfig

    parser = subparsers.add_parser("train", help="Fine-tune a checkpoint: lmk-embed train --config run.yaml [--field value ...]")
    parser.add_argument("--config", default=None, help="YAML file with the run's fields; flags override it")
    add_dataclass_flags(parser, TrainConfig)
    parser.set_defaults(handler=_run_train)


def train_config(args: argparse.Namespace):
    """The TrainConfig for parsed `train` arguments: the YAML file's fields, then the flags given."""
    import yaml

    from lmk_embed_tools.training import TrainConfig

    names = {f.name for f in fields(TrainConfig)}
    overrides = {name: value for name, value in vars(args).items() if name in names}
    try:
        if args.config is None:
            return TrainConfig(**overrides)
        if not Path(args.config).is_file():
            raise UsageError(f"--config {args.config!r}: no such file")
        return TrainConfig.from_yaml(args.config, **overrides)  # unknown fields in the file raise, naming them
    except yaml.YAMLError as error:
        raise UsageError(f"--config {args.config!r} is not valid YAML: {' '.join(str(error).split())}") from None
    except ValueError as error:  # TrainConfig.check names the field
        raise UsageError(str(error)) from None


def _run_train(args) -> int:
    import logging

    config = train_config(args)
    if config.finetune != "qlora":
        keep_out_quantisation(args)
    _check_source(config.model, "--model")
    _check_output(config.output_dir, "--output_dir")
    if config.train_data != "stdlib" and not Path(config.train_data).is_file():
        raise UsageError(f"--train_data {config.train_data!r}: no such file (give a jsonl, csv or parquet file, or 'stdlib')")
    from lmk_embed_tools.training import train  # sentence-transformers, peft: after the checks
    from lmk_embed_tools.training.data import TrainingDataError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = train(config)
    except TrainingDataError as error:  # a bad row or field of the data file, named with its line: one line
        first, *rows = str(error).splitlines()
        raise UsageError(f"--train_data: {first}" + (" " + "; ".join(row.strip() for row in rows) if rows else "")) from None
    finally:
        import torch.distributed as dist

        # Under torchrun the trainer opened a process group; leaving it to interpreter exit can abort
        # a rank while gloo's threads are torn down ("terminate called without an active exception").
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    print(f"Final model: {result['final_dir']}")
    if result["metrics"]:
        print("Held-out metrics:", {k: round(v, 4) for k, v in result["metrics"].items() if k.endswith("ndcg@10")})
    return 0


# ---- card and push -------------------------------------------------------------------------------


def _add_card(subparsers) -> None:
    parser = subparsers.add_parser("card", help="Write (or refresh) a checkpoint's model card README.md.")
    parser.add_argument("checkpoint")
    parser.add_argument("--model-id", default=None, help="org/name used in the card's snippets")
    parser.add_argument("--license", default="apache-2.0")
    parser.set_defaults(handler=_run_card)


def _run_card(args) -> int:
    from lmk_embed_tools.model_cards import check_card, write_card

    if not (Path(args.checkpoint) / "config.json").is_file():
        raise UsageError(f"`checkpoint` {args.checkpoint!r} is not a checkpoint folder (no config.json)")
    try:
        path = write_card(args.checkpoint, model_id=args.model_id, license=args.license)
    except ValueError as error:  # not one of our families, or a bad results file: named in the message
        raise UsageError(str(error)) from None
    check_card(path)
    print(f"Model card written to {path}")
    return 0


def _add_push(subparsers) -> None:
    from lmk_embed_tools import push
    parser = subparsers.add_parser("push", help="Stage, validate and upload a checkpoint: lmk-embed push CHECKPOINT REPO_ID ...")
    push.add_arguments(parser)
    parser.set_defaults(handler=_run_push)


def _run_push(args) -> int:
    from lmk_embed_tools import push
    return push.run(args)


# ---- evaluate and analyze ---------------------------------------------------------------------------

SYNTHETIC_TASKS = ("passkey", "needle")


def _add_evaluate(subparsers) -> None:
    from lmk_embed_tools.evaluation.synthetic import DEFAULT_LENGTHS

    parser = subparsers.add_parser(
        "evaluate", help="Retrieval at growing max lengths: synthetic passkey/needle, stdlib docs, BEIR folders, mteb tasks.")
    parser.add_argument("models", nargs="+", help="checkpoint folders (ours, or any SentenceTransformer), or `bm25`")
    parser.add_argument("--task", nargs="+", required=True,
                        help="passkey, needle, stdlib, deep:scientific / deep:symbolic (a method's summary as the query "
                             "for its class page, 600-3800 tokens deep; deep:systems, the validation source, is for "
                             "choosing settings), a BEIR folder (queries.jsonl, corpus.jsonl, "
                             "qrels/test.tsv), or mteb:NAME")
    parser.add_argument("--corpus-cache", default="runs/corpora", help="deep:*: where the documentation corpora are cached")
    parser.add_argument("--max-lengths", type=_positive_int, nargs="+", default=list(DEFAULT_LENGTHS))
    parser.add_argument("--out", default="runs/evaluate", help="folder for results.json, results.txt and the PNGs")
    parser.add_argument("--names", nargs="+", default=None, help="a row name per model (default: the folder's name)")
    parser.add_argument("--bm25", action="store_true", help="add BM25 (bm25s) as a sanity baseline")
    parser.add_argument("--multi-vector", action="store_true",
                        help="LMK models: also score by max over landmarks, and the max+mean hybrid")
    parser.add_argument("--granularities", type=_positive_int, nargs="+", default=None,
                        help="LMK models: one row per inference granularity g (the granularity trade-off)")
    parser.add_argument("--long-input", nargs="+", default=None, choices=("one-pass", "windows"),
                        help="LMK models: one row per long-input schedule (default: the checkpoint's)")
    parser.add_argument("--window-length", type=_positive_int, nargs="+", default=None,
                        help="LMK models with --long-input windows: one row per window length W")
    parser.add_argument("--windows", nargs="*", default=None, metavar="NAME",
                        help="also the windows-mean (PCW) and windows-max baselines: for the models named (row names), "
                             "or for every model when none is named")
    parser.add_argument("--window", type=_positive_int, default=None,
                        help="--windows: tokens per window (default: a SentenceTransformer's max_seq_length, "
                             "our models' original positions)")
    parser.add_argument("--schedule", default=None, choices=("horizontal", "vertical", "auto"),
                        help="recurrent models: the inference schedule (default: the checkpoint's)")
    parser.add_argument("--queries", type=_positive_int, default=50, help="synthetic and deep:* tasks: queries (per length)")
    parser.add_argument("--documents", type=_positive_int, default=100, help="synthetic and deep:* tasks: candidates (per length)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=None,
                        help="synthetic lengths are counted in this tokenizer's tokens (default: the first model's)")
    parser.add_argument("--batch-size", type=_positive_int, default=8)
    parser.add_argument("--cache-dir", default=None, help="corpus-embedding cache (default: OUT/cache)")
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--record", action="store_true",
                        help="store nDCG@1 beside each of our checkpoints (eval_results.json) for its model card")
    parser.add_argument("--compare", nargs=2, action="append", default=None, metavar=("ROW", "RIVAL"),
                        help="NAME@LENGTH NAME@LENGTH (repeatable): on every task, nDCG@10 of ROW minus RIVAL with "
                             "its 95%% paired bootstrap interval over the queries; with two tasks or more, also over "
                             "all their queries pooled")
    parser.set_defaults(handler=_run_evaluate)


def _parse_comparisons(pairs, names: list[str], lengths: list[int]) -> list[tuple[tuple[str, int], tuple[str, int]]]:
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


def _stdlib_pages():
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    return module_pages()


def _jobs(args, count_tokens) -> list:
    from lmk_embed_tools.evaluation.longcontext import RetrievalData, load_beir, load_mteb_task
    from lmk_embed_tools.evaluation.synthetic import haystack_sentences, synthetic_tasks

    jobs = []
    for task in args.task:
        if task in SYNTHETIC_TASKS:
            if count_tokens is None:
                raise UsageError(f"--task {task}: give --tokenizer (a folder or tokenizer.json) to count lengths")
            haystack = haystack_sentences([page.text for page in _stdlib_pages()]) if task == "needle" else ()
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
            data = deep_evidence_split(build_corpus(args.corpus_cache, sources=(source,)), source, count_tokens,
                                       max_queries=args.queries, max_documents=args.documents, seed=args.seed)
            jobs += [(data.name, length, data) for length in args.max_lengths]
            continue
        if task == "stdlib":
            pages = _stdlib_pages()
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
            raise UsageError(f"--task {task!r}: not passkey, needle, stdlib, deep:SOURCE, mteb:NAME or a BEIR folder")
        jobs += [(data.name, length, data) for length in args.max_lengths]
    return jobs


def _run_evaluate(args) -> int:
    from lmk_embed_tools.evaluation.longcontext import evaluate_jobs, load_model, paired_comparisons
    from lmk_embed_tools.evaluation.report import card_records, length_curves, write_report
    from lmk_embed_tools.evaluation.retrievers import build_retrievers
    from lmk_embed_tools.evaluation.synthetic import token_counter
    from lmk_embed_tools.evaluation.table import format_length_table

    paths = [m for m in args.models if m.lower() != "bm25"]
    args.bm25 = args.bm25 or len(paths) < len(args.models)
    if args.names is not None and len(args.names) != len(paths):
        raise UsageError(f"--names: {len(args.names)} names for {len(paths)} models")
    for path in paths:
        _check_source(path, "MODEL")
    _check_output(args.out, "--out")
    names = args.names or [Path(p).name for p in paths]
    models = {name: load_model(path) for name, path in zip(names, paths)}
    if args.tokenizer:
        count_tokens = token_counter(args.tokenizer)
    else:
        count_tokens = token_counter(next(iter(models.values())).tokenizer) if models else None
    jobs = _jobs(args, count_tokens)
    cache_dir = None if args.no_cache else (args.cache_dir or Path(args.out) / "cache")
    if args.windows:
        unknown = sorted(set(args.windows) - set(names))
        if unknown:
            raise UsageError(f"--windows: {unknown} are not among the models' names {names}")
    retrievers = build_retrievers(models, batch_size=args.batch_size, granularities=args.granularities,
                                  multi_vector=args.multi_vector, schedule=args.schedule, bm25=args.bm25,
                                  long_inputs=args.long_input,
                                  windows=None if args.windows is None else (args.windows or list(models)), window=args.window,
                                  window_lengths=args.window_length)
    pairs = _parse_comparisons(args.compare, [r.name for r in retrievers], args.max_lengths)
    rows = evaluate_jobs(retrievers, jobs, cache_dir=cache_dir, per_query=bool(pairs))
    comparisons = paired_comparisons(rows, pairs)
    settings = {k: v for k, v in vars(args).items() if k not in ("handler",)}
    written = write_report(rows, args.out, settings, comparisons=comparisons)
    for metric in ("ndcg_at_1", "ndcg_at_10"):
        print(format_length_table(rows, metric), end="\n\n")
    for c in comparisons:
        print(f"{c['task']}: {c['row']} - {c['rival']}: nDCG@10 {c['difference']:+.3f} "
              f"[{c['low']:+.3f}, {c['high']:+.3f}] (95% paired bootstrap over queries)")
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


def _add_analyze(subparsers) -> None:
    parser = subparsers.add_parser("analyze", help="The LMK paper's analyses: attention by position, landmark locality.")
    parser.add_argument("analysis", choices=("attention", "locality"))
    parser.add_argument("models", nargs="+", help="LMK checkpoint folders")
    parser.add_argument("--names", nargs="+", default=None)
    parser.add_argument("--pooling", nargs="+", default=None, choices=("lmk", "cls"),
                        help="attention: whose attention to read (default: each checkpoint's own pooling)")
    parser.add_argument("--max-length", type=_positive_int, default=512)
    parser.add_argument("--granularity", type=_positive_int, default=None)
    parser.add_argument("--texts", type=_positive_int, default=16, help="how many of the longest stdlib pages to read")
    parser.add_argument("--bins", type=_positive_int, default=20)
    parser.add_argument("--k", type=_positive_int, nargs="+", default=[1, 3, 5])
    parser.add_argument("--out", default="runs/analyze")
    parser.set_defaults(handler=_run_analyze)


def _run_analyze(args) -> int:
    import json

    from lmk_embed_tools.evaluation.analyses import attention_by_position, landmark_locality, plot_attention, plot_locality

    _check_output(args.out, "--out")
    from lmk_embed_tools.evaluation.longcontext import load_model

    if args.names is not None and len(args.names) != len(args.models):
        raise UsageError(f"--names: {len(args.names)} names for {len(args.models)} models")
    for path in args.models:
        _check_source(path)
    pages = sorted(_stdlib_pages(), key=lambda p: (-len(p.text), p.name))[: args.texts]  # long inputs, deterministic
    texts = [page.text for page in pages]
    results = {}
    for name, path in zip(args.names or [Path(p).name for p in args.models], args.models):
        model = load_model(path)
        if getattr(getattr(model, "config", None), "model_type", None) != "lmk_embedder":
            raise UsageError(f"{path!r} is not an LMK checkpoint")
        if args.analysis == "attention":
            for pooling in args.pooling or [model.config.pooling]:
                results[f"{name} ({pooling})"] = attention_by_position(
                    model, texts, max_length=args.max_length, bins=args.bins, pooling=pooling, granularity=args.granularity)
        else:
            results[name] = landmark_locality(model, texts, k_values=args.k, max_length=args.max_length,
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


# ---- encode-corpus ---------------------------------------------------------------------------------


def _add_encode_corpus(subparsers) -> None:
    parser = subparsers.add_parser(
        "encode-corpus", help="Embed a corpus (jsonl/csv/parquet glob or saved dataset) into resumable parquet shards.")
    parser.add_argument("model", help="checkpoint folder or Hub id")
    parser.add_argument("input", help="jsonl, csv or parquet files (a glob; quote it), or a `datasets` save_to_disk folder")
    parser.add_argument("output_dir", help="folder for part-NNNNN.parquet shards and manifest.json")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--id-field", default="id")
    parser.add_argument("--path-field", default=None, help="rows name a UTF-8 text file in this field instead of holding "
                        "the text (relative to the input file's folder); recurrent models stream it")
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument("--max-length", type=_positive_int, default=None)
    parser.add_argument("--prompt-name", default="document", choices=["document", "query"])
    parser.add_argument("--output-value", default="embedding", choices=["embedding", "landmarks"])
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    parser.add_argument("--num-workers", type=_positive_int, default=1)
    parser.add_argument("--shard-size", type=_positive_int, default=10_000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="how vectors are stored")
    parser.add_argument("--ray-address", default=None, help="attach to this Ray cluster (e.g. ray://head:10001 or auto); "
                        "default: start a local one")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help="GPUs each Ray worker reserves")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"],
                        help="onnx: LMK checkpoints run their exported graph on ONNX Runtime, on CPU (lmk-embed export-onnx)")
    parser.add_argument("--onnx-file", default="onnx/model.onnx",
                        help="--backend onnx: the graph in the checkpoint (onnx/model_qint8.onnx for int8)")
    parser.set_defaults(handler=_run_encode_corpus)


def _run_encode_corpus(args) -> int:
    from lmk_embed_tools.corpus import CorpusArgumentError, CorpusInputError, CorpusSettingsError, encode_corpus

    try:
        summary = encode_corpus(
            args.model, args.input, args.output_dir, text_field=args.text_field, id_field=args.id_field,
            path_field=args.path_field,
            batch_size=args.batch_size, max_length=args.max_length, prompt_name=args.prompt_name,
            output_value=args.output_value, engine=args.engine, num_workers=args.num_workers,
            shard_size=args.shard_size, dtype=args.dtype, ray_address=args.ray_address,
            gpus_per_worker=args.gpus_per_worker, show_progress_bar=not args.no_progress,
            backend=args.backend, onnx_file=args.onnx_file,
        )
    except (CorpusArgumentError, CorpusInputError, CorpusSettingsError) as error:
        raise UsageError(" ".join(str(error).split())) from None
    print(f"{summary['rows']} rows in {summary['shards']} shards ({summary['shards_skipped']} kept from an earlier run) "
          f"written to {args.output_dir}: {summary['truncated']} truncated, {summary['empty']} empty, "
          f"{summary['tokens']} tokens")
    return 0


def _add_search(subparsers) -> None:
    parser = subparsers.add_parser(
        "search", help="Search a landmark index (encode-corpus --output-value landmarks): documents by their best "
                       "landmark, each with the passage that matched.")
    parser.add_argument("index", help="an encode-corpus folder written with --output-value landmarks")
    parser.add_argument("queries", nargs="+", help="one or more query texts")
    parser.add_argument("--top-k", type=_positive_int, default=10)
    parser.add_argument("--fuse", type=float, default=0.0,
                        help="weight of the document vector beside max-sim (0: max-sim only; 1: the document vector)")
    parser.add_argument("--model", default=None, help="the query encoder (default: the model that encoded the corpus)")
    parser.add_argument("--json", action="store_true", help="print the hits as JSON lines")
    parser.set_defaults(handler=_run_search)


def _run_search(args) -> int:
    import json

    from lmk_embed_tools.corpus.search import SearchError, format_hits, search_corpus

    if not 0.0 <= args.fuse <= 1.0:
        raise UsageError(f"--fuse must be between 0 and 1, got {args.fuse}")
    model = None
    if args.model is not None:
        _check_source(args.model)
        from lmk_embed_tools.evaluation.longcontext import load_model

        model = load_model(args.model)
    try:
        results = search_corpus(args.index, args.queries, top_k=args.top_k, fuse=args.fuse, model=model)
    except (SearchError, ImportError) as error:
        raise UsageError(" ".join(str(error).split())) from None
    for query, hits in zip(args.queries, results):
        if args.json:
            for rank, hit in enumerate(hits, 1):
                print(json.dumps({"query": query, "rank": rank, "id": hit.id, "score": round(hit.score, 6),
                                  "landmark": hit.landmark, "span": list(hit.span), "text": hit.text}))
        else:
            print(format_hits(query, hits))
    return 0


# ---- export-onnx -----------------------------------------------------------------------------------

# Why recurrent checkpoints are not exported (docs/onnx.md says more).
RECURRENT_ONNX_REFUSAL = (
    "ONNX export is for LMK checkpoints; recurrent checkpoints are refused: their vertical schedule is a "
    "Python loop over blocks that carries each layer's conv and SSM state, which a traced graph would unroll "
    "for one length, and their CPU time is the scan's own products and elementwise passes, which ONNX Runtime "
    "has no fused kernel for. Run them on torch (see docs/onnx.md)"
)


def _add_export_onnx(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-onnx", help="Write an LMK checkpoint's ONNX graphs (onnx/model.onnx; int8 too with --quantize int8).")
    parser.add_argument("checkpoint", help="an LMK checkpoint folder; the graphs are written into its onnx/ folder")
    parser.add_argument("--quantize", default=None, choices=["int8"],
                        help="also write onnx/model_qint8.onnx (dynamic int8 quantisation of the linear layers)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="keep plain ONNX operators: no ONNX Runtime attention / LayerNorm / GELU fusions")
    parser.set_defaults(handler=_run_export_onnx)


def _run_export_onnx(args) -> int:
    import json

    folder = Path(args.checkpoint)
    if not (folder / "config.json").is_file():
        raise UsageError(f"`checkpoint` {args.checkpoint!r} is not a checkpoint folder (no config.json)")
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type == "recurrent_embedder":
        raise UsageError(f"{args.checkpoint!r} is a recurrent checkpoint. {RECURRENT_ONNX_REFUSAL}")
    if model_type != "lmk_embedder":
        raise UsageError(f"{args.checkpoint!r} is not an LMK checkpoint (config.json model_type {model_type!r})")
    from lmk_embed_tools.onnx_export import export_onnx

    try:
        written = export_onnx(folder, quantize=args.quantize, fuse=not args.no_fuse)
    except ImportError as error:  # onnxruntime / onnx missing: the message names the extra
        raise UsageError(str(error)) from None
    for kind, path in written.items():
        print(f"{kind}: {path} ({path.stat().st_size / 2**20:.1f} MB)")
    print("Load with AutoModel.from_pretrained(CHECKPOINT, trust_remote_code=True, backend='onnx') or "
          "SentenceTransformer(CHECKPOINT, trust_remote_code=True, backend='onnx'); `lmk-embed card` lists the "
          "graphs in the model card.")
    return 0


# ---- the command -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lmk-embed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert_lmk(subparsers)
    _add_convert_recurrent(subparsers)
    _add_train(subparsers)
    _add_card(subparsers)
    _add_push(subparsers)
    _add_evaluate(subparsers)
    _add_analyze(subparsers)
    _add_encode_corpus(subparsers)
    _add_search(subparsers)
    _add_export_onnx(subparsers)
    _add_demo(subparsers)
    subparsers.add_parser("train-student", add_help=False,
                          help="The recurrent student of MiniLM, end to end: rows, training, evaluation, card, "
                               "dry-run publishing (`lmk-embed train-student --help` for its options).")
    return parser


# ---- demo ---------------------------------------------------------------------------------------


def _add_demo(subparsers) -> None:
    parser = subparsers.add_parser("demo", add_help=False,
                                   help="The main job: corpora, fine-tuning, evaluation, cards, dry-run publishing "
                                        "(`lmk-embed demo --help` for its options).")
    parser.set_defaults(handler=_run_demo)


def _run_demo(args) -> int:
    from lmk_embed_tools import demo

    return demo.main(args.rest)


def _run_train_student(args) -> int:
    from lmk_embed_tools import student_demo

    return student_demo.main(args.rest)


# bitsandbytes prints a line when it is imported, and peft imports it whenever it is installed. The
# console command keeps it out (`find_spec` then reports it missing) unless a run asks for 4-bit
# (QLoRA), so that a one-line error is the only line. Only there: peft caches the answer per process.
QUANTISATION_MODULE = "bitsandbytes"


def keep_out_quantisation(args) -> None:
    if getattr(args, "console", False) and QUANTISATION_MODULE not in sys.modules:
        sys.modules[QUANTISATION_MODULE] = None


def main(argv: list[str] | None = None, console: bool = False) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    own_parsers = {"demo": _run_demo, "train-student": _run_train_student}  # jobs that parse their own options
    if argv[:1] and argv[0] in own_parsers:
        args = argparse.Namespace(command=argv[0], handler=own_parsers[argv[0]], rest=argv[1:])
    else:
        args = build_parser().parse_args(argv)
    args.console = console
    if args.command != "train":  # train decides once its config is read
        keep_out_quantisation(args)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"lmk-embed {args.command}: error: {error}", file=sys.stderr)
        return 2


def console_main() -> int:
    """The `lmk-embed` console command."""
    return main(console=True)


if __name__ == "__main__":
    sys.exit(console_main())
