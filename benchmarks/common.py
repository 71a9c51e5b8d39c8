"""Shared helpers for the benchmarks: offline texts, interleaved best-of-N timing and a random Mamba2."""

from __future__ import annotations

import json
import os
import resource
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def stdlib_words() -> list[str]:
    from lmk_embed_tools.training.stdlib_corpus import module_pages

    return [word for page in module_pages() for word in page.text.split()]


def sample_texts(count: int, min_words: int, max_words: int, seed: int = 0) -> list[str]:
    """`count` windows of stdlib documentation, each min_words..max_words words long."""
    words = stdlib_words()
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        length = rng.randint(min_words, max_words)
        start = rng.randrange(0, len(words) - length)
        texts.append(" ".join(words[start : start + length]))
    return texts


def random_mamba2(hidden_size: int, num_hidden_layers: int, state_size: int, vocab_size: int, head_dim: int = 64,
                  num_heads: int | None = None, *, bos_token_id: int = 101, eos_token_id: int = 102, seed: int = 0,
                  causal_lm: bool = False, **embed_config):
    """A Mamba2 with random weights (torch seeded with `seed`), in eval mode: our `RecurrentEmbedModel`
    (`embed_config`: RecurrentEmbedConfig options, e.g. block_size), or with `causal_lm` transformers'
    `Mamba2ForCausalLM`. Expand 2, one group, SSD chunk 256, pad id 0; num_heads defaults to
    2 * hidden_size / head_dim; the default BOS/EOS ids are MiniLM's [CLS]/[SEP]."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from lmk_embed.configuration_recurrent import RecurrentEmbedConfig
    from lmk_embed.modeling_recurrent import RecurrentEmbedModel

    backbone = Mamba2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, state_size=state_size,
        head_dim=head_dim, num_heads=num_heads or 2 * hidden_size // head_dim, expand=2, n_groups=1, chunk_size=256,
        pad_token_id=0, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
    )
    torch.manual_seed(seed)
    if causal_lm:
        return Mamba2ForCausalLM(backbone).eval()
    return RecurrentEmbedModel(RecurrentEmbedConfig(backbone_config=backbone.to_dict(), **embed_config)).eval()


def best_of(runs: int, **candidates) -> dict[str, float]:
    """Best wall time of each candidate (a zero-argument callable), runs interleaved to share the noise."""
    best = {name: float("inf") for name in candidates}
    for _ in range(runs):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def save_results(name: str, results: dict) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def reset_peak_rss() -> None:
    """Linux: make VmHWM (the peak RSS) start again from the current RSS."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def peak_rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def save_figure(fig, path: Path) -> None:
    """Lay out, write (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
