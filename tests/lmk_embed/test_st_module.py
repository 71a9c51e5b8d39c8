"""The sentence-transformers module: its config file, prompt parity with AutoModel, the truncation
warning, and the backbone's position limit (encode, max_seq_length, conversion)."""

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel

from tests.helpers import SAMPLE_TEXT

LONG = "word " * 600  # over MiniLM's 512 positions
QUERIES = ["how do I parse json?", "wrap text to a width"]
DOCUMENTS = [SAMPLE_TEXT, "textwrap fills paragraphs to a given width."]


def load_st(folder):
    return SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")


@pytest.fixture(scope="module")
def st_lmk(minilm_lmk_checkpoint):
    return load_st(minilm_lmk_checkpoint)


def truncation_warnings(record):
    return [w for w in record if "truncated" in str(w.message)]


# ---- the module's config --------------------------------------------------------------------


def test_module_config_is_written_once_and_read(minilm_lmk_checkpoint, st_lmk, tmp_path):
    written = json.loads((minilm_lmk_checkpoint / "embedder_module_config.json").read_text())
    assert written == {"family": "lmk_embedder"} == st_lmk[0].get_config_dict()
    st_lmk.save(str(tmp_path / "resaved"))
    assert json.loads((tmp_path / "resaved" / "embedder_module_config.json").read_text()) == written

    wrong = tmp_path / "wrong-family"
    shutil.copytree(minilm_lmk_checkpoint, wrong)
    (wrong / "embedder_module_config.json").write_text(json.dumps({"family": "recurrent_embedder"}))
    with pytest.raises(ValueError, match="recurrent_embedder"):
        load_st(wrong)


# ---- prompts: SentenceTransformer and AutoModel agree ------------------------------------------


def test_lmk_prompt_parity(minilm_lmk_checkpoint, tmp_path):
    from lmk_embed import LMKModel
    from lmk_embed_tools.training.convert import save_checkpoint

    model = LMKModel.from_pretrained(minilm_lmk_checkpoint)
    model.config.query_prompt = "Represent this question for retrieving passages: "
    model.config.document_prompt = "passage: "
    folder = save_checkpoint(model, model.tokenizer, tmp_path / "prompted")

    auto, st = AutoModel.from_pretrained(folder, trust_remote_code=True), load_st(folder)
    assert st.prompts["query"] == "Represent this question for retrieving passages: "
    auto_queries = auto.encode_query(QUERIES)
    assert np.abs(st.encode_query(QUERIES) - auto_queries).max() <= 1e-5
    assert np.abs(st.encode_document(DOCUMENTS) - auto.encode_document(DOCUMENTS)).max() <= 1e-5
    assert np.abs(auto_queries - auto.encode(QUERIES)).max() > 1e-3  # the prompt is really applied


def test_recurrent_prompt_parity(mamba2_lm, tmp_path):
    from lmk_embed_tools.training.convert import convert_to_recurrent

    task = "Given a question, retrieve Python documentation that answers it"
    folder = convert_to_recurrent(mamba2_lm, tmp_path / "instructed", block_size=40, ssd_chunk_size=16, default_task=task)
    auto, st = AutoModel.from_pretrained(folder, trust_remote_code=True), load_st(folder)
    assert st.prompts["query"] == f"Instruct: {task}\nQuery: "
    auto_queries = auto.encode_query(QUERIES)
    assert np.abs(st.encode_query(QUERIES) - auto_queries).max() <= 1e-5
    assert np.abs(st.encode_document(DOCUMENTS) - auto.encode_document(DOCUMENTS)).max() <= 1e-5
    assert np.abs(auto_queries - auto.encode(QUERIES)).max() > 1e-3
    other = "Retrieve the module that implements the query"
    assert np.abs(st.encode(QUERIES, prompt=f"Instruct: {other}\nQuery: ") - auto.encode_query(QUERIES, task=other)).max() <= 1e-5


# ---- truncation warns once per call, as encode() does -----------------------------------------


