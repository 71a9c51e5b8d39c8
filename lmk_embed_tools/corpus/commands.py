"""The corpus jobs on the command line: `lmk-embed encode-corpus` and `lmk-embed search`."""

from __future__ import annotations

import argparse
import json

from lmk_embed_tools.commandline import UsageError, check_source, one_line, positive_int


def add_encode_corpus_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "encode-corpus", help="Embed a corpus (jsonl/csv/parquet glob or saved dataset) into resumable parquet shards.")
    parser.add_argument("model", help="checkpoint folder or Hub id")
    parser.add_argument("input", help="jsonl, csv or parquet files (a glob; quote it), or a `datasets` save_to_disk folder")
    parser.add_argument("output_dir", help="folder for part-NNNNN.parquet shards and manifest.json")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--id-field", default="id")
    parser.add_argument("--path-field", default=None, help="rows name a UTF-8 text file in this field instead of holding "
                        "the text (relative to the input file's folder); recurrent models stream it")
    parser.add_argument("--batch-size", type=positive_int, default=32)
    parser.add_argument("--max-length", type=positive_int, default=None)
    parser.add_argument("--prompt-name", default="document", choices=["document", "query"])
    parser.add_argument("--output-value", default="embedding", choices=["embedding", "landmarks"])
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
    parser.add_argument("--onnx-file", default="onnx/model.onnx",
                        help="--backend onnx: the graph in the checkpoint (onnx/model_qint8.onnx for int8)")
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
                       "landmark, each with the passage that matched.")
    parser.add_argument("index", help="an encode-corpus folder written with --output-value landmarks")
    parser.add_argument("queries", nargs="+", help="one or more query texts")
    parser.add_argument("--top-k", type=positive_int, default=10)
    parser.add_argument("--fuse", type=float, default=0.0,
                        help="weight of the document vector beside max-sim (0: max-sim only; 1: the document vector)")
    parser.add_argument("--model", default=None, help="the query encoder: a copy of the model that encoded the corpus "
                        "(same files; another model is refused), default: the one the manifest names")
    parser.add_argument("--json", action="store_true", help="print the hits as JSON lines")
    parser.set_defaults(handler=run_search)


def run_search(args: argparse.Namespace) -> int:
    from .search import SearchError, format_hits, search_corpus

    if not 0.0 <= args.fuse <= 1.0:
        raise UsageError(f"--fuse must be between 0 and 1, got {args.fuse}")
    if args.model is not None:
        check_source(args.model, "--model")
    try:  # --model is loaded only once it is known to be the model that encoded INDEX
        results = search_corpus(args.index, args.queries, top_k=args.top_k, fuse=args.fuse, model=args.model)
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
