"""Vectors saved before a refactor, to show it changed no number: both families, each schedule.

`data/saved_vectors.npz` was written by the code before the change (`python -m
tests.lmk_embed.test_saved_vectors` in a checkout of that commit); the test computes the same
vectors with the code of today. float32 kernels differ in the last bits between CPU families, so
the tolerance is 1e-5 rather than 0 (on the CPU that wrote them, the difference is 0).
"""

import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

SAVED = Path(__file__).parent / "data" / "saved_vectors.npz"
WORDS = ("landmark", "token", "window", "state", "scan", "vector", "page", "query", "chunk", "model", "the", "of",
         "reads", "keeps", "every", "long", "short", "document", "embedding", "block")


def texts() -> list[str]:
    """Three fixed texts: short, about 600 tokens and about 2,000 tokens (made from a seeded draw)."""
    draw = random.Random(0)
    return [" ".join(draw.choice(WORDS) for _ in range(words)) + "." for words in (12, 600, 2000)]


def compute(minilm_lmk: Path, mamba2: Path) -> dict[str, np.ndarray]:
    from transformers import xLSTMConfig

    from lmk_embed import LMKModel, RecurrentEmbedModel
    from lmk_embed.configuration_recurrent import RecurrentEmbedConfig

    pages = texts()
    lmk = LMKModel.from_pretrained(minilm_lmk).eval()
    vectors = {
        "lmk_one_pass": lmk.encode(pages, max_length=512),
        "lmk_granularity_64": lmk.encode(pages, max_length=512, granularity=64),
        "lmk_windows": lmk.encode(pages, long_input="windows", window_length=256),
    }
    recurrent = RecurrentEmbedModel.from_pretrained(mamba2).eval()
    vectors["mamba2_vertical"] = recurrent.encode(pages, schedule="vertical", block_size=40)
    vectors["mamba2_horizontal"] = recurrent.encode(pages, schedule="horizontal")
    torch.manual_seed(0)
    backbone = xLSTMConfig(vocab_size=600, hidden_size=32, num_heads=2, num_blocks=2, qk_dim_factor=1.0, chunk_size=8,
                           pad_token_id=0, bos_token_id=0, eos_token_id=0)
    xlstm = RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), block_size=16)).eval()
    ids = torch.randint(1, 600, (2, 50), generator=torch.Generator().manual_seed(0))
    ids[:, -1] = 0  # each row ends with its EOS
    with torch.no_grad():
        vectors["xlstm_vertical"] = xlstm(ids, torch.ones_like(ids), schedule="vertical").embeddings.numpy()
    return vectors


def test_vectors_equal_the_ones_saved_before_the_change(minilm_lmk_checkpoint, mamba2_checkpoint):
    saved = np.load(SAVED)
    found = compute(minilm_lmk_checkpoint, mamba2_checkpoint)
    assert sorted(saved.files) == sorted(found)
    for name in saved.files:
        np.testing.assert_allclose(found[name], saved[name], rtol=0, atol=1e-5, err_msg=name)


if __name__ == "__main__":  # write the saved vectors with the code of this checkout
    from lmk_embed_tools.training.convert import convert_to_lmk, convert_to_recurrent
    from tests import helpers

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        minilm_lmk = convert_to_lmk(helpers.minilm_path(), scratch / "minilm-lmk", granularity=32)
        lm = helpers.tiny_mamba2_lm(scratch / "mamba2-lm", helpers.stored_bpe_tokenizer(scratch / "bpe"))
        mamba2 = convert_to_recurrent(lm, scratch / "mamba2-emb", block_size=40, ssd_chunk_size=16)
        found = compute(minilm_lmk, mamba2)
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else SAVED
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez(target, **found)
    print(f"wrote {target}: {', '.join(f'{k} {v.shape}' for k, v in found.items())}")
