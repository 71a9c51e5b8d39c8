"""Landmark indexes for the error tables: one intact, and copies damaged in each way a search must
refuse with one line (data files swapped, cut or deleted, rows added after encoding, a record
edited or incomplete, the earlier shard format), beside another checkpoint of the same width."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def other_checkpoint(checkpoint: Path, out: Path) -> Path:
    """A copy of `checkpoint` with its weights moved: same family and width, another model."""
    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(checkpoint, out)
    for file in copy.glob("*.safetensors"):
        weights = load_file(file)
        moved = {name: tensor + 0.01 if tensor.is_floating_point() else tensor for name, tensor in weights.items()}
        save_file(moved, file, metadata={"format": "pt"})
    return copy


def data_files(index: Path) -> list[Path]:
    """The `documents` table's data files, oldest first (one a shard)."""
    return sorted((index / "documents.lance" / "data").glob("*.lance"), key=lambda path: path.stat().st_mtime_ns)


def write_shard_index(index: Path, out: Path) -> Path:
    """The earlier format of `index`: one parquet shard per shard and manifest.json with sha256 sums,
    as encode-corpus --output-value landmarks wrote it before the index was a LanceDB table."""
    import pyarrow as pa

    from lmk_embed_tools.corpus import shards, table

    record = table.read_record(index)
    rows = table.connect(index).open_table("documents").to_arrow().sort_by("row")
    out.mkdir()
    written = []
    for shard in sorted(set(rows["shard"].to_pylist())):
        part = rows.filter(pa.compute.equal(rows["shard"], shard))
        columns = {name: part[name] for name in ("id", "embedding", "landmarks", "landmark_spans", "text")}
        counts = {"truncated": 0, "empty": 0, "tokens": 0}
        written.append({"index": shard, **shards.write_shard(out, shard, pa.table(columns), counts)})
    manifest = {"format": shards.FORMAT, **{key: record[key] for key in ("model", "settings", "input", "dimension")},
                "num_shards": len(written), "shards": written, "complete": True}
    shards.write_manifest(out, manifest)
    return out


def _edited(index: Path, name: str, edit) -> None:
    """A copy of `index` named `name`, with its record passed through `edit(record, folder)`."""
    from lmk_embed_tools.corpus import table

    copy = shutil.copytree(index, index.with_name(name))
    record = table.read_record(copy)
    edit(record, copy)
    table.write_record(copy, record)


def write_indexes(root: Path, checkpoint: Path) -> Path:
    """root/index (4 documents, one per shard) and its damaged copies root/index-<damage>; also
    root/other-lmk and root/index-shards (the earlier format). Returns root/index."""
    from lmk_embed_tools.corpus import encode_corpus, table

    texts = ["json encoder options and decoders", "the csv module reads rows", "zip archives hold files",
             "regular expressions match text"]
    source = root / "index-input.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    index = root / "index"
    encode_corpus(str(checkpoint), str(source), index, output_value="landmarks", shard_size=1, show_progress_bar=False)
    other = other_checkpoint(checkpoint, root / "other-lmk")

    def swap(record, folder):
        first, second = data_files(folder)[:2]
        data = first.read_bytes()
        first.write_bytes(second.read_bytes())
        second.write_bytes(data)

    def truncate(record, folder):
        data = data_files(folder)[3].read_bytes()
        data_files(folder)[3].write_bytes(data[: len(data) // 2])

    def add_row(record, folder):  # a row added through LanceDB after the index was finished
        documents = table.connect(folder).open_table("documents")
        documents.add(documents.search().where("row = 0").limit(1).to_arrow())

    edits = {
        "swapped": swap, "truncated": truncate, "changed": add_row,
        "deleted": lambda record, folder: data_files(folder)[1].unlink(),
        "incomplete": lambda record, folder: record.update(complete=False),
        "rows": lambda record, folder: record["input"].update(rows=5),
        "no-settings": lambda record, folder: record.pop("settings"),
        "dimension": lambda record, folder: record.update(dimension=record["dimension"] * 2),
        "model-path": lambda record, folder: record["model"].update(source=str(root / "moved-model")),
        "model-entry": lambda record, folder: record["model"].update(source=str(other)),
    }
    for damage, edit in edits.items():
        _edited(index, f"index-{damage}", edit)
    write_shard_index(index, root / "index-shards")
    return index


__all__ = ["data_files", "other_checkpoint", "write_indexes", "write_shard_index"]
