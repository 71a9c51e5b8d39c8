"""`encode(output_value="late_chunks")`: per chunk, the mean of its content tokens' final states, read
in context (late chunking). Checked against a direct computation from the backbone's token states:
in one pass (landmark layout), on the untouched base read the plain way ([CLS] text [SEP], pooling
mean), and in the `windows` schedule (a plain loop over the windows)."""

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from lmk_embed import LMKModel
from tests import helpers

G, WINDOW = 32, 128


@pytest.fixture(scope="module")
def model(minilm_lmk_checkpoint):
    return LMKModel.from_pretrained(minilm_lmk_checkpoint).eval()


@pytest.fixture(scope="module")
def base(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path), AutoModel.from_pretrained(minilm_path).eval()


@pytest.fixture(scope="module")
def long_text():
    return " ".join(helpers.stdlib_texts(4))[:9000]


def chunk_means(states: torch.Tensor, sizes: list[int]) -> np.ndarray:
    """states [sum(sizes), D] of consecutive content tokens -> [len(sizes), D], the mean of each run."""
    return np.stack([part.mean(0).numpy() for part in torch.split(states, sizes)])


def test_one_pass_equals_the_mean_of_each_chunk_between_its_landmarks(model):
    text = helpers.SAMPLE_TEXT * 3
    out = model.encode(text, output_value="late_chunks", normalize=False)
    ids = model.tokenizer.layout([text], model.resolve(output_value="late_chunks").layout).input_ids[0]
    landmark = model.tokenizer.landmark_id("sep")
    with torch.no_grad():
        row = torch.tensor(ids)[None]
        hidden = model.backbone(input_ids=row, attention_mask=torch.ones_like(row)).last_hidden_state[0]
    marks = np.flatnonzero(ids == landmark)
    expected = np.stack([hidden[a + 1:b].mean(0).numpy() for a, b in zip([0, *marks[:-1]], marks)])
    assert len(expected) > 3
    np.testing.assert_allclose(out["embeddings"], expected, atol=2e-5)
    landmarks = model.encode(text, output_value="landmarks")
    assert out["spans"] == landmarks["spans"]  # the same chunks, the same characters


def test_the_untouched_base_read_plainly(base, minilm_path, tmp_path):
    """Pooling mean is the base's own layout: its late chunks are the base's token states, from
    transformers' own forward, mean-pooled over runs of g content tokens."""
    from lmk_embed_tools.training.convert import convert_to_lmk

    tokenizer, backbone = base
    plain = LMKModel.from_pretrained(convert_to_lmk(minilm_path, tmp_path / "mean", pooling="mean", granularity=G)).eval()
    text = helpers.SAMPLE_TEXT * 4
    out = plain.encode(text, output_value="late_chunks", normalize=False)
    encoded = tokenizer(text, return_tensors="pt", truncation=False)
    with torch.no_grad():
        hidden = backbone(**encoded).last_hidden_state[0, 1:-1]  # [CLS] text [SEP]: the content tokens
    sizes = [min(G, len(hidden) - start) for start in range(0, len(hidden), G)]
    np.testing.assert_allclose(out["embeddings"], chunk_means(hidden, sizes), atol=2e-5)
    assert len(out["spans"]) == len(sizes) and out["spans"][0][0] == 0
    start, end = out["spans"][1]
    assert tokenizer(text[start:end], add_special_tokens=False)["input_ids"] == \
        encoded["input_ids"][0, 1 + G:1 + 2 * G].tolist()  # each span is its chunk's characters


def test_windows_read_each_chunk_in_its_own_window(model, long_text):
    request = model.resolve(long_input="windows", window_length=WINDOW, output_value="late_chunks")
    ids = model.tokenizer.layout([long_text], request.layout).input_ids[0].tolist()
    landmark = model.tokenizer.landmark_id("sep")
    windows = helpers.landmark_windows(ids, landmark, WINDOW)
    expected = []
    with torch.no_grad():
        for part in windows:
            row = torch.tensor([[ids[0], *part]])
            hidden = model.backbone(input_ids=row, attention_mask=torch.ones_like(row)).last_hidden_state[0]
            marks = np.flatnonzero(row[0].numpy() == landmark)
            expected += [hidden[a + 1:b].mean(0).numpy() for a, b in zip([0, *marks[:-1]], marks)]
    out = model.encode(long_text, long_input="windows", window_length=WINDOW, max_length=None,
                       output_value="late_chunks", normalize=False)
    assert len(windows) > 5
    np.testing.assert_allclose(out["embeddings"], np.stack(expected), atol=2e-5)
    batched = model.encode([long_text, "short", ""], long_input="windows", window_length=WINDOW, max_length=None,
                           output_value="late_chunks", normalize=False, batch_size=3)
    np.testing.assert_allclose(batched[0]["embeddings"], out["embeddings"], atol=1e-5)
    assert [len(item["embeddings"]) for item in batched[1:]] == [1, 1]  # an empty text still has one vector
    assert np.isfinite(batched[2]["embeddings"]).all()


def test_late_chunks_are_normalised_by_default(model):
    out = model.encode([helpers.SAMPLE_TEXT], output_value="late_chunks")[0]
    np.testing.assert_allclose(np.linalg.norm(out["embeddings"], axis=1), 1.0, atol=1e-5)


def test_an_unknown_output_value_is_named(model):
    with pytest.raises(ValueError, match="Unknown `output_value` 'chunks'"):
        model.encode("x", output_value="chunks")


def test_landmarks_and_late_chunks_read_the_index_window_and_the_vector_keeps_its_own(minilm_lmk_checkpoint, tmp_path,
                                                                                       long_text):
    """`config.index_window_length`: the window the index reads (chosen for search), for landmark vectors and
    late chunks alike; the document vector keeps `window_length`; an explicit window_length wins."""
    import json
    import shutil

    folder = shutil.copytree(minilm_lmk_checkpoint, tmp_path / "index-window")
    config = json.loads((folder / "config.json").read_text())
    config.update(long_input="windows", index_window_length=WINDOW)
    (folder / "config.json").write_text(json.dumps(config))
    model = LMKModel.from_pretrained(folder).eval()
    for output_value in ("landmarks", "late_chunks"):
        chosen = model.encode(long_text, output_value=output_value, max_length=None)
        explicit = model.encode(long_text, output_value=output_value, max_length=None, window_length=WINDOW)
        np.testing.assert_array_equal(chosen["embeddings"], explicit["embeddings"])
        own = model.encode(long_text, output_value=output_value, max_length=None, window_length=512)
        assert len(own["spans"]) == len(chosen["spans"]) and not np.allclose(own["embeddings"], chosen["embeddings"])
    np.testing.assert_array_equal(model.encode(long_text, max_length=None),
                                  model.encode(long_text, max_length=None, window_length=512))
    with pytest.raises(ValueError, match="`index_window_length`"):
        LMKModel.from_pretrained(folder, index_window_length=0)
