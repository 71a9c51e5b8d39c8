"""The saved tokenizer mirrors the config: `save_pretrained` rewrites tokenizer_config.json's options
(the defaults of the tokenizer used on its own) from `config.tokenizer_options()`, so a config changed
after loading (as training does) is what the saved tokenizer says too. The tokenizer object is left
as it is."""

import json
import shutil

from transformers import AutoTokenizer

from lmk_embed import LMKModel, RecurrentEmbedModel
from tests import helpers


def landmark_gaps(tokenizer, text=helpers.SAMPLE_TEXT):
    """The distances between consecutive landmarks (SEP, MiniLM's landmark) of the standalone layout."""
    ids = tokenizer(text)["input_ids"]
    positions = [index for index, token in enumerate(ids) if token == tokenizer.sep_token_id]
    return positions[0], [b - a for a, b in zip(positions, positions[1:])]


def with_code_of(checkpoint, folder):
    """`folder` with the checkpoint's code, as published: AutoTokenizer's remote code comes from there."""
    for path in checkpoint.glob("*.py"):
        shutil.copyfile(path, folder / path.name)
    return folder


def test_lmk_save_pretrained_writes_the_config_options_into_tokenizer_config(minilm_lmk_checkpoint, tmp_path):
    model = LMKModel.from_pretrained(minilm_lmk_checkpoint)
    tokenizer = model.tokenizer
    held_options = dict(tokenizer.init_kwargs)
    model.config.granularity = 8
    model.save_pretrained(tmp_path / "saved")

    saved = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert saved["lmk_granularity"] == 8
    assert {name: saved[name] for name in model.config.tokenizer_options()} == model.config.tokenizer_options()
    assert model.tokenizer is tokenizer and tokenizer.init_kwargs == held_options  # nothing written into the tokenizer
    assert json.loads((minilm_lmk_checkpoint / "tokenizer_config.json").read_text())["lmk_granularity"] == 32

    # The tokenizer used on its own builds 8-token chunks: [CLS] z1 [LMK] z2 [LMK] ...
    saved_folder = with_code_of(minilm_lmk_checkpoint, tmp_path / "saved")
    first, gaps = landmark_gaps(AutoTokenizer.from_pretrained(saved_folder, trust_remote_code=True))
    assert first == 1 + 8 and len(gaps) > 3 and set(gaps[:-1]) == {8 + 1} and gaps[-1] <= 8 + 1
    original_first, _ = landmark_gaps(AutoTokenizer.from_pretrained(minilm_lmk_checkpoint, trust_remote_code=True))
    assert original_first == 1 + 32  # the original checkpoint's tokenizer still says 32


def test_recurrent_save_pretrained_writes_the_config_options_into_tokenizer_config(mamba2_checkpoint, tmp_path):
    model = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint)
    assert json.loads((mamba2_checkpoint / "tokenizer_config.json").read_text())["rec_add_bos"] is False
    model.config.add_bos_token = True
    model.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["rec_add_bos"] is True
    standalone = AutoTokenizer.from_pretrained(with_code_of(mamba2_checkpoint, tmp_path / "saved"), trust_remote_code=True)
    assert standalone.init_kwargs["rec_add_bos"] is True
    assert model.tokenizer.init_kwargs["rec_add_bos"] is False
