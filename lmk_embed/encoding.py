"""The one `encode()` engine shared by both model families.

The engine owns everything that does not depend on the architecture: argument checks,
length-sorted batching with the original order restored, the progress bar, inference
mode, device placement, normalisation, output conversion and the truncation warning.

A family plugs in by subclassing `EncoderMixin` (an abstract base) and implementing:

- `resolve(prompt=..., output_value=..., **options) -> request`: default every per-call option
  from the config and check it, once; the request is frozen and has a `prompt`, an
  `output_value` and a `max_length`.
- `encode(texts, ...)` with the family's per-call options as keywords: `resolve` them, then hand
  the request to the engine (`_run_encode(texts, request, ...)`); and `encode_query`
  (`encode_document` is shared).
- `_embed_texts(texts, request) -> (torch.Tensor [b, D], truncated)` (or, for
  `output_value="landmarks"`, a list of `(vectors [n_i, D], spans)` pairs): tokenize, run its
  forward schedule, pool; `truncated` counts the texts cut at `max_length`.
- `_embed_stream(source, request) -> (torch.Tensor [D], truncated)` (optional): one document given
  as an iterator of text pieces or a `pathlib.Path`; set `supports_streaming = True`.

The engine adds up the truncated counts and warns once per call.

Both families' tokenizers also share the single Rust pass without special tokens
(`encode_content`, which cuts very long texts at a safe place first) and their call checks.
That pass runs on a private, configured copy of the tokenizer's Rust backend: the shared
backend's truncation, padding and `encode_special_tokens` settings are never changed, so any
number of threads may encode with one model.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import write_checkpoint_files, write_tokenizer_options

try:  # tqdm is a dependency of transformers, but keep the shipped file importable without it
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover
    tqdm = None

# Show a progress bar by default from this many batches on.
PROGRESS_MIN_BATCHES = 8
# The `from_pretrained` arguments that say where a checkpoint's files are; its tokenizer gets them too.
TOKENIZER_LOADING_KWARGS = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")


# Per-call options that sentence-transformers sets its own way (`max_seq_length`, the Normalize module).
SENTENCE_TRANSFORMERS_OWN_OPTIONS = ("max_length", "normalize")


def call_options(options) -> tuple[str, ...]:
    """The names of a family's per-call options (`Option.per_call`) that its sentence-transformers
    module passes on from `SentenceTransformer.encode`: all but `SENTENCE_TRANSFORMERS_OWN_OPTIONS`."""
    return tuple(option.name for option in options
                 if option.per_call and option.name not in SENTENCE_TRANSFORMERS_OWN_OPTIONS)


@dataclass(frozen=True)
class Option:
    """One option of a family, declared once in its configuration file (`LMK_OPTIONS`,
    `RECURRENT_OPTIONS`): its `default` (the config field `name` is set to it), its `kind` (the type a
    reader sees) and its `rule` (`rule(value, config) -> value`, raising a TypeError for a wrong type
    and a ValueError for a wrong value, naming the option; None: any value). The config's `check()`
    runs every rule on its fields, and the family's `resolve` runs the same rule on a call's value.
    `tokenizer_key` names its mirror in tokenizer_config.json (None: not mirrored), `per_call` whether
    `encode()` takes it for one call, and `cli_flag` the convert command's flag that sets the default
    (None: none)."""

    name: str
    default: object = None
    kind: str = "str"
    rule: Callable | None = None
    tokenizer_key: str | None = None
    per_call: bool = False
    cli_flag: str | None = None

    def check(self, value, config):
        """`value` for this option, checked by its rule in the context of `config` (the family's config)."""
        return value if self.rule is None else self.rule(value, config)


def option_defaults(options) -> dict:
    """`{name: default}` of a family's options: the config class's field defaults."""
    return {option.name: option.default for option in options}


def check_positive_int(name: str, value) -> int:
    """Return `value` as an int, or raise naming the argument: a TypeError for a non-integer (bools
    included), a ValueError for an integer below 1. The one positive-integer rule."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be a positive integer, got {value!r} ({type(value).__name__}).")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {value}.")
    return int(value)


# Tokenizers without a real limit report a huge sentinel as model_max_length.
NO_LIMIT = 10**12


def tokenizer_limit(model_max_length) -> int | None:
    """A tokenizer's `model_max_length` as a limit: None for the no-limit sentinel (or none at all)."""
    return int(model_max_length) if model_max_length is not None and model_max_length < NO_LIMIT else None


def max_length_default(configured, *limits) -> int | None:
    """The one rule for `max_length`'s default: the configured budget (`config.max_length`), else the
    smallest of the known `limits` (the tokenizer's, the position table's; None: unknown), else None
    (no budget). Every caller works the default out here: the models, the tokenizer, the model card."""
    if configured is not None:
        return int(configured)
    known = [int(limit) for limit in limits if limit is not None]
    return min(known) if known else None


def check_max_length(max_length, minimum: int, holds: str, limit: int | None = None, name: str = "max_length"):
    """The one rule for a token budget (`max_length`, a window's `window_length`), given as `name`:
    None (no budget), or a positive integer (TypeError / ValueError as `check_positive_int`) of at least
    `minimum` (what the layout `holds`) and at most `limit`, the backbone's positions (None: no limit).
    Returns it as an int (or None)."""
    if max_length is None:
        return None
    max_length = check_positive_int(name, max_length)
    if max_length < minimum:
        raise ValueError(f"`{name}`={max_length} is too small: it must hold {holds} (at least {minimum}).")
    if limit is not None and max_length > limit:
        raise ValueError(
            f"`{name}`={max_length} exceeds the backbone's limit of {limit} positions; "
            f"use `{name}` <= {limit} (longer texts are truncated with a warning)."
        )
    return max_length


def warn_truncated(count: int, total: int, max_length, stacklevel: int, detail: str = "") -> None:
    """The one truncation warning of a call: how many texts exceeded `max_length`."""
    if count:
        warnings.warn(
            f"{count} of {total} texts were longer than max_length={max_length} tokens and were truncated{detail}.",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def warn_non_finite(rows: list[int], total: int, stacklevel: int) -> None:
    """The one warning of a call whose vectors hold NaN or inf: which texts (their positions in the call)."""
    if rows:
        shown = ", ".join(map(str, rows[:10])) + (", ..." if len(rows) > 10 else "")
        warnings.warn(f"{len(rows)} of {total} texts gave vectors holding NaN or inf (texts {shown}): the model cannot "
                      "read them (an overflow in half precision, or weights holding NaN); do not index those rows.",
                      UserWarning, stacklevel=stacklevel + 1)


def position_table_limit(backbone: torch.nn.Module) -> int | None:
    """The most tokens `backbone` can read: the size of its absolute position table, less the rows
    a padding offset reserves (RoBERTa-style). None when there is no such table (rotary or
    recurrent backbones), so no hard limit. The one place a position limit is computed from weights."""
    for name, module in backbone.named_modules():
        if name.rsplit(".", 1)[-1] == "position_embeddings" and isinstance(module, torch.nn.Embedding):
            reserved = module.padding_idx + 1 if module.padding_idx is not None else 0
            return int(module.num_embeddings) - reserved
    return None


def check_prompt(prompt) -> str | None:
    """`prompt` unchanged, or a TypeError naming it: a string or None."""
    if prompt is not None and not isinstance(prompt, str):
        raise TypeError(f"`prompt` must be a string or None, got {type(prompt).__name__}.")
    return prompt


def check_choice(name: str, value, choices) -> str:
    """Return `value` if it is one of `choices`, or raise naming the argument."""
    if value not in choices:
        raise ValueError(f"Unknown `{name}` {value!r}; expected one of {sorted(choices)}.")
    return value


def is_stream(item) -> bool:
    """A streamed document: a `pathlib.Path` (any `os.PathLike`) or an iterator of text pieces.

    Plain strings are always texts, never paths; lists, tuples and other sized sequences are batches.
    """
    return isinstance(item, (os.PathLike, Iterator))


def _as_batch(texts, allow_streams: bool) -> tuple[bool, list]:
    """Normalise the `texts` argument to `(is_single, items)`, raising on bad input."""
    if texts is None:
        raise TypeError("`texts` must be a string or a list of strings, got None.")
    if isinstance(texts, str):
        return True, [texts]
    if is_stream(texts):
        if allow_streams:
            return True, [texts]
        if isinstance(texts, os.PathLike):
            raise TypeError(
                f"`texts` must be a string or a list of strings, got {type(texts).__name__}; "
                "paths are streamed documents, which only recurrent models accept."
            )
        texts = list(texts)  # an iterable of texts is many texts, as in sentence-transformers
    if isinstance(texts, (bytes, dict)) or not (hasattr(texts, "__len__") and hasattr(texts, "__getitem__")):
        raise TypeError(f"`texts` must be a string or a list of strings, got {type(texts).__name__}.")
    items = texts.tolist() if isinstance(texts, np.ndarray) else list(texts)
    for index, item in enumerate(items):
        if isinstance(item, str) or (allow_streams and is_stream(item)):
            continue
        expected = "a string, a pathlib.Path or an iterator of strings" if allow_streams else "a string"
        raise TypeError(f"`texts[{index}]` must be {expected}, got {type(item).__name__}.")
    return False, items


# A whitespace run that starts after a non-space character: a safe place to cut a text.
_SAFE_CUT = re.compile(r"(?<=\S)\s")
_CUT_WINDOW = 4096


def last_safe_cut(text: str) -> int:
    """The last position where a whitespace run starts after a non-space character (0: none).

    No token of a whitespace/punctuation-splitting pre-tokenizer (WordPiece, byte-level BPE,
    Metaspace) spans such a position, so the text before it tokenizes the same on its own.
    Only the last few thousand characters are searched.
    """
    last = 0
    for match in _SAFE_CUT.finditer(text, max(len(text) - _CUT_WINDOW, 0)):
        last = match.start()
    return last


# Each tokenizer's private backend copy, (vocabulary size, copy), kept beside the tokenizer rather
# than in its attributes; an entry goes when its tokenizer does.
_CONTENT_BACKENDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def content_backend(tokenizer):
    """A private copy of `tokenizer.backend_tokenizer` that never truncates or pads and keeps
    literal special tokens ("[SEP]", "</s>") as plain text.

    The copy is made once per tokenizer (again after tokens are added) and only read from then
    on, so concurrent encodes share it safely and the user's backend keeps its own settings.
    """
    shared = tokenizer.backend_tokenizer
    key = shared.get_vocab_size(with_added_tokens=True)
    cached = _CONTENT_BACKENDS.get(tokenizer)
    if cached is not None and cached[0] == key:
        return cached[1]
    backend = deepcopy(shared)
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = True
    _CONTENT_BACKENDS[tokenizer] = (key, backend)  # one store: a racing thread builds an equal copy
    return backend


def _encode_batch(backend, texts: list[str]):
    """`backend.encode_batch` without special tokens; a text the Rust tokenizer cannot take (a lone
    surrogate such as "\\ud800": not valid Unicode) is named instead of the tokenizer's opaque TypeError
    (by its beginning: the engine reorders texts, so an index here is not the caller's)."""
    try:
        return backend.encode_batch(texts, add_special_tokens=False)
    except TypeError:
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(f"A text is not valid Unicode: {error.reason} at character {error.start} "
                                 f"({text[error.start]!r}) of the text beginning {text[:40]!r}; decode its bytes "
                                 "with errors='replace'.") from None
        raise


# Texts longer than this many characters are tokenized piece by piece (`encode_long_content`);
# counted against a budget, in smaller pieces, so that reading stops soon after the budget.
_PIECE_CHARS = 1 << 16
_COUNT_PIECE_CHARS = 1 << 14


class ContentEncoding:
    """A long text's content tokens, read piece by piece: `ids` [n] and `offsets` [n, 2] (int64
    arrays, characters of the whole text), what `encode_content`'s callers read of an `Encoding`."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray):
        self.ids, self.offsets = ids, offsets


def encode_long_content(backend, text: str, piece_chars: int = _PIECE_CHARS,
                        max_tokens: int | None = None) -> ContentEncoding:
    """`text`'s content tokens, equal to one pass over it, from pieces of about `piece_chars`
    characters cut at safe places (`last_safe_cut`). The Rust pass holds several words of
    alignment data per character and an `Encoding` a token string per token; pieces bound the first
    and arrays replace the second, so memory stays a few int64 per token however long the text.
    With `max_tokens`, reading stops at the first piece that takes the count past it: the tokens
    read are the text's first ones, and more than `max_tokens` of them say the text is longer."""
    ids, offsets, begin, count = [], [], 0, 0
    while begin < len(text) and (max_tokens is None or count <= max_tokens):
        end = begin + piece_chars
        cut = 0 if end >= len(text) else last_safe_cut(text[begin:end])
        while end < len(text) and cut == 0:  # no safe cut near the piece's end: read on
            end += piece_chars
            cut = 0 if end >= len(text) else last_safe_cut(text[begin:end])
        stop = begin + cut if cut else len(text)
        encoding = _encode_batch(backend, [text[begin:stop]])[0]
        ids.append(np.asarray(encoding.ids, dtype=np.int64))
        offsets.append(np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2) + begin)
        count += len(ids[-1])
        begin = stop
    if not ids:
        return ContentEncoding(np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64))
    return ContentEncoding(np.concatenate(ids), np.concatenate(offsets))