def test_sentence_transformers_encode_warns_once_per_call(st_lmk, minilm_lmk_checkpoint):
    texts = [LONG, "short", LONG + "more"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        st_lmk.encode(texts, batch_size=1)
        first = len(truncation_warnings(record))
        st_lmk.encode(texts, batch_size=2)
        second = len(truncation_warnings(record)) - first
        st_lmk.encode(["short", "texts only"], batch_size=1)
        third = len(truncation_warnings(record)) - first - second
    assert (first, second, third) == (1, 1, 0)
    assert "max_length=512" in str(truncation_warnings(record)[0].message)

    auto = AutoModel.from_pretrained(minilm_lmk_checkpoint, trust_remote_code=True)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        auto.encode(texts, batch_size=1)
    assert len(truncation_warnings(record)) == 1


def test_recurrent_sentence_transformers_encode_warns_once_per_call(mamba2_checkpoint):
    st = load_st(mamba2_checkpoint)
    st.max_seq_length = 8
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        st.encode([SAMPLE_TEXT, SAMPLE_TEXT[:200], "a b"], batch_size=1)
    found = truncation_warnings(record)
    assert len(found) == 1 and "max_length=8" in str(found[0].message)


# ---- max_length above the backbone's positions --------------------------------------------------


def test_encode_max_length_above_positions_names_the_limit(minilm_lmk_checkpoint):
    auto = AutoModel.from_pretrained(minilm_lmk_checkpoint, trust_remote_code=True)
    assert auto.max_positions() == 512
    for texts in (LONG, "a short text passes too, so the error is not data dependent"):
        with pytest.raises(ValueError, match=r"`max_length`=600 exceeds .* 512 positions"):
            auto.encode(texts, max_length=600)
    with pytest.warns(UserWarning, match="max_length=512"):
        assert auto.encode(LONG, max_length=512).shape == (384,)
    auto.config.max_length = 600
    with pytest.raises(ValueError, match=r"`config.max_length`=600 exceeds .* 512"):
        auto.encode("short")


def test_max_seq_length_above_positions_names_the_limit(st_lmk):
    with pytest.raises(ValueError, match=r"`max_seq_length`=600 exceeds .* 512"):
        st_lmk.max_seq_length = 600
    assert st_lmk.max_seq_length == 512
    st_lmk[0].model.config.max_length = 600  # e.g. a hand-edited config.json
    try:
        with pytest.raises(ValueError, match=r"`max_seq_length`=600 exceeds .* 512"):
            st_lmk.encode("short")
    finally:
        st_lmk[0].model.config.max_length = None


def test_convert_max_length_above_positions_names_the_limit(minilm_path, tmp_path):
    from lmk_embed_tools.training.convert import convert_to_lmk

    with pytest.raises(ValueError, match=r"`max_length`=600 exceeds .* 512"):
        convert_to_lmk(minilm_path, tmp_path / "too-long", max_length=600)
    assert not (tmp_path / "too-long" / "model.safetensors").exists()


def test_rotary_backbone_has_no_position_limit(lmk_model):
    assert lmk_model.max_positions() is None  # ModernBERT: rotary positions, no table to overflow
    assert lmk_model.encode("a b c", max_length=100_000).shape == (lmk_model.config.embedding_dim,)


# ---- bfloat16 through both loaders -------------------------------------------------------------


def test_recurrent_bfloat16_through_both_loaders(mamba2_checkpoint):
    """`dtype=torch.bfloat16` reaches a recurrent checkpoint through AutoModel and through
    sentence-transformers' model_kwargs: the projections load in bf16, and both give the same vectors."""
    auto = AutoModel.from_pretrained(mamba2_checkpoint, trust_remote_code=True, dtype=torch.bfloat16)
    st = SentenceTransformer(str(mamba2_checkpoint), trust_remote_code=True, device="cpu",
                             model_kwargs={"dtype": torch.bfloat16})
    for model in (auto, st[0].model):
        assert model.backbone.layers[0].mixer.in_proj.weight.dtype == torch.bfloat16
    texts = [SAMPLE_TEXT, "a b"]
    np.testing.assert_allclose(st.encode(texts), auto.encode(texts), atol=1e-5)


# ---- per-call options -------------------------------------------------------------------------


@pytest.mark.parametrize("options", [{"granularity": 8}, {"splitter": "sentence"}, {"long_input": "windows"},
                                     {"long_input": "windows", "window_length": 256}])
def test_lmk_per_call_options_match_automodel(st_lmk, minilm_lmk_checkpoint, options):
    model = AutoModel.from_pretrained(str(minilm_lmk_checkpoint), trust_remote_code=True)
    texts = [SAMPLE_TEXT * 3, "word " * 900, "zip archives"]
    found = st_lmk.encode(texts, **options)
    assert np.abs(found - model.encode(texts, **options)).max() <= 1e-5
    assert np.abs(found - model.encode(texts)).max() > 1e-4  # the option reached the model


def test_recurrent_per_call_options_match_automodel(mamba2_checkpoint):
    st = load_st(mamba2_checkpoint)
    model = AutoModel.from_pretrained(str(mamba2_checkpoint), trust_remote_code=True)
    texts = DOCUMENTS
    for options in ({"schedule": "horizontal"}, {"schedule": "vertical", "block_size": 7}):
        assert np.abs(st.encode(texts, **options) - model.encode(texts, **options)).max() <= 1e-5
    with pytest.raises(ValueError, match="schedule"):
        st.encode(texts, schedule="sideways")
    with pytest.raises(ValueError, match="granularity"):  # not a recurrent option: sentence-transformers refuses it
        st.encode(texts, granularity=8)


@pytest.mark.parametrize("checkpoint", ["minilm_lmk_checkpoint", "mamba2_checkpoint"])
def test_model_inputs_survive_being_rebuilt_on_a_device(checkpoint, request):
    """accelerate and transformers' Trainer move a batch with `type(batch)({...})` (sentence-transformers'
    model card does it to our features after training); the features must allow it and keep their tensors."""
    from accelerate.utils import send_to_device

    model = AutoModel.from_pretrained(request.getfixturevalue(checkpoint), trust_remote_code=True).eval()
    features = model.prepare_features([SAMPLE_TEXT, "short"])
    moved = send_to_device(features, "cpu")
    assert type(moved) is type(features) and moved.keys() == features.keys()
    assert all(torch.equal(moved[name], features[name]) for name in features)
    with torch.no_grad():
        assert torch.equal(model(**moved).embeddings, model(**features).embeddings)
