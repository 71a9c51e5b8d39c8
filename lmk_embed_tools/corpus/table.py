"""The landmark index as LanceDB tables in OUTPUT_DIR (`encode-corpus --output-value landmarks`).

- `documents`: one row per input row: `row` (its place in INPUT), `shard`, `id`, `text` (what the
  spans index), `embedding` (the document vector), `landmarks` (a multivector column, each
  document's landmark vectors, searched by max-sim) and `landmark_spans` ([start, end) characters).
- `shards`: one row per finished shard with its counts (rows, truncated, empty, tokens).
- `record`: one row, the index's record as JSON: format, model identity, settings, input,
  dimension, the hybrid weight, and once complete the `documents` version it was finished at and
  BM25's tokenizer (`lexical`, `LEXICAL_TOKENIZER`).

A shard is one `add` to `documents`, and Lance commits an `add` whole or not at all, so a killed
worker leaves its shard absent, never half there: a rerun redoes the shards whose rows are not all
there (deleting any partial or doubled copy first), from any engine. Lance's versions stand for the
old manifest: the record names the version the index was finished at, and a search refuses a table
at another version.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FORMAT = "lmk-embed-landmarks/2"
DOCUMENTS, SHARDS, RECORD = "documents", "shards", "record"
DEFAULT_HYBRID_WEIGHT = 0.5  # BM25's share in min-max fusion (the evaluation's default)
# BM25's one configuration: the tokenizer of the full-text index (LanceDB's FTS) that `search`, `serve`
# and `evaluate --through-index` rank with: lower-cased, ASCII-folded words, English stop words removed,
# stemmed. Stemming was chosen on validation (deep:systems and the validation split; docs/experiments.md).
# Written into the record as "lexical".
LEXICAL_TOKENIZER = {"base_tokenizer": "simple", "language": "English", "max_token_length": 40, "lower_case": True,
                     "stem": True, "remove_stop_words": True, "ascii_folding": True}
# Landmark vectors below which search scans them all (exact); at and above, a vector index. LanceDB's
# multivector flat scan took 670 ms a query at 100k landmarks against 10-12 ms through IVF_SQ with
# recall@10 0.99-1.0 (benchmarks/landmark_index.py): the scan is kept for small indexes only.
FLAT_LIMIT = 50_000
VECTOR_INDEX = "IVF_SQ"
# Partitions a query probes. 64 gave recall@10 0.977-1.000 at 1M landmarks (244 partitions) and 1.000
# at 10M (2,441), p50 18-20 ms there with the pages cached; probing an eighth of the partitions
# (305 at 10M) cost 3.7x the time for the same recall (benchmarks/landmark_index.py, docs/corpus-encoding.md).
NPROBES = 64


def require_lancedb():
    try:
        import lancedb
    except ImportError:
        raise ImportError("The landmark index needs LanceDB: pip install 'lmk-embed[search]' (lancedb).") from None
    return lancedb


def connect(folder):
    return require_lancedb().connect(str(folder))


def is_index(folder) -> bool:
    """Whether `folder` holds a landmark index's tables (complete or not)."""
    return Path(folder).is_dir() and (Path(folder) / f"{RECORD}.lance").is_dir()


def documents_schema(dimension: int, dtype: str, id_type):
    import pyarrow as pa

    value = pa.float16() if dtype == "float16" else pa.float32()
    return pa.schema([
        pa.field("row", pa.int64()), pa.field("shard", pa.int32()), pa.field("id", id_type),
        pa.field("text", pa.large_string()), pa.field("embedding", pa.list_(value, dimension)),
        pa.field("landmarks", pa.list_(pa.list_(value, dimension))),
        pa.field("landmark_spans", pa.list_(pa.list_(pa.int64(), 2))),
    ])


def _shards_schema():
    import pyarrow as pa

    return pa.schema([pa.field(name, pa.int64()) for name in ("shard", "rows", "truncated", "empty", "tokens")])


def read_record(folder) -> dict:
    """The JSON record of the index in `folder` (ValueError when it is not one of ours)."""
    table = connect(folder).open_table(RECORD).to_arrow()
    if table.num_rows != 1 or "record" not in table.column_names:
        raise ValueError(f"its `{RECORD}` table holds {table.num_rows} rows, not the one record encode-corpus writes")
    return json.loads(table["record"][0].as_py())


def write_record(folder, record: dict) -> None:
    """Replace the record (one commit: a kill leaves the old one or the new one)."""
    import pyarrow as pa

    data = pa.table({"record": pa.array([json.dumps(record)], pa.large_string())})
    db = connect(folder)
    db.create_table(RECORD, data=data, mode="overwrite" if is_index(folder) else "create")


def create(folder, record: dict, dimension: int, dtype: str, id_type) -> None:
    """The empty tables of a new index, before any worker writes."""
    db = connect(folder)
    db.create_table(DOCUMENTS, schema=documents_schema(dimension, dtype, id_type), exist_ok=True)
    db.create_table(SHARDS, schema=_shards_schema(), exist_ok=True)
    write_record(folder, record)


