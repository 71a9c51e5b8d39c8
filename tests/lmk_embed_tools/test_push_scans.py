"""Staging reads every file before anything is published: non-finite weights, and secrets hidden in
binary formats (PNG text chunks, compressed or not; safetensors metadata and tensor names)."""

import re
import shutil
import struct
import zlib

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lmk_embed_tools import push
from tests.lmk_embed_tools.test_publish import RecordingHfApi

# Built by concatenation so this file holds nothing that looks like a token.
FAKE_TOKEN = "hf" + "_" + "Zq7Lw2Xv9Kp4Rt6Ym1Nb8Hc3Jd5Fg0Sa"
TOKEN_REASON = "looks like a Hugging Face token"


@pytest.fixture
def checkpoint(lmk_checkpoint, tmp_path):
    return shutil.copytree(lmk_checkpoint, tmp_path / "lmk")


def refusal(folder, tmp_path) -> str:
    with pytest.raises(push.PushError) as caught:
        push.stage(folder, tmp_path / "staged")
    assert not (tmp_path / "staged").exists()
    return str(caught.value)


def word_embedding_key(path) -> str:
    with safe_open(str(path), framework="pt") as weights:
        keys = [key for key in weights.keys() if "embeddings" in key and key.endswith("weight") and weights.get_slice(key).get_shape()[0] > 100]
    assert len(keys) == 1, keys
    return keys[0]


# ---- non-finite weights -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_embedding_row_is_refused_by_name(checkpoint, tmp_path, value, capsys):
    weights_path = checkpoint / "model.safetensors"
    tensors = load_file(weights_path)
    key = word_embedding_key(weights_path)
    tensors[key][123, 5] = value  # one entry of one row: the probe texts would never touch it
    save_file(tensors, weights_path, metadata={"format": "pt"})

    message = refusal(checkpoint, tmp_path)
    assert re.search(rf"model\.safetensors: tensor '{re.escape(key)}' has 1 non-finite value", message)

    api = RecordingHfApi()
    assert push.main([str(checkpoint), "our-org/x", "--stage-dir", str(tmp_path / "s2")], api=api) == 1
    assert key in capsys.readouterr().err
    assert api.calls == []


def test_every_shard_is_scanned(checkpoint, tmp_path):
    """A sharded checkpoint: the bad tensor sits in the second shard."""
    tensors = load_file(checkpoint / "model.safetensors")
    names = sorted(tensors)
    first, second = names[: len(names) // 2], names[len(names) // 2:]
    (checkpoint / "model.safetensors").unlink()
    save_file({k: tensors[k] for k in first}, checkpoint / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    bad = {k: tensors[k].clone() for k in second}
    floating = next(k for k in second if bad[k].is_floating_point())
    bad[floating].view(-1)[-1] = float("-inf")
    save_file(bad, checkpoint / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    (checkpoint / "model.safetensors.index.json").write_text("{}")
    message = refusal(checkpoint, tmp_path)
    assert f"model-00002-of-00002.safetensors: tensor '{floating}'" in message
    assert "model-00001-of-00002" not in message


def test_finite_weights_stage(checkpoint, tmp_path):
    report = push.stage(checkpoint, tmp_path / "staged")
    assert "model.safetensors" in report.files


# ---- secrets in safetensors headers -------------------------------------------------------------


def test_a_token_in_safetensors_metadata_is_refused(checkpoint, tmp_path):
    weights_path = checkpoint / "model.safetensors"
    save_file(load_file(weights_path), weights_path, metadata={"format": "pt", "uploaded_by": FAKE_TOKEN})
    message = refusal(checkpoint, tmp_path)
    assert "model.safetensors: metadata or tensor names" in message and TOKEN_REASON in message


def test_a_token_as_a_tensor_name_is_refused(checkpoint, tmp_path):
    weights_path = checkpoint / "model.safetensors"
    tensors = load_file(weights_path)
    tensors[FAKE_TOKEN] = torch.zeros(2)
    save_file(tensors, weights_path, metadata={"format": "pt"})
    assert TOKEN_REASON in refusal(checkpoint, tmp_path)


def test_an_unreadable_safetensors_file_is_refused(checkpoint, tmp_path):
    (checkpoint / "extra.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    assert "extra.safetensors: is not a readable safetensors file" in refusal(checkpoint, tmp_path)


# ---- secrets in PNG text chunks -----------------------------------------------------------------


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def text_chunk(kind: str, keyword: str, text: str) -> bytes:
    key, value = keyword.encode("latin-1"), text.encode()
    if kind == "tEXt":
        return png_chunk(b"tEXt", key + b"\0" + value)
    if kind == "zTXt":
        return png_chunk(b"zTXt", key + b"\0\0" + zlib.compress(value))
    compressed = kind == "iTXt-compressed"
    body = zlib.compress(value) if compressed else value
    return png_chunk(b"iTXt", key + b"\0" + (b"\1" if compressed else b"\0") + b"\0" + b"en\0" + b"Note\0" + body)


def plot_with_chunk(folder, chunk: bytes):
    """A real plot (matplotlib) with `chunk` inserted before IEND."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 2, 3], [0.4, 0.5, 0.6])
    path = folder / "ndcg_vs_max_length.png"
    fig.savefig(path)
    plt.close(fig)
    data = path.read_bytes()
    iend = data.rindex(b"IEND") - 4
    path.write_bytes(data[:iend] + chunk + data[iend:])
    return path


@pytest.mark.parametrize("kind", ["tEXt", "zTXt", "iTXt", "iTXt-compressed"])
def test_a_token_in_a_png_text_chunk_is_refused(checkpoint, tmp_path, kind):
    path = plot_with_chunk(checkpoint, text_chunk(kind, "Comment", f"made with token {FAKE_TOKEN}"))
    with Image.open(path) as image:  # a real PNG, and a reader finds the text in it
        image.load()
        assert FAKE_TOKEN in image.text["Comment"]
    if kind in ("zTXt", "iTXt-compressed"):
        assert FAKE_TOKEN.encode() not in path.read_bytes()  # only decompression shows it
    assert f"ndcg_vs_max_length.png: contains what {TOKEN_REASON}" in refusal(checkpoint, tmp_path)


def test_dry_run_refuses_a_token_in_a_compressed_png_chunk(checkpoint, tmp_path, capsys):
    plot_with_chunk(checkpoint, text_chunk("zTXt", "Author", FAKE_TOKEN))
    api = RecordingHfApi()
    code = push.main([str(checkpoint), "our-org/x", "--dry-run", "--stage-dir", str(tmp_path / "staged")], api=api)
    assert code == 1 and api.calls == []
    err = capsys.readouterr().err
    assert "ndcg_vs_max_length.png" in err and TOKEN_REASON in err


def test_harmless_png_text_stages(checkpoint, tmp_path):
    plot_with_chunk(checkpoint, text_chunk("zTXt", "Software", "matplotlib, hf_short"))
    report = push.stage(checkpoint, tmp_path / "staged")
    assert "ndcg_vs_max_length.png" in report.files


def test_a_malformed_png_is_refused(checkpoint, tmp_path):
    (checkpoint / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"zTXt", b"Comment\0\0not zlib data"))
    assert "plot.png: cannot read its PNG chunks" in refusal(checkpoint, tmp_path)
