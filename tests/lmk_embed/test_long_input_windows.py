"""LMK's `windows` long-input schedule: texts cut into windows of whole chunks, each read at the
original positions, every landmark of every window pooled. Checked against a plain loop over the
windows, against one pass for texts that fit one window, and through sentence-transformers."""

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from lmk_embed import LMKModel
from tests import helpers

WINDOW = 128  # MiniLM g=32: three chunks and their landmarks per window, after [CLS]


@pytest.fixture(scope="module")
def model(minilm_lmk_checkpoint):
    return LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()


@pytest.fixture(scope="module")
def long_text():
    return " ".join(helpers.stdlib_texts(6))[:12000]


def reference_windows(model, text, window):
    """The schedule as a plain loop: the whole text's landmark layout, cut after whole chunks while
    [CLS] + the chunks fit `window`, each window run alone; the mean of all landmark states."""
    request = model.resolve(long_input="windows", window_length=window)  # the whole text: no budget
    assert request.max_length is None
    ids = model.tokenizer.layout([text], request.layout).input_ids[0].tolist()
    landmark, states = model.tokenizer.landmark_id("sep"), []
    windows = helpers.landmark_windows(ids, landmark, window)
    with torch.no_grad():
        for part in windows:
            row = torch.tensor([[ids[0], *part]])
            hidden = model.backbone(input_ids=row, attention_mask=torch.ones_like(row)).last_hidden_state[0]
            states.append(hidden[row[0] == landmark])
    assert all(len(part) + 1 <= window for part in windows) and len(windows) > 1
    return torch.cat(states), len(windows)


def test_windows_equal_the_plain_loop(model, long_text):
    states, num_windows = reference_windows(model, long_text, WINDOW)
    vector = model.encode(long_text, long_input="windows", window_length=WINDOW, max_length=None, normalize=False)
    np.testing.assert_allclose(vector, states.mean(0).numpy(), atol=2e-5)
    landmarks = model.encode(long_text, long_input="windows", window_length=WINDOW, max_length=None,
                             output_value="landmarks", normalize=False)
    np.testing.assert_allclose(landmarks["embeddings"], states.numpy(), atol=2e-5)
    assert num_windows >= 10


def test_a_text_that_fits_one_window_reads_as_one_pass(model):
    texts = [helpers.SAMPLE_TEXT, "short", ""]
    one_pass = model.encode(texts, normalize=False)
    windows = model.encode(texts, long_input="windows", normalize=False)  # W: the original 512 positions
    np.testing.assert_array_equal(windows, one_pass)
    mixed = model.encode([helpers.SAMPLE_TEXT, helpers.SAMPLE_TEXT * 30], long_input="windows", window_length=WINDOW,
                         max_length=None, normalize=False)
    np.testing.assert_allclose(mixed[0], one_pass[0], atol=1e-5)  # batched beside a windowed text


