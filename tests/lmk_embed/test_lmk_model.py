"""LMKModel: every pooler against a direct computation, encode() behaviour, backbones, bad input."""

import math
import warnings

import numpy as np
import pytest
import torch

from lmk_embed import LMKConfig, LMKModel
from lmk_embed_tools.training.convert import convert_to_lmk
from tests.helpers import SAMPLE_TEXT, stdlib_texts, tiny_encoder_source

TEXTS = ["a short one", SAMPLE_TEXT, "", "Two sentences. Here they are!", SAMPLE_TEXT * 3]


def model_with_pooling(lmk_checkpoint, pooling):
    model = LMKModel.from_pretrained(lmk_checkpoint, pooling=pooling).eval()
    return model


def backbone_states(model, features):
    with torch.no_grad():
        return model.backbone(input_ids=features["input_ids"], attention_mask=features["attention_mask"]).last_hidden_state


@pytest.mark.parametrize("pooling", ["lmk", "cls", "mean", "mean@k", "multi_cls"])
def test_pooling_matches_direct_computation(lmk_checkpoint, pooling):
    model = model_with_pooling(lmk_checkpoint, pooling)
    features = model.prepare_features(TEXTS)
    with torch.no_grad():
        pooled = model(**features).embeddings
    hidden = backbone_states(model, features).numpy()
    ids, attention = features["input_ids"].numpy(), features["attention_mask"].numpy()
    g = model.config.granularity
    for row in range(len(TEXTS)):
        length = attention[row].sum()
        if pooling == "lmk":  # landmarks are the only SEP tokens (literal [SEP] is text)
            positions = [p for p in range(length) if ids[row, p] == 102]
        elif pooling == "cls":
            positions = [0]
        elif pooling == "mean":
            positions = list(range(length))
        elif pooling == "mean@k":  # last token of every g-chunk of content (positions 1..length-2)
            content = length - 2
            positions = [1 + i for i in range(content) if (i + 1) % g == 0 or i == content - 1] or [0]
        else:  # multi_cls: every CLS
            positions = [p for p in range(length) if ids[row, p] == 101]
        expected = hidden[row, positions].mean(0)
        np.testing.assert_allclose(pooled[row].numpy(), expected, atol=1e-5)


def test_multi_cls_adds_cls_tokens_at_inference_only(lmk_checkpoint):
    model = model_with_pooling(lmk_checkpoint, "multi_cls")
    inference = model.prepare_features([SAMPLE_TEXT])["input_ids"][0].tolist()
    training = model.prepare_features([SAMPLE_TEXT], training=True)["input_ids"][0].tolist()
    assert inference.count(101) > 1 and training.count(101) == 1
    model.train()  # no `training=`: the layout follows the model's mode
    try:
        assert model.prepare_features([SAMPLE_TEXT])["input_ids"][0].tolist() == training
    finally:
        model.eval()
    assert model.prepare_features([SAMPLE_TEXT])["input_ids"][0].tolist() == inference


