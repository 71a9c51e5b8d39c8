"""The `lmk-embed` command: one argparse tree, flags over the YAML file for `train`, and user errors
reported in one line with exit status 2 (no traceback)."""

import os
import subprocess
import sys

import pytest
import yaml

from lmk_embed_tools import cli
from lmk_embed_tools.training.commands import train_config
from tests.helpers import REPO_ROOT


def run_cli(*args, **popen):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, *popen.pop("python_flags", []), "-m", "lmk_embed_tools.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600, **popen)


def error_lines(stderr: str) -> list[str]:
    """The lines the command itself wrote: libraries may log their own warnings on import."""
    return [line for line in stderr.splitlines() if line.startswith(("lmk-embed", "push:"))]


def exit_status(argv) -> int:
    """`cli.main(argv)`'s exit status, in process: argparse's own errors exit through SystemExit."""
    try:
        return cli.main([str(arg) for arg in argv])
    except SystemExit as exit_:
        return exit_.code


def write_yaml(path, **data):
    path.write_text(yaml.safe_dump(data))
    return path


# ---- user errors: one line, exit 2, no traceback ---------------------------------------------------


@pytest.mark.parametrize(
    "args, named",
    [
        (["card", "{tmp}/no-such-checkpoint"], "no-such-checkpoint"),
        (["convert-lmk", "{tmp}/no/such/encoder", "{tmp}/out"], "no/such/encoder"),
        (["convert-lmk", "a", "b", "--granularity", "many"], "--granularity"),
        (["push", "{tmp}/no-such-checkpoint", "our-org/x", "--dry-run"], "no-such-checkpoint"),
        (["train", "--config", "{tmp}/missing.yaml"], "missing.yaml"),
        (["train", "--config", "{tmp}/run.yaml", "--lora_rank", "4"], "--lora_rank"),
        (["train", "--config", "{tmp}/run.yaml", "--train_data", "{tmp}/no-such-data.jsonl"], "no-such-data.jsonl"),
        (["push", "{tmp}", "our-org/x/y", "--dry-run"], "repo_id"),
        (["encode-corpus", "{tmp}/no-model", "{tmp}/in.jsonl", "{tmp}/run.yaml"], "OUTPUT_DIR"),  # a file
        (["encode-corpus", "{tmp}/no-model", "{tmp}/in.jsonl", "{tmp}/run.yaml/out"], "is a file"),
        (["encode-corpus", "{tmp}/no-model", "{tmp}/in.jsonl", "{tmp}/out"], "no-model"),
        (["encode-corpus", "{tmp}/no-model", "{tmp}/dup.jsonl", "{tmp}/out"], "duplicate id 'a'"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(tmp_path, args, named, capsys):
    """In process (`cli.main`): a traceback would be an exception raised here. The console command
    itself, in a fresh process, is the next test's."""
    write_yaml(tmp_path / "run.yaml", model="m", output_dir=str(tmp_path / "o"))
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (tmp_path / "dup.jsonl").write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n')
    assert exit_status([arg.format(tmp=tmp_path) for arg in args]) == 2
    err = capsys.readouterr().err
    assert not [line for line in err.splitlines() if line.startswith("usage:")]
    lines = error_lines(err)
    assert len(lines) == 1 and named in lines[0], err[-2000:]


def test_the_console_command_reports_a_user_error_in_one_line_and_exits_2(tmp_path):
    result = run_cli("train", "--config", tmp_path / "missing.yaml")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "missing.yaml" in lines[0], result.stderr[-2000:]


def test_a_training_row_without_positive_is_one_line_and_exit_2(tmp_path, lmk_checkpoint, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"query": "q1", "positive": "p1"}\n{"query": "q2", "postive": "misspelt"}\n')
    argv = ["train", "--model", lmk_checkpoint, "--output_dir", tmp_path / "o", "--train_data", data, "--max_steps", "1",
            "--eval_data", "none"]
    assert exit_status(argv) == 2
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("lmk-embed train: error: --train_data: ")
    assert "pairs.jsonl" in lines[0] and "line 2: missing field `positive`" in lines[0]


def test_bad_yaml_field_is_one_line_and_the_file_is_closed(tmp_path):
    """An unknown field in the file is named; the config file is never left open (ResourceWarning)."""
    config = write_yaml(tmp_path / "run.yaml", model="m", output_dir=str(tmp_path / "o"), lora_rank=4)
    result = run_cli("train", "--config", config, python_flags=["-W", "always::ResourceWarning"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "unknown field(s) ['lora_rank']" in lines[0]
    assert not [line for line in result.stderr.splitlines() if "ResourceWarning" in line and str(config) in line]


# ---- the tree, in process -----------------------------------------------------------------------


def test_every_subcommand_has_its_handler():
    parser = cli.build_parser()
    samples = {
        "convert-lmk": ["src", "out"],
        "convert-recurrent": ["src", "out"],
        "train": ["--config", "run.yaml"],
        "card": ["ckpt"],
        "push": ["ckpt", "org/name", "--dry-run", "--max-file-mb", "2"],
    }
    handlers = set()
    for command, rest in samples.items():
        args = parser.parse_args([command, *rest])
        assert args.command == command and callable(args.handler)
        handlers.add(args.handler)
    assert len(handlers) == len(samples)
    push_args = parser.parse_args(["push", "ckpt", "org/name", "--dry-run", "--max-file-mb", "2"])
    assert (push_args.checkpoint, push_args.repo_id, push_args.dry_run, push_args.max_file_mb) == ("ckpt", "org/name", True, 2.0)


def test_choice_lists_come_from_the_shipped_package():
    from lmk_embed.configuration_lmk import POOLINGS, SPLITTERS
    from lmk_embed.configuration_recurrent import SCHEDULES

    parser = cli.build_parser()
    for value in POOLINGS:
        assert parser.parse_args(["convert-lmk", "s", "o", "--pooling", value]).pooling == value
    for value in SPLITTERS:
        assert parser.parse_args(["convert-lmk", "s", "o", "--splitter", value]).splitter == value
    for value in SCHEDULES:
        assert parser.parse_args(["convert-recurrent", "s", "o", "--schedule", value]).schedule == value


def test_train_flags_override_the_file_field_by_field(tmp_path):
    config = write_yaml(tmp_path / "run.yaml", model="m", output_dir="o", max_steps=3, lora_r=8, bf16=True,
                        granularities=[32, 64])
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--config", str(config), "--max_steps", "9", "--lora-alpha", "4",
                              "--granularities", "16", "--splitter", "variable"])
    run = train_config(args)
    assert (run.max_steps, run.lora_alpha, run.granularities, run.splitter) == (9, 4, [16], "variable")  # flags
    assert (run.lora_r, run.bf16, run.model) == (8, True, "m")  # the file
    assert run.learning_rate is None and run.seed == 42  # the dataclass's defaults
    # A flag equal to the dataclass default still overrides the file.
    run = train_config(parser.parse_args(["train", "--config", str(config), "--lora_r", "16", "--bf16", "false"]))
    assert (run.lora_r, run.bf16) == (16, False)
    # No file: flags alone.
    run = train_config(parser.parse_args(["train", "--model", "m", "--output_dir", "o", "--bf16"]))
    assert (run.model, run.output_dir, run.bf16, run.max_steps) == ("m", "o", True, -1)


@pytest.mark.parametrize(
    "data, flags, named",
    [
        ({"model": "m", "output_dir": "o", "lora_rank": 4}, [], "unknown field(s) ['lora_rank']"),
        ({"model": "m", "output_dir": "o", "lora_alpha": -1}, [], "`lora_alpha` must be a positive integer"),
        ({"model": "m", "output_dir": "o"}, ["--lora_alpha", "0"], "`lora_alpha` must be a positive integer"),
        ({"output_dir": "o"}, [], "`model` is required"),
    ],
)
def test_train_config_errors_name_the_field(tmp_path, data, flags, named, capsys):
    config = write_yaml(tmp_path / "run.yaml", **data)
    assert cli.main(["train", "--config", str(config), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and err.startswith("lmk-embed train: error:")


def test_invalid_yaml_is_a_user_error(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("model: [unclosed\n")
    assert cli.main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not valid YAML" in err and "run.yaml" in err


def test_bad_flags_exit_2_in_one_line(capsys):
    for argv, named in [(["convert-lmk", "a", "b", "--granularity", "0"], "--granularity"),
                        (["train", "--max_steps", "x"], "--max_steps"),
                        (["train", "--finetune", "partial"], "--finetune"),
                        (["push", "ckpt"], "repo_id"),
                        ([], "command")]:
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and named in err, (argv, err)


def test_a_file_given_as_the_source_is_named(tmp_path, capsys):
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert cli.main(["convert-lmk", str(tmp_path / "weights.bin"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights.bin" in err and "is a file" in err
