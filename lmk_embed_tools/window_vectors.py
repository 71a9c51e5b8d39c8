"""The base's window vectors: a page cut into windows of tokens, each window embedded alone, and the
windows' unit vectors combined. They are both the baseline a user builds with any embedding model
(evaluation's `WindowsRetriever`) and the teacher's targets for a student (training's
`teacher_page_vectors`), so both import them from here.
"""

from __future__ import annotations

import numbers
from typing import Callable

import numpy as np

from lmk_embed.encoding import encode_content


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows of `vectors` [..., D] scaled to unit length (zero rows stay zero)."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def window_texts(tokenizer, text: str, content: int, max_length: int | None) -> list[str]:
    """`text`'s first `max_length` content tokens cut into windows of `content` tokens, each as the
    characters its tokens cover (a window starts and ends on a token)."""
    encoding = encode_content(tokenizer, [text])[0]
    offsets = encoding.offsets[:max_length] if max_length is not None else encoding.offsets
    pieces = [text[offsets[i][0]:offsets[min(i + content, len(offsets)) - 1][1]]
              for i in range(0, len(offsets), content)]
    return pieces or [text]


def embed_windows(encode: Callable[[list[str]], np.ndarray], tokenizer, texts: list[str], content: int,
                   max_length: int | None) -> list[np.ndarray]:
    """Per text, the unit vectors of its windows [n_i, D]: each text cut by `window_texts`, and every
    window of every text embedded by one call of `encode` (list of N texts -> [N, D])."""
    pieces = [window_texts(tokenizer, text, content, max_length) for text in texts]
    vectors = normalize(np.asarray(encode([piece for windows in pieces for piece in windows]), dtype=np.float32))
    bounds = np.cumsum([0] + [len(windows) for windows in pieces])
    return [vectors[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def check_first_window_weight(first_window_weight) -> float:
    """`first_window_weight` as a float, or a ValueError naming it: a number in [0, 1]."""
    if isinstance(first_window_weight, bool) or not isinstance(first_window_weight, numbers.Real) \
            or not 0.0 <= first_window_weight <= 1.0:
        raise ValueError(f"`first_window_weight` must be a number in [0, 1], got {first_window_weight!r}.")
    return float(first_window_weight)


def first_weighted_means(windows: list[np.ndarray], first_window_weight: float) -> np.ndarray:
    """Per document its unit window vectors e_1..e_n [n_i, D] -> [N, D] unit vectors
    normalise(b e_1 + (1 - b) m), m the normalised mean of e_1..e_n and b = `first_window_weight`
    (already checked): b = 0 is the windows-mean, b = 1 the first window alone."""
    if any(len(v) == 0 for v in windows):
        raise ValueError("every document needs at least one window vector")
    means = normalize(np.stack([v.mean(0) for v in windows]))
    if first_window_weight == 0:
        return means
    return normalize(first_window_weight * np.stack([v[0] for v in windows]) + (1 - first_window_weight) * means)


__all__ = ["check_first_window_weight", "embed_windows", "first_weighted_means", "normalize", "window_texts"]
