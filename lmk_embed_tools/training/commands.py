"""The training jobs on the command line: `lmk-embed convert-lmk`, `convert-recurrent` and `train`.

Each command is `add_*_command(subparsers)`, which makes its parser, and `run_*(args)`; defaults are
the configs' own, and a mistake is a `UsageError` in one line.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from lmk_embed_tools.commandline import (UsageError, block_size, check_output, check_source, keep_out_quantisation,
                                         positive_int)


def convert_source(convert, args, **options):
    """Run a converter; a source that cannot be fetched is the user's to fix, so say it in one line."""
    from .convert import ConversionError

    check_source(args.source)
    check_output(args.output, "OUTPUT")
    if getattr(args, "tokenizer", None):
        check_source(args.tokenizer, "--tokenizer")
    try:
        return convert(args.source, args.output, **options)
    except ConversionError as error:  # a source we cannot convert: the message names the file and field
        raise UsageError(str(error)) from None
    except OSError as error:
        if Path(args.source).is_dir():
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"cannot load `source` {args.source!r} (not a local folder): {first_line}") from None


def declared_arguments(args: argparse.Namespace, options) -> dict:
    """A convert command's values of its family's declared options (`Option.cli_flag`), by the
    converter's keyword: each flag's dest (`--no-normalize` is each command's own)."""
    dests = [option.cli_flag[2:].replace("-", "_") for option in options
             if option.cli_flag not in (None, "--no-normalize")]
    return {dest: getattr(args, dest) for dest in dests}


# ---- convert-lmk -------------------------------------------------------------------------------

def add_convert_lmk_command(subparsers) -> None:
    from lmk_embed.configuration_lmk import LONG_INPUTS, POOLINGS, POSITION_EXTENSIONS, SPLITTERS, LMKConfig

    parser = subparsers.add_parser("convert-lmk", help="Turn an encoder (folder or Hub id) into an LMK checkpoint.")
    parser.set_defaults(handler=run_convert_lmk)
    # Defaults are LMKConfig's (None here: the config fills them in).
    parser.add_argument("source", help="encoder checkpoint: a local folder, or a Hub id where the Hub is reachable")
    parser.add_argument("output", help="folder to write the LMK checkpoint to")
    parser.add_argument("--pooling", default=None, choices=POOLINGS, help=f"default {LMKConfig.pooling}")
    parser.add_argument("--granularity", type=positive_int, default=None, help=f"default {LMKConfig.granularity}")
    parser.add_argument("--splitter", default=None, choices=SPLITTERS, help=f"default {LMKConfig.splitter}")
    parser.add_argument("--granularities", type=positive_int, nargs="+", default=None,
                        help=f"the variable splitter's set (default {list(LMKConfig.granularities)})")
    parser.add_argument("--landmark-token", default=None, help=f"sep, eos, or a literal token (default {LMKConfig.landmark_token})")
    parser.add_argument("--max-length", type=positive_int, default=None)
    parser.add_argument("--no-normalize", action="store_true", help="do not L2-normalise embeddings by default")
    parser.add_argument("--seed", type=int, default=None, help=f"default {LMKConfig.splitter_seed}")
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.add_argument("--max-positions", type=positive_int, default=None, metavar="N",
                        help="extend the backbone to N positions; inputs that fit the original ones keep the base's vectors")
    parser.add_argument("--position-extension", default=None, choices=POSITION_EXTENSIONS,
                        help="how positions past the original table are read: interpolate (default), recurrent or "
                             "group for absolute tables; dynamic (NTK rope scaling, the default) for rotary backbones")
    parser.add_argument("--long-input", default=None, choices=LONG_INPUTS,
                        help=f"how texts longer than one window are read by default (default {LMKConfig.long_input}; "
                             "windows: landmark windows at the original positions, lmk pooling only)")
    parser.add_argument("--window-length", type=positive_int, default=None,
                        help="tokens per window for --long-input windows (default: the original positions)")


def run_convert_lmk(args: argparse.Namespace) -> int:
    from lmk_embed.configuration_lmk import LMK_OPTIONS

    from .convert import convert_to_lmk

    path = convert_source(convert_to_lmk, args, normalize=False if args.no_normalize else None,
                          **declared_arguments(args, LMK_OPTIONS),
                          **{name: getattr(args, name) for name in ("base_model", "max_positions", "position_extension")})
    print(f"LMK checkpoint written to {path}")
    return 0


