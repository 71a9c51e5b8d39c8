"""What every `lmk-embed` subcommand shares: the one-line user error, the parser that prints it,
argparse types, and the checks of a model source and an output folder.

It imports nothing of the tooling (of the shipped package, only the rules its checks apply), so the
module that owns a job can hold its command (`add_arguments`, `run`) without importing the command
tree back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class UsageError(Exception):
    """A mistake in the command line or its files: reported in one line, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors in one line (argparse's default adds the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def flag_value(text: str, rule, takes: str):
    """A flag's text checked by one of the shipped rules (`rule(value)`): read as an integer
    when it is one, else kept as text for the rule to take or refuse; argparse's error otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = text
    try:
        return rule(value)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {takes}, got {value!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer above 0 (`lmk_embed.encoding.check_positive_int`, the one rule)."""
    from lmk_embed.encoding import check_positive_int  # lazily: torch loads only when a flag is given

    return flag_value(text, lambda value: check_positive_int("value", value), "a positive integer")


def block_size(text: str) -> int | str:
    """argparse type: V tokens per vertical block, or "auto" (the option's rule, `check_block_size`)."""
    from lmk_embed.configuration_recurrent import check_block_size

    return flag_value(text, check_block_size, "a positive integer or 'auto'")


def check_source(source: str, name: str = "`source`") -> None:
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


def check_output(output, name: str) -> None:
    """An output folder may exist (it is reused or refused by the command itself), but not as a file."""
    if Path(output).exists() and not Path(output).is_dir():
        raise UsageError(f"{name} {str(output)!r} is a file; give a folder to write to")


def check_checkpoint_folder(checkpoint, name: str = "`checkpoint`") -> Path:
    """A checkpoint folder (one with a config.json), as a Path."""
    if not (Path(checkpoint) / "config.json").is_file():
        raise UsageError(f"{name} {str(checkpoint)!r} is not a checkpoint folder (no config.json)")
    return Path(checkpoint)


def check_names(names: list[str] | None, models: list[str]) -> list[str]:
    """--names (one per model), or each model folder's name."""
    if names is not None and len(names) != len(models):
        raise UsageError(f"--names: {len(names)} names for {len(models)} models")
    return names or [Path(model).name for model in models]


def one_line(error: Exception) -> str:
    """An error's message on one line."""
    return " ".join(str(error).split())


# bitsandbytes logs a warning when it is imported on some CPUs, and peft imports it whenever it is
# installed (`lmk_embed_tools.compat.bitsandbytes_kept_out` says where). Only QLoRA needs it.
QUANTISATION_MODULE = "bitsandbytes"


def keep_out_quantisation(args: argparse.Namespace) -> None:
    """The console command keeps bitsandbytes out for the whole process unless the run asks for 4-bit
    (QLoRA): a one-line error is then the only line. Only there: peft caches the answer per process."""
    if getattr(args, "console", False) and QUANTISATION_MODULE not in sys.modules:
        sys.modules[QUANTISATION_MODULE] = None

