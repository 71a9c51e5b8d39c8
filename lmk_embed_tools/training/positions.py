"""Training the extended position rows with short inputs: skipped position ids (PoSE, Zhu et al. 2023).

A passage of L tokens trained at its own positions 0..L-1 never reaches the extended rows of an
LMK checkpoint (`config.position_extension`): rows of at most Lo tokens read the original table.
Skipping gives each training row a virtual length V, drawn uniformly from Lo+1..N, and virtual
positions that keep its tokens in order but jump once: the row is cut at a random point c, the
first part keeps 0..c-1 and the second is moved on by a random skip, so its last token lands at
most at V-1. The virtual positions then go through the checkpoint's own rule for a V-token input
(`extended_position_ids`), so training reads exactly the rows inference reads at length V.
The training collator draws them for passages only (queries are short at inference too), once
per batch, so GradCache's two passes read the same ids.

`finetune="positions"` trains those rows only, through peft's TrainableTokens on the position
table: inputs of at most Lo tokens stay the untouched checkpoint, exactly.
"""

from __future__ import annotations

import torch


def extension_of(embedder) -> dict:
    """The checkpoint's absolute-table extension; a ValueError when it has none to train."""
    extension = getattr(embedder.config, "position_extension", None)
    if extension is None or "first_row" not in extension:
        raise ValueError(
            "`position_skipping` and `finetune='positions'` need an LMK checkpoint with an extended absolute "
            "position table: make one with `lmk-embed convert-lmk ... --max-positions N`."
        )
    return extension


def skipped_positions(attention_mask: torch.Tensor, extension: dict,
                      generator: torch.Generator | None = None, share: float = 1.0) -> torch.Tensor:
    """Position ids [B, T] for right-padded rows (`attention_mask` [B, T]) of at most N tokens.

    Each row gets a virtual length V ~ U{max(L, Lo + 1) .. N}, a cut c ~ U{1 .. L - 1} and a skip
    k ~ U{0 .. V - L}: tokens before c keep positions 0..c-1, the rest move on by k. Padding columns
    continue the row's last position (they are masked out). Draws use `generator` (default: torch's).
    With `share` < 1, each row is skipped with that probability; the others keep 0..L-1 at their own
    length (so a row of at most Lo tokens reads the original rows, as at inference).
    """
    from lmk_embed.modeling_lmk import extended_position_ids

    original, maximum = extension["original_positions"], extension["max_positions"]
    batch, width = attention_mask.shape
    lengths = attention_mask.sum(-1).long()
    if int(lengths.max()) > maximum:
        raise ValueError(f"A training row has {int(lengths.max())} tokens, past the table's {maximum} positions.")
    uniform = torch.rand(batch, 3, generator=generator)
    low = lengths.clamp(min=original + 1)
    virtual = low + (uniform[:, 0] * (maximum - low + 1)).long().clamp(max=maximum - low)
    cut = 1 + (uniform[:, 1] * (lengths - 1).clamp(min=1)).long()
    skip = (uniform[:, 2] * (virtual - lengths + 1)).long().clamp(max=virtual - lengths)
    columns = torch.arange(width).unsqueeze(0)
    positions = columns + torch.where(columns >= cut.unsqueeze(1), skip.unsqueeze(1), 0)
    positions = positions.clamp(max=(virtual - 1).unsqueeze(1))
    if share < 1:  # a separate draw, so share=1 keeps the stream (and the runs) it always had
        kept = torch.rand(batch, generator=generator) >= share
        positions = torch.where(kept.unsqueeze(1), columns, positions)
        virtual = torch.where(kept, lengths, virtual)
    device = attention_mask.device
    return extended_position_ids(attention_mask, extension, positions.to(device), virtual.unsqueeze(1).to(device))


def extended_row_indices(embedder) -> list[int]:
    """The rows of the position table that inputs past Lo tokens read: first_row .. first_row + N - 1."""
    extension = extension_of(embedder)
    return list(range(extension["first_row"], extension["first_row"] + extension["max_positions"]))
