"""`lmk-embed`: convert backbones into checkpoints, train, write model cards and publish.

    lmk-embed convert-lmk SOURCE OUTPUT [--pooling lmk] [--granularity 128] ...
    lmk-embed convert-recurrent SOURCE OUTPUT [--schedule auto] [--block-size auto] ...
    lmk-embed train [--config run.yaml] [--field value ...]
    lmk-embed card CHECKPOINT
    lmk-embed push CHECKPOINT REPO_ID [--dry-run] ...

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


def _check_source(source: str) -> None:
    """A source is a local folder or a Hub id; name the problem when it is neither."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    path = Path(source)
    if path.is_dir():
        return
    if path.exists():
        raise UsageError(f"`source` {source!r} is a file; give the checkpoint's folder")
    try:
        validate_repo_id(source)
    except HFValidationError:
        raise UsageError(f"`source` {source!r} is neither a folder nor a Hub id (org/name)") from None


def _load_source(convert, args, **options):
    """Run a converter; a source that cannot be fetched is the user's to fix, so say it in one line."""
    _check_source(args.source)
    try:
        return convert(args.source, args.output, **options)
    except OSError as error:
        if Path(args.source).is_dir():
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"cannot load `source` {args.source!r} (not a local folder): {first_line}") from None


# ---- convert-lmk -------------------------------------------------------------------------------


def _add_convert_lmk(subparsers) -> None:
    from lmk_embed.configuration_lmk import POOLINGS, SPLITTERS

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
    from training.convert import convert_to_lmk

    path = _load_source(
        convert_to_lmk,
        args,
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
    parser.set_defaults(handler=_run_convert_recurrent)


def _run_convert_recurrent(args) -> int:
    from training.convert import convert_to_recurrent

    path = _load_source(
        convert_to_recurrent, args, schedule=args.schedule, block_size=args.block_size, add_bos_token=args.add_bos_token,
        max_length=args.max_length, default_task=args.default_task, normalize=not args.no_normalize,
        base_model=args.base_model,
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
    from training import TrainConfig

    parser = subparsers.add_parser("train", help="Fine-tune a checkpoint: lmk-embed train --config run.yaml [--field value ...]")
    parser.add_argument("--config", default=None, help="YAML file with the run's fields; flags override it")
    add_dataclass_flags(parser, TrainConfig)
    parser.set_defaults(handler=_run_train)


def train_config(args: argparse.Namespace):
    """The TrainConfig for parsed `train` arguments: the YAML file's fields, then the flags given."""
    import yaml

    from training import TrainConfig

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

    from training import train

    config = train_config(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = train(config)
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
    from model_cards import check_card, write_card

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
    import push

    parser = subparsers.add_parser("push", help="Stage, validate and upload a checkpoint: lmk-embed push CHECKPOINT REPO_ID ...")
    push.add_arguments(parser)
    parser.set_defaults(handler=_run_push)


def _run_push(args) -> int:
    import push

    return push.run(args)


# ---- the command -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lmk-embed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_convert_lmk(subparsers)
    _add_convert_recurrent(subparsers)
    _add_train(subparsers)
    _add_card(subparsers)
    _add_push(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"lmk-embed {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
