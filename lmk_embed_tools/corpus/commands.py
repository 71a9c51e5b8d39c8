"""The corpus jobs on the command line: `lmk-embed encode-corpus`, `lmk-embed search` and
`lmk-embed index convert`."""

from __future__ import annotations

import argparse
import json

from lmk_embed.configuration_lmk import LMK_OPTIONS, LONG_INPUTS
from lmk_embed_tools.commandline import UsageError, check_source, one_line, positive_int

from .encode import OUTPUT_VALUES

# encode()'s per-call options, from the family's spec, that decide how a long document is read (an
# index reads pages in 256-token windows: docs/long-inputs.md).
ENCODE_CORPUS_OPTIONS = [option for option in LMK_OPTIONS if option.per_call
                         and option.name in ("long_input", "window_length")]


def add_encode_corpus_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "encode-corpus", help="Embed a corpus (jsonl/csv/parquet glob or saved dataset) into resumable parquet shards, "
                              "or with --output-value landmarks into a landmark index (LanceDB).")
    parser.add_argument("model", help="checkpoint folder or Hub id")
    parser.add_argument("input", help="jsonl, csv or parquet files (a glob; quote it), or a `datasets` save_to_disk folder")
    parser.add_argument("output_dir", help="folder for part-NNNNN.parquet shards and manifest.json, or for the landmark "
                        "index's tables (--output-value landmarks)")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--id-field", default="id")
    parser.add_argument("--path-field", default=None, help="rows name a UTF-8 text file in this field instead of holding "
                        "the text (relative to the input file's folder); recurrent models stream it")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--max-length", type=positive_int, default=None)
    for option in ENCODE_CORPUS_OPTIONS:  # declared once, in the family's option spec
        kind = {"choices": LONG_INPUTS} if option.name == "long_input" else {"type": positive_int}
        parser.add_argument(option.cli_flag, default=None, **kind,
                            help=f"LMK checkpoints: encode()'s `{option.name}` (default: the checkpoint's)")
    parser.add_argument("--prompt-name", default="document", choices=["document", "query"])
    parser.add_argument("--output-value", default="embedding", choices=list(OUTPUT_VALUES),
                        help="embedding: parquet shards of document vectors; landmarks or late_chunks: a LanceDB index "
                        "of each document's landmark vectors, or of its late chunks (mean token states per chunk)")
    parser.add_argument("--engine", default="local", choices=["local", "ray"])
    parser.add_argument("--num-workers", type=positive_int, default=1)
    parser.add_argument("--shard-size", type=positive_int, default=10_000)
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16"], help="how vectors are stored")
    parser.add_argument("--ray-address", default=None, help="attach to this Ray cluster (e.g. ray://head:10001 or auto); "
                        "default: start a local one")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help="GPUs each Ray worker reserves")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"],
                        help="onnx: LMK checkpoints run their exported graph on ONNX Runtime, on CPU (lmk-embed export-onnx)")
    parser.add_argument("--onnx-file", default=None,
                        help="--backend onnx: the graph in the checkpoint (default onnx/model.onnx; "
                             "onnx/model_qint8.onnx for int8)")
    parser.set_defaults(handler=run_encode_corpus)


def run_encode_corpus(args: argparse.Namespace) -> int:
    from . import CorpusArgumentError, CorpusInputError, CorpusSettingsError, encode_corpus

    try:
        summary = encode_corpus(
            args.model, args.input, args.output_dir, text_field=args.text_field, id_field=args.id_field,
            path_field=args.path_field,
            batch_size=args.batch_size, max_length=args.max_length, prompt_name=args.prompt_name,
            output_value=args.output_value, engine=args.engine, num_workers=args.num_workers,
            shard_size=args.shard_size, dtype=args.dtype, ray_address=args.ray_address,
            gpus_per_worker=args.gpus_per_worker, show_progress_bar=not args.no_progress,
            backend=args.backend, onnx_file=args.onnx_file,
            **{option.name: getattr(args, option.name) for option in ENCODE_CORPUS_OPTIONS},
        )
    except (CorpusArgumentError, CorpusInputError, CorpusSettingsError) as error:
        raise UsageError(one_line(error)) from None
    print(f"{summary['rows']} rows in {summary['shards']} shards ({summary['shards_skipped']} kept from an earlier run) "
          f"written to {args.output_dir}: {summary['truncated']} truncated, {summary['empty']} empty, "
          f"{summary['tokens']} tokens")
    return 0


