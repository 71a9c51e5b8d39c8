"""OUTPUT_DIR of document vectors: parquet shards `part-00000.parquet`, ... and `manifest.json`
(the landmark index's shards of the earlier format are read by `verify` for `index convert`).

A shard is written under a temporary name and renamed when complete, so a file with a shard's
name is always whole. The manifest records the settings the shards were made with; a rerun with
other settings is refused with the differences named, and a rerun with the same settings keeps
every complete shard (checked against its row count and checksum) and redoes the rest.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
FORMAT = "lmk-embed-corpus/1"
TEMP_MARK = ".tmp-"
METADATA_KEY = b"lmk_embed.counts"


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def update_digest(digest, path) -> None:
    """Feed the file at `path` to `digest` (hashlib), 1 MiB at a time."""
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)


def file_sha256(path) -> str:
    digest = hashlib.sha256()
    update_digest(digest, path)
    return "sha256:" + digest.hexdigest()


def _vectors(array: np.ndarray, dtype: str):
    """[n, D] -> an arrow fixed_size_list<dtype>[D] array."""
    import pyarrow as pa

    array = np.ascontiguousarray(array, dtype=np.dtype(dtype))
    return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), array.shape[1])


def shard_table(ids: list, embeddings: np.ndarray, dtype: str):
    """The arrow table of one shard of document vectors: ids (str or int) and embeddings float32
    [n, D] -> columns id and embedding fixed_size_list<dtype>[D]. (A landmark index is LanceDB
    tables: `table`.)"""
    import pyarrow as pa

    return pa.table({"id": pa.array(ids), "embedding": _vectors(embeddings, dtype)})


def write_shard(output_dir, index: int, table, counts: dict) -> dict:
    """Write `table` as shard `index`: a temporary file, then an atomic rename. Returns its record.

    `counts` ({"truncated": ..., "empty": ..., "tokens": ...}) also go into the file's metadata, so
    a shard completed just before a kill, and not yet in the manifest, still brings its counts.
    """
    import pyarrow.parquet as pq

    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(counts)})
    final = Path(output_dir) / shard_name(index)
    temporary = final.with_name(f"{final.name}{TEMP_MARK}{os.getpid()}")
    pq.write_table(table, temporary)
    with open(temporary, "rb") as handle:  # the bytes reach the disk before the name says "complete"
        os.fsync(handle.fileno())
    os.replace(temporary, final)
    return {"file": final.name, "rows": table.num_rows, "sha256": file_sha256(final), **counts}


def remove_temporaries(output_dir) -> list[str]:
    """Delete shards left half-written by a killed run; returns their names."""
    removed = []
    for path in Path(output_dir).glob(f"part-*.parquet{TEMP_MARK}*"):
        path.unlink()
        removed.append(path.name)
    return removed


def read_manifest(output_dir) -> dict | None:
    path = Path(output_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg}); it was not written by encode-corpus") from None


def write_manifest(output_dir, manifest: dict) -> None:
    """Atomically replace manifest.json (a kill leaves the old one or the new one, never half)."""
    path = Path(output_dir) / MANIFEST
    temporary = path.with_name(f"{MANIFEST}{TEMP_MARK}{os.getpid()}")
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    os.replace(temporary, path)


def setting_differences(old: dict, new: dict) -> list[str]:
    """`key: old -> new` for every setting that differs (the reasons a rerun is refused)."""
    keys = sorted(set(old) | set(new))
    return [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key)]


def verify_shard(output_dir, index: int, expected_rows: int, recorded: dict | None) -> dict | None:
    """The record of shard `index` if its file is complete and matches, else None (to be redone).

    A shard renamed but not yet in the manifest (killed between the two) is checked by reading
    its row count; one in the manifest must also match its checksum.
    """
    import pyarrow.parquet as pq

    path = Path(output_dir) / shard_name(index)
    if not path.is_file():
        return None
    checksum = file_sha256(path)
    if recorded is not None:
        return recorded if recorded.get("sha256") == checksum and recorded.get("rows") == expected_rows else None
    try:
        parquet = pq.ParquetFile(path)
        rows = parquet.metadata.num_rows
        counts = json.loads(parquet.schema_arrow.metadata[METADATA_KEY])
    except Exception:  # not parquet, or not one of ours: not a complete shard
        return None
    return {"file": path.name, "rows": rows, "sha256": checksum, **counts} if rows == expected_rows else None
