"""Inputs that were read wrongly, ignored or answered with a wall of text, without a clear word: a text
that fits one window is read whatever g (and a window that cannot hold a chunk is refused, never
stretched), `window_length` where no window is read, a pickle refusal, sentence-transformers'
`max_seq_length` under windows, and NaN vectors."""

import pickle
import shutil
import warnings

import numpy as np
import pytest
import torch

from lmk_embed import LMKModel
from tests import helpers


@pytest.fixture(scope="module")
def windows_checkpoint(tmp_path_factory):
    """A tiny BERT LMK checkpoint (g=32, 512 positions) read in windows by default (W = 512)."""
    from lmk_embed_tools.training.convert import convert_to_lmk

    root = tmp_path_factory.mktemp("windows")
    return convert_to_lmk(helpers.tiny_encoder_source(root / "bert", "bert"), root / "lmk", granularity=32,
                          long_input="windows")


@pytest.fixture(scope="module")
def windows_model(windows_checkpoint):
    return LMKModel.from_pretrained(windows_checkpoint).eval()


def test_a_text_that_fits_one_window_is_read_whatever_g(windows_model):
    short = "short text"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vector = windows_model.encode(short, granularity=1000)
    np.testing.assert_allclose(vector, windows_model.encode(short, granularity=1000, long_input="one-pass"), atol=1e-6)
    assert windows_model.encode("x", window_length=20).shape == (32,)  # fits a window of 20 at g=32


def test_a_window_that_cannot_hold_a_chunk_is_refused_for_the_texts_it_must_cut(windows_model):
    """Never read as one row longer than the window (the first window once wrapped round to the
    text's end: a row of 335 tokens for W=64)."""
    long = helpers.SAMPLE_TEXT * 3
    with pytest.raises(ValueError, match=r"`window_length`=64 must hold one chunk of g=100"):
        windows_model.encode(long, window_length=64, granularity=100)
    with pytest.raises(ValueError, match=r"`window_length`=512 must hold one chunk of g=1000"):
        windows_model.encode(helpers.SAMPLE_TEXT * 20, granularity=1000, max_length=None)


def test_window_length_where_no_window_is_read_is_refused(windows_model, lmk_model, minilm_path, tmp_path):
    from lmk_embed_tools.training.convert import ConversionError, convert_to_lmk

    with pytest.raises(ValueError, match=r"`window_length` is the window of long_input='windows', but this call reads in one pass"):
        windows_model.encode("x", long_input="one-pass", window_length=64)
    with pytest.raises(ValueError, match=r"`window_length` is the window of long_input='windows'"):
        lmk_model.encode("x", window_length=64)  # a one-pass checkpoint
    with pytest.raises(ConversionError, match=r"`window_length` is the window .* needs pooling='lmk', not 'cls'"):
        convert_to_lmk(minilm_path, tmp_path / "cls", pooling="cls", window_length=64)
    assert not (tmp_path / "cls").exists()


def test_a_pickle_refusal_is_one_line(lmk_checkpoint, tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModel

    class Payload:
        def __reduce__(self):
            return (print, ("unpickled",))

    folder = shutil.copytree(lmk_checkpoint, tmp_path / "pickled", ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({**load_file(lmk_checkpoint / "model.safetensors"), "extra": Payload()}, folder / "pytorch_model.bin")
    for load in (LMKModel.from_pretrained, lambda path: AutoModel.from_pretrained(path, trust_remote_code=True)):
        with pytest.raises(pickle.UnpicklingError) as caught:
            load(str(folder))
        message = str(caught.value)
        assert "\n" not in message and "weights_only" not in message and "(print)" in message, message
        assert message.startswith(str(folder)) and "safetensors" in message
    assert "unpickled" not in capsys.readouterr().out


def test_max_seq_length_below_the_minimum_is_refused_under_windows(windows_checkpoint):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(windows_checkpoint), trust_remote_code=True, device="cpu")
    before = st.max_seq_length
    for bad in (1, 2):
        with pytest.raises(ValueError, match=rf"`max_seq_length`={bad} is too small: .*at least 3"):
            st.max_seq_length = bad
        assert st.max_seq_length == before
    st.max_seq_length = 64
    assert st.max_seq_length == 64


def test_a_nan_row_is_reported(lmk_checkpoint):
    """A token whose embedding row holds NaN gives its text a NaN vector; the call warns, naming it."""
    model = LMKModel.from_pretrained(lmk_checkpoint).eval()
    token = model.tokenizer.convert_tokens_to_ids("zebra")
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("nan")
    texts = ["a plain text", "a zebra", "another plain text"]
    with pytest.warns(UserWarning, match=r"1 of 3 texts gave vectors holding NaN or inf \(texts 1\)"):
        vectors = model.encode(texts)
    assert np.isnan(vectors[1]).all() and np.isfinite(vectors[[0, 2]]).all()
    with pytest.warns(UserWarning, match=r"1 of 1 texts gave vectors holding NaN"):
        model.encode("a zebra", output_value="landmarks")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.encode(texts[::2])


def test_convert_refuses_an_unrelated_folder_that_is_not_empty_and_reuses_its_own(tmp_path):
    from lmk_embed_tools.training.convert import ConversionError, convert_to_lmk

    source = helpers.tiny_encoder_source(tmp_path / "bert", "bert")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("mine")
    with pytest.raises(ConversionError, match=r"`output_dir` .* is not empty \(thesis.tex\)"):
        convert_to_lmk(source, tmp_path / "notes")
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["thesis.tex"]
    first = convert_to_lmk(source, tmp_path / "lmk", granularity=16)
    assert convert_to_lmk(source, first, granularity=8) == first  # a conversion done again overwrites its own


def test_a_literal_landmark_token_not_in_the_vocabulary_is_named_as_such(tmp_path, minilm_path):
    """MiniLM has [SEP]: the error is that the literal token is missing, not that SEP is."""
    from lmk_embed_tools.training.convert import ConversionError, convert_to_lmk

    with pytest.raises(ConversionError, match=r"`lmk_landmark`='<lmk>' is not a token of the tokenizer's vocabulary") as error:
        convert_to_lmk(str(minilm_path), tmp_path / "out", landmark_token="<lmk>")
    assert "neither a SEP" not in str(error.value)


def test_convert_recurrent_refuses_an_empty_default_task(tmp_path, mamba2_lm):
    from lmk_embed_tools.training.convert import ConversionError, convert_to_recurrent

    with pytest.raises(ConversionError, match="`default_task` must be a non-empty instruction"):
        convert_to_recurrent(mamba2_lm, tmp_path / "out", default_task="")
