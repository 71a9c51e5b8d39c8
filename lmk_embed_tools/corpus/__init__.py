"""Corpus-scale encoding (`lmk-embed encode-corpus`): a checkpoint's own `encode()` over jsonl,
csv, parquet or a saved `datasets` dataset, into resumable parquet shards with a manifest, or with
`output_value="landmarks"` into a landmark index (LanceDB tables, `table`; searched by `search`),
on local worker processes or a Ray cluster.

The names below load on first use, so that `corpus.search` (and the server's request checks, which
read its modes and fusions) can be imported without the encoder's torch.
"""

import importlib

_LAZY = {"encode_corpus": "encode", "CorpusArgumentError": "encode", "CorpusSettingsError": "encode",
         "CorpusInputError": "inputs"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["encode_corpus", "CorpusArgumentError", "CorpusInputError", "CorpusSettingsError"]
