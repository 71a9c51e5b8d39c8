"""`lmk-embed index convert SRC DST`: a landmark index in the earlier shard format (parquet shards and
manifest.json) into the LanceDB index search reads now, without encoding anything again.

Every shard is verified as the old search verified it (its sha256, rows and width against the
manifest) before its rows are written; a shard becomes one commit of the new table, and the new
record keeps the model identity, settings and input of the old manifest.
"""

from __future__ import annotations

from pathlib import Path

from . import table as index_table
from . import verify
from .verify import SearchError


def _documents(shard: dict, table, dtype: str):
    """An old shard's arrow table as rows of the new `documents` table."""
    import pyarrow as pa

    id_type = table.schema.field("id").type
    id_type = pa.int64() if pa.types.is_integer(id_type) else pa.string()
    dimension = table.schema.field("embedding").type.list_size
    columns = {"row": pa.array(range(shard["start"], shard["start"] + table.num_rows), pa.int64()),
               "shard": pa.array([shard["index"]] * table.num_rows, pa.int32())}
    columns.update({name: table.column(name) for name in ("id", "text", "embedding", "landmarks", "landmark_spans")})
    schema = index_table.documents_schema(dimension, dtype, id_type)
    return pa.table(columns).cast(schema), id_type


def convert_shard_index(source, destination) -> dict:
    """Write the LanceDB index of the shard-format index `source` into the new folder `destination`;
    returns its record. A damaged `source` raises `SearchError` naming the shard."""
    source, destination = Path(source), Path(destination)
    manifest = verify.read_shard_manifest(source)
    records = verify.check_shard_list(source, manifest)
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise SearchError(f"DST {str(destination)!r} exists and is not an empty folder; give a new one")
    dtype = manifest["settings"].get("dtype", "float32")
    record = {"format": index_table.FORMAT, **{key: manifest[key] for key in ("model", "settings", "input", "dimension")},
              "hybrid_weight": index_table.DEFAULT_HYBRID_WEIGHT, "complete": False, "converted_from": str(source)}
    start, created, totals = 0, False, {"rows": 0, "truncated": 0, "empty": 0, "tokens": 0}
    for shard_record in records:
        table = verify.read_shard(source, shard_record, manifest["dimension"])
        shard = {"index": shard_record["index"], "start": start, "stop": start + table.num_rows}
        rows, id_type = _documents(shard, table, dtype)
        if not created:
            destination.mkdir(parents=True, exist_ok=True)
            index_table.create(destination, record, manifest["dimension"], dtype, id_type)
            created = True
        counts = {key: int(shard_record.get(key, 0)) for key in ("truncated", "empty", "tokens")}
        index_table.write_shard(destination, shard, rows, counts)
        totals = {key: totals[key] + (rows.num_rows if key == "rows" else counts[key]) for key in totals}
        start = shard["stop"]
    if not created:  # an empty corpus
        import pyarrow as pa

        destination.mkdir(parents=True, exist_ok=True)
        index_table.create(destination, record, manifest["dimension"], dtype, pa.string())
    return index_table.finish(destination, {**record, "counts": totals})


__all__ = ["convert_shard_index"]
