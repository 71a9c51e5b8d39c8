"""`lmk-embed serve`'s argument checks: each bad argument is one plain line naming it, before a model
is loaded or Ray starts."""

import socket
import subprocess
import sys

import pytest

from lmk_embed_tools import cli
from lmk_embed_tools.serve.process import free_port
from tests.helpers import REPO_ROOT


def test_a_file_as_checkpoint_is_one_line(tmp_path, capsys):
    (tmp_path / "model.bin").write_text("x")
    assert cli.main(["serve", str(tmp_path / "model.bin")]) == 2
    assert "CHECKPOINT" in capsys.readouterr().err


def test_an_index_that_is_not_one_is_named(tmp_path, lmk_checkpoint, capsys):
    assert cli.main(["serve", str(lmk_checkpoint), "--index", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "--index" in error and len(error.strip().splitlines()) == 1


@pytest.mark.parametrize("option, value", [("--port", "70000"), ("--replicas", "0"), ("--max-batch-size", "-1"),
                                           ("--batch-wait-ms", "-5"), ("--batch-wait-ms", "inf"),
                                           ("--max-input-tokens", "0"), ("--num-cpus", "0"), ("--num-cpus", "nan"),
                                           ("--max-body-bytes", "0"), ("--max-inputs", "-1"),
                                           ("--max-request-tokens", "x"), ("--request-timeout-s", "0"),
                                           ("--read-timeout-s", "-1"), ("--max-queued-requests", "0"),
                                           ("--backend", "tensorrt")])
def test_bad_options_exit_2_naming_them(lmk_checkpoint, option, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", str(lmk_checkpoint), option, value])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and option in error and len(error.strip().splitlines()) == 1


def test_a_folder_that_is_no_checkpoint_is_one_line(tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "config.json" in error and len(error.strip().splitlines()) == 1
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    assert cli.main(["serve", str(tmp_path)]) == 2
    assert "not an lmk-embed checkpoint" in capsys.readouterr().err


def test_the_onnx_backend_without_its_graph_is_one_line(lmk_checkpoint, capsys):
    assert cli.main(["serve", str(lmk_checkpoint), "--backend", "onnx"]) == 2
    error = capsys.readouterr().err
    assert "onnx/model.onnx" in error and "export-onnx" in error and len(error.strip().splitlines()) == 1


def test_an_empty_api_key_is_refused_and_a_key_never_reaches_the_replica(lmk_checkpoint, capsys, monkeypatch):
    monkeypatch.setenv("LMK_EMBED_API_KEY", " ")
    assert cli.main(["serve", str(lmk_checkpoint)]) == 2
    assert "API key" in capsys.readouterr().err
    from lmk_embed_tools.serve.app import key_digest

    assert b"sk-secret" not in key_digest("sk-secret") and len(key_digest("sk-secret")) == 32


def test_an_open_host_without_a_key_warns_once_and_a_ray_that_does_not_start_is_one_line(lmk_checkpoint, capsys,
                                                                                         monkeypatch):
    import ray

    def refuse(**kwargs):
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the address.")

    monkeypatch.delenv("LMK_EMBED_API_KEY", raising=False)
    monkeypatch.setattr(ray, "init", refuse)
    port = str(free_port("0.0.0.0"))
    assert cli.main(["serve", str(lmk_checkpoint), "--host", "0.0.0.0", "--port", port, "--address", "auto"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "without an API key" in lines[0] and "0.0.0.0" in lines[0]
    assert lines[1].startswith("lmk-embed serve: error: Ray did not start: Could not find any running Ray instance.")
    monkeypatch.setenv("LMK_EMBED_API_KEY", "sk-x")
    assert cli.main(["serve", str(lmk_checkpoint), "--host", "0.0.0.0", "--port", port, "--address", "auto"]) == 1
    error = capsys.readouterr().err
    assert "without an API key" not in error and "sk-x" not in error


@pytest.mark.parametrize("mode", [(), ("--replicas", "2")], ids=["one process", "ray"])
def test_a_port_in_use_is_one_plain_line_before_anything_starts(lmk_checkpoint, mode):
    """The command binds --host:--port first: a port in use exits 2 with one line naming it, no colour
    codes, without loading the model or starting Ray (which would print more)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "lmk_embed_tools.cli", "serve", str(lmk_checkpoint), "--port",
                               str(port), *mode], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                              env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "RAY_USAGE_STATS_ENABLED": "0"})
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and lines == [f"lmk-embed serve: error: --port {port}: the port is already in use "
                                               "on 127.0.0.1; stop what listens there or choose another --port"]


def test_a_host_not_of_this_machine_is_one_line(lmk_checkpoint, capsys):
    assert cli.main(["serve", str(lmk_checkpoint), "--host", "192.0.2.1"]) == 2  # TEST-NET-1: never local
    error = capsys.readouterr().err
    assert "--host '192.0.2.1'" in error and len(error.strip().splitlines()) == 1


def test_errors_are_plain_text_without_terminal_codes(capsys):
    """Ray's errors carry colour codes: the line printed holds none, and stays one line."""
    from lmk_embed_tools.serve.command import error_line

    error_line("\x1b[31mRayActorError\x1b[39m: The actor died\n  \x1b[1mTraceback\x1b[0m (most recent call last)")
    assert capsys.readouterr().err == ("lmk-embed serve: error: RayActorError: The actor died Traceback (most recent "
                                       "call last)\n")