def finished_shards(folder, plan: list[dict]) -> dict[int, dict]:
    """{shard: its counts} of the shards of `plan` whose rows are all in `documents`, exactly once,
    with their counts recorded. Any other rows of a shard (a doubled or unrecorded write) are deleted,
    so the shard is redone from nothing."""
    db = connect(folder)
    documents, shards = db.open_table(DOCUMENTS), db.open_table(SHARDS)
    present = documents.search().select(["shard"]).limit(None).to_arrow()["shard"].to_numpy()
    written = np.bincount(present, minlength=len(plan)) if len(present) else np.zeros(len(plan), np.int64)
    counts = {int(r["shard"]): r for r in shards.to_arrow().to_pylist()}
    finished, redo = {}, []
    for shard in plan:
        k, expected = shard["index"], shard["stop"] - shard["start"]
        if written[k] == expected and k in counts:
            finished[k] = {"index": k, **{key: counts[k][key] for key in ("rows", "truncated", "empty", "tokens")}}
        elif written[k]:
            redo.append(k)
    if redo:
        documents.delete(f"shard IN ({', '.join(map(str, redo))})")
    stale = [k for k in counts if k not in finished]
    if stale:
        shards.delete(f"shard IN ({', '.join(map(str, stale))})")
    return finished


def shard_rows(shard: dict, ids: list, texts: list[str], embeddings: np.ndarray, landmarks: list[dict], dtype: str,
               id_type):
    """The `documents` rows of one shard, in input order: landmarks[i] is {"embeddings": [n_i, D], "spans"}."""
    import pyarrow as pa

    value = np.dtype(dtype)
    dim = embeddings.shape[1]
    counts = np.array([len(item["spans"]) for item in landmarks], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    flat = np.concatenate([np.asarray(item["embeddings"], dtype=value).reshape(-1, dim) for item in landmarks])
    spans = np.array([span for item in landmarks for span in item["spans"]], dtype=np.int64).reshape(-1, 2)
    columns = {
        "row": pa.array(np.arange(shard["start"], shard["stop"], dtype=np.int64)),
        "shard": pa.array(np.full(len(ids), shard["index"], dtype=np.int32)),
        "id": pa.array(ids, id_type), "text": pa.array(texts, pa.large_string()),
        "embedding": _vectors(np.asarray(embeddings, dtype=value)),
        "landmarks": pa.ListArray.from_arrays(offsets, _vectors(flat)),
        "landmark_spans": pa.ListArray.from_arrays(offsets, _vectors(spans)),
    }
    return pa.table(columns, schema=documents_schema(dim, dtype, id_type))


def _vectors(array: np.ndarray):
    import pyarrow as pa

    array = np.ascontiguousarray(array)
    return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), array.shape[1])


def write_shard(folder, shard: dict, rows, counts: dict) -> dict:
    """Append one shard's rows (one commit), then its counts; returns its record."""
    import pyarrow as pa

    db = connect(folder)
    db.open_table(DOCUMENTS).add(rows)
    record = {"shard": shard["index"], "rows": rows.num_rows, **counts}
    db.open_table(SHARDS).add(pa.Table.from_pylist([record], schema=_shards_schema()))
    return {"index": shard["index"], "rows": rows.num_rows, **counts}


def finish(folder, record: dict, flat_limit: float = FLAT_LIMIT, index_type: str | None = None) -> dict:
    """Index a complete `documents` table (full text; landmarks when there are `flat_limit` or more,
    with `index_type`, default `VECTOR_INDEX`), then record its version: the record becomes complete."""
    from lancedb.index import FTS

    documents = connect(folder).open_table(DOCUMENTS)
    rows = documents.count_rows()
    landmarks = landmark_count(documents) if rows else 0
    if rows:
        documents.create_index("text", config=FTS(with_position=False, **LEXICAL_TOKENIZER), replace=True)
        documents.create_scalar_index("row", replace=True)
    record["vector_index"], record["lexical"] = None, dict(LEXICAL_TOKENIZER)
    if landmarks and landmarks >= flat_limit:
        record["vector_index"] = build_vector_index(documents, landmarks, index_type or VECTOR_INDEX)
    record.update(complete=True, rows=rows, landmarks=landmarks, version=documents.version)
    write_record(folder, record)
    return record


def landmark_count(documents) -> int:
    import pyarrow.compute as pc

    total = 0
    for batch in documents.search().select(["landmark_spans"]).limit(None).to_batches():
        total += int(pc.sum(pc.list_value_length(batch["landmark_spans"])).as_py() or 0)
    return total


def build_vector_index(documents, landmarks: int, index_type: str) -> dict:
    """A vector index over the landmark vectors (cosine, as max-sim scores them), about 4,096
    vectors a partition; searched with `NPROBES` partitions, candidates re-ranked exactly
    (`refine_factor`; and every returned document is scored again from its own landmarks)."""
    from lancedb import index as kinds

    partitions = max(1, int(landmarks // 4096))
    dimension = documents.schema.field("embedding").type.list_size
    options = {"distance_type": "cosine", "num_partitions": partitions}
    if index_type == "IVF_PQ":
        options["num_sub_vectors"] = next(n for n in (dimension // 8, dimension // 4, dimension) if dimension % n == 0)
    config = {"IVF_PQ": kinds.IvfPq, "IVF_SQ": kinds.IvfSq, "IVF_FLAT": kinds.IvfFlat}[index_type](**options)
    documents.create_index("landmarks", config=config)
    return {"type": index_type, **{k: v for k, v in options.items() if k != "distance_type"},
            "nprobes": NPROBES, "refine_factor": 4}


__all__ = ["DEFAULT_HYBRID_WEIGHT", "FLAT_LIMIT", "FORMAT", "LEXICAL_TOKENIZER", "connect", "create", "finish",
           "finished_shards", "is_index", "read_record", "shard_rows", "write_record", "write_shard"]
