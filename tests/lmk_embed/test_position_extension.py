"""Position extension past the backbone's table: short inputs are the base exactly, 512 < T <= N
runs and stays close to T = 512, above N is a clear error, and the checkpoint says what it is."""

import json

import numpy as np
import pytest
import torch

from lmk_embed import LMKModel
from lmk_embed.modeling_lmk import extended_position_ids, extended_position_table
from lmk_embed_tools.training.convert import ConversionError, convert_to_lmk
from tests import helpers

N = 4096
METHODS = ("interpolate", "recurrent", "group")


@pytest.fixture(scope="module")
def long_text():
    return " ".join(helpers.stdlib_texts(400))


@pytest.fixture(scope="module")
def extended(tmp_path_factory, minilm_path):
    """MiniLM (LMK, g=32) extended to N positions, once per method."""
    return {m: convert_to_lmk(minilm_path, tmp_path_factory.mktemp(f"ext-{m}"), granularity=32, max_positions=N,
                              position_extension=m) for m in METHODS}


@pytest.fixture(scope="module")
def base_model(minilm_lmk_checkpoint):
    return LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()


def load(folder):
    return LMKModel.from_pretrained(folder).eval()


def test_tables_are_the_methods_layouts():
    original = torch.randn(8, 3, dtype=torch.float64)
    inter = extended_position_table(original, "interpolate", 29)  # 28 / 7 = 4: every 4th row is an original one
    assert torch.allclose(inter[::4], original) and torch.allclose(inter[2], (original[0] + original[1]) / 2)
    assert torch.equal(extended_position_table(original, "recurrent", 20), original[torch.arange(20) % 8])
    assert torch.equal(extended_position_table(original, "group", 16), original.repeat_interleave(2, 0))


def test_position_ids_keep_short_rows_on_the_original_rows():
    extension = {"method": "interpolate", "original_positions": 4, "max_positions": 9, "first_row": 6,
                 "position_offset": 2}
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0, 0], [1] * 9, [1] * 5 + [0] * 4])
    ids = extended_position_ids(mask, extension)
    assert ids[0, :4].tolist() == [2, 3, 4, 5]  # RoBERTa-style offset, the base's own ids
    assert ids[1].tolist() == [6 + p for p in range(9)]  # L = N: every extended row once
    assert ids[2, :5].tolist() == [6, 8, 10, 12, 14]  # L = 5 spread over the 9 rows
    assert int(ids.max()) <= 6 + 8
    dense = extended_position_ids(mask, {**extension, "method": "recurrent"})
    assert dense[2, :5].tolist() == [6, 7, 8, 9, 10]


@pytest.mark.parametrize("method", METHODS)
def test_short_inputs_are_the_base_exactly(method, extended, base_model, long_text):
    model = load(extended[method])
    texts = [helpers.SAMPLE_TEXT, "hello world", long_text[:1200], ""]  # each under 512 tokens
    reference = base_model.encode(texts)
    assert np.abs(model.encode(texts) - reference).max() <= 1e-6
    # In one batch with a long text, the short ones still read the original rows.
    mixed = model.encode(texts + [long_text], max_length=2048, batch_size=8)
    assert np.abs(mixed[:4] - reference).max() <= 1e-6


@pytest.mark.parametrize("method", METHODS)
def test_513_tokens_stay_close_to_512(method, extended, long_text):
    model = load(extended[method])
    with pytest.warns(UserWarning, match="truncated"):
        at_512 = model.encode(long_text, max_length=512)
    with pytest.warns(UserWarning, match="truncated"):
        at_513 = model.encode(long_text, max_length=513)
    with pytest.warns(UserWarning, match="truncated"):
        at_2048 = model.encode(long_text, max_length=2048)
    assert float(at_512 @ at_513) > 0.99
    assert float(at_512 @ at_2048) < float(at_512 @ at_513)  # the longer input is read, not dropped


