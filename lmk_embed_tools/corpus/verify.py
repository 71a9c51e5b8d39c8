"""Opening a landmark index: its record, its table's version and the query model checked.

An index is a record, not a pointer: its table holds the text the spans index, so nothing outside
INDEX is read but the model. Opening reads the `record` table (format, model identity, settings,
the version the index was finished at) and the `documents` table's manifest, not its vectors:
- Lance's own manifest lists every data file of every version with its rows, and a commit is whole
  or absent, which is what the old manifest.json and its shard list gave; a table at another version
  than the record's (rows added, deleted or rewritten after encoding) is refused;
- the rows, width and model identity are checked against the record here; a data file that is
  missing, cut short or not Lance fails when a query reads it, and that is refused in one line too;
- the query model's identity against the model that encoded the corpus stays ours: nothing in
  Lance knows which model made the vectors.
Indexes in the earlier shard format (parquet shards and manifest.json) are refused with the command
that converts them; `read_shard_index` reads them, checksums and all, for that conversion.
Every problem is a `SearchError` naming the folder and what is wrong.
"""

from __future__ import annotations

from pathlib import Path

from . import shards as shard_files

# The columns a landmark shard holds; `text` came with the index as a record.
COLUMNS = ("id", "embedding", "landmarks", "landmark_spans", "text")
# Manifest entries search reads, and their types.
_MANIFEST_ENTRIES = (("settings", dict), ("model", dict), ("input", dict), ("dimension", int), ("num_shards", int),
                     ("shards", list))
# Record entries search reads, and their types.
_RECORD_ENTRIES = (("settings", dict), ("model", dict), ("input", dict), ("dimension", int), ("rows", int),
                   ("version", int))


class SearchError(ValueError):
    """A folder that is not a landmark corpus, a damaged one, or a bad search argument; the message names it."""


def read_index_manifest(folder: Path) -> dict:
    """The record of a complete landmark index in `folder`, its entries checked (the name is the
    shard format's; the record stands for its manifest)."""
    from . import table as index_table

    if not folder.is_dir():
        raise SearchError(f"INDEX {str(folder)!r} is not a folder written by encode-corpus")
    if (folder / shard_files.MANIFEST).is_file():
        return _refuse_shard_folder(folder)
    if not index_table.is_index(folder):
        raise SearchError(f"INDEX {str(folder)!r} holds no landmark index (no `record` table): it was not written by "
                          "encode-corpus --output-value landmarks")
    try:
        record = index_table.read_record(folder)
    except ImportError:
        raise
    except Exception as error:
        raise SearchError(f"INDEX {str(folder)!r}: cannot read its record ({' '.join(str(error).split())[:200]}); "
                          "encode the corpus again") from None
    if not isinstance(record, dict) or record.get("format") != index_table.FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise SearchError(f"INDEX {str(folder)!r}: format {found!r}, not {index_table.FORMAT!r}")
    for key, kind in _RECORD_ENTRIES:
        if isinstance(record.get(key), bool) or not isinstance(record.get(key), kind):
            raise SearchError(f"INDEX {str(folder)!r}: its record's `{key}` is missing or not a {kind.__name__} (it was "
                              "edited or damaged); encode the corpus again")
    if not isinstance(record["settings"].get("model"), dict) or not isinstance(record["model"].get("source"), str):
        raise SearchError(f"INDEX {str(folder)!r}: the model entry is missing (the record was edited or damaged); "
                          "encode the corpus again")
    if not record.get("complete"):
        raise SearchError(f"INDEX {str(folder)!r} is not complete: run the same encode-corpus command again to finish it")
    return record


def _refuse_shard_folder(folder: Path):
    try:
        manifest = shard_files.read_manifest(folder)
    except ValueError as error:  # not JSON
        raise SearchError(str(error)) from None
    if isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict) and \
            manifest["settings"].get("output_value") == "embedding":
        raise SearchError(f"INDEX {str(folder)!r} holds document vectors only: encode the corpus with "
                          "`--output-value landmarks`")
    raise SearchError(f"INDEX {str(folder)!r} is a landmark index in the earlier shard format: convert it once with "
                      f"`lmk-embed index convert {folder} NEW_INDEX` and search NEW_INDEX")


def open_documents(folder: Path, record: dict):
    """The `documents` table at the version the record was finished at, its rows and width checked."""
    from . import table as index_table

    try:
        documents = index_table.connect(folder).open_table(index_table.DOCUMENTS)
        version, rows = documents.version, documents.count_rows()
        width = documents.schema.field("landmarks").type.value_type.list_size
    except Exception as error:
        raise SearchError(f"INDEX {str(folder)!r}: cannot open its documents table ({' '.join(str(error).split())[:200]}"
                          "); encode the corpus again") from None
    if version != record.get("version"):
        raise SearchError(f"INDEX {str(folder)!r}: its documents table is at version {version}, but the index was "
                          f"finished at version {record.get('version')} (it was changed after encoding); encode the "
                          "corpus again")
    if rows != record["input"].get("rows") or rows != record.get("rows"):
        raise SearchError(f"INDEX {str(folder)!r}: its documents table holds {rows} rows but the input had "
                          f"{record['input'].get('rows')}")
    if width != record["dimension"]:
        raise SearchError(f"INDEX {str(folder)!r}: vectors of width {width}, its record says dimension "
                          f"{record['dimension']}")
    return documents


def read_shard_manifest(folder: Path) -> dict:
    """The manifest of a complete landmark index in the earlier shard format, its entries checked."""
    path = folder / shard_files.MANIFEST
    if not folder.is_dir():
        raise SearchError(f"SRC {str(folder)!r} is not a folder")
    try:
        manifest = shard_files.read_manifest(folder)
    except ValueError as error:  # not JSON
        raise SearchError(str(error)) from None
    if manifest is None:
        raise SearchError(f"SRC {str(folder)!r} has no {shard_files.MANIFEST}: it is not a shard-format index")
    if not isinstance(manifest, dict) or manifest.get("format") != shard_files.FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise SearchError(f"{path}: format {found!r}, not {shard_files.FORMAT!r}; it was not written by encode-corpus")
    for key, kind in _MANIFEST_ENTRIES:
        if isinstance(manifest.get(key), bool) or not isinstance(manifest.get(key), kind):
            raise SearchError(f"{path}: `{key}` is missing or not a {kind.__name__} (the file was edited or "
                              "damaged); encode the corpus again")
    if manifest["settings"].get("output_value") != "landmarks":
        raise SearchError(f"SRC {str(folder)!r} holds document vectors only: there are no landmarks to convert")
    if not manifest.get("complete"):
        raise SearchError(f"SRC {str(folder)!r} is not complete: finish it with the encode-corpus command of its version")
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
    name = "`model` (--model)" if model is not None else "the model the index names"
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


__all__ = ["SearchError", "check_shard_list", "open_documents", "query_model", "read_index_manifest", "read_shard",
           "read_shard_manifest"]