def test_latent_attention_matches_direct_computation(lmk_checkpoint):
    model = model_with_pooling(lmk_checkpoint, "latent_attention")
    for name, parameter in model.pooler.named_parameters():  # freshly initialised, not left as garbage
        assert torch.isfinite(parameter).all() and parameter.abs().max() < 10, name
    assert model.pooler.latents.abs().sum() > 0
    built = LMKModel(LMKConfig(backbone_config=model.config.backbone_config.to_dict(), pooling="latent_attention"))
    assert 0.015 < float(built.pooler.latents.std()) < 0.025  # initialised once, in `_init_weights`
    features = model.prepare_features(TEXTS)
    with torch.no_grad():
        pooled = model(**features).embeddings
        hidden = backbone_states(model, features)
        pooler = model.pooler
        d, heads = hidden.shape[-1], pooler.attention.num_heads
        w_q, w_k, w_v = pooler.attention.in_proj_weight.chunk(3)
        b_q, b_k, b_v = pooler.attention.in_proj_bias.chunk(3)
        q = (hidden @ w_q.T + b_q).view(*hidden.shape[:2], heads, d // heads).transpose(1, 2)
        k = (pooler.latents @ w_k.T + b_k).view(-1, heads, d // heads).transpose(0, 1)
        v = (pooler.latents @ w_v.T + b_v).view(-1, heads, d // heads).transpose(0, 1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // heads), dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(hidden.shape)
        attended = attended @ pooler.attention.out_proj.weight.T + pooler.attention.out_proj.bias
        x = hidden + attended
        x = x + pooler.mlp(x)
        mask = features["attention_mask"].unsqueeze(-1).float()
        expected = (x * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(pooled, expected, atol=1e-5, rtol=1e-5)


def test_encode_restores_order_and_ignores_batch_size(lmk_model):
    texts = stdlib_texts(11) + ["", "x"]
    one_by_one = np.stack([lmk_model.encode(t) for t in texts])
    for batch_size in (1, 3, 32):
        np.testing.assert_allclose(lmk_model.encode(texts, batch_size=batch_size), one_by_one, atol=1e-5)


def test_encode_outputs(lmk_model):
    vectors = lmk_model.encode(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    tensor = lmk_model.encode(TEXTS, convert_to_tensor=True)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    np.testing.assert_allclose(tensor.numpy(), vectors, atol=1e-6)
    raw = lmk_model.encode(TEXTS, normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    assert lmk_model.encode("hello").shape == (32,)


def test_granularity_and_splitter_are_per_call(lmk_model):
    a = lmk_model.encode(SAMPLE_TEXT, granularity=4)
    b = lmk_model.encode(SAMPLE_TEXT, granularity=16)
    c = lmk_model.encode(SAMPLE_TEXT, splitter="sentence")
    assert not np.allclose(a, b) and not np.allclose(b, c)
    np.testing.assert_allclose(lmk_model.encode(SAMPLE_TEXT), lmk_model.encode(SAMPLE_TEXT, granularity=8), atol=1e-6)
    # At inference `variable` means the configured g: deterministic.
    np.testing.assert_allclose(lmk_model.encode(SAMPLE_TEXT, splitter="variable"), lmk_model.encode(SAMPLE_TEXT), atol=1e-6)


def test_landmark_output_gives_chunk_vectors(lmk_model):
    texts = [SAMPLE_TEXT, "tiny", ""]
    landmarks = lmk_model.encode(texts, output_value="landmarks", normalize=False)
    embeddings = lmk_model.encode(texts, normalize=False)
    tokenizer = lmk_model.tokenizer
    for text, item, embedding in zip(texts, landmarks, embeddings):
        n_content = len(tokenizer.content_encodings([text])[0].ids)
        assert item["embeddings"].shape == (max(1, math.ceil(n_content / 8)), 32)
        assert len(item["spans"]) == len(item["embeddings"])
        np.testing.assert_allclose(item["embeddings"].mean(0), embedding, atol=1e-5)  # LMK = mean of landmarks
    start, end = landmarks[0]["spans"][1]
    assert 0 < start < end < len(SAMPLE_TEXT)
    normalized = lmk_model.encode(SAMPLE_TEXT, output_value="landmarks")
    np.testing.assert_allclose(np.linalg.norm(normalized["embeddings"], axis=1), 1.0, atol=1e-5)


def test_prompt_changes_the_embedding(lmk_model):
    assert not np.allclose(lmk_model.encode("fox", prompt="query: "), lmk_model.encode("fox"))


def test_bfloat16_model_encodes_close_to_float32(lmk_checkpoint):
    fp32 = LMKModel.from_pretrained(lmk_checkpoint).eval()
    bf16 = LMKModel.from_pretrained(lmk_checkpoint, dtype=torch.bfloat16).eval()
    a, b = fp32.encode(TEXTS[:2]), bf16.encode(TEXTS[:2])
    assert b.dtype == np.float32
    assert np.min(np.sum(a * b, axis=1)) > 0.99


def test_training_mode_is_restored_after_encode(lmk_checkpoint):
    model = LMKModel.from_pretrained(lmk_checkpoint).train()
    model.encode(["x"])
    assert model.training


@pytest.mark.parametrize("kind", ["bert", "xlm-roberta", "modernbert"])
def test_backbones(tmp_path, kind):
    source = tiny_encoder_source(tmp_path / "src", kind)
    model = LMKModel.from_pretrained(convert_to_lmk(source, tmp_path / "lmk", granularity=16)).eval()
    assert model.config.backbone_config.model_type == kind
    vectors = model.encode([SAMPLE_TEXT, "x"])
    assert vectors.shape == (2, 32) and np.isfinite(vectors).all()
    assert model.default_max_length() == (8192 if kind == "modernbert" else 512) or kind == "modernbert"


# ---- bad input -------------------------------------------------------------------------------


def test_bad_texts(lmk_model):
    with pytest.raises(TypeError, match="`texts`"):
        lmk_model.encode(None)
    with pytest.raises(TypeError, match=r"`texts\[1\]`"):
        lmk_model.encode(["ok", 3])
    with pytest.raises(TypeError, match="`texts\\[1\\]`"):
        lmk_model.encode(iter(["a", 3]))
    with pytest.raises(TypeError, match="paths are streamed documents"):
        lmk_model.encode(__import__("pathlib").Path("book.txt"))


def test_an_iterable_of_texts_is_many_texts(lmk_model):
    texts = ["json parsing", "zip archives", "a longer text about regular expressions"]
    np.testing.assert_allclose(lmk_model.encode(t for t in texts), lmk_model.encode(texts), atol=1e-6)
    assert lmk_model.encode(iter(texts)).shape == (3, 32)


def test_empty_list_gives_zero_by_d(lmk_model):
    empty = lmk_model.encode([])
    assert isinstance(empty, np.ndarray) and empty.shape == (0, 32)
    assert lmk_model.encode([], convert_to_tensor=True).shape == (0, 32)


@pytest.mark.parametrize("granularity", [0, -3])
def test_bad_granularity(lmk_model, granularity):
    with pytest.raises(ValueError, match="`granularity`"):
        lmk_model.encode(["x"], granularity=granularity)
    with pytest.raises(ValueError, match="`granularity`"):
        lmk_model.tokenizer("x", granularity=granularity)


def test_max_length_too_small(lmk_model):
    with pytest.raises(ValueError, match="`max_length`"):
        lmk_model.encode(["x"], max_length=2)
    with pytest.raises(ValueError, match="`max_length`"):
        lmk_model.tokenizer("x", max_length=2)
    assert lmk_model.encode("x y z", max_length=3).shape == (32,)  # the smallest legal budget works


def test_unknown_pooling_and_splitter(lmk_model, lmk_checkpoint):
    with pytest.raises(ValueError, match="`pooling`"):
        LMKConfig(pooling="max")
    with pytest.raises(ValueError, match="`pooling`"):
        LMKModel.from_pretrained(lmk_checkpoint, pooling="max")
    with pytest.raises(ValueError, match="`pooling`"):
        lmk_model.tokenizer("x", pooling="max")
    with pytest.raises(ValueError, match="`splitter`"):
        lmk_model.encode(["x"], splitter="paragraph")
    with pytest.raises(ValueError, match="`splitter`"):
        LMKConfig(splitter="paragraph")


def test_bad_batch_size_and_output_value(lmk_model):
    with pytest.raises(ValueError, match="`batch_size`"):
        lmk_model.encode(["x"], batch_size=0)
    with pytest.raises(ValueError, match="`output_value`"):
        lmk_model.encode(["x"], output_value="tokens")


def test_tokenizer_without_sep_or_eos(tmp_path, bpe_tokenizer_dir):
    from transformers import AutoTokenizer

    from lmk_embed.tokenization_lmk import LMKTokenizer

    bare = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    bare.eos_token = None
    bare.bos_token = None
    bare.save_pretrained(tmp_path)
    tokenizer = LMKTokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="neither a SEP nor an EOS.*--landmark-token"):
        tokenizer("some text")


@pytest.mark.parametrize("family", ["lmk", "recurrent"])
def test_a_lone_surrogate_is_named_by_its_text(family, lmk_model, mamba2_checkpoint):
    """"\\ud800" is not valid Unicode: the error names the text and the character, not the tokenizer's TypeError."""
    from transformers import AutoModel

    model = lmk_model if family == "lmk" else AutoModel.from_pretrained(mamba2_checkpoint, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"A text is not valid Unicode: surrogates not allowed at character 4 .* beginning 'bad "):
        model.encode(["fine", "bad \ud800 text"])


def test_empty_string_gives_a_valid_embedding(lmk_model):
    vector = lmk_model.encode("")
    assert np.isfinite(vector).all() and abs(np.linalg.norm(vector) - 1) < 1e-5


def test_million_character_text_is_truncated_with_one_warning(lmk_model):
    text = ("lorem ipsum dolor sit amet " * 40_000)[:1_000_000]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vector = lmk_model.encode(text, max_length=256)
    truncation = [w for w in caught if "truncated" in str(w.message)]
    assert len(truncation) == 1 and "max_length=256" in str(truncation[0].message)
    assert np.isfinite(vector).all()


def test_a_subclass_without_torch_weights_keeps_the_shared_state(lmk_model):
    """`build_weights=False` (the ONNX Runtime model's path) builds no backbone or pooler, the state every
    LMKModel holds is set by LMKModel itself, and `forward` is `embed_rows` plus the window combining."""
    from lmk_embed.modeling_lmk import LMKOnnxModel

    class Rows(LMKModel):  # its rows come from elsewhere: here, from a torch model
        def embed_rows(self, *args, **kwargs):
            return lmk_model.embed_rows(*args, **kwargs)

    bare = Rows(lmk_model.config, build_weights=False)
    assert not hasattr(bare, "backbone") and not hasattr(bare, "pooler") and not list(bare.parameters())
    assert bare._tokenizer is None and hasattr(bare, "_granularity_draws")  # set by LMKModel.__init__
    windows = {"long_input": "windows", "window_length": 24, "max_length": None}
    for options in ({}, windows):
        features = lmk_model.prepare_features(TEXTS, **options)
        assert ("window_document" in features) == bool(options)
        with torch.no_grad():
            ours, theirs = bare(**features), lmk_model(**features)
        assert torch.equal(ours.embeddings, theirs.embeddings) and len(ours.embeddings) == len(TEXTS)
        if options:  # windows run in bounded groups: no state of every window is kept
            assert ours.last_hidden_state is None and theirs.last_hidden_state is None
        else:
            assert torch.equal(ours.last_hidden_state, theirs.last_hidden_state)
    assert issubclass(LMKOnnxModel, LMKModel) and "__init__" in vars(LMKOnnxModel)
