"""benchmarks/recurrent_batched.py: its length sampler, batch plan and the three methods' agreement."""

import importlib.util
import sys

import numpy as np
import pytest
import torch

from lmk_embed.configuration_recurrent import RecurrentEmbedConfig
from lmk_embed.modeling_recurrent import RecurrentEmbedModel
from lmk_embed.tokenization_recurrent import RecurrentEmbedTokenizer
from tests.helpers import REPO_ROOT, SAMPLE_TEXT, tiny_mamba2_config


@pytest.fixture(scope="module")
def bench():
    path = REPO_ROOT / "benchmarks" / "recurrent_batched.py"
    spec = importlib.util.spec_from_file_location("recurrent_batched", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("recurrent_batched", module)
    spec.loader.exec_module(module)
    return module


def test_lengths_are_seeded_long_tailed_and_clipped(bench):
    lengths = bench.sample_lengths(2000, seed=3, median=500, p99=30000, low=16, high=65536)
    assert lengths == bench.sample_lengths(2000, seed=3, median=500, p99=30000, low=16, high=65536)
    assert min(lengths) >= 16 and max(lengths) <= 65536
    assert 400 < bench.percentile(lengths, 50) < 600
    assert 15000 < bench.percentile(lengths, 99) < 60000


def test_batches_respect_the_token_budget(bench):
    lengths = [5, 300, 40, 9000, 120, 120, 7]
    batches = bench.plan_batches(lengths, token_budget=512)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert batches[0] == [3]  # longer than the budget: alone
    for batch in batches:
        assert [lengths[i] for i in batch] == sorted((lengths[i] for i in batch), reverse=True)
        assert len(batch) == 1 or len(batch) * lengths[batch[0]] <= 512


def test_texts_hit_their_token_lengths(bench, minilm_path):
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(minilm_path, eos_token="[SEP]")
    words = SAMPLE_TEXT.split() * 40
    targets = [16, 50, 300, 1200]
    texts = bench.make_texts(targets, tokenizer, seed=0, words=words)
    realised = tokenizer.build_batch(texts).lengths.tolist()
    for target, got in zip(targets, realised):
        assert min(0.9 * target, target - 9) <= got <= target


def test_the_three_methods_agree(bench, minilm_path):
    torch.manual_seed(0)
    tokenizer = RecurrentEmbedTokenizer.from_pretrained(minilm_path, eos_token="[SEP]")
    backbone = tiny_mamba2_config(vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=101, eos_token_id=102)
    model = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), block_size=16)).eval()
    model.tokenizer = tokenizer
    words = SAMPLE_TEXT.split()
    texts = [" ".join(words[: n]) for n in (3, 40, 12, 25, 7)]
    lengths = tokenizer.build_batch(texts).lengths.tolist()
    batches = bench.plan_batches(lengths, token_budget=64)
    vectors = {method: bench.embed(method, model, texts, batches, None) for method in bench.METHODS}
    assert vectors["encode"].shape == (len(texts), 64)
    for method in ("transformers", "horizontal"):
        assert np.abs(vectors[method] - vectors["encode"]).max() < 1e-4
