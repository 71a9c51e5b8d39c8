"""Landmark tokenizer: Algorithm 1 of "LMK > CLS: Landmark Pooling for Dense Embeddings" (arXiv 2601.21525).

    [CLS] z1 [LMK] z2 [LMK] ... zn [LMK]

The text is tokenized once without special tokens (literal "[SEP]" or "</s>" in the text stays
plain text), split into chunks z_i of g content tokens, and a landmark (the SEP token, or EOS
when there is no SEP) closes every chunk. The landmarks count against `max_length`; a truncated
sequence still ends with a landmark. `landmark_mask` marks the positions the pooler averages.

Layouts for the baselines, chosen by `pooling`:

    lmk               [CLS] z1 [LMK] ... zn [LMK]        pool: the landmarks
    cls               [CLS] text [SEP]                   pool: [CLS]
    mean              [CLS] text [SEP]                   pool: every token
    latent_attention  [CLS] text [SEP]                   pool: every token (after the latent layer)
    mean@k            [CLS] text [SEP]                   pool: the last token of every k-chunk (k = g)
    multi_cls         [CLS] z1 [CLS] z2 ... zn [SEP]     pool: every [CLS]

Splitters: `fixed` (chunks of g), `variable` (g drawn per call from a seeded set: for training)
and `sentence` (a landmark after each sentence, long sentences still split at g; sentence ends
are mapped to tokens through the offsets of the single tokenization pass).

Everything after the one call into the Rust tokenizer is vectorised over the flat batch.
"""

from __future__ import annotations

import random
import re
import weakref
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from transformers import BatchEncoding, PreTrainedTokenizerFast

from .configuration_lmk import (CHUNK_ALIGNED_POOLINGS, LMK_OPTIONS, OPTION, POOLINGS, SPLITTERS, LMKConfig,
                                check_lmk_max_length)
from .encoding import (
    check_choice,
    check_tokenizer_call,
    ModelInputs,
    encode_content,
    max_length_default,
    tokenizer_limit,
    to_batch_encoding,
    warn_truncated,
)

# tokenizer_config.json key -> its option's default (`LMK_OPTIONS`: the config's defaults too)
_OPTION_DEFAULTS = {option.tokenizer_key: option.default for option in LMK_OPTIONS if option.tokenizer_key}

# A sentence ends after terminal punctuation (plus closing quotes or brackets) followed by
# whitespace or the end of the text, or at a blank line.
SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?=\s|$)|\n[ \t]*\n")


@dataclass
class LandmarkBatch:
    """A padded (right) batch in landmark layout.

    input_ids, attention_mask, landmark_mask: int64 [B, T]
    truncated: bool [B], True where the text did not fit in max_length
    spans: per text, the (start, end) character span of each chunk: the chunk each pooled position
        closes (landmark vectors: chunk-aligned poolings only), or every chunk (late chunks); only when asked for
    chunk_of: int64 [B, T], the chunk (0..n_i-1 within its text) of each content token, -1 at the
        special tokens and padding (late chunks only, else None)
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    landmark_mask: np.ndarray
    truncated: np.ndarray
    granularity: int
    max_length: int | None
    spans: list[list[tuple[int, int]]] | None = None
    window_document: np.ndarray | None = None  # [rows]: the text each row (a window) belongs to
    chunk_of: np.ndarray | None = None

    def tensors(self, device=None) -> ModelInputs:
        """The model inputs: int64 [rows, T] tensors (a dict that also carries `truncated`), plus
        `window_document` [rows] when texts were cut into windows (`cut_windows`)."""
        tensors = {
            "input_ids": torch.from_numpy(self.input_ids).to(device),
            "attention_mask": torch.from_numpy(self.attention_mask).to(device),
            "landmark_mask": torch.from_numpy(self.landmark_mask).to(device),
        }
        if self.window_document is not None:
            tensors["window_document"] = torch.from_numpy(self.window_document).to(device)
        return ModelInputs(tensors, self.truncated, self.max_length)


def check_window_holds_chunk(window_length: int, granularity: int, has_start: bool, name: str = "window_length") -> int:
    """The one rule that a window W holds one chunk: g content tokens, its landmark and, when the
    tokenizer has one, the start token (W >= g + 1 + has_start); else a ValueError naming `name`.
    `cut_windows` applies it to every text it must cut, the converter to a checkpoint's defaults."""
    smallest = granularity + 1 + int(bool(has_start))
    if window_length < smallest:
        raise ValueError(f"`{name}`={window_length} must hold one chunk of g={granularity} tokens with its landmark"
                         f"{' and the start token' if has_start else ''} (at least {smallest}).")
    return window_length


