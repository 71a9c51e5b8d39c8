"""Corpus-scale encoding (`lmk-embed encode-corpus`): a checkpoint's own `encode()` over jsonl,
csv, parquet or a saved `datasets` dataset, into resumable parquet shards with a manifest, or with
`output_value="landmarks"` into a landmark index (LanceDB tables, `table`; searched by `search`),
on local worker processes or a Ray cluster.
"""

from .encode import CorpusArgumentError, CorpusSettingsError, encode_corpus
from .inputs import CorpusInputError

__all__ = ["encode_corpus", "CorpusArgumentError", "CorpusInputError", "CorpusSettingsError"]