def add_search_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "search", help="Search a landmark index (encode-corpus --output-value landmarks): documents by their best "
                       "landmark, by BM25, or both fused, each with the passage that matched.")
    parser.add_argument("index", help="an encode-corpus folder written with --output-value landmarks")
    parser.add_argument("queries", nargs="+", help="one or more query texts")
    parser.add_argument("--top-k", type=positive_int, default=10)
    parser.add_argument("--mode", default="dense", choices=["dense", "lexical", "hybrid"],
                        help="dense: max-sim over landmarks; lexical: BM25 over the text; hybrid: both, fused")
    parser.add_argument("--fuse", type=float, default=0.0,
                        help="weight of the document vector beside max-sim (0: max-sim only; 1: the document vector)")
    parser.add_argument("--fusion", default="minmax", choices=["minmax", "rank"],
                        help="hybrid: min-max convex fusion, or reciprocal rank fusion")
    parser.add_argument("--fuse-weight", type=float, default=None,
                        help="hybrid min-max: BM25's share (default: the weight the index records, 0.5)")
    parser.add_argument("--model", default=None, help="the query encoder: a copy of the model that encoded the corpus "
                        "(same files; another model is refused), default: the one the index names")
    parser.add_argument("--json", action="store_true", help="print the hits as JSON lines")
    parser.set_defaults(handler=run_search)


def run_search(args: argparse.Namespace) -> int:
    from .search import SearchError, format_hits, search_corpus

    for flag, value in (("--fuse", args.fuse), ("--fuse-weight", args.fuse_weight)):
        if value is not None and not 0.0 <= value <= 1.0:
            raise UsageError(f"{flag} must be between 0 and 1, got {value}")
    if args.model is not None:
        check_source(args.model, "--model")
    try:  # --model is loaded only once it is known to be the model that encoded INDEX
        results = search_corpus(args.index, args.queries, top_k=args.top_k, fuse=args.fuse, model=args.model,
                                mode=args.mode, fusion=args.fusion, fuse_weight=args.fuse_weight)
    except (SearchError, ImportError) as error:
        raise UsageError(one_line(error)) from None
    for query, hits in zip(args.queries, results):
        if args.json:
            for rank, hit in enumerate(hits, 1):
                print(json.dumps({"query": query, "rank": rank, "id": hit.id, "score": round(hit.score, 6),
                                  "landmark": hit.landmark, "span": list(hit.span), "text": hit.text}))
        else:
            print(format_hits(query, hits))
    return 0


def add_index_command(subparsers) -> None:
    parser = subparsers.add_parser("index", help="Landmark index maintenance: `index convert SRC DST`.")
    actions = parser.add_subparsers(dest="action", required=True)
    convert = actions.add_parser("convert", help="Convert a landmark index of the earlier shard format (parquet "
                                 "shards, manifest.json) into the LanceDB index search reads; nothing is encoded again.")
    convert.add_argument("source", metavar="SRC", help="the shard-format index folder (its shards are verified)")
    convert.add_argument("destination", metavar="DST", help="a new or empty folder for the LanceDB index")
    convert.set_defaults(handler=run_index_convert)


def run_index_convert(args: argparse.Namespace) -> int:
    from .convert import convert_shard_index
    from .verify import SearchError

    try:
        record = convert_shard_index(args.source, args.destination)
    except (SearchError, ImportError) as error:
        raise UsageError(one_line(error)) from None
    print(f"{record['rows']} documents, {record['landmarks']} landmarks converted into {args.destination}")
    return 0
