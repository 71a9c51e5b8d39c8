"""The one checkpoint's rows: (synopsis, page) rows cut to what the recipe reads at 512 tokens, so that
the longer budget of the deep-sentence rows reads them in one window, as the recipe always did."""

import pytest

from lmk_embed_tools.training.long_pages import content_budget
from lmk_embed_tools.training.recipe import LONG_PAGES, RECIPE, cut_rows_to_recipe, long_page_fields
from tests.helpers import stdlib_texts


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_path))


def test_synopsis_rows_fit_one_window_at_every_g(tokenizer, minilm_path, tmp_path):
    from transformers import AutoModel

    from lmk_embed_tools.training.convert import convert_to_lmk

    page, short = " ".join(stdlib_texts(20)), "The csv module reads and writes CSV files."
    rows = [{"query": " ".join(["json"] * 80), "positive": page, "negatives": [], "source": "stdlib"},
            {"query": "csv files", "positive": short, "negatives": [], "source": "stdlib"}]
    cut = cut_rows_to_recipe(rows, tokenizer, RECIPE)
    counts = [len(tokenizer(row["positive"], add_special_tokens=False)["input_ids"]) for row in cut]
    assert counts[0] == content_budget(RECIPE["passage_max_length"], min(RECIPE["granularities"]))
    assert cut[1] == rows[1] and cut[0]["source"] == "stdlib"
    assert page.startswith(cut[0]["positive"])
    assert len(tokenizer(cut[0]["query"], add_special_tokens=False)["input_ids"]) == content_budget(RECIPE["query_max_length"], 32)
    lmk = AutoModel.from_pretrained(convert_to_lmk(str(minilm_path), tmp_path / "lmk", granularity=32, long_input="windows"),
                                    trust_remote_code=True)
    for g in RECIPE["granularities"]:
        windows = lmk.prepare_features([cut[0]["positive"]], max_length=LONG_PAGES["passage_max_length"], training=True,
                                       granularity=g, long_input="windows", window_length=LONG_PAGES["passage_window_length"])
        assert len(windows.get("window_document", [0])) == 1, g  # one window: read as one pass


def test_long_page_fields_are_train_config_fields():
    from lmk_embed_tools.training import TrainConfig
    from lmk_embed_tools.training.recipe import training_fields

    fields = {**training_fields(RECIPE), **long_page_fields(LONG_PAGES, "teacher")}  # as the demo's LMK run
    config = TrainConfig(model="m", output_dir="o", train_data="t.jsonl", **fields)
    assert config.passage_long_input == "windows" and config.window_teacher == "teacher"
    assert config.passage_max_length == LONG_PAGES["passage_max_length"] and config.learning_rate == RECIPE["learning_rate"]
