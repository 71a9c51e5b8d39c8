"""`lmk-embed serve` in a process of its own on 127.0.0.1, for a test module."""

from __future__ import annotations

import base64
import contextlib

import numpy as np

from lmk_embed_tools.serve.process import lmk_embed_server
from tests.helpers import REPO_ROOT


@contextlib.contextmanager
def running_server(checkpoint, *options: str, name: str = "tiny", log_path=None, env: dict | None = None):
    """The server (a local Ray of its own) for CHECKPOINT; yields its base URL once /health answers."""
    with lmk_embed_server(checkpoint, *options, name=name, log_path=log_path,
                          env={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT), **(env or {})}) as url:
        yield url


def decode_base64(text: str) -> np.ndarray:
    """OpenAI's base64: little-endian float32."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4")
