"""`lmk-embed serve` in a process of its own on 127.0.0.1, for a test module; and the clients' checks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

from tests.helpers import REPO_ROOT

START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_server(checkpoint, *options: str, name: str = "tiny", log_path=None):
    """Start `lmk-embed serve CHECKPOINT --name NAME OPTIONS` (a local Ray of its own) and yield its
    base URL once it says it serves; stopped with SIGTERM (then its process group is killed)."""
    port = free_port()
    command = [sys.executable, "-m", "lmk_embed_tools.cli", "serve", str(checkpoint), "--name", name,
               "--host", "127.0.0.1", "--port", str(port), *options]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), RAY_USAGE_STATS_ENABLED="0")
    log = open(log_path, "w+") if log_path else open(os.devnull, "w+")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            line = process.stdout.readline()
            if line.startswith("serving "):
                break
            if not line and process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"lmk-embed serve did not start (exit {process.poll()}):\n{log.read()[-4000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):  # Ray's processes, started in the server's session
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


def decode_base64(text: str):
    import base64

    import numpy as np

    return np.frombuffer(base64.b64decode(text), dtype="<f4")