def test_spans_cut_the_text_where_the_landmarks_close(model, long_text):
    windows = model.encode(long_text, long_input="windows", window_length=WINDOW, max_length=None,
                           output_value="landmarks")
    spans = windows["spans"]
    assert len(spans) == len(windows["embeddings"]) and spans[0][0] == 0
    assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:]))
    assert long_text[spans[-1][0]:spans[-1][1]].strip() == long_text[spans[-1][0]:].strip()
    content = model.tokenizer.content_encodings([long_text])[0].ids
    assert len(spans) == -(-len(content) // 32)  # nothing dropped: one landmark per 32 tokens


def test_windows_read_past_the_position_table_without_truncating(model, long_text):
    assert model.max_positions() == 512
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the whole text is read: no truncation warning
        vector = model.encode(long_text, long_input="windows", max_length=None)
    assert vector.shape == (384,)
    with pytest.warns(UserWarning, match="1 of 1 texts were longer than max_length=2000"):
        model.encode(long_text, long_input="windows", max_length=2000)


def test_bad_window_options_are_named(model):
    with pytest.raises(ValueError, match="`window_length`=20 must hold one chunk of g=32"):
        model.encode(helpers.SAMPLE_TEXT, long_input="windows", window_length=20)  # "x" fits: it is read
    with pytest.raises(ValueError, match="`window_length`=600 exceeds the backbone's limit of 512"):
        model.encode("x", long_input="windows", window_length=600)
    with pytest.raises(ValueError, match="Unknown `long_input` 'pages'"):
        model.encode("x", long_input="pages")
    with pytest.raises(TypeError, match="`window_length` must be a positive integer"):
        model.encode("x", long_input="windows", window_length="64")


def test_each_check_fires_once_per_call(model, monkeypatch):
    import lmk_embed.modeling_lmk as modeling

    calls = []
    rule = modeling.check_lmk_max_length

    def counted(*args, **kwargs):
        calls.append(args)
        return rule(*args, **kwargs)

    monkeypatch.setattr(modeling, "check_lmk_max_length", counted)
    texts = [helpers.SAMPLE_TEXT * 40] * 3 + ["short"] * 6
    with pytest.warns(UserWarning) as caught:
        model.encode(texts, batch_size=2, max_length=64)  # five batches
    assert len(calls) == 1 and calls[0][:2] == (64, model.max_positions())  # the budget and the position limit, once
    assert [str(w.message) for w in caught] == ["3 of 9 texts were longer than max_length=64 tokens and were truncated."]


def test_sentence_transformers_follows_the_configured_schedule(minilm_lmk_checkpoint, tmp_path, long_text):
    from sentence_transformers import SentenceTransformer

    folder = shutil.copytree(minilm_lmk_checkpoint, tmp_path / "windows")
    config = json.loads((folder / "config.json").read_text())
    config.update(long_input="windows", window_length=WINDOW, max_length=4096)
    (folder / "config.json").write_text(json.dumps(config))
    auto = LMKModel.from_pretrained(folder).eval()
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    texts = [long_text, helpers.SAMPLE_TEXT]
    expected = auto.encode(texts)
    np.testing.assert_allclose(st.encode(texts), expected, atol=1e-5)
    np.testing.assert_allclose(expected[0], auto.encode(long_text, long_input="windows", window_length=WINDOW,
                                                        max_length=4096), atol=1e-6)
    assert st.max_seq_length == 4096  # the document budget, past the 512 positions each window reads


def test_windows_need_landmark_pooling(minilm_path, tmp_path):
    from lmk_embed_tools.training.convert import convert_to_lmk

    cls = LMKModel.from_pretrained(convert_to_lmk(minilm_path, tmp_path / "cls", pooling="cls")).eval()
    with pytest.raises(ValueError, match="needs pooling='lmk', not 'cls'"):
        cls.encode("x", long_input="windows")


def backbone_batches(model) -> list[int]:
    """The rows of every backbone forward from now on (a forward hook on `model.backbone`)."""
    rows = []
    model.backbone.register_forward_hook(lambda module, args, kwargs, output: rows.append(kwargs["input_ids"].shape[0]),
                                         with_kwargs=True)
    return rows


def test_sentence_transformers_and_encode_run_windows_one_way(minilm_lmk_checkpoint, tmp_path, long_text):
    """The sentence-transformers module and `encode()` share `embed_windows`: the same vectors to the last
    digit on a multi-window text, from the same bounded groups of windows (never every window at once)."""
    from sentence_transformers import SentenceTransformer

    from lmk_embed.modeling_lmk import WINDOWS_PER_FORWARD

    folder = shutil.copytree(minilm_lmk_checkpoint, tmp_path / "windows")
    config = json.loads((folder / "config.json").read_text())
    config.update(long_input="windows", window_length=WINDOW)
    (folder / "config.json").write_text(json.dumps(config))
    auto = LMKModel.from_pretrained(folder).eval()
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    texts = [long_text, helpers.SAMPLE_TEXT]
    auto_rows, st_rows = backbone_batches(auto), backbone_batches(st[0].model)
    expected = auto.encode(texts)
    np.testing.assert_array_equal(st.encode(texts), expected)
    windows = len(auto.tokenize(texts, auto.resolve()).window_document)
    assert windows > 2 * WINDOWS_PER_FORWARD
    assert auto_rows == st_rows and sum(auto_rows) == windows and max(auto_rows) == WINDOWS_PER_FORWARD
    auto_rows.clear()
    auto.encode([long_text[:1200]] * 20, batch_size=20)  # more texts than WINDOWS_PER_FORWARD: a group per text
    assert max(auto_rows) == 20 and sum(auto_rows) > 20