def encode_in_pieces(backend, texts: list[str]) -> list:
    """`_encode_batch`, with texts over `_PIECE_CHARS` characters read by `encode_long_content`."""
    long = [i for i, text in enumerate(texts) if len(text) > _PIECE_CHARS]
    if not long:
        return _encode_batch(backend, texts)
    short = [i for i, text in enumerate(texts) if len(text) <= _PIECE_CHARS]
    encodings = [None] * len(texts)
    for i, encoding in zip(short, _encode_batch(backend, [texts[i] for i in short]) if short else []):
        encodings[i] = encoding
    for i in long:
        encodings[i] = encode_long_content(backend, texts[i])
    return encodings


def encode_content(tokenizer, texts: list[str], max_tokens: int | None = None):
    """One Rust pass over `texts` without special tokens (literal "[SEP]", "</s>" stay plain text).

    `tokenizer` is a fast tokenizer; returns its `tokenizers.Encoding`s, never truncated or padded
    (a `ContentEncoding`, with the same `ids` and `offsets`, for a text over `_PIECE_CHARS`
    characters). With `max_tokens`, a text over `_COUNT_PIECE_CHARS` characters is read piece by
    piece only until it has more than `max_tokens` tokens: its first tokens are the same, and the
    caller still sees that the text exceeds the budget, at the cost of the budget, not of the text.
    """
    backend = content_backend(tokenizer)
    if max_tokens is None:
        return encode_in_pieces(backend, texts)
    short = [i for i, text in enumerate(texts) if len(text) <= _COUNT_PIECE_CHARS]
    encodings = [None] * len(texts)
    for i, encoding in zip(short, _encode_batch(backend, [texts[i] for i in short]) if short else []):
        encodings[i] = encoding
    for i, text in enumerate(texts):
        if encodings[i] is None:
            encodings[i] = encode_long_content(backend, text, _COUNT_PIECE_CHARS, max_tokens)
    return encodings


