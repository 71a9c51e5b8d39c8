"""Landmark indexes for the error tables: one intact, and copies damaged in each way a search must
refuse with one line (shards swapped, a byte flipped, shards unlisted or deleted, a truncated
parquet, a manifest edited), beside another checkpoint of the same width."""

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


def _edited(index: Path, name: str, edit) -> None:
    """A copy of `index` named `name`, with its manifest passed through `edit(manifest, folder)`."""
    copy = shutil.copytree(index, index.with_name(name))
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest, copy)
    (copy / "manifest.json").write_text(json.dumps(manifest))


def write_indexes(root: Path, checkpoint: Path) -> Path:
    """root/index (4 documents, one per shard) and its damaged copies root/index-<damage>; also
    root/other-lmk. Returns root/index."""
    from lmk_embed_tools.corpus import encode_corpus

    texts = ["json encoder options and decoders", "the csv module reads rows", "zip archives hold files",
             "regular expressions match text"]
    source = root / "index-input.jsonl"
    source.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    index = root / "index"
    encode_corpus(str(checkpoint), str(source), index, output_value="landmarks", shard_size=1, show_progress_bar=False)
    other = other_checkpoint(checkpoint, root / "other-lmk")

    def swap(manifest, folder):
        first, second = folder / "part-00000.parquet", folder / "part-00001.parquet"
        data = first.read_bytes()
        first.write_bytes(second.read_bytes())
        second.write_bytes(data)

    def flip(manifest, folder):
        data = bytearray((folder / "part-00002.parquet").read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / "part-00002.parquet").write_bytes(bytes(data))

    def truncate(manifest, folder):
        data = (folder / "part-00003.parquet").read_bytes()
        (folder / "part-00003.parquet").write_bytes(data[: len(data) // 2])

    def unlist(manifest, folder):
        manifest["shards"], manifest["num_shards"], manifest["input"]["rows"] = manifest["shards"][:2], 2, 2

    edits = {
        "swapped": swap, "flipped": flip, "truncated": truncate, "unlisted": unlist,
        "fewer": lambda manifest, folder: manifest.update(shards=manifest["shards"][:2]),
        "deleted": lambda manifest, folder: (folder / "part-00001.parquet").unlink(),
        "no-settings": lambda manifest, folder: manifest.pop("settings"),
        "dimension": lambda manifest, folder: manifest.update(dimension=manifest["dimension"] * 2),
        "model-path": lambda manifest, folder: manifest["model"].update(source=str(root / "moved-model")),
        "model-entry": lambda manifest, folder: manifest["model"].update(source=str(other)),
    }
    for damage, edit in edits.items():
        _edited(index, f"index-{damage}", edit)
    shutil.copytree(index, root / "index-not-json")
    (root / "index-not-json" / "manifest.json").write_text('{"format": ')
    return index


__all__ = ["other_checkpoint", "write_indexes"]
