"""An on-disk cache of corpus embeddings, keyed by model hash + settings + data hash.

Re-running an evaluation (another metric, another plot, one more model) then encodes no corpus
twice. A key changes whenever the weights, any encode setting (max length, granularity, ...) or
any document changes, so a hit is always the same computation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import numpy as np


def model_hash(model) -> str:
    """sha256 of every parameter and buffer (names, dtypes, shapes, bytes), the model's class and its
    config (our models' defaults, such as granularity or long_input, live there).

    Hashes what the model computes with, not where it was loaded from, so a fine-tuned copy
    saved over the same folder, or a copy whose config.json was edited, never reads its
    predecessor's vectors."""
    import torch

    digest = hashlib.sha256(type(model).__qualname__.encode())
    config = getattr(model, "config", None)
    if hasattr(config, "to_dict"):
        settings = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
        digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor = tensor.detach().cpu().contiguous()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def data_hash(documents: dict[str, str]) -> str:
    """sha256 of the documents, ids and order included."""
    digest = hashlib.sha256()
    for doc_id, text in documents.items():
        digest.update(f"{len(doc_id)}:{doc_id}{len(text)}:".encode())
        digest.update(text.encode())
    return digest.hexdigest()


def cache_key(model_digest: str, settings: dict, documents_digest: str) -> str:
    blob = json.dumps({"model": model_digest, "settings": settings, "data": documents_digest}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class EmbeddingCache:
    """`get_or_compute(key, compute)`: float32 arrays (or lists of arrays) stored as .npz under `folder`.

    `folder=None` disables caching. `hits` / `misses` count lookups (reported by the runner)."""

    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder is not None else None
        self.hits = self.misses = 0

    def get_or_compute(self, key: str, compute: Callable[[], np.ndarray | list[np.ndarray]]):
        path = self.folder / f"{key}.npz" if self.folder is not None else None
        if path is not None and path.is_file():
            self.hits += 1
            with np.load(path) as stored:
                if "offsets" in stored:  # a list of [n_i, D] arrays, stored flat
                    flat, offsets = stored["flat"], stored["offsets"]
                    return [flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
                return stored["vectors"]
        self.misses += 1
        value = compute()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial.npz")  # never leave a half-written file under the real key
            if isinstance(value, list):
                offsets = np.cumsum([0] + [len(v) for v in value])
                np.savez(partial, flat=np.concatenate(value).astype(np.float32), offsets=offsets)
            else:
                np.savez(partial, vectors=np.asarray(value, dtype=np.float32))
            partial.replace(path)
        return value