def cut_windows(batch: LandmarkBatch, window_length: int, has_start: bool, pad_id: int) -> LandmarkBatch:
    """The `windows` long-input schedule: each landmark-layout row longer than `window_length` is cut
    at landmark boundaries into windows of whole chunks, each window opened by the row's start token
    ([CLS] c_1 [LMK] ... c_j [LMK]) and read at the original positions. A row that fits stays one row,
    unchanged; if every row fits, `batch` is returned as is. Landmarks keep their order, so `spans`
    still line up. A batch with a row to cut needs `window_length` to hold a chunk (`check_window_holds_chunk`).

    Returns the batch with rows = windows, [rows, T'], and `window_document` [rows].
    """
    lengths = batch.attention_mask.sum(1)
    if (lengths <= window_length).all():
        return batch
    check_window_holds_chunk(window_length, batch.granularity, has_start)
    start = int(bool(has_start))
    ids_rows, mask_rows, chunk_rows, document = [], [], [], []
    chunk_of = batch.chunk_of if batch.chunk_of is not None else np.full_like(batch.input_ids, -1)
    for text, length in enumerate(lengths.tolist()):
        ids, mask, chunks = batch.input_ids[text, :length], batch.landmark_mask[text, :length], chunk_of[text, :length]
        if length <= window_length:
            ids_rows.append(ids), mask_rows.append(mask), chunk_rows.append(chunks), document.append(text)
            continue
        chunk_ends = np.flatnonzero(mask[start:]) + start + 1  # exclusive end of each chunk, after its landmark
        begin = start
        while begin < length:
            last = np.searchsorted(chunk_ends, begin + window_length - start, side="right") - 1
            if last < 0:  # never: a chunk holds at most g tokens, and a window holds a chunk (checked above)
                raise RuntimeError(f"No whole chunk fits a window of {window_length} tokens at token {begin}.")
            stop = chunk_ends[last]
            ids_rows.append(np.concatenate([ids[:start], ids[begin:stop]]))
            mask_rows.append(np.concatenate([mask[:start] * 0, mask[begin:stop]]))
            chunk_rows.append(np.concatenate([chunks[:start], chunks[begin:stop]]))
            document.append(text)
            begin = stop
    width = max(len(row) for row in ids_rows)
    input_ids = np.full((len(ids_rows), width), pad_id, dtype=np.int64)
    landmark_mask = np.zeros((len(ids_rows), width), dtype=np.int64)
    attention_mask = np.zeros((len(ids_rows), width), dtype=np.int64)
    window_chunk_of = np.full((len(ids_rows), width), -1, dtype=np.int64)
    for row, (ids, mask, chunks) in enumerate(zip(ids_rows, mask_rows, chunk_rows)):
        input_ids[row, : len(ids)], landmark_mask[row, : len(ids)], attention_mask[row, : len(ids)] = ids, mask, 1
        window_chunk_of[row, : len(ids)] = chunks
    return LandmarkBatch(input_ids, attention_mask, landmark_mask, batch.truncated, batch.granularity,
                         batch.max_length, batch.spans, np.asarray(document, dtype=np.int64),
                         window_chunk_of if batch.chunk_of is not None else None)


