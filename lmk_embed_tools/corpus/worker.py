"""One model copy that encodes whole shards: the unit of work of both engines.

A worker reads its shard's rows from INPUT itself (so the driver never holds the corpus), sorts
them longest first, calls the checkpoint's own `encode()` one batch at a time (landmarks and
vertical chunking included; one forward gives both landmarks and the document vector), and writes
the shard in input order: a parquet file, or one commit to the landmark index's table.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from copy import deepcopy
from pathlib import Path

import numpy as np

from . import table as index_table
from .inputs import Source, is_blank_file, read_range
from .shards import shard_table, write_shard

# Characters per piece when a streamed document's tokens are counted.
_PIECE_CHARS = 1 << 16
# encode() reports truncation in one warning per call: "{count} of {total} texts were longer ...".
_TRUNCATION = re.compile(r"^(\d+) of (\d+) texts were longer than max_length")


def load_model(model: dict, device=None, backend: dict | None = None, num_threads: int | None = None):
    """The checkpoint's AutoModel (its own code, `trust_remote_code=True`), in eval mode. With an ONNX
    `backend` setting ({"name": "onnx", "file": ...}), its exported graph on ONNX Runtime (CPU, with
    `num_threads` intra-op threads; None: ONNX Runtime's default)."""
    from transformers import AutoModel

    kwargs = {"revision": model["revision"]} if model.get("revision") else {}
    if backend is not None:
        kwargs.update(backend=backend["name"], file_name=backend["file"], num_threads=num_threads)
        return AutoModel.from_pretrained(model["source"], trust_remote_code=True, **kwargs).eval()
    loaded = AutoModel.from_pretrained(model["source"], trust_remote_code=True, **kwargs)
    if device is not None:
        loaded.to(device)
    return loaded.eval()


class ShardEncoder:
    """Encodes shards described by `{"index": k, "start": i, "stop": j}` (global input rows [i, j)).

    `job` is the plain dict `encode_corpus` builds (model, sources, settings, output_dir,
    batch_size), so the same object runs in this process, in a spawned process or as a Ray actor.
    Ray Data calls it as a callable class: `__call__({"shard": [json, ...]}) -> {"record": [json, ...]}`.
    """

    def __init__(self, job: dict, device=None, num_threads: int | None = None):
        import torch

        from lmk_embed_tools import return_freed_memory

        return_freed_memory()  # a huge document's windows must not raise RSS for good (glibc keeps freed heap)
        if num_threads:
            torch.set_num_threads(num_threads)
        self.job = job
        self.settings = job["settings"]
        self.sources = [Source(**source) for source in job["sources"]]
        self.model = load_model(job["model"], device, self.settings.get("backend"), num_threads)
        # A private copy that never truncates: counts every token of the input, for tokens/s.
        self._counter = deepcopy(self.model.tokenizer.backend_tokenizer)
        self._counter.no_truncation()
        self._counter.no_padding()

    def _pieces(self, path: Path):
        with open(path, encoding="utf-8") as handle:
            while piece := handle.read(_PIECE_CHARS):
                yield piece

    def _count_tokens(self, texts: list) -> int:
        """Content tokens of each text (no special tokens, no truncation); a long text and a streamed
        file are counted piece by piece, never tokenized whole."""
        from lmk_embed.encoding import encode_in_pieces

        strings = [t for t in texts if isinstance(t, str)]  # a long one in pieces: one Rust pass holds ~185 MB a MB
        count = sum(len(e.ids) for e in encode_in_pieces(self._counter, strings)) if strings else 0
        for path in (t for t in texts if isinstance(t, Path)):
            count += sum(len(ids) for ids in self.model.tokenizer.stream_content_ids(self._pieces(path)))
        return count

    def _readable(self, texts: list) -> list:
        """Paths stay paths for a model that streams them (recurrent: vertical schedule, flat
        memory); other models get the file's text."""
        if getattr(self.model, "supports_streaming", False):
            return texts
        return [t.read_text(encoding="utf-8") if isinstance(t, Path) else t for t in texts]

    def _encode_batch(self, texts: list) -> tuple[np.ndarray, list | None, int]:
        """texts (strings, or Paths of text files) -> (embeddings float32 [b, D], landmarks per
        text or None, number truncated)."""
        options = {"batch_size": len(texts), "max_length": self.settings["max_length"],
                   "prompt": self.settings["prompt"] or None, "show_progress_bar": False}
        options.update({name: self.settings[name] for name in ("long_input", "window_length") if name in self.settings})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if self.settings["output_value"] == "landmarks":
                embeddings, landmarks = self._landmarks_and_mean(texts, options)
            elif self.settings["output_value"] == "late_chunks":  # two passes: the document vector is the model's
                embeddings = self.model.encode(texts, **options)
                landmarks = self.model.encode(texts, output_value="late_chunks", **options)
            else:
                embeddings, landmarks = self.model.encode(texts, **options), None
        truncated = None
        for warning in caught:
            match = _TRUNCATION.match(str(warning.message))
            if match and truncated is None:
                truncated = int(match.group(1))
            elif not match:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return np.asarray(embeddings, dtype=np.float32), landmarks, truncated or 0

    def _landmarks_and_mean(self, texts: list, options: dict) -> tuple[np.ndarray, list]:
        """One forward for both outputs: landmark pooling's document vector is the mean of the
        landmark states, normalised after the mean (so the landmarks come back unnormalised here and
        are normalised one by one, as `encode(output_value="landmarks")` gives them)."""
        if self.model.config.pooling != "lmk":  # another chunk-aligned pooling: its own document vector
            return self.model.encode(texts, **options), self.model.encode(texts, output_value="landmarks", **options)
        import torch
        import torch.nn.functional as F

        raw = self.model.encode(texts, output_value="landmarks", normalize=False, convert_to_tensor=True, **options)
        normalize = bool(self.model.config.normalize)
        means = torch.stack([item["embeddings"].mean(0) for item in raw])
        landmarks = [{"embeddings": (F.normalize(item["embeddings"], dim=-1) if normalize else item["embeddings"])
                      .cpu().numpy(), "spans": item["spans"]} for item in raw]
        return (F.normalize(means, dim=-1) if normalize else means).cpu().numpy(), landmarks

    def encode_shard(self, shard: dict, progress=None) -> dict:
        """Encode and write one shard; returns its manifest record (with "index").

        progress(rows, tokens) is called after each batch.
        """
        ids, texts = read_range(self.sources, shard["start"], shard["stop"], self.settings["text_field"],
                                self.settings["id_field"], self.settings.get("path_field"))
        # Longest first, as encode() does: similar lengths share a batch (less padding).
        lengths = [os.path.getsize(t) if isinstance(t, Path) else len(t) for t in texts]
        order = sorted(range(len(texts)), key=lambda i: -lengths[i])
        batch_size = self.job["batch_size"]
        embeddings, landmarks = None, [None] * len(texts)
        truncated = tokens = 0
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = self._readable([texts[i] for i in rows])
            vectors, batch_landmarks, batch_truncated = self._encode_batch(batch)
            if embeddings is None:
                embeddings = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            embeddings[rows] = vectors  # back to input order
            for row, item, text in zip(rows, batch_landmarks or [], batch):  # the text goes into the shard too
                landmarks[row] = {"embeddings": np.asarray(item["embeddings"]), "spans": item["spans"], "text": text}
            batch_tokens = self._count_tokens(batch)
            truncated += batch_truncated
            tokens += batch_tokens
            if progress is not None:
                progress(len(rows), batch_tokens)
        if embeddings is None:  # an empty shard cannot happen (shards are non-empty ranges)
            raise ValueError(f"shard {shard['index']} has no rows")
        empty = sum(is_blank_file(t) if isinstance(t, Path) else not t.strip() for t in texts)
        counts = {"truncated": truncated, "empty": empty, "tokens": tokens}
        if landmarks[0] is not None:  # an index (landmarks or late chunks): one commit to its documents table
            rows = index_table.shard_rows(shard, ids, [item["text"] for item in landmarks], embeddings,
                                          landmarks, self.settings["dtype"], self._id_type())
            return index_table.write_shard(self.job["output_dir"], shard, rows, counts)
        table = shard_table(ids, embeddings, self.settings["dtype"])
        return {"index": shard["index"], **write_shard(self.job["output_dir"], shard["index"], table, counts)}

    def _id_type(self):
        import pyarrow as pa

        return pa.int64() if self.job.get("id_type") == "int" else pa.string()

    def __call__(self, batch: dict) -> dict:
        records = [self.encode_shard(json.loads(item)) for item in batch["shard"]]
        return {"record": np.array([json.dumps(record) for record in records], dtype=object)}
