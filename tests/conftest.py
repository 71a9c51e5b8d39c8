"""Shared fixtures: offline, CPU, tiny models. Every Hugging Face cache points into a temp dir."""

import os
import tempfile

_CACHE_ROOT = tempfile.mkdtemp(prefix="lmk-embed-tests-")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_CACHE"] = os.path.join(_CACHE_ROOT, "hub")
os.environ["HF_MODULES_CACHE"] = os.path.join(_CACHE_ROOT, "modules")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests import helpers  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def minilm_path():
    return helpers.minilm_path()


@pytest.fixture(scope="session")
def modernbert_source(tmp_path_factory):
    """A tiny random ModernBERT saved with MiniLM's WordPiece tokenizer."""
    return helpers.tiny_encoder_source(tmp_path_factory.mktemp("modernbert-src"), "modernbert")


@pytest.fixture(scope="session")
def lmk_checkpoint(tmp_path_factory, modernbert_source):
    """A tiny ModernBERT LMK checkpoint (g=8), written by the converter."""
    from lmk_embed_tools.training.convert import convert_to_lmk

    return convert_to_lmk(modernbert_source, tmp_path_factory.mktemp("lmk-tiny"), granularity=8)


@pytest.fixture(scope="session")
def lmk_model(lmk_checkpoint):
    from lmk_embed import LMKModel

    return LMKModel.from_pretrained(lmk_checkpoint).eval()


@pytest.fixture(scope="session")
def minilm_lmk_checkpoint(tmp_path_factory, minilm_path):
    """The real all-MiniLM-L6-v2 converted to LMK (g=32)."""
    from lmk_embed_tools.training.convert import convert_to_lmk

    return convert_to_lmk(minilm_path, tmp_path_factory.mktemp("lmk-minilm"), granularity=32)


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE trained on stdlib docs: EOS `<|endoftext|>`, no SEP, no CLS."""
    return helpers.stored_bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="session")
def mamba2_lm(tmp_path_factory, bpe_tokenizer_dir):
    """A tiny random Mamba2 causal LM with the BPE tokenizer (EOS <|endoftext|>)."""
    return helpers.tiny_mamba2_lm(tmp_path_factory.mktemp("mamba2-lm"), bpe_tokenizer_dir)


@pytest.fixture(scope="session")
def mamba2_checkpoint(tmp_path_factory, mamba2_lm):
    """That LM converted into an embedder: V=40 (not a multiple of Q=16), scan chunk 16."""
    from lmk_embed_tools.training.convert import convert_to_recurrent

    return convert_to_recurrent(mamba2_lm, tmp_path_factory.mktemp("mamba2-emb"), block_size=40, ssd_chunk_size=16)
