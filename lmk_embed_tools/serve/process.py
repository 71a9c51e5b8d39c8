"""An HTTP server in a process of its own, up until the block ends: `lmk-embed serve` (one process,
or Ray Serve with its flags) for tests and benchmarks, and a peer server for the benchmark."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running(command: list[str], health_url: str, timeout_s: float = 180, env: dict | None = None, log_path=None,
            cwd=None, ready_text: str | None = None):
    """Start `command` in a new session, wait until `health_url` answers 200 (and, with `ready_text`,
    its output holds that text), yield the process; then SIGTERM, and after 20 s its whole process
    group is killed (a local Ray's processes too)."""
    import httpx

    log = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT,
                               cwd=cwd, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health_url, timeout=5).status_code == 200 and (ready_text is None or _holds(log, ready_text)):
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"{command[0]} did not come up (exit {process.poll()}):\n{log.read()[-4000:]}")
            time.sleep(0.1)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


def _holds(log, text: str) -> bool:
    log.flush()
    log.seek(0)
    found = text in log.read()
    log.seek(0, os.SEEK_END)
    return found


@contextlib.contextmanager
def lmk_embed_server(checkpoint, *options: str, name: str = "model", host: str = "127.0.0.1", log_path=None,
                     env: dict | None = None):
    """`lmk-embed serve CHECKPOINT --name NAME OPTIONS` on a free port; yields its base URL."""
    port = free_port(host)
    command = [sys.executable, "-m", "lmk_embed_tools.cli", "serve", str(checkpoint), "--name", name,
               "--host", host, "--port", str(port), *options]
    # /health answers once one replica is up; the command says "serving" once every replica is.
    with running(command, f"http://{host}:{port}/health", env={"RAY_USAGE_STATS_ENABLED": "0", **(env or {})},
                 log_path=log_path, ready_text=f" at http://{host}:{port}/v1 ("):
        yield f"http://{host}:{port}"
