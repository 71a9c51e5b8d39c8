"""Each family's option spec (`LMK_OPTIONS`, `RECURRENT_OPTIONS`) is its one list of options: the
config's fields, the tokenizer_config.json mirror, `encode()`'s keywords and the convert command's
flags all agree with it, and a config default meets the same rule as a call's argument."""

import inspect
import json
import warnings

import pytest

from lmk_embed import LMKModel, RecurrentEmbedModel
from lmk_embed.configuration_lmk import LMK_OPTIONS, LMKConfig
from lmk_embed.configuration_recurrent import RECURRENT_OPTIONS, RecurrentEmbedConfig

FAMILIES = {
    "lmk": (LMK_OPTIONS, LMKConfig, LMKModel, "convert-lmk", "lmk_"),
    "recurrent": (RECURRENT_OPTIONS, RecurrentEmbedConfig, RecurrentEmbedModel, "convert-recurrent", "rec_"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_option_is_a_config_field_and_the_only_config_fields_encode_takes_are_the_per_call_ones(family):
    options, config_class, model_class, _, _ = FAMILIES[family]
    fields = set(config_class.__annotations__)
    assert {option.name for option in options} <= fields
    encode = set(inspect.signature(model_class.encode).parameters)
    per_call = {option.name for option in options if option.per_call}
    assert encode & fields == per_call
    assert per_call - {"normalize"} <= set(inspect.signature(model_class.resolve).parameters)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_saved_tokenizer_config_mirrors_exactly_the_declared_keys(family, lmk_checkpoint, mamba2_checkpoint):
    options, config_class, _, _, prefix = FAMILIES[family]
    folder = lmk_checkpoint if family == "lmk" else mamba2_checkpoint
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    config = config_class.from_pretrained(folder)
    mirrored = {option.tokenizer_key: option.name for option in options if option.tokenizer_key}
    assert {key for key in saved if key.startswith(prefix)} == set(mirrored)
    assert {key: saved[key] for key in mirrored} == {key: getattr(config, name) for key, name in mirrored.items()}


def test_the_lmk_tokenizer_without_options_reads_the_config_defaults(lmk_checkpoint):
    from lmk_embed import LMKTokenizer

    tokenizer = LMKTokenizer.from_pretrained(lmk_checkpoint)
    for key in [option.tokenizer_key for option in LMK_OPTIONS if option.tokenizer_key]:
        tokenizer.init_kwargs.pop(key, None)
    assert (tokenizer.lmk_pooling, tokenizer.lmk_granularity, tokenizer.lmk_splitter, tokenizer.lmk_granularities) == (
        LMKConfig.pooling, LMKConfig.granularity, LMKConfig.splitter, tuple(LMKConfig.granularities))
    assert tokenizer._landmark_option() == LMKConfig.landmark_token


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_convert_command_has_each_declared_flag(family):
    from lmk_embed_tools.cli import build_parser

    options, _, _, command, _ = FAMILIES[family]
    subparsers = next(action for action in build_parser()._actions if action.choices and command in action.choices)
    flags = {flag for action in subparsers.choices[command]._actions for flag in action.option_strings}
    assert {option.cli_flag for option in options if option.cli_flag} <= flags


@pytest.mark.parametrize("value", [2, "64", 2.5])
def test_a_window_length_meets_one_rule_as_a_config_default_and_as_an_argument(value, minilm_lmk_checkpoint):
    """Before, the config refused W < 3 while a call took any positive W."""
    error = TypeError if not isinstance(value, int) else ValueError
    with pytest.raises(error, match="`window_length`"):
        LMKConfig(window_length=value)
    model = LMKModel.from_pretrained(minilm_lmk_checkpoint)
    with pytest.raises(error, match="`window_length`"):
        model.encode("x", long_input="windows", window_length=value)


@pytest.mark.parametrize("value", ["big", 2.5, 0])
def test_a_block_size_meets_one_rule_as_a_config_default_and_as_an_argument(value, mamba2_checkpoint):
    error = TypeError if isinstance(value, float) else ValueError
    with pytest.raises(error, match="`block_size`"):
        RecurrentEmbedConfig(block_size=value)
    model = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint)
    with pytest.raises(error, match="`block_size`"):
        model.encode("x", block_size=value)


def test_a_max_length_default_meets_the_rule_of_an_argument_with_bos(mamba2_checkpoint):
    """With BOS, a budget must hold BOS, one token and EOS: as a config default and as an argument."""
    with pytest.raises(ValueError, match="`max_length`=2 is too small: it must hold BOS, one token and EOS"):
        RecurrentEmbedConfig(add_bos_token=True, max_length=2)
    RecurrentEmbedConfig(add_bos_token=False, max_length=2)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_config_fields_take_the_spec_defaults_and_their_annotations_name_its_kinds(family):
    """The default is written once, in the spec; the config's annotations stay for readers and IDEs."""
    options, config_class, _, _, _ = FAMILIES[family]
    for option in options:
        assert getattr(config_class, option.name) == option.default, option.name
        assert config_class.__annotations__[option.name].replace("list[int] | tuple[int, ...]", "list[int]") == option.kind


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_config_check_runs_every_rule_of_the_spec(family, monkeypatch):
    from lmk_embed.encoding import Option

    options, config_class, _, _, _ = FAMILIES[family]
    checked, check = [], Option.check
    monkeypatch.setattr(Option, "check", lambda option, value, config: checked.append(option.name) or check(option, value, config))
    config_class()
    assert checked == [option.name for option in options]


@pytest.mark.parametrize(("name", "value", "error"), [
    ("granularity", "64", TypeError), ("granularity", 0, ValueError), ("granularity", True, TypeError),
    ("max_length", "64", TypeError), ("max_length", 2, ValueError),
    ("splitter", "words", ValueError), ("long_input", "pages", ValueError),
])
def test_an_lmk_option_meets_one_rule_with_one_error_type_as_a_default_and_as_an_argument(name, value, error,
                                                                                            minilm_lmk_checkpoint):
    """Before, a bad granularity was a ValueError as a config default and a TypeError as an argument."""
    with pytest.raises(error, match=f"`{name}`"):
        LMKConfig(**{name: value})
    model = LMKModel.from_pretrained(minilm_lmk_checkpoint)
    with pytest.raises(error, match=f"`{name}`"):
        model.encode("x", **{name: value})


@pytest.mark.parametrize(("name", "value", "error"), [
    ("schedule", "diagonal", ValueError), ("max_length", 1, ValueError), ("max_length", 2.5, TypeError),
])
def test_a_recurrent_option_meets_one_rule_as_a_default_and_as_an_argument(name, value, error, mamba2_checkpoint):
    with pytest.raises(error, match=f"`{name}`"):
        RecurrentEmbedConfig(**{name: value})
    model = RecurrentEmbedModel.from_pretrained(mamba2_checkpoint)
    with pytest.raises(error, match=f"`{name}`"):
        model.encode("x", **{name: value})


def test_an_empty_default_task_is_refused_rather_than_replaced():
    with pytest.raises(ValueError, match="`default_task` must be a non-empty instruction"):
        RecurrentEmbedConfig(default_task="")


def card_row(folder, row: str) -> str:
    """A row of the checkpoint's model card's details table."""
    from lmk_embed_tools.model_cards.generator import build_card

    (line,) = [line for line in str(build_card(folder)).splitlines() if line.startswith(f"| {row} |")]
    return line.split("|")[2].strip()


def sentence_transformer(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_model_card_shows_the_max_length_encode_works_out(family, minilm_lmk_checkpoint, mamba2_checkpoint):
    folder = minilm_lmk_checkpoint if family == "lmk" else mamba2_checkpoint
    expected = {"lmk": "512", "recurrent": "unbounded (vertical schedule)"}[family]  # MiniLM: 512 positions
    assert card_row(folder, "Max length") == expected
    assert sentence_transformer(folder).max_seq_length == (512 if family == "lmk" else None)


def test_a_windows_checkpoint_reads_the_whole_text_in_its_card_and_in_sentence_transformers(minilm_path, tmp_path):
    """Before, the card and `max_seq_length` said 512 while `encode()` read the whole text."""
    from lmk_embed_tools.training.convert import convert_to_lmk

    folder = convert_to_lmk(minilm_path, tmp_path / "windows", granularity=32, long_input="windows", window_length=128)
    model = LMKModel.from_pretrained(folder)
    long_text = "the json module encodes and decodes data " * 200  # about 1,400 tokens: past MiniLM's 512
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a text past max_length would warn: none may
        landmarks = model.encode(long_text, output_value="landmarks")
    assert landmarks["spans"][-1][1] == len(long_text.rstrip())  # read to its end
    assert sentence_transformer(folder).max_seq_length is None
    assert card_row(folder, "Max length") == "the whole text (read in windows of 128 tokens)"


def test_the_card_and_max_seq_length_leave_out_the_padding_offset(tmp_path):
    """An XLM-RoBERTa table of 514 rows with pad id 0 reads 514 - (0 + 1) = 513 tokens (positions start
    after the padding index); before, the card read 514 from `max_position_embeddings`."""
    from lmk_embed_tools.training.convert import convert_to_lmk
    from tests.helpers import tiny_encoder_source

    source = tiny_encoder_source(tmp_path / "xlmr", "xlm-roberta")
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = 100_000  # the position table is the only limit
    (source / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    folder = convert_to_lmk(source, tmp_path / "lmk", granularity=8)
    positions, pad = 514, 0  # tiny_encoder_source's XLM-RoBERTa config
    assert card_row(folder, "Max length") == str(positions - (pad + 1))
    assert sentence_transformer(folder).max_seq_length == positions - (pad + 1)
    model = LMKModel.from_pretrained(folder)
    with pytest.raises(ValueError, match="`max_length`"):
        model.encode("x", max_length=positions)


@pytest.mark.parametrize(("value", "error"), [("128", TypeError), (128.0, TypeError), (True, TypeError),
                                              (0, ValueError), (-1, ValueError)])
def test_a_training_granularity_meets_the_option_rule_with_its_error_type(value, error):
    """Before, TrainConfig raised a ValueError for "128", 128.0 and True, the option's rule a TypeError."""
    from lmk_embed_tools.training.config import TrainConfig

    with pytest.raises(error, match="`granularity`"):
        LMKConfig(granularity=value)
    with pytest.raises(error, match="`granularity`"):
        TrainConfig(model="m", output_dir="o", granularity=value)


@pytest.mark.parametrize(("value", "error"), [([], ValueError), ([32, "64"], TypeError), ([32, 0], ValueError),
                                              ("32", TypeError)])
def test_granularities_meet_one_rule_in_the_config_and_in_training(value, error):
    """An empty set is refused at construction (before, `random.choice([])` failed at the first draw)."""
    from lmk_embed_tools.training.config import TrainConfig

    with pytest.raises(error, match="`granularities`"):
        LMKConfig(granularities=value, splitter="variable")
    with pytest.raises(error, match="`granularities`"):
        TrainConfig(model="m", output_dir="o", granularities=value)


def test_training_offers_the_options_own_choices():
    """`TrainConfig.passage_long_input` and `splitter` take the families' lists (no copies)."""
    from lmk_embed.configuration_lmk import LONG_INPUTS, SPLITTERS
    from lmk_embed_tools.cli import build_parser

    train = next(action for action in build_parser()._actions if action.choices and "train" in action.choices)
    choices = {action.dest: action.choices for action in train.choices["train"]._actions}
    assert list(choices["passage_long_input"]) == list(LONG_INPUTS)
    assert list(choices["splitter"]) == list(SPLITTERS)


def test_the_integer_flags_meet_the_shipped_rules():
    """One positive-integer rule and one block_size rule: the flags read a number and apply them."""
    import argparse

    from lmk_embed_tools import commandline

    assert commandline.positive_int("7") == 7 and commandline.block_size("auto") == "auto"
    assert commandline.block_size("64") == 64
    for flag, text in [(commandline.positive_int, "0"), (commandline.positive_int, "2.5"),
                       (commandline.positive_int, "auto"), (commandline.block_size, "big"), (commandline.block_size, "0")]:
        with pytest.raises(argparse.ArgumentTypeError, match="must be a positive integer"):
            flag(text)
    assert not hasattr(commandline, "check_positive_int")  # the shipped rule is the only one


def test_the_budgets_are_named_once():
    """The analyses' 512 and the training budgets (128 / 512) are named constants, written once."""
    import ast
    import inspect

    from lmk_embed_tools import evaluation_jobs
    from lmk_embed_tools.evaluation import analyses
    from lmk_embed_tools.training import config, finetune

    def literals(module, value):
        return [node.lineno for node in ast.walk(ast.parse(inspect.getsource(module)))
                if isinstance(node, ast.Constant) and node.value == value and not isinstance(node.value, bool)]

    assert len(literals(analyses, 512)) == 1 and literals(evaluation_jobs, 512) == []
    assert len(literals(config, 128)) == len(literals(config, 512)) == 1
    assert literals(finetune, 128) == literals(finetune, 512) == []
    assert finetune.EmbeddingDataCollator.query_max_length == config.TrainConfig.query_max_length == config.QUERY_MAX_LENGTH
    assert finetune.EmbeddingDataCollator.passage_max_length == config.TrainConfig.passage_max_length == config.PASSAGE_MAX_LENGTH
    for analysis in (analyses.attention_by_position, analyses.landmark_locality):
        assert inspect.signature(analysis).parameters["max_length"].default == analyses.ANALYSIS_MAX_LENGTH


def test_a_training_run_takes_every_block_size_the_option_takes():
    """`TrainConfig.block_size` meets the option's rule: "auto" trains too, and a flag's text is a number."""
    from lmk_embed_tools.training.config import TrainConfig

    assert TrainConfig(model="m", output_dir="o", block_size="auto").block_size == "auto"
    assert TrainConfig(model="m", output_dir="o", block_size="512").block_size == 512
    with pytest.raises(ValueError, match="`block_size` must be a positive integer or 'auto'"):
        TrainConfig(model="m", output_dir="o", block_size="big")


def layout_table_rows() -> list[list[str]]:
    """docs/layout.md's options table: [option, declared, default worked out, checked] per row."""
    from tests.helpers import REPO_ROOT

    lines = (REPO_ROOT / "docs" / "layout.md").read_text().splitlines()
    start = lines.index("| option | declared | default worked out | checked |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def name_exists(name: str) -> bool:
    """Whether a name the table writes in backticks (`module.name`, `Class.attribute`, `name`, `name()`)
    is in the shipped modules, the training config or the command line's helpers."""
    import importlib

    modules = {short: importlib.import_module(f"lmk_embed.{short}") for short in (
        "encoding", "configuration_lmk", "configuration_recurrent", "modeling_lmk", "modeling_recurrent",
        "tokenization_lmk")}
    modules["commandline"] = importlib.import_module("lmk_embed_tools.commandline")
    from lmk_embed_tools.training.config import TrainConfig

    holders = [*modules.values(), LMKModel, RecurrentEmbedModel, TrainConfig, modules["modeling_recurrent"].Schedule,
               importlib.import_module("lmk_embed.st_module").EmbedderModule]
    head, _, tail = name.removesuffix("()").partition(".")
    classes = {holder.__name__: holder for holder in holders if isinstance(holder, type)}
    if tail:
        holder = modules.get(head) or classes.get(head) or next((getattr(h, head) for h in holders if hasattr(h, head)), None)
        return holder is not None and hasattr(holder, tail)
    return head in classes or any(hasattr(holder, head) for holder in holders)


def test_the_layout_table_of_options_is_true():
    """Each row's option is declared in the specs it names with the default it writes, the option's rule
    calls a `check_*` the row names, and every code name in the row exists."""
    import ast
    import re

    specs = {"LMK_OPTIONS": LMK_OPTIONS, "RECURRENT_OPTIONS": RECURRENT_OPTIONS}
    rows = layout_table_rows()
    assert {row[0].strip("`") for row in rows} >= {"max_length", "granularity", "granularities", "long_input",
                                                   "window_length", "block_size", "schedule"}
    for name, declared, worked_out, checked in rows:
        name = name.strip("`")
        default = ast.literal_eval(re.search(r"\((.*)\)$", declared).group(1))
        named_specs = re.findall(r"`(\w+_OPTIONS)`", declared)
        assert named_specs, name
        for spec in named_specs:
            (option,) = [option for option in specs[spec] if option.name == name]
            assert option.default == default, (name, spec)
            rule = option.rule
            called = set(rule.__code__.co_names) | {rule.__name__}
            assert called & set(re.findall(r"`(?:\w+\.)?(check_\w+)`", checked)), (name, spec, called)
        for code in re.findall(r"`([^`]+)`", worked_out + " " + checked):
            if re.fullmatch(r"[A-Za-z_][\w.]*(\(\))?", code) and ("_" in code or "." in code or code[0].isupper()):
                assert name_exists(code), (name, code)