# ---- convert-recurrent -------------------------------------------------------------------------

def add_convert_recurrent_command(subparsers) -> None:
    from lmk_embed.configuration_recurrent import SCHEDULES, RecurrentEmbedConfig

    parser = subparsers.add_parser("convert-recurrent", help="Turn a recurrent causal LM into an embedder checkpoint.")
    parser.set_defaults(handler=run_convert_recurrent)
    parser.add_argument("source", help="a Mamba2 / xLSTM / RWKV causal-LM checkpoint: a local folder, or a Hub id")
    parser.add_argument("output", help="folder to write the embedder checkpoint to")
    parser.add_argument("--schedule", default=RecurrentEmbedConfig.schedule, choices=SCHEDULES)
    parser.add_argument("--block-size", type=block_size, default=RecurrentEmbedConfig.block_size,
                        help="V: tokens per vertical block, or 'auto' (chosen per call from device, width and batch)")
    parser.add_argument("--add-bos-token", action="store_true")
    parser.add_argument("--max-length", type=positive_int, default=None)
    parser.add_argument("--default-task", default=None, help="the instruction for queries without a task")
    parser.add_argument("--no-normalize", action="store_true")
    parser.add_argument("--base-model", default=None, help="Hub id to record as the base model (for cards)")
    parser.add_argument(
        "--tokenizer", default=None,
        help="tokenizer folder or Hub id, for sources that ship none (mamba_ssm releases: EleutherAI/gpt-neox-20b)",
    )


def run_convert_recurrent(args: argparse.Namespace) -> int:
    from lmk_embed.configuration_recurrent import RECURRENT_OPTIONS

    from .convert import convert_to_recurrent

    path = convert_source(convert_to_recurrent, args, normalize=not args.no_normalize,
                          **declared_arguments(args, RECURRENT_OPTIONS), base_model=args.base_model, tokenizer=args.tokenizer)
    print(f"Recurrent embedder checkpoint written to {path}")
    return 0


# ---- train ---------------------------------------------------------------------------------------

UNSET = object()  # a TrainConfig field no flag gave: the file's value, else the dataclass default


def add_train_command(subparsers) -> None:
    """--config, then one flag per TrainConfig field (transformers' `HfArgumentParser`, as `--field_name`
    or `--field-name`): a flag given overrides the file's field."""
    from transformers import HfArgumentParser

    from .config import TrainConfig

    flags = HfArgumentParser(TrainConfig, add_help=False)
    flags.set_defaults(**{field.name: UNSET for field in fields(TrainConfig)})
    parser = subparsers.add_parser("train", parents=[flags],
                                   help="Fine-tune a checkpoint: lmk-embed train --config run.yaml [--field value ...]")
    parser.add_argument("--config", default=None, help="YAML file with the run's fields; flags override it")
    parser.set_defaults(handler=run_train)


def train_config(args: argparse.Namespace):
    """The TrainConfig for parsed `train` arguments: the YAML file's fields, then the flags given."""
    import yaml

    from .config import TrainConfig

    names = {field.name for field in fields(TrainConfig)}
    overrides = {name: value for name, value in vars(args).items() if name in names and value is not UNSET}
    try:
        if args.config is None:
            return TrainConfig(**overrides)
        if not Path(args.config).is_file():
            raise UsageError(f"--config {args.config!r}: no such file")
        return TrainConfig.from_yaml(args.config, **overrides)  # unknown fields in the file raise, naming them
    except yaml.YAMLError as error:
        raise UsageError(f"--config {args.config!r} is not valid YAML: {' '.join(str(error).split())}") from None
    except (TypeError, ValueError) as error:  # TrainConfig.check names the field
        raise UsageError(str(error)) from None


def run_train(args: argparse.Namespace) -> int:
    import logging

    config = train_config(args)
    if config.finetune != "qlora":
        keep_out_quantisation(args)
    check_source(config.model, "--model")
    check_output(config.output_dir, "--output_dir")
    if config.train_data != "stdlib" and not Path(config.train_data).is_file():
        raise UsageError(f"--train_data {config.train_data!r}: no such file (give a jsonl, csv or parquet file, or 'stdlib')")
    from . import train  # sentence-transformers, peft: after the checks
    from .data import TrainingDataError

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
