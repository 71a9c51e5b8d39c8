"""`lmk-embed`: convert backbones into checkpoints, train, evaluate, encode corpora, write model cards
and publish.

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
    lmk-embed serve CHECKPOINT [--index DIR] [--port 8000] [--replicas N] [--max-input-tokens N] ...
    lmk-embed demo [ablate|rescore|compare|validate ...] [--budget demo|full]
    lmk-embed train-student [--budget demo|full]

A bad argument, a missing file or an invalid config value prints one line naming it, and the
command exits with status 2.

Each subcommand belongs to the module that owns its job: that module's `add_*_command(subparsers)`
makes its parser, and the parser's `handler` runs it. This file is only the tree.
"""

from __future__ import annotations

import argparse
import sys

from lmk_embed_tools import demo, evaluation_jobs, onnx_export, push, student_demo
from lmk_embed_tools.commandline import OneLineParser, UsageError, keep_out_quantisation
from lmk_embed_tools.corpus import commands as corpus_commands
from lmk_embed_tools.model_cards import command as card_command
from lmk_embed_tools.serve import command as serve_command
from lmk_embed_tools.training import commands as training_commands

# The functions adding each subcommand, in the order `lmk-embed --help` lists them. The modules
# import only what their parsers need; each job's heavy imports wait until it runs.
COMMANDS = (
    training_commands.add_convert_lmk_command,
    training_commands.add_convert_recurrent_command,
    training_commands.add_train_command,
    card_command.add_card_command,
    push.add_push_command,
    evaluation_jobs.add_evaluate_command,
    evaluation_jobs.add_analyze_command,
    corpus_commands.add_encode_corpus_command,
    corpus_commands.add_search_command,
    corpus_commands.add_index_command,
    onnx_export.add_export_onnx_command,
    serve_command.add_serve_command,
    demo.add_demo_command,
    student_demo.add_train_student_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="lmk-embed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def main(argv: list[str] | None = None, console: bool = False) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
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
