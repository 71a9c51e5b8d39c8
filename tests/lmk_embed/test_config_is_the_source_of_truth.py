"""LMK options live in config.json: editing it changes what encode() does, whatever the tokenizer's
own defaults in tokenizer_config.json say."""

import json
import shutil

import pytest

from lmk_embed import LMKModel
from tests import helpers


@pytest.fixture()
def edited(minilm_lmk_checkpoint, tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(minilm_lmk_checkpoint, folder)

    def edit(**changes):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
        return LMKModel.from_pretrained(folder).eval()

    return edit


def landmarks(model, text=helpers.SAMPLE_TEXT):
    output = model.encode(text, output_value="landmarks")
    return len(output["spans"])


def test_editing_the_granularity_in_config_json_changes_the_landmark_count(edited, minilm_lmk_checkpoint):
    tokenizer_config = json.loads((minilm_lmk_checkpoint / "tokenizer_config.json").read_text())
    assert tokenizer_config["lmk_granularity"] == 32  # the tokenizer's own default stays 32 throughout
    at_32, at_8 = landmarks(edited(granularity=32)), landmarks(edited(granularity=8))
    assert at_8 > 3 * at_32


def test_editing_the_landmark_token_in_config_json_changes_the_layout(edited):
    model = edited(landmark_token="[unused0]")
    ids = model.tokenize([helpers.SAMPLE_TEXT], model.resolve()).input_ids[0]
    unused = model.tokenizer.convert_tokens_to_ids("[unused0]")
    assert (ids == unused).sum() == landmarks(model) and model.tokenizer.sep_token_id not in ids.tolist()


def test_variable_draws_come_from_the_config_set_and_seed(edited):
    draws = {}
    for seed in (0, 0, 5):
        model = edited(splitter="variable", granularities=[8, 16, 24], splitter_seed=seed)
        draws.setdefault(seed, []).append([model.draw_granularity() for _ in range(12)])
    assert draws[0][0] == draws[0][1] and set(draws[0][0]) <= {8, 16, 24}
    assert draws[5][0] != draws[0][0]
