"""`lmk-embed card CHECKPOINT`: write (or refresh) a checkpoint's model card."""

from __future__ import annotations

import argparse

from lmk_embed_tools.commandline import UsageError, check_checkpoint_folder

from .generator import check_card, write_card


def add_card_command(subparsers) -> None:
    parser = subparsers.add_parser("card", help="Write (or refresh) a checkpoint's model card README.md.")
    parser.add_argument("checkpoint")
    parser.add_argument("--model-id", default=None, help="org/name used in the card's snippets")
    parser.add_argument("--license", default="apache-2.0")
    parser.set_defaults(handler=run_card)


def run_card(args: argparse.Namespace) -> int:
    check_checkpoint_folder(args.checkpoint)
    try:
        path = write_card(args.checkpoint, model_id=args.model_id, license=args.license)
    except ValueError as error:  # not one of our families, or a bad results file: named in the message
        raise UsageError(str(error)) from None
    check_card(path)
    print(f"Model card written to {path}")
    return 0
