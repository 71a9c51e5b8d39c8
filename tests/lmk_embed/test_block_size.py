"""block_size="auto": V from the device type, the model width and the batch; explicit V wins."""

import pytest
import torch

from lmk_embed.configuration_recurrent import MAX_AUTO_BLOCK, MIN_AUTO_BLOCK, RecurrentEmbedConfig, auto_block_size
from lmk_embed.modeling_recurrent import RecurrentEmbedModel
from tests.helpers import tiny_mamba2_config


@pytest.mark.parametrize(
    "device, width, batch, expected",
    [
        ("cpu", 256, 1, 512),  # the benchmark model: 512 was the fastest V on 2-core CPUs
        ("cpu", 128, 1, 1024),
        ("cpu", 2048, 1, MIN_AUTO_BLOCK),  # 1.3B-wide: the floor of the clamp
        ("cpu", 16, 1, MAX_AUTO_BLOCK),  # tiny models: the ceiling
        ("cpu", 64, 4, 512),  # a batch shares the budget
        ("cuda", 2048, 1, 4096),  # the paper: 4096 for one sequence
        ("cuda", 2048, 8, 512),  # and 2Q for batches (Q = 256)
        ("cuda", 256, 8, 128),  # 2Q with this backbone's Q = 64
    ],
)
def test_auto_rule(device, width, batch, expected):
    chunk = 64 if width == 256 and batch == 8 else 256
    assert auto_block_size(device, width, batch, chunk) == expected


def test_cpu_rule_fits_the_budget_and_shrinks_with_width_and_batch():
    for width in (64, 128, 256, 768, 1024, 2048, 4096):
        for batch in (1, 2, 8):
            block = auto_block_size("cpu", width, batch, cache_bytes=2**23)
            assert MIN_AUTO_BLOCK <= block <= MAX_AUTO_BLOCK and block & (block - 1) == 0
            working_set = block * 16 * width * 4 * batch  # bytes: 16 float32 values per token per unit of width
            if MIN_AUTO_BLOCK < block < MAX_AUTO_BLOCK:  # the largest power of two within the budget
                assert working_set <= 2**23 < 2 * working_set
            assert auto_block_size("cpu", 2 * width, batch) <= auto_block_size("cpu", width, batch)
            assert auto_block_size("cpu", width, 2 * batch) <= auto_block_size("cpu", width, batch)


def test_auto_is_the_config_default_and_explicit_values_win():
    config = RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict())
    assert config.block_size == "auto"
    with pytest.raises(ValueError, match="`block_size`"):
        RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict(), block_size="big")
    model = RecurrentEmbedModel(config).eval()
    assert model.resolve_block_size(None) == auto_block_size("cpu", 64, 1, 16) == 2048
    assert model.resolve_block_size(None, batch_size=64) == auto_block_size("cpu", 64, 64, 16)
    assert model.resolve_block_size(37) == 37  # a call's explicit V wins over the config's auto
    model.config.block_size = 40
    assert model.resolve_block_size(None) == 40  # and a config's explicit V over the rule
    assert model.resolve_block_size("auto") == 2048  # unless the call asks for auto


def test_auto_block_size_drives_the_vertical_schedule(monkeypatch):
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict())).eval()
    monkeypatch.setattr("lmk_embed.modeling_recurrent.auto_block_size", lambda device, width, batch, chunk: 8)
    shapes = []
    step = model.block_step
    monkeypatch.setattr(model, "block_step", lambda ids, state: shapes.append(tuple(ids.shape)) or step(ids, state))
    with torch.no_grad():
        model(torch.randint(1, 600, (2, 20)))  # auto schedule: T = 20 > V = 8, so vertical
    assert shapes == [(2, 8), (2, 8), (2, 4)]


def test_resolve_returns_the_schedule_resolved_once_and_each_batch_decides_only_auto(monkeypatch):
    """`resolve_schedule` (what `resolve` calls) defaults the schedule and V from the config and checks them; `forward` and streaming
    take that `Schedule` as it is (no second default), and only an "auto" is decided per batch."""
    from lmk_embed.modeling_recurrent import Schedule

    config = RecurrentEmbedConfig(backbone_config=tiny_mamba2_config().to_dict(), schedule="horizontal", block_size=40)
    model = RecurrentEmbedModel(config).eval()
    assert model.resolve_schedule(None, None) == Schedule("horizontal", 40, None)
    assert model.resolve_schedule("auto", "auto") == Schedule("auto", "auto", "auto")
    explicit = model.resolve_schedule("vertical", 8)
    assert explicit.for_batch(model, longest=100, batch_size=4) == ("vertical", 8)
    # auto: Mamba2 off CUDA takes our step (vertical) even when the input fits one block
    assert Schedule("auto", 64).for_batch(model, longest=10, batch_size=1) == ("vertical", 64)
    monkeypatch.setattr("lmk_embed.modeling_recurrent.auto_block_size", lambda device, width, batch, chunk: 4 * batch)
    assert Schedule("horizontal", "auto").for_batch(model, longest=10, batch_size=3) == ("horizontal", 12)
    with pytest.raises(ValueError, match="`block_size` must"):
        model.resolve_schedule(None, 0)
    ids = torch.tensor([[5, 6, 7, 0]])
    with pytest.raises(ValueError, match="`block_size` is part of a resolved `Schedule`"):
        model(ids, schedule=explicit, block_size=8)
    torch.testing.assert_close(model(ids, schedule=explicit).embeddings,
                               model(ids, schedule="vertical", block_size=8).embeddings)
