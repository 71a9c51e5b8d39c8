"""Training the extended position rows: skipped position ids reach the rows inference reads at the
virtual length, and `finetune='positions'` changes those rows only, so short inputs stay exact."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lmk_embed import LMKModel
from lmk_embed.modeling_lmk import extended_position_ids
from lmk_embed_tools.training import TrainConfig, train
from lmk_embed_tools.training.convert import convert_to_lmk
from lmk_embed_tools.training.positions import skipped_positions
from lmk_embed_tools.training.recipe import write_rows
from tests import helpers

EXTENSION = {"method": "interpolate", "original_positions": 16, "max_positions": 64, "first_row": 16,
             "position_offset": 0}


@pytest.fixture(scope="module")
def extended_bert(tmp_path_factory):
    """A tiny random BERT (512 positions, LMK g=16) extended to 1024 positions."""
    source = helpers.tiny_encoder_source(tmp_path_factory.mktemp("bert-src"), "bert")
    return convert_to_lmk(source, tmp_path_factory.mktemp("bert-ext"), granularity=16, max_positions=1024)


@pytest.fixture
def rows_jsonl(tmp_path):
    texts = helpers.stdlib_texts(24)
    rows = [{"query": text.split(".")[0][:80], "positive": text} for text in texts]
    return write_rows(rows, tmp_path / "rows.jsonl")


def config_for(checkpoint, data, tmp_path, **overrides):
    settings = dict(model=str(checkpoint), output_dir=str(tmp_path / "run"), train_data=str(data), eval_data=None,
                    per_device_train_batch_size=4, max_steps=3, save_steps=1000, logging_steps=1, learning_rate=1e-2,
                    query_max_length=16, passage_max_length=128)
    settings.update(overrides)
    return TrainConfig(**settings)


@pytest.mark.parametrize("method", ["interpolate", "recurrent"])
def test_skipped_positions_are_the_rule_at_a_virtual_length(method):
    extension = {**EXTENSION, "method": method}
    mask = torch.zeros(200, 12, dtype=torch.long)
    lengths = torch.randint(2, 13, (200,), generator=torch.Generator().manual_seed(0))
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids = skipped_positions(mask, extension, generator=torch.Generator().manual_seed(1))
    first, top = extension["first_row"], extension["first_row"] + extension["max_positions"] - 1
    for row, length in enumerate(lengths.tolist()):
        real = ids[row, :length]
        assert int(real.min()) >= first and int(real.max()) <= top  # every row reads the extended rows
        assert bool((real[1:] >= real[:-1]).all())  # in order
    # A row with its virtual positions and length read exactly what the inference rule gives
    # a row of that length at those positions.
    virtual = torch.arange(40).unsqueeze(0)
    full = extended_position_ids(torch.ones(1, 40, dtype=torch.long), extension)
    assert torch.equal(extended_position_ids(torch.ones(1, 40), extension, virtual, torch.tensor([[40]])), full)
    # Skips vary: many distinct gaps, so the rows far apart get trained together.
    gaps = (ids[:, 1:] - ids[:, :-1])[mask[:, 1:].bool()]
    assert len(set(gaps.tolist())) > 10


def test_a_share_of_rows_keeps_its_own_positions():
    mask = torch.ones(400, 12, dtype=torch.long)
    plain = torch.arange(12).expand(400, 12)
    everyone = skipped_positions(mask, EXTENSION, generator=torch.Generator().manual_seed(1))
    half = skipped_positions(mask, EXTENSION, generator=torch.Generator().manual_seed(1), share=0.5)
    kept = (half == plain).all(-1)  # the original rows, exactly as inference reads a 12-token input
    assert 150 < int(kept.sum()) < 250
    assert torch.equal(half[~kept], everyone[~kept])  # the others are skipped as with share=1, same draws
    assert int(everyone.min()) >= EXTENSION["first_row"]
    with pytest.raises(ValueError, match="position_skipping_share"):
        TrainConfig(model="m", output_dir="o", position_skipping=True, position_skipping_share=1.5)
    with pytest.raises(ValueError, match="position_skipping_share"):
        TrainConfig(model="m", output_dir="o", position_skipping_share=0.5)


def test_finetune_positions_changes_only_the_extended_rows(extended_bert, rows_jsonl, tmp_path):
    result = train(config_for(extended_bert, rows_jsonl, tmp_path, finetune="positions", position_skipping=True))
    before = load_file(extended_bert / "model.safetensors")
    after = load_file(result["final_dir"] / "model.safetensors")
    assert before.keys() == after.keys()
    table = next(name for name in before if name.endswith("position_embeddings.weight"))
    first = LMKModel.from_pretrained(extended_bert).config.position_extension["first_row"]
    assert torch.equal(before[table][:first], after[table][:first])
    assert (before[table][first:] - after[table][first:]).abs().max() > 1e-4  # the extended rows were trained
    assert all(torch.equal(before[name], after[name]) for name in before if name != table)
    # Short inputs are the untouched checkpoint; long ones read the trained rows.
    untouched, trained = LMKModel.from_pretrained(extended_bert).eval(), LMKModel.from_pretrained(result["final_dir"]).eval()
    short, long = helpers.SAMPLE_TEXT, " ".join(" ".join(helpers.stdlib_texts(30)).split()[:250])  # about 760 tokens: 512 < T <= 1024
    assert np.abs(trained.encode(short) - untouched.encode(short)).max() <= 1e-6
    assert np.abs(trained.encode(long, max_length=1024) - untouched.encode(long, max_length=1024)).max() > 1e-4


def test_the_collator_skips_passages_only(extended_bert):
    from sentence_transformers import SentenceTransformer

    from lmk_embed_tools.training.finetune import EmbeddingDataCollator

    st = SentenceTransformer(str(extended_bert), trust_remote_code=True)
    embedder = st.transformers_model
    first = embedder.config.position_extension["first_row"]
    collate = EmbeddingDataCollator(preprocess_fn=st.preprocess, embedder=embedder, query_max_length=16,
                                    passage_max_length=128, position_skipping=True)
    batch = collate([{"query": "zip archives", "positive": helpers.SAMPLE_TEXT},
                     {"query": "json parsing", "positive": "A module for json."}])
    assert "query_position_ids" not in batch  # queries keep their own positions, as at inference
    ids, mask = batch["positive_position_ids"], batch["positive_attention_mask"]
    assert ids.shape == mask.shape and int(ids[mask.bool()].min()) >= first
    unskipped = EmbeddingDataCollator(preprocess_fn=st.preprocess, embedder=embedder, query_max_length=16,
                                      passage_max_length=128)
    assert "positive_position_ids" not in unskipped([{"query": "q", "positive": "p"}])


def test_refusals_name_the_argument(extended_bert, lmk_checkpoint, rows_jsonl, tmp_path):
    with pytest.raises(ValueError, match="position_skipping"):
        train(config_for(extended_bert, rows_jsonl, tmp_path, finetune="positions"))
    with pytest.raises(ValueError, match="--max-positions"):
        train(config_for(lmk_checkpoint, rows_jsonl, tmp_path, position_skipping=True))
    with pytest.raises(ValueError, match="finetune"):
        TrainConfig(model="m", output_dir=str(tmp_path), finetune="rows")
