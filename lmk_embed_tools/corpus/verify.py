"""Opening a landmark index: its manifest, every shard and the query model checked against the record.

An index is a record, not a pointer: the shards hold the text the spans index, so nothing outside
INDEX is read but the model. What the manifest records is verified at every open, because a
damaged index otherwise searches to wrong hits with no error: the shard list against the files
present, each shard's bytes against its sha256 (a swapped, edited or truncated shard), each
shard's rows and width against the manifest, and the query model's identity against the model
that encoded the corpus. Every problem is a `SearchError` naming the file and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

from . import shards as shard_files

# The columns a landmark shard holds; `text` came with the index as a record.
COLUMNS = ("id", "embedding", "landmarks", "landmark_spans", "text")
# Manifest entries search reads, and their types.
_MANIFEST_ENTRIES = (("settings", dict), ("model", dict), ("input", dict), ("dimension", int), ("num_shards", int),
                     ("shards", list))


class SearchError(ValueError):
    """A folder that is not a landmark corpus, a damaged one, or a bad search argument; the message names it."""


def read_index_manifest(folder: Path) -> dict:
    """The manifest of a complete landmark corpus in `folder`, its entries checked."""
    if not folder.is_dir():
        raise SearchError(f"INDEX {str(folder)!r} is not a folder written by encode-corpus")
    path = folder / shard_files.MANIFEST
    try:
        manifest = shard_files.read_manifest(folder)
    except ValueError as error:  # not JSON
        raise SearchError(str(error)) from None
    if manifest is None:
        raise SearchError(f"INDEX {str(folder)!r} has no {shard_files.MANIFEST}: it was not written by encode-corpus")
    if not isinstance(manifest, dict) or manifest.get("format") != shard_files.FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise SearchError(f"{path}: format {found!r}, not {shard_files.FORMAT!r}; it was not written by encode-corpus")
    for key, kind in _MANIFEST_ENTRIES:
        if isinstance(manifest.get(key), bool) or not isinstance(manifest.get(key), kind):
            raise SearchError(f"{path}: `{key}` is missing or not a {kind.__name__} (the file was edited or "
                              "damaged); encode the corpus again")
    if not isinstance(manifest["settings"].get("model"), dict) or not isinstance(manifest["model"].get("source"), str):
        raise SearchError(f"{path}: the model entry is missing (the file was edited or damaged); encode the corpus again")
    if manifest["settings"].get("output_value") != "landmarks":
        raise SearchError(f"INDEX {str(folder)!r} holds document vectors only: encode the corpus with "
                          "`--output-value landmarks`")
    if not manifest.get("complete"):
        raise SearchError(f"INDEX {str(folder)!r} is not complete: run the same encode-corpus command again to finish it")
    return manifest


def check_shard_list(folder: Path, manifest: dict) -> list[dict]:
    """The manifest's shard records, checked to be shards 0..num_shards-1, by their names, with no
    other shard file in `folder` and the input's row count between them."""
    path, records = folder / shard_files.MANIFEST, manifest["shards"]
    for k, record in enumerate(records):
        if not isinstance(record, dict) or record.get("index") != k or record.get("file") != shard_files.shard_name(k) \
                or not isinstance(record.get("rows"), int) or not isinstance(record.get("sha256"), str):
            raise SearchError(f"{path}: shard record {k} is {record!r:.120}, not shard {shard_files.shard_name(k)}")
    if len(records) != manifest["num_shards"]:
        raise SearchError(f"{path} lists {len(records)} of its {manifest['num_shards']} shards; encode the corpus again")
    listed = {record["file"] for record in records}
    for file in sorted(folder.glob("part-*.parquet")):
        if file.name not in listed:
            raise SearchError(f"{file}: a shard that {shard_files.MANIFEST} does not list ({len(records)} shards); "
                              "the manifest was edited or belongs to another run")
    rows = sum(record["rows"] for record in records)
    if rows != manifest["input"].get("rows"):
        raise SearchError(f"{path}: its shards hold {rows} rows but the input had {manifest['input'].get('rows')}")
    return records


def read_shard(folder: Path, record: dict, dimension: int):
    """The arrow table of one shard, read once from bytes that match the manifest's checksum."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / record["file"]
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SearchError(f"{path}: cannot read the shard ({error.strerror or error}); {shard_files.MANIFEST} "
                          "lists it") from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise SearchError(f"{path}: its bytes do not match the sha256 in {shard_files.MANIFEST} (the shard was "
                          "changed, swapped or truncated after encoding); encode the corpus again")
    try:
        table = pq.read_table(pa.BufferReader(data))
    except Exception as error:  # pyarrow raises ArrowInvalid / OSError for bytes that are not parquet
        raise SearchError(f"{path}: cannot read as parquet ({' '.join(str(error).split())})") from None
    missing = [column for column in COLUMNS if column not in table.column_names]
    if missing:
        raise SearchError(f"{path}: no {missing} column(s); shards written before the index stored its text cannot "
                          "show passages: encode the corpus again into a new folder")
    if table.num_rows != record["rows"]:
        raise SearchError(f"{path}: {table.num_rows} rows, {shard_files.MANIFEST} says {record['rows']}")
    width = table.schema.field("embedding").type.list_size
    if width != dimension:
        raise SearchError(f"{path}: vectors of width {width}, {shard_files.MANIFEST} says dimension {dimension}")
    return table


def query_model(manifest: dict, folder: Path, model: str | None = None) -> dict:
    """The identity ({"source", "revision", "sha256"}) of the model to embed queries with: `model`
    (a folder or Hub id) or the one the manifest names, refused unless it is the model that encoded
    the corpus. Folders compare by their sha256 (`folder_sha256`), Hub snapshots by commit; a Hub
    snapshot given for an index made from a folder compares by the snapshot folder's sha256."""
    from .encode import CorpusArgumentError, describe_model, folder_sha256

    recorded, index_source = manifest["settings"]["model"], manifest["model"]["source"]
    name = "`model` (--model)" if model is not None else f"the model {shard_files.MANIFEST} names"
    source = model if model is not None else index_source
    try:
        identity, files = describe_model(source)
    except CorpusArgumentError:
        raise SearchError(f"{name} {source!r} is not a checkpoint folder, nor a Hub model that can be found; INDEX "
                          f"{str(folder)!r} was encoded with it") from None
    if recorded.get("sha256"):
        same = (identity["sha256"] or folder_sha256(files)) == recorded["sha256"]
    else:
        same = identity["revision"] is not None and identity["revision"] == recorded.get("revision")
    if not same:
        raise SearchError(f"{name} {source!r} ({_fingerprint(identity)}) is not the model that encoded INDEX "
                          f"{str(folder)!r} ({index_source!r}, {_fingerprint(recorded)}): query vectors of another "
                          "model do not rank its landmarks; search with the index's own model")
    return identity


def _fingerprint(identity: dict) -> str:
    return identity.get("sha256") or f"revision {identity.get('revision')}"


__all__ = ["SearchError", "check_shard_list", "query_model", "read_index_manifest", "read_shard"]