@dataclass(frozen=True)
class LayoutOptions:
    """One call's resolved layout options (`LMKTokenizer.resolve`, or `LMKModel.resolve` from its config).

    pooling: the layout's pooling (training gives MultiCLS the CLS layout); granularity: g, already
    drawn for `variable`; splitter: "fixed" or "sentence" (how chunks close); max_length: the token
    budget, landmarks included (None: unbounded); landmark: "sep", "eos" or a literal token.
    with_spans: the spans of the pooled positions (landmark vectors); with_chunks: every chunk's span
    and `chunk_of` (late chunks: any pooling, since they pool content tokens, not markers).
    """

    pooling: str
    granularity: int
    splitter: str
    max_length: int | None
    landmark: str
    prompt: str | None = None
    with_spans: bool = False
    with_chunks: bool = False

    def checked(self, tokenizer) -> "LayoutOptions":
        """Raise a ValueError for options `tokenizer` cannot lay out; return them unchanged."""
        if self.with_spans and self.pooling not in CHUNK_ALIGNED_POOLINGS:
            raise ValueError(f"Landmark vectors and spans (`output_value='landmarks'`) need chunk-aligned pooling "
                             f"(lmk, mean@k), not {self.pooling!r}.")
        if self.pooling == "lmk":
            tokenizer.landmark_id(self.landmark)  # a clear error without SEP / EOS
        start_id, end_id = tokenizer.start_token_id, tokenizer.end_token_id
        if self.pooling == "multi_cls" and (start_id is None or end_id is None):
            raise ValueError("`pooling='multi_cls'` needs a CLS (or BOS) and a SEP (or EOS) token.")
        if self.pooling == "cls" and start_id is None:
            raise ValueError("`pooling='cls'` needs a CLS (or BOS) token, and the tokenizer has none.")
        return self


def _exclusive_cumsum_per_group(values: np.ndarray, group_starts: np.ndarray, group_of: np.ndarray) -> np.ndarray:
    """Sum of `values` before each position within its group (flat arrays, groups contiguous)."""
    total = np.cumsum(values) - values
    if not len(values):
        return total
    # An empty group's start may point past the end; no element reads it.
    return total - total[np.minimum(group_starts, len(values) - 1)][group_of]


@dataclass
class _Tokens:
    """A batch's content tokens, flat: token i is `ids[i]`, at `pos[i]` in text `text_of[i]`; `closes[i]`
    when a chunk ends after it. `kept` / `kept_start` count and locate each text's tokens after truncation."""

    ids: np.ndarray
    text_of: np.ndarray
    pos: np.ndarray
    closes: np.ndarray
    offsets: np.ndarray | None  # [tokens, 2] character spans, when asked for
    lengths: np.ndarray  # [texts] tokens before truncation
    text_start: np.ndarray  # [texts] first token of each text, before truncation
    kept: np.ndarray | None = None
    kept_start: np.ndarray | None = None

    @property
    def num_texts(self) -> int:
        return len(self.lengths)


