"""The LMK paper's analyses on any LMK checkpoint: attention by position and landmark locality.

- `attention_by_position`: how much final-layer attention the pooled tokens (the landmarks, or
  CLS) give to each part of a long input (Figure 2 analog), with eager attention so that the
  weights are the softmax itself.
- `landmark_locality`: is a contextualised landmark nearest to the chunk it closes (left), to the
  next chunk (right), or to either, among the independently encoded chunks (Figure 4 analog)?
The length curve and the granularity trade-off are `lmk-embed evaluate` runs (see longcontext.py).
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np
import torch

from lmk_embed_tools.compat import attention_implementation

# The analyses read texts at the base's pretraining length (MiniLM's, the paper's BERT-size encoders').
ANALYSIS_MAX_LENGTH = 512


def binned_attention(attention: torch.Tensor, attention_mask: torch.Tensor, pooled_mask: torch.Tensor,
                     bins: int = 20) -> list[np.ndarray]:
    """Final-layer attention [B, H, T, T] -> per text, [P_b, bins]: the mass each pooled token gives
    to each tenth (or `bins`-th) of the text's real tokens, averaged over heads.

    Padding gets no attention (the mask), so each pooled token's row sums to 1."""
    out = []
    for b in range(attention.shape[0]):
        length = int(attention_mask[b].sum())
        pooled = torch.nonzero(pooled_mask[b], as_tuple=True)[0]
        rows = attention[b, :, pooled, :length].float().mean(0)  # [P, length]
        which_bin = torch.div(torch.arange(length) * bins, length, rounding_mode="floor")
        mass = torch.zeros(len(pooled), bins).index_add_(1, which_bin, rows)
        out.append(mass.numpy())
    return out


def attention_by_position(model, texts: Sequence[str], max_length: int = ANALYSIS_MAX_LENGTH, bins: int = 20, pooling: str | None = None,
                          granularity: int | None = None, batch_size: int = 2) -> dict:
    """The mean attention mass [bins] that an LMK checkpoint's pooled tokens give to each position bin.

    `pooling` overrides the layout's pooled tokens ("lmk": the landmarks, "cls": the first token).
    Returns {"pooling", "max_length", "bins", "mass": [bins], "row_sums": [n pooled tokens]}."""
    backbone = model.backbone
    previous = attention_implementation(backbone)
    backbone.set_attn_implementation("eager")  # sdpa returns no weights; eager's are the real softmax
    pooling = pooling or model.config.pooling
    masses = []
    try:
        for start in range(0, len(texts), batch_size):
            with warnings.catch_warnings():  # long inputs cut at max_length are what this analysis reads
                warnings.filterwarnings("ignore", message=".*truncated.*")
                batch = model.tokenizer(list(texts[start:start + batch_size]), pooling=pooling, granularity=granularity,
                                        max_length=max_length, return_tensors="pt")
            with torch.inference_mode():
                output = backbone(input_ids=batch["input_ids"].to(model.device),
                                  attention_mask=batch["attention_mask"].to(model.device), output_attentions=True)
            masses += binned_attention(output.attentions[-1].cpu(), batch["attention_mask"], batch["landmark_mask"], bins)
    finally:
        backbone.set_attn_implementation(previous)
    rows = np.concatenate(masses)  # every pooled token of every text, [sum P, bins]
    per_text = np.stack([m.mean(0) for m in masses])  # each text counts once, however many landmarks it has
    return {"pooling": pooling, "max_length": max_length, "bins": bins, "mass": per_text.mean(0).tolist(),
            "row_sums": rows.sum(1).tolist()}


def locality_hits(landmarks: np.ndarray, chunks: np.ndarray, k_values: Sequence[int] = (1, 3, 5)) -> dict[str, dict[int, list[bool]]]:
    """landmarks [n, D] (landmark i closes chunk i), chunks [n, D] (each chunk encoded alone).

    For each landmark i, is chunk i (left), chunk i+1 (right, for i < n-1) or either among its k
    nearest chunks by cosine? Returns {"left" | "right" | "either": {k: [hit per landmark]}}."""
    def unit(x):
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    order = np.argsort(-(unit(landmarks) @ unit(chunks).T), axis=1, kind="stable")
    n = len(landmarks)
    hits: dict[str, dict[int, list[bool]]] = {"left": {}, "right": {}, "either": {}}
    for k in k_values:
        top = [set(order[i, :k].tolist()) for i in range(n)]
        hits["left"][k] = [i in top[i] for i in range(n)]
        hits["right"][k] = [i + 1 in top[i] for i in range(n - 1)]
        hits["either"][k] = [i in top[i] or i + 1 in top[i] for i in range(n)]
    return hits


def landmark_locality(model, texts: Sequence[str], k_values: Sequence[int] = (1, 3, 5), max_length: int = ANALYSIS_MAX_LENGTH,
                      granularity: int | None = None, batch_size: int = 8) -> dict:
    """Hits@k (left, right, either) over every landmark of `texts` that has a neighbour chunk.

    Landmark vectors come from one pass over each text (`output_value="landmarks"`); each chunk's
    own text (its character span) is then encoded alone as a document."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*truncated.*")
        out = model.encode_document(list(texts), output_value="landmarks", max_length=max_length, granularity=granularity,
                                    batch_size=batch_size, show_progress_bar=False)
    totals: dict[str, dict[int, list[bool]]] = {"left": {}, "right": {}, "either": {}}
    for text, item in zip(texts, out):
        spans = item["spans"]
        if len(spans) < 2:
            continue  # one chunk: nothing to tell left from right
        chunks = model.encode_document([text[a:b] for a, b in spans], granularity=granularity, max_length=max_length,
                                       batch_size=batch_size, show_progress_bar=False)
        for side, by_k in locality_hits(np.asarray(item["embeddings"]), np.asarray(chunks), k_values).items():
            for k, flags in by_k.items():
                totals[side].setdefault(k, []).extend(flags)
    return {"k_values": list(k_values), "landmarks": len(totals["left"].get(k_values[0], [])),
            "hits": {side: {str(k): float(np.mean(flags)) if flags else float("nan") for k, flags in by_k.items()}
                     for side, by_k in totals.items()}}


# ---- figures ------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_attention(results: dict[str, dict], path) -> None:
    """One line per (model, pooled tokens): attention mass against relative position."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 4))
    for label, result in results.items():
        bins = result["bins"]
        axis.plot((np.arange(bins) + 0.5) / bins, result["mass"], marker="o", markersize=3, label=label)
    axis.set_xlabel("relative position in the input")
    axis.set_ylabel("final-layer attention mass of pooled tokens")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_locality(results: dict[str, dict], path) -> None:
    """Grouped bars: Hits@k of left, right and either, per model and k."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    labels = [(name, k) for name, result in results.items() for k in result["k_values"]]
    x = np.arange(len(labels))
    for offset, side in zip((-0.27, 0.0, 0.27), ("left", "right", "either")):
        axis.bar(x + offset, [results[name]["hits"][side][str(k)] for name, k in labels], width=0.27, label=side)
    axis.set_xticks(x, [f"{name}\nHits@{k}" for name, k in labels], fontsize=7)
    axis.set_ylabel("fraction of landmarks")
    axis.set_ylim(0, 1)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
