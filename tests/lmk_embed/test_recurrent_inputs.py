"""Recurrent embedders: what `encode` and `forward` accept. An iterable of texts is many texts,
streaming one document is explicit (`encode_stream`), padding may be on either side, and unknown
forward arguments are refused. Also the typed per-layer state carried between blocks."""

import pathlib

import numpy as np
import pytest
import torch

from lmk_embed.configuration_recurrent import RecurrentEmbedConfig
from lmk_embed.modeling_recurrent import RecurrentEmbedModel
from tests.helpers import SAMPLE_TEXT, stdlib_texts

V = 40  # the checkpoint's block size (see conftest)
TEXTS = [SAMPLE_TEXT, "short", "a second, somewhat longer text about json and pickle", SAMPLE_TEXT * 3]


@pytest.fixture(scope="module")
def model(mamba2_checkpoint):
    return RecurrentEmbedModel.from_pretrained(mamba2_checkpoint).eval()


# ---- an iterable of texts is many texts ----------------------------------------------------------


def test_generator_of_texts_is_many_texts(model):
    expected = model.encode(TEXTS)
    from_generator = model.encode(text for text in TEXTS)
    from_iterator = model.encode(iter(TEXTS), convert_to_tensor=True)
    assert from_generator.shape == (len(TEXTS), model.config.embedding_dim)
    assert np.abs(from_generator - expected).max() <= 1e-6
    assert tuple(from_iterator.shape) == (len(TEXTS), model.config.embedding_dim)
    assert np.abs(from_iterator.numpy() - expected).max() <= 1e-6


def test_generator_items_are_checked(model):
    with pytest.raises(TypeError, match=r"`texts\[1\]`"):
        model.encode(t for t in ["ok", 3])


def test_an_iterator_inside_the_list_is_refused(model):
    with pytest.raises(TypeError, match=r"`texts\[1\]`.*encode_stream"):
        model.encode(["short", iter(["a ", "b"])])


# ---- streaming one document is explicit -----------------------------------------------------------


def test_encode_stream_equals_encoding_the_joined_text(model, monkeypatch):
    import lmk_embed.tokenization_recurrent as module

    monkeypatch.setattr(module, "STREAM_MIN_CHARS", 64)  # force many incremental cuts
    text = "\n".join(stdlib_texts(6))
    pieces = [text[i : i + 97] for i in range(0, len(text), 97)]
    assert "".join(pieces) == text
    expected = model.encode(text, block_size=V)
    for source in (pieces, (p for p in pieces)):
        vector = model.encode_stream(source, block_size=V)
        assert vector.shape == (model.config.embedding_dim,)
        assert np.abs(vector - expected).max() <= 1e-4
    as_tensor = model.encode_stream(pieces, convert_to_tensor=True, normalize=False)
    raw = model.encode(text, convert_to_tensor=True, normalize=False)
    assert isinstance(as_tensor, torch.Tensor) and (as_tensor - raw).abs().max() <= 1e-4


def test_encode_stream_prompt_and_file(model, tmp_path):
    text = SAMPLE_TEXT * 5
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    expected = model.encode(text)
    assert np.abs(model.encode_stream(path) - expected).max() <= 1e-4
    assert np.abs(model.encode(pathlib.Path(path)) - expected).max() <= 1e-4  # a file is still one document
    prompt = "Instruct: find it\nQuery: "
    assert np.abs(model.encode_stream([text[:50], text[50:]], prompt=prompt) - model.encode(text, prompt=prompt)).max() <= 1e-4


def test_encode_stream_bad_input(model):
    with pytest.raises(TypeError, match="`pieces`"):
        model.encode_stream(None)
    with pytest.raises(TypeError, match="`pieces`"):
        model.encode_stream(5)
    with pytest.raises(TypeError, match="piece 1"):
        model.encode_stream(["ok", 3])


# ---- forward: padding side and arguments ------------------------------------------------------------


def padded(rows, side):
    longest = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        span = slice(0, len(row)) if side == "right" else slice(longest - len(row), longest)
        ids[i, span], mask[i, span] = torch.tensor(row), 1
    return ids, mask


@pytest.mark.parametrize("schedule", ["horizontal", "vertical"])
def test_left_padding_pools_the_real_last_token(model, schedule):
    torch.manual_seed(3)
    rows = [torch.randint(1, 600, (n,)).tolist() for n in (2 * V + 7, 5, V, 1)]
    with torch.no_grad():
        right = model(*padded(rows, "right"), schedule=schedule).embeddings
        left = model(*padded(rows, "left"), schedule=schedule).embeddings
        single = torch.cat([model(torch.tensor([row]), schedule=schedule).embeddings for row in rows])
    assert (left - right).abs().max() <= 1e-4
    assert (left - single).abs().max() <= 1e-4


def test_forward_rejects_unknown_arguments(model):
    ids = torch.randint(1, 600, (1, 5))
    with pytest.raises(TypeError, match="token_type_ids"):
        model(ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(TypeError, match="schedul"):
        model(ids, schedul="vertical")


# ---- the state carried between blocks ------------------------------------------------------------


def test_mamba2_state_is_typed_per_layer(model):
    from lmk_embed.modeling_recurrent import Mamba2LayerState

    mixer = model.backbone.layers[0].mixer
    ids = torch.randint(1, 600, (3, 2 * V))
    with torch.no_grad():
        _, state = model.block_step(ids[:, :V], None)
    assert len(state.layers) == len(model.backbone.layers)
    for layer in state.layers:
        assert isinstance(layer, Mamba2LayerState)
        assert layer.conv_state.shape == (3, mixer.conv_dim, mixer.conv_kernel_size - 1)
        assert layer.ssm_state.shape == (3, mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)
    kept = state.select(torch.tensor([0, 2]))
    torch.testing.assert_close(kept.layers[1].ssm_state, state.layers[1].ssm_state[[0, 2]], rtol=0, atol=0)
    with torch.no_grad():  # carrying the selected rows equals running those rows alone
        both, _ = model.block_step(ids[[0, 2], V:], kept)
        _, first = model.block_step(ids[[0], :V], None)
        alone, _ = model.block_step(ids[[0], V:], first)
    assert (both[0] - alone[0]).abs().max() <= 1e-5


def test_xlstm_state_uses_the_transformers_cache():
    from transformers import xLSTMConfig
    from transformers.models.xlstm.modeling_xlstm import xLSTMCache

    backbone = xLSTMConfig(vocab_size=100, hidden_size=32, num_heads=2, num_blocks=2, qk_dim_factor=1.0,
                           chunk_size=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict())).eval()
    with torch.no_grad():
        _, state = model.block_step(torch.randint(3, 100, (3, 9)), None)
    assert isinstance(state.cache, xLSTMCache)
    kept = state.select(torch.tensor([1]))
    assert all(t.shape[0] == 1 for layer in kept.cache.rnn_state.values() for t in layer)