@dataclass
class _Rows:
    """The padded [texts, width] layout and where its markers went."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    column: np.ndarray  # [tokens] column of each content token
    marker_after: np.ndarray  # [tokens] a marker follows this token
    is_final: np.ndarray  # [tokens] the text's last token
    empty: np.ndarray  # [texts] no content token kept


def _segment(encodings, texts: list[str], g: int, splitter: str, need_offsets: bool) -> _Tokens:
    """Step 1, segment: flatten the encodings and mark where chunks close.

    A segment is a sentence (sentence splitter) or the whole text; chunks of g tokens inside each.
    """
    num_texts = len(encodings)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=num_texts)
    total = int(lengths.sum())
    ids = np.concatenate([np.zeros(0, dtype=np.int64), *(np.asarray(e.ids, dtype=np.int64) for e in encodings)])
    text_of = np.repeat(np.arange(num_texts), lengths)
    text_start = np.cumsum(lengths) - lengths
    index = np.arange(total)
    pos = index - text_start[text_of]
    offsets = None
    if need_offsets:
        offsets = np.concatenate([np.zeros((0, 2), dtype=np.int64),
                                  *(np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in encodings)])
    if splitter == "sentence":
        span = max((len(t) for t in texts), default=0) + 1
        ends = np.fromiter(
            chain.from_iterable((i * span + m.end() for m in SENTENCE_END.finditer(t)) for i, t in enumerate(texts)),
            dtype=np.int64,
        )
        segment = np.searchsorted(ends, text_of * span + offsets[:, 0], side="right") + text_of
    else:
        segment = text_of
    new_segment = np.ones(total, dtype=bool)
    new_segment[1:] = segment[1:] != segment[:-1]
    segment_first = np.maximum.accumulate(np.where(new_segment, index, 0)) if total else index
    closes = (index - segment_first + 1) % g == 0
    closes[:-1] |= new_segment[1:]
    if total:
        closes[-1] = True
    return _Tokens(ids, text_of, pos, closes, offsets, lengths, text_start)


def _truncate(tokens: _Tokens, layout: str, max_length: int | None, has_start: int, end_id) -> np.ndarray:
    """Step 2, truncate: keep each text's longest prefix whose full layout fits `max_length` (markers
    count against it). Updates `tokens` in place; returns which texts were cut, [texts] bool."""
    if max_length is not None:
        if layout == "plain":
            cost = has_start + tokens.pos + 1 + int(end_id is not None)
        else:  # one marker per chunk (multi_cls: CLS markers + the final SEP)
            markers = _exclusive_cumsum_per_group(tokens.closes.astype(np.int64), tokens.text_start, tokens.text_of)
            cost = has_start + tokens.pos + 1 + markers + 1
        keep = cost <= max_length
    else:
        keep = np.ones(len(tokens.ids), dtype=bool)
    tokens.kept = np.bincount(tokens.text_of[keep], minlength=tokens.num_texts).astype(np.int64)
    if not keep.all():
        tokens.ids, tokens.text_of, tokens.pos, tokens.closes = (
            tokens.ids[keep], tokens.text_of[keep], tokens.pos[keep], tokens.closes[keep])
        if tokens.offsets is not None:
            tokens.offsets = tokens.offsets[keep]
    tokens.kept_start = np.cumsum(tokens.kept) - tokens.kept
    tokens.closes[(tokens.kept_start + tokens.kept - 1)[tokens.kept > 0]] = True  # a text always ends a chunk
    return tokens.kept < tokens.lengths


def _assemble(tokens: _Tokens, layout: str, has_start: int, start_id, end_id, marker_id, final_id, pad_id: int) -> _Rows:
    """Step 3, assemble: [start] tokens with a marker after each closing token, padded to one width.

    Plain layouts get only the final SEP after the last token; an empty text gets the final marker alone.
    """
    total, num_texts, kept = len(tokens.ids), tokens.num_texts, tokens.kept
    last_token = (tokens.kept_start + kept - 1)[kept > 0]
    marker_after = tokens.closes.copy() if layout != "plain" else np.zeros(total, dtype=bool)
    if layout == "plain" and end_id is not None:
        marker_after[last_token] = True
    markers_before = _exclusive_cumsum_per_group(marker_after.astype(np.int64), tokens.kept_start, tokens.text_of)
    column = has_start + tokens.pos + markers_before
    empty = kept == 0
    num_markers = np.bincount(tokens.text_of[marker_after], minlength=num_texts) + (empty & (final_id is not None))
    row_length = has_start + kept + num_markers
    width = int(row_length.max())

    input_ids = np.full((num_texts, width), pad_id, dtype=np.int64)
    attention_mask = (np.arange(width)[None, :] < row_length[:, None]).astype(np.int64)
    if has_start:
        input_ids[:, 0] = start_id
    input_ids[tokens.text_of, column] = tokens.ids
    is_final = np.zeros(total, dtype=bool)
    is_final[last_token] = True
    input_ids[tokens.text_of[marker_after], column[marker_after] + 1] = np.where(is_final[marker_after], final_id, marker_id)
    if final_id is not None:
        input_ids[np.flatnonzero(empty), has_start] = final_id
    return _Rows(input_ids, attention_mask, column, marker_after, is_final, empty)


def _pooling_mask(tokens: _Tokens, rows: _Rows, pooling: str, has_start: int) -> np.ndarray:
    """Step 4, mask: [texts, width], 1 at the positions `pooling` averages."""
    landmark_mask = np.zeros_like(rows.input_ids)
    marker_rows, marker_cols = tokens.text_of[rows.marker_after], rows.column[rows.marker_after] + 1
    if pooling == "lmk":
        landmark_mask[marker_rows, marker_cols] = 1
        landmark_mask[np.flatnonzero(rows.empty), has_start] = 1
    elif pooling == "multi_cls":
        landmark_mask[:, 0] = 1
        inner = rows.marker_after & ~rows.is_final
        landmark_mask[tokens.text_of[inner], rows.column[inner] + 1] = 1
    elif pooling == "cls":
        landmark_mask[:, 0] = 1
    elif pooling == "mean@k":
        landmark_mask[tokens.text_of[tokens.closes], rows.column[tokens.closes]] = 1
    else:  # mean, latent_attention
        landmark_mask[:] = rows.attention_mask
    landmark_mask[landmark_mask.sum(1) == 0, 0] = 1  # e.g. mean@k of an empty text: fall back to [CLS]
    return landmark_mask


# The standalone tokenizer's `variable` draws, one generator per tokenizer, kept outside its attributes.
_DRAWS: "weakref.WeakKeyDictionary[LMKTokenizer, random.Random]" = weakref.WeakKeyDictionary()


def reference_layout(content: list[int], granularity: int, max_length: int | None, start_id: int, landmark_id: int,
                     sentence_ends=()) -> tuple[list[int], list[int]]:
    """Algorithm 1 for one text, as a plain loop: the minimal reference that the vectorised path
    above (`_segment` .. `_pooling_mask`) is tested against.

    [CLS] z1 [LMK] ... zn [LMK] from the text's content ids: a chunk ends after `granularity` tokens,
    at a sentence end (`sentence_ends`: the content indices after which a sentence ends) or at the
    text's end. Truncation keeps the longest prefix whose layout, landmarks included, fits
    `max_length`. Returns (ids, landmark positions).
    """
    def build(tokens):
        ids, landmarks, in_chunk = [start_id], [], 0
        for i, token in enumerate(tokens):
            ids.append(token)
            in_chunk += 1
            if in_chunk == granularity or i in sentence_ends or i == len(tokens) - 1:
                ids.append(landmark_id)
                landmarks.append(len(ids) - 1)
                in_chunk = 0
        if not tokens:  # the empty text still gets its landmark
            ids.append(landmark_id)
            landmarks.append(1)
        return ids, landmarks

    kept = len(content) if max_length is None else min(len(content), max_length)
    while max_length is not None and len(build(content[:kept])[0]) > max_length:
        kept -= 1
    return build(content[:kept])


class LMKTokenizer(PreTrainedTokenizerFast):
    """A fast tokenizer whose call returns the landmark layout.

    It defines no `__init__`: transformers 5.23 rebuilds the vocabulary (ignoring tokenizer.json)
    for remote-code subclasses that do. Options live in tokenizer_config.json and are read from
    `init_kwargs`: `lmk_pooling`, `lmk_granularity`, `lmk_splitter`, `lmk_granularities`,
    `lmk_seed` and `lmk_landmark` ("sep", "eos" or a literal token).

    No option name ends in `_token`: transformers registers such init kwargs as special tokens,
    which would add e.g. "sep" to the vocabulary and split "separate" as `sep ara ##te`.
    """

    # ---- options ---------------------------------------------------------------------------

    def _option(self, key: str):
        """Option `key` of tokenizer_config.json, else its `LMKConfig` default (`LMK_OPTIONS`)."""
        value = self.init_kwargs.get(key)
        return _OPTION_DEFAULTS[key] if value is None else value

    @property
    def lmk_pooling(self) -> str:
        return self._option("lmk_pooling")

    @property
    def lmk_granularity(self) -> int:
        return int(self._option("lmk_granularity"))

    @property
    def lmk_splitter(self) -> str:
        return self._option("lmk_splitter")

    @property
    def lmk_granularities(self) -> tuple[int, ...]:
        return tuple(int(g) for g in self._option("lmk_granularities"))

    @property
    def landmark_token_id(self) -> int:
        """The landmark: SEP, or EOS when the tokenizer has no SEP (`lmk_landmark` overrides)."""
        return self.landmark_id()

    def landmark_id(self, choice: str | None = None) -> int:
        """The id of landmark `choice` ("sep": SEP, else EOS; "eos"; or a literal token); None: `lmk_landmark`."""
        choice = self._landmark_option() if choice is None else choice
        if choice == "sep":
            token_id = self.sep_token_id if self.sep_token_id is not None else self.eos_token_id
        elif choice == "eos":
            token_id = self.eos_token_id
        else:
            token_id = self.convert_tokens_to_ids(choice)
            if token_id == self.unk_token_id and choice != self.unk_token:
                token_id = None
        if token_id is None:
            if choice in ("sep", "eos"):
                missing = "neither a SEP nor an EOS token" if choice == "sep" else "no EOS token"
                problem = f"`lmk_landmark`={choice!r} but the tokenizer has {missing}"
            else:
                problem = f"`lmk_landmark`={choice!r} is not a token of the tokenizer's vocabulary"
            raise ValueError(
                f"The tokenizer has no landmark token: {problem}. Give a landmark token in the vocabulary ('sep', "
                "'eos' or a literal token: `landmark_token` of convert_to_lmk, `--landmark-token` of lmk-embed "
                "convert-lmk)."
            )
        return int(token_id)

    def _landmark_option(self) -> str:
        """`lmk_landmark` of tokenizer_config.json (default "sep")."""
        return str(self._option("lmk_landmark"))

    @property
    def start_token_id(self) -> int | None:
        """The token that opens every sequence: CLS, else BOS, else none."""
        return self.cls_token_id if self.cls_token_id is not None else self.bos_token_id

    @property
    def end_token_id(self) -> int | None:
        """The token that closes the plain layouts: SEP, else EOS."""
        return self.sep_token_id if self.sep_token_id is not None else self.eos_token_id

    def max_length_limit(self) -> int | None:
        """The most tokens this tokenizer says its model reads (`model_max_length`; None: no limit)."""
        return tokenizer_limit(self.model_max_length)

    def draw_granularity(self) -> int:
        """One g from `lmk_granularities`, from a generator seeded with `lmk_seed` (reproducible; for
        the tokenizer used on its own: `LMKModel` draws from its config's set with its own generator)."""
        rng = _DRAWS.get(self)
        if rng is None:
            rng = _DRAWS[self] = random.Random(int(self._option("lmk_seed")))
        return rng.choice(self.lmk_granularities)

    # ---- the public call ---------------------------------------------------------------------

    def __call__(
        self,
        text,
        *,
        pooling: str | None = None,
        granularity: int | None = None,
        splitter: str | None = None,
        max_length: int | None = None,
        prompt: str | None = None,
        padding: bool | str = True,
        truncation: bool = True,
        return_tensors: str | None = None,
        return_landmark_spans: bool = False,
        **kwargs,
    ) -> BatchEncoding:
        """Tokenize `text` (a string or a list of strings) into the landmark layout.

        Returns a BatchEncoding with `input_ids`, `attention_mask` and `landmark_mask` (lists,
        or tensors with `return_tensors="pt"` / `"np"`), plus `landmark_spans` when asked for.
        """
        single, texts = check_tokenizer_call(
            "LMKTokenizer", text, kwargs, padding, return_tensors, "the landmark layout defines them"
        )
        if max_length is None and truncation:
            max_length = max_length_default(None, self.max_length_limit())
        batch = self.build_layout(texts, pooling=pooling, granularity=granularity, splitter=splitter,
                                  max_length=max_length if truncation else None, prompt=prompt,
                                  with_spans=return_landmark_spans)
        warn_truncated(int(batch.truncated.sum()), len(texts), max_length, stacklevel=2,
                       detail=" (the sequence still ends with a landmark)")
        data = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "landmark_mask": batch.landmark_mask}
        encoding = to_batch_encoding(data, single, return_tensors)
        if return_landmark_spans:
            encoding["landmark_spans"] = batch.spans[0] if single else batch.spans
        return encoding

    # ---- Algorithm 1, vectorised -------------------------------------------------------------

    def content_encodings(self, texts: list[str], max_tokens: int | None = None):
        """One Rust pass over `texts` without special tokens; literal special tokens stay text."""
        return encode_content(self, texts, max_tokens)

    @staticmethod
    def check_max_length(max_length) -> int | None:
        return check_lmk_max_length(max_length)

    def resolve(self, *, pooling: str | None = None, granularity: int | None = None, splitter: str | None = None,
                max_length: int | None = None, prompt: str | None = None, with_spans: bool = False,
                landmark: str | None = None) -> "LayoutOptions":
        """The standalone tokenizer's options for one call: each None from tokenizer_config.json, each
        checked once (`variable` draws g here). `LMKModel.resolve` builds its options from its config."""
        pooling = check_choice("pooling", self.lmk_pooling if pooling is None else pooling, POOLINGS)
        splitter = check_choice("splitter", self.lmk_splitter if splitter is None else splitter, SPLITTERS)
        if granularity is None:
            granularity = self.draw_granularity() if splitter == "variable" else self.lmk_granularity
        self.check_max_length(max_length)
        options = LayoutOptions(pooling, OPTION["granularity"].check(granularity, None),
                                "sentence" if splitter == "sentence" else "fixed", max_length,
                                self._landmark_option() if landmark is None else landmark, prompt, with_spans)
        return options.checked(self)

    def build_layout(self, texts: list[str], **options) -> LandmarkBatch:
        """`layout(texts, resolve(**options))`: options left out come from tokenizer_config.json."""
        return self.layout(texts, self.resolve(**options))

    def layout(self, texts: list[str], options: "LayoutOptions") -> LandmarkBatch:
        """Build the padded landmark layout for `texts` (see the module docstring) from resolved
        `options`, in four steps: `_segment` (chunks), `_truncate` (to `max_length`, markers included),
        `_assemble` (ids and attention mask, [texts, width]) and `_pooling_mask` (the positions
        `pooling` averages). Nothing is defaulted or checked here: `resolve` did that."""
        pooling, g, max_length = options.pooling, options.granularity, options.max_length
        layout = {"lmk": "landmark", "multi_cls": "multi_cls"}.get(pooling, "plain")
        marker_id = self.landmark_id(options.landmark) if layout == "landmark" else self.start_token_id
        end_id = self.end_token_id
        start_id = self.start_token_id
        final_id = marker_id if layout == "landmark" else end_id
        has_start = int(start_id is not None)

        prefix = options.prompt or ""
        full_texts = [prefix + t for t in texts] if prefix else texts
        tokens = _segment(self.content_encodings(full_texts, max_length), full_texts, g, options.splitter,
                          need_offsets=options.with_spans or options.with_chunks or options.splitter == "sentence")
        truncated = _truncate(tokens, layout, max_length, has_start, end_id)
        rows = _assemble(tokens, layout, has_start, start_id, end_id, marker_id, final_id,
                         self.pad_token_id if self.pad_token_id is not None else 0)
        landmark_mask = _pooling_mask(tokens, rows, pooling, has_start)
        spans = chunk_of = None
        if options.with_spans or options.with_chunks:
            spans = self._chunk_spans(tokens.closes, tokens.text_of, tokens.kept_start, tokens.offsets, rows.empty,
                                      len(prefix), tokens.num_texts)
        if options.with_chunks:
            chunk_of = np.full_like(rows.input_ids, -1)
            chunk_of[tokens.text_of, rows.column] = _exclusive_cumsum_per_group(
                tokens.closes.astype(np.int64), tokens.kept_start, tokens.text_of)
        return LandmarkBatch(rows.input_ids, rows.attention_mask, landmark_mask, truncated, g, max_length, spans,
                             chunk_of=chunk_of)

    @staticmethod
    def _chunk_spans(closes, text_of, kept_start, offsets, empty, prefix_length, num_texts):
        """(start, end) characters of the chunk each closing token ends, relative to the text without prompt."""
        last = np.flatnonzero(closes)
        first = np.empty_like(last)
        if len(last):
            first[0] = 0
            first[1:] = last[:-1] + 1
            new_text = np.ones(len(last), dtype=bool)
            new_text[1:] = text_of[last[1:]] != text_of[last[:-1]]
            first[new_text] = kept_start[text_of[last[new_text]]]
        starts = np.maximum(offsets[first, 0] - prefix_length, 0) if len(last) else first
        ends = np.maximum(offsets[last, 1] - prefix_length, 0) if len(last) else first
        counts = np.bincount(text_of[last], minlength=num_texts)
        spans, cursor = [], 0
        for text_index in range(num_texts):
            n = int(counts[text_index])
            spans.append(list(zip(starts[cursor : cursor + n].tolist(), ends[cursor : cursor + n].tolist())) or [(0, 0)])
            cursor += n
        return spans