def check_tokenizer_call(owner: str, text, kwargs: dict, padding, return_tensors, specials_reason: str):
    """Shared argument checks of our tokenizers' `__call__`; returns (is_single, texts)."""
    if kwargs.pop("add_special_tokens", True) is not True:
        raise ValueError(f"`add_special_tokens=False` is not supported: {specials_reason}.")
    kwargs.pop("split_special_tokens", None)  # always True: literal special tokens are plain text
    if kwargs:
        raise TypeError(f"{owner}.__call__ got unsupported arguments: {sorted(kwargs)}.")
    if padding not in (True, "longest"):
        raise ValueError(f"`padding` must be True or 'longest' (right padding to the longest), got {padding!r}.")
    if return_tensors not in (None, "pt", "np"):
        raise ValueError(f"`return_tensors` must be None, 'pt' or 'np', got {return_tensors!r}.")
    single = isinstance(text, str)
    texts = [text] if single else text
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError("`text` must be a string or a list of strings.")
    return single, list(texts)


class ModelInputs(dict):
    """One batch's model inputs, `{name: [B, T] tensor}`, that also says what was truncated.

    A plain dict to `model(**inputs)`; `truncated` (bool [B]) and `max_length` (the budget) are
    attributes, read by callers that report truncation (the sentence-transformers module). Built from
    a mapping alone, as libraries rebuild mappings they move to a device (`type(batch)({...})`:
    accelerate, transformers' Trainer), it holds the tensors and says nothing of truncation.
    """

    def __init__(self, tensors: dict, truncated: np.ndarray | None = None, max_length: int | None = None):
        super().__init__(tensors)
        self.truncated = truncated
        self.max_length = max_length


