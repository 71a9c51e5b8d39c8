"""`lmk-embed`: convert backbones into checkpoints, train, write model cards and publish.

    lmk-embed convert-lmk SOURCE OUTPUT [--pooling lmk] [--granularity 128] ...
    lmk-embed convert-recurrent SOURCE OUTPUT [--schedule auto] [--block-size 4096] ...
    lmk-embed train --config run.yaml [--key value ...]
    lmk-embed card CHECKPOINT
    lmk-embed push CHECKPOINT REPO_ID [--dry-run] ...
"""

from __future__ import annotations

import argparse
import sys


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _add_convert_lmk(subparsers) -> None:
    from .configuration_lmk import POOLINGS, SPLITTERS

    parser = subparsers.add_parser("convert-lmk", help="Turn an encoder (folder or Hub id) into an LMK checkpoint.")
    parser.add_argument("source", help="encoder checkpoint: a local folder, or a Hub id where the Hub is reachable")
    parser.add_argument("output", help="folder to write the LMK checkpoint to")
    parser.add_argument("--pooling", default="lmk", choices=POOLINGS)
    parser.add_argument("--granularity", type=_positive_int, default=128)
    parser.add_argument("--splitter", default="fixed", choices=SPLITTERS)
    parser.add_argument("--granularities", type=_positive_int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--landmark-token", default="sep", help="sep, eos, or a literal token")
    parser.add_argument("--max-length", type=_positive_int, default=None)
    parser.add_argument("--no-normalize", action="store_true", help="do not L2-normalise embeddings by default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.set_defaults(handler=_run_convert_lmk)


def _run_convert_lmk(args) -> int:
    from .checkpoint import convert_to_lmk

    path = convert_to_lmk(
        args.source,
        args.output,
        pooling=args.pooling,
        granularity=args.granularity,
        splitter=args.splitter,
        granularities=args.granularities,
        normalize=not args.no_normalize,
        landmark_token=args.landmark_token,
        max_length=args.max_length,
        seed=args.seed,
        base_model=args.base_model,
    )
    print(f"LMK checkpoint written to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmk-embed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert_lmk(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