def test_long_inputs_run_up_to_n_and_the_limit_names_n(extended, long_text):
    model = load(extended["interpolate"])
    assert model.max_positions() == N and model.default_max_length() == N
    batch = model.tokenize([long_text], model.resolve(max_length=N))
    assert batch.input_ids.shape[1] == N  # the text fills the whole extended table
    assert model.encode(long_text, max_length=N).shape == (384,)
    with pytest.raises(ValueError, match="limit of 4096 positions"):
        model.encode("x", max_length=N + 1)


def test_the_checkpoint_says_what_it_is_and_reloads_to_the_same_vectors(extended, tmp_path, long_text):
    config = json.loads((extended["group"] / "config.json").read_text())
    assert config["position_extension"] == {"method": "group", "original_positions": 512, "max_positions": N,
                                            "first_row": 512, "position_offset": 0}
    assert config["backbone_config"]["max_position_embeddings"] == 512 + N
    model = load(extended["group"])
    model.save_pretrained(tmp_path / "again")
    again = LMKModel.from_pretrained(tmp_path / "again").eval()
    again.tokenizer = model.tokenizer
    texts = [long_text[:20000], helpers.SAMPLE_TEXT]
    assert np.abs(again.encode(texts, max_length=N) - model.encode(texts, max_length=N)).max() <= 1e-6


def test_roberta_style_offset(tmp_path):
    source = helpers.tiny_encoder_source(tmp_path / "src", "xlm-roberta")
    base = load(convert_to_lmk(source, tmp_path / "base", granularity=16))
    model = load(convert_to_lmk(source, tmp_path / "ext", granularity=16, max_positions=1024))
    extension = model.config.position_extension  # 514 rows, padding index 0: one row reserved
    assert extension["position_offset"] == 1 and extension["original_positions"] == base.max_positions() == 513
    texts = [helpers.SAMPLE_TEXT, "a b c"]
    assert np.abs(model.encode(texts) - base.encode(texts)).max() <= 1e-6
    assert model.encode(" ".join(helpers.stdlib_texts(80)), max_length=1024).shape == (32,)


def test_rotary_backbones_use_their_own_dynamic_rope_scaling(modernbert_source, lmk_checkpoint, tmp_path):
    with pytest.raises(ConversionError, match="rotary"):
        convert_to_lmk(modernbert_source, tmp_path / "no", max_positions=16384, position_extension="interpolate")
    model = load(convert_to_lmk(modernbert_source, tmp_path / "ext", granularity=8, max_positions=16384))
    rope = model.config.backbone_config.rope_parameters
    assert {params["rope_type"] for params in rope.values()} == {"dynamic"}
    base = load(lmk_checkpoint)
    texts = [helpers.SAMPLE_TEXT, "hello world"]
    assert np.abs(model.encode(texts) - base.encode(texts)).max() <= 1e-6
    assert model.max_positions() == 16384


def test_conversion_refusals_name_the_argument(minilm_path, tmp_path):
    with pytest.raises(ConversionError, match="max-positions"):
        convert_to_lmk(minilm_path, tmp_path / "a", max_length=600)
    with pytest.raises(ConversionError, match="must exceed the backbone's 512 positions"):
        convert_to_lmk(minilm_path, tmp_path / "b", max_positions=512)
    with pytest.raises(ConversionError, match="rotary backbones"):
        convert_to_lmk(minilm_path, tmp_path / "c", max_positions=1024, position_extension="dynamic")


def test_sentence_transformer_reads_up_to_n(extended, long_text):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(extended["recurrent"]), trust_remote_code=True, device="cpu")
    st.max_seq_length = N
    model = load(extended["recurrent"])
    texts = [long_text[:30000], helpers.SAMPLE_TEXT]
    assert np.abs(st.encode(texts) - model.encode(texts, max_length=N)).max() <= 1e-5
    with pytest.raises(ValueError, match="4096"):
        st.max_seq_length = N + 1
