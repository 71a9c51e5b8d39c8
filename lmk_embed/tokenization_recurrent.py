"""Tokenizer of the recurrent embedders: `[BOS] tokens EOS`, right-padded; the EOS state is pooled.

Literal special tokens in a text are plain text, except that a text already ending in the EOS
string gets no second EOS: that trailing EOS is the one the model pools. Long documents can be
tokenized incrementally (`stream_content_ids`) without ever holding their full token-id list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from transformers import BatchEncoding, PreTrainedTokenizerFast

from .configuration_recurrent import OPTION, check_recurrent_max_length
from .encoding import (
    ModelInputs,
    check_tokenizer_call,
    encode_content,
    last_safe_cut,
    to_batch_encoding,
    warn_truncated,
)

# Tokenize a stream once this many characters are pending, then keep only an unstable tail.
STREAM_MIN_CHARS = 16_384
# Texts longer than this are tokenized piece by piece too: a Rust Encoding costs hundreds of
# bytes per token, the int64 ids we keep cost 8.
LONG_TEXT_CHARS = 65_536


@dataclass
class RecurrentBatch:
    """input_ids, attention_mask: int64 [B, T]; lengths: int64 [B] (EOS at lengths - 1); truncated: bool [B];
    max_length: the token budget it was built with (None: unbounded)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    lengths: np.ndarray
    truncated: np.ndarray
    max_length: int | None = None

    def tensors(self, device=None) -> ModelInputs:
        """The model inputs: int64 [B, T] tensors (a dict that also carries `truncated`)."""
        tensors = {
            "input_ids": torch.from_numpy(self.input_ids).to(device),
            "attention_mask": torch.from_numpy(self.attention_mask).to(device),
        }
        return ModelInputs(tensors, self.truncated, self.max_length)