def to_batch_encoding(data: dict[str, np.ndarray], single: bool, return_tensors):
    """[B, T] arrays -> BatchEncoding: python lists (one text: not batched), or "pt" / "np" arrays."""
    from transformers import BatchEncoding

    if return_tensors is None:
        data = {key: value[0].tolist() if single else value.tolist() for key, value in data.items()}
    return BatchEncoding(data, tensor_type="pt" if return_tensors == "pt" else None)


class EncoderMixin(ABC):
    """What both family models share: `encode()`-style batching (see the module docstring), the
    lazily loaded tokenizer (`tokenizer_class`), the backbone's input embeddings and
    `encode_document`. A family implements the abstract methods and sets the class attributes."""

    supports_streaming: bool = False
    output_values: tuple[str, ...] = ("embedding",)
    # The per-call options of `encode()` beyond the engine's: those that shape the inputs
    # (`prepare_features` takes them) and those that pick the forward (`forward` takes them). The
    # sentence-transformers module declares both, so SentenceTransformer.encode takes them too.
    preprocess_options: tuple[str, ...] = ()
    forward_options: tuple[str, ...] = ()
    tokenizer_class = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`, remembering where the weights came from: the lazily
        loaded tokenizer then comes from the same revision, cache, subfolder and token."""
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        except pickle.UnpicklingError as error:  # torch's weights_only refusal: many lines advising unsafe loading
            found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
            raise pickle.UnpicklingError(
                f"{pretrained_model_name_or_path}: its pickled weights hold objects other than tensors"
                f"{f' ({found.group(1)})' if found else ''}, which are never unpickled (that would run their code); "
                "load a checkpoint whose weights are safetensors (model.safetensors).") from None
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True
        model._tokenizer_loading_kwargs = {
            name: kwargs[name] for name in TOKENIZER_LOADING_KWARGS if kwargs.get(name) is not None
        }
        return loaded

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer, loaded on first use from where the model was loaded."""
        if getattr(self, "_tokenizer", None) is None:
            if not self.name_or_path:
                name = self.tokenizer_class.__name__
                raise ValueError(f"This model has no tokenizer: set `model.tokenizer = {name}.from_pretrained(...)`.")
            loading_kwargs = getattr(self, "_tokenizer_loading_kwargs", None) or {}
            self._tokenizer = self.tokenizer_class.from_pretrained(self.name_or_path, **loading_kwargs)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def save_pretrained(self, save_directory, *args, sentence_transformers_files: bool = True, **kwargs):
        """`PreTrainedModel.save_pretrained`, and the rest of a complete checkpoint
        (`write_checkpoint_files`: the family's code, `auto_map`s and, unless
        `sentence_transformers_files=False`, the sentence-transformers files), so the folder loads the
        same with AutoModel and SentenceTransformer. The sentence-transformers module's own save
        passes False: `SentenceTransformer.save` writes those files itself.

        The tokenizer is saved beside the weights: `encode()` needs it, so the saved folder loads
        and encodes on its own. The tokenizer is the one this model holds,
        else the one it was loaded with (read now, from there; a warning says so when that fails).
        A model built from a config alone has neither: it saves without one.

        The saved tokenizer_config.json's options are then rewritten from the config
        (`config.tokenizer_options()`): the model passes its config's options to the tokenizer, and the
        copy there is only the default of the tokenizer used on its own, which must say what the config
        says (training may have changed it). The tokenizer object itself is left as it is."""
        saved = super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return saved
        tokenizer = getattr(self, "_tokenizer", None)
        if tokenizer is None and self.name_or_path:
            try:
                tokenizer = self.tokenizer
            except (OSError, ValueError) as error:
                warnings.warn(f"save_pretrained: no tokenizer saved in {save_directory} (it could not be loaded from "
                              f"{self.name_or_path!r}: {error}); `encode()` of the saved model needs one: set "
                              "`model.tokenizer` to this model's tokenizer and save again.", stacklevel=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(save_directory)
            write_tokenizer_options(save_directory, self.config.tokenizer_options())
        write_checkpoint_files(self, save_directory, with_tokenizer=tokenizer is not None,
                               sentence_transformers_files=sentence_transformers_files)
        return saved

    def max_positions(self) -> int | None:
        """The most tokens one sequence may hold (`position_table_limit` of the backbone)."""
        return position_table_limit(self.backbone)

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone.set_input_embeddings(value)

    # Families implement these.
    @abstractmethod
    def resolve(self, **options):
        """The call's options, defaulted from the config and checked once -> a frozen request with
        `prompt`, `output_value` and `max_length` (see the module docstring)."""

    @abstractmethod
    def encode(self, texts, **options):
        """The family's `encode()`: its keywords are the per-call options of its option spec."""

    @abstractmethod
    def encode_query(self, queries, **kwargs):
        """`encode` with the family's query prompt or instruction."""

    @abstractmethod
    def _embed_texts(self, texts: list[str], request):
        """One batch of texts -> (vectors, truncated count) (see the module docstring)."""

    def _embed_stream(self, source, request) -> tuple[torch.Tensor, int]:
        """One streamed document -> ([D], truncated 0 or 1); for families with `supports_streaming`."""
        raise NotImplementedError(f"{type(self).__name__} does not stream documents.")

    def encode_document(self, documents, **kwargs):
        """`encode` with `config.document_prompt` prepended (empty by default)."""
        return self.encode(documents, prompt=self.config.document_prompt or None, **kwargs)

    def _embedding_dim(self) -> int:
        return int(self.config.embedding_dim)

    def _run_encode(
        self,
        texts,
        request,
        *,
        batch_size: int,
        normalize: bool | None,
        show_progress_bar: bool | None,
        convert_to_tensor: bool,
        device,
    ):
        """Encode `texts` with the options of `request` (what the family's `resolve` made of the call)
        and return `[N, D]` float32 (numpy, or a tensor), `[D]` for one text.

        `output_value="landmarks"` returns, per text, `{"embeddings": [n_i, D], "spans": [(start, end), ...]}`.
        """
        is_single, items = _as_batch(texts, allow_streams=self.supports_streaming)
        batch_size = check_positive_int("batch_size", batch_size)
        normalize = bool(self.config.normalize if normalize is None else normalize)
        output_value = request.output_value
        num_truncated = 0
        if device is not None:
            self.to(device)

        if not items:
            if output_value != "embedding":
                return []
            empty = torch.zeros(0, self._embedding_dim())
            return empty if convert_to_tensor else empty.numpy()

        stream_ids = [i for i, item in enumerate(items) if not isinstance(item, str)]
        text_ids = [i for i, item in enumerate(items) if isinstance(item, str)]
        # Longest first: similar lengths share a batch, and a too-large batch fails at once.
        text_ids.sort(key=lambda i: -len(items[i]))
        batches = [text_ids[s : s + batch_size] for s in range(0, len(text_ids), batch_size)]
        units = [("stream", [i]) for i in stream_ids] + [("texts", b) for b in batches]

        if show_progress_bar is None:
            show_progress_bar = len(units) >= PROGRESS_MIN_BATCHES
        progress = tqdm(total=len(items), desc="Encoding", unit="text", disable=not show_progress_bar) if tqdm else None

        results: list = [None] * len(items)
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                for kind, ids in units:
                    if kind == "stream":
                        vector, truncated = self._embed_stream(items[ids[0]], request)
                        results[ids[0]] = vector.float()[None]
                    else:
                        out, truncated = self._embed_texts([items[i] for i in ids], request)
                        if output_value == "embedding":
                            out = out.float()
                            for row, i in enumerate(ids):
                                results[i] = out[row : row + 1]
                        else:
                            for (vectors, spans), i in zip(out, ids):
                                results[i] = (vectors.float(), spans)
                    num_truncated += truncated
                    if progress is not None:
                        progress.update(len(ids))
        finally:
            self.train(was_training)
            if progress is not None:
                progress.close()

        warn_truncated(num_truncated, len(items), request.max_length, stacklevel=3)
        vectors = (result if output_value == "embedding" else result[0] for result in results)
        warn_non_finite([i for i, v in enumerate(vectors) if not bool(torch.isfinite(v).all())], len(items), stacklevel=3)

        if output_value == "embedding":
            embeddings = torch.cat(results)
            if normalize:
                embeddings = F.normalize(embeddings, p=2, dim=-1)
            if not convert_to_tensor:
                embeddings = embeddings.cpu().numpy()
            return embeddings[0] if is_single else embeddings

        landmarks = []
        for vectors, spans in results:
            if normalize:
                vectors = F.normalize(vectors, p=2, dim=-1)
            landmarks.append(
                {"embeddings": vectors if convert_to_tensor else vectors.cpu().numpy(), "spans": list(spans)}
            )
        return landmarks[0] if is_single else landmarks
