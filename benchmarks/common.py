"""Shared helpers for the benchmarks: offline texts and interleaved best-of-N timing."""

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
