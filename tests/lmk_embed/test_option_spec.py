"""The LMK option spec (`LMK_OPTIONS`) is the one list of the family's options: the config's fields,
the tokenizer_config.json mirror, `encode()`'s keywords and the convert-lmk flags all agree with it."""

import inspect
import json

import pytest

from lmk_embed import LMKModel
from lmk_embed.configuration_lmk import LMK_OPTIONS, LMKConfig


def test_every_option_is_a_config_field_and_the_only_config_fields_encode_takes_are_the_per_call_ones():
    fields = set(LMKConfig.__annotations__)
    assert {option.name for option in LMK_OPTIONS} <= fields
    encode = set(inspect.signature(LMKModel.encode).parameters)
    per_call = {option.name for option in LMK_OPTIONS if option.per_call}
    assert encode & fields == per_call
    assert per_call - {"normalize"} <= set(inspect.signature(LMKModel.resolve).parameters)


def test_the_saved_tokenizer_config_mirrors_exactly_the_declared_keys(lmk_checkpoint):
    saved = json.loads((lmk_checkpoint / "tokenizer_config.json").read_text())
    config = LMKConfig.from_pretrained(lmk_checkpoint)
    mirrored = {option.tokenizer_key: option.name for option in LMK_OPTIONS if option.tokenizer_key}
    assert {key for key in saved if key.startswith("lmk_")} == set(mirrored)
    assert {key: saved[key] for key in mirrored} == {key: getattr(config, name) for key, name in mirrored.items()}


def test_the_tokenizer_without_options_reads_the_config_defaults(lmk_checkpoint, tmp_path):
    from lmk_embed import LMKTokenizer

    tokenizer = LMKTokenizer.from_pretrained(lmk_checkpoint)
    for key in [option.tokenizer_key for option in LMK_OPTIONS if option.tokenizer_key]:
        tokenizer.init_kwargs.pop(key, None)
    assert (tokenizer.lmk_pooling, tokenizer.lmk_granularity, tokenizer.lmk_splitter, tokenizer.lmk_granularities) == (
        LMKConfig.pooling, LMKConfig.granularity, LMKConfig.splitter, tuple(LMKConfig.granularities))
    assert tokenizer._landmark_option() == LMKConfig.landmark_token


def test_convert_lmk_has_each_declared_flag():
    from lmk_embed_tools.cli import build_parser

    parser = build_parser()
    subparsers = next(action for action in parser._actions if action.choices and "convert-lmk" in action.choices)
    flags = {flag for action in subparsers.choices["convert-lmk"]._actions for flag in action.option_strings}
    assert {option.cli_flag for option in LMK_OPTIONS if option.cli_flag} <= flags


@pytest.mark.parametrize("value", [2, "64", 2.5])
def test_a_window_length_meets_one_rule_as_a_config_default_and_as_an_argument(value, minilm_lmk_checkpoint):
    """Before, the config refused W < 3 while a call took any positive W."""
    error = TypeError if not isinstance(value, int) else ValueError
    with pytest.raises(error, match="`window_length`"):
        LMKConfig(window_length=value)
    model = LMKModel.from_pretrained(minilm_lmk_checkpoint)
    with pytest.raises(error, match="`window_length`"):
        model.encode("x", long_input="windows", window_length=value)