class RecurrentEmbedTokenizer(PreTrainedTokenizerFast):
    """A fast tokenizer whose call appends EOS (and optionally prepends BOS).

    No `__init__` (transformers 5.23 mis-loads remote-code subclasses that define one); the option
    `rec_add_bos` is read from tokenizer_config.json through `init_kwargs`. (No option name ends
    in `_token`: transformers registers string-valued ones as special tokens.)
    """

    @property
    def add_bos(self) -> bool:
        value = self.init_kwargs.get("rec_add_bos")  # else the option's default (`RECURRENT_OPTIONS`)
        return bool(OPTION["add_bos_token"].default if value is None else value)

    @property
    def eos_id(self) -> int:
        if self.eos_token_id is None:
            raise ValueError("The tokenizer has no EOS token, which recurrent embedders pool; set `eos_token`.")
        return int(self.eos_token_id)

    @property
    def prefix_ids(self) -> list[int]:
        if not self.add_bos:
            return []
        if self.bos_token_id is None:
            raise ValueError("`rec_add_bos` is set but the tokenizer has no BOS token.")
        return [int(self.bos_token_id)]

    def check_max_length(self, max_length, limit: int | None = None, name: str = "max_length") -> int | None:
        """`check_recurrent_max_length` with this tokenizer's BOS."""
        return check_recurrent_max_length(max_length, self.add_bos, limit, name)

    def strip_trailing_eos(self, text: str) -> str:
        """A text that already ends in the EOS string gets no second EOS."""
        eos = self.eos_token
        return text[: -len(eos)] if eos and text.endswith(eos) else text

    def __call__(
        self,
        text,
        *,
        prompt: str | None = None,
        max_length: int | None = None,
        truncation: bool = True,
        padding: bool | str = True,
        return_tensors: str | None = None,
        **kwargs,
    ) -> BatchEncoding:
        """Tokenize `text` (a string or a list of strings) into `[BOS] tokens EOS`, right-padded."""
        single, texts = check_tokenizer_call(
            "RecurrentEmbedTokenizer", text, kwargs, padding, return_tensors, "EOS is what the model pools"
        )
        self.check_max_length(max_length if truncation else None)
        batch = self.build_batch(texts, prompt=prompt, max_length=max_length if truncation else None)
        warn_truncated(int(batch.truncated.sum()), len(texts), max_length, stacklevel=2, detail=" (EOS kept)")
        return to_batch_encoding({"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}, single, return_tensors)

    def build_batch(self, texts: list[str], *, prompt: str | None = None, max_length: int | None = None) -> RecurrentBatch:
        """`[BOS] (prompt + text) EOS` for each text, right-padded; see `RecurrentBatch`. `max_length`
        is already checked (`check_max_length`, by the caller that resolved it)."""
        prefix, eos = self.prefix_ids, self.eos_id
        full = [(prompt or "") + t for t in texts]
        budget = None if max_length is None else max_length - len(prefix) - 1
        ids = [None] * len(full)
        short = [i for i, text in enumerate(full) if len(text) <= LONG_TEXT_CHARS]
        encodings = encode_content(self, [self.strip_trailing_eos(full[i]) for i in short], max_tokens=budget)
        for i, encoding in zip(short, encodings):
            ids[i] = encoding.ids
        for i, text in enumerate(full):
            if ids[i] is None:
                ids[i] = self._long_text_ids(text, budget)
        content = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(full))
        kept = content if budget is None else np.minimum(content, budget)
        lengths = kept + len(prefix) + 1
        width = int(lengths.max()) if len(lengths) else 0
        pad = self.pad_token_id if self.pad_token_id is not None else eos
        input_ids = np.full((len(full), width), pad, dtype=np.int64)
        rows = np.repeat(np.arange(len(full)), kept)
        columns = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept) + len(prefix)
        input_ids[rows, columns] = np.fromiter(
            chain.from_iterable(row[:k] for row, k in zip(ids, kept.tolist())), dtype=np.int64, count=len(rows)
        )
        if prefix:
            input_ids[:, 0] = prefix[0]
        input_ids[np.arange(len(full)), lengths - 1] = eos
        attention_mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        return RecurrentBatch(input_ids, attention_mask, lengths, kept < content, max_length)

    def _long_text_ids(self, text: str, budget: int | None) -> np.ndarray:
        """Content ids of a long text, tokenized piece by piece (stops once over `budget`)."""
        pieces = (text[start : start + LONG_TEXT_CHARS] for start in range(0, len(text), LONG_TEXT_CHARS))
        parts, count = [], 0
        for part in self.stream_content_ids(pieces):
            parts.append(part)
            count += len(part)
            if budget is not None and count > budget:
                break
        return np.concatenate(parts)

    def stream_content_ids(self, pieces: Iterable[str], prompt: str | None = None) -> Iterator[np.ndarray]:
        """Content token ids of `prompt + "".join(pieces)`, yielded in order as they become final.

        Equal to tokenizing the concatenated text (trailing EOS string stripped), while holding
        only the pending text: tokens are committed up to the last safe cut (see `last_safe_cut`).
        """
        buffer = prompt or ""
        for index, piece in enumerate(pieces):
            if not isinstance(piece, str):
                raise TypeError(f"streamed pieces must be strings; piece {index} is {type(piece).__name__}.")
            buffer += piece
            if len(buffer) < STREAM_MIN_CHARS:
                continue
            cut = last_safe_cut(buffer)
            if cut == 0:
                continue  # no safe cut yet (e.g. one very long word): keep reading
            encoding = encode_content(self, [buffer[:cut]])[0]
            yield np.asarray(encoding.ids, dtype=np.int64)
            buffer = buffer[cut:]
        yield np.asarray(encode_content(self, [self.strip_trailing_eos(buffer)])[0].ids, dtype=np.int64)


def iter_text_file(path, chunk_chars: int = 1 << 16) -> Iterator[str]:
    """A UTF-8 text file as pieces of `chunk_chars` characters (never the whole file at once)."""
    with open(path, encoding="utf-8") as handle:
        while piece := handle.read(chunk_chars):
            yield piece


__all__ = ["RecurrentEmbedTokenizer", "RecurrentBatch", "iter_text_file"]
