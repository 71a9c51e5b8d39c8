"""Evaluation kept apart from training by content, checked over everything before training.

Every evaluation task's text (`evaluation_texts`: the 512 splits' and deep tasks' pages and queries,
which are the held-out stdlib modules', the out-of-domain and the validation sources' items; every
page and subject of each long genre; the passkey and needle queries) is compared with every
training row's text (query, page and negatives, synopsis rows and deep-sentence rows alike):

- a shared sentence (its lower-cased words, `MIN_SENTENCE_WORDS` or more) or a shared run of
  `NGRAM` words, on any number of training pages: nothing is dropped for being common;
- a query equal to a training query, or one of 8 words or more found inside a training text.

Sentences under `MIN_SENTENCE_WORDS` words ("Return the result.") are common phrasing, not a shared
page: they are not compared alone, but their words still count in the 13-word runs. Left out on both
sides are only the lines pydoc writes on a page whatever its subject (`template_lines`: "Data
descriptors defined here:", a builtin's inherited docstring). Texts are held as 64-bit hashes in
sorted numpy arrays (a few seconds for the demo's corpora), and an overlap found is one plain
`OverlapError` naming the task and an example.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import numpy as np

NGRAM = 13
MIN_SENTENCE_WORDS = 8
QUERY_RUN_WORDS = range(MIN_SENTENCE_WORDS, NGRAM)  # a short query found inside a training text, by its length
WORD = re.compile(r"\w+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: a run's hash is its word hashes in base _MULTIPLIER, mod 2**64


class OverlapError(ValueError):
    """An evaluation task shares text with training; the message names the task and an example, and
    `found` holds every overlap found, one line each."""

    def __init__(self, message: str, found: list[str]):
        super().__init__(message)
        self.found = found


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def _template_classes():
    """Small classes over the bases pages inherit from, whose pydoc pages hold only pydoc's template and
    Python's own inherited documentation."""
    import abc
    import enum
    import types
    import typing

    T = typing.TypeVar("T")
    import builtins
    import dataclasses

    T = typing.TypeVar("T")
    exceptions = [value for value in vars(builtins).values() if isinstance(value, type) and issubclass(value, BaseException)]
    bases = [object, *exceptions, list, dict, tuple, set, frozenset, int, float, str, bytes, type, abc.ABC,
             typing.Generic[T], typing.Protocol]
    classes = [types.new_class("Template", (base,)) for base in bases]
    classes += [kind("Template", "A B") for kind in (enum.Enum, enum.IntEnum, enum.Flag, enum.IntFlag, enum.StrEnum)]
    classes.append(typing.NamedTuple("Template", [("a", int)]))
    classes.append(dataclasses.dataclass(types.new_class("Template", (object,), exec_body=lambda ns: ns.update(
        __annotations__={"a": int}))))
    return classes


@functools.lru_cache(maxsize=1)
def template_lines() -> frozenset[str]:
    """The lines pydoc writes on pages whatever their subject, as lower-cased words."""
    import colorsys
    import pydoc

    lines = set()
    # A standard library module's page opens with a note on where its reference lives.
    reference = pydoc.render_doc(colorsys, renderer=pydoc.plaintext).split("MODULE REFERENCE")[1].split("\nDESCRIPTION")[0]
    lines |= {" ".join(found) for line in reference.splitlines()[2:] if (found := words(line))}
    for cls in _template_classes():
        for line in pydoc.render_doc(cls, renderer=pydoc.plaintext).splitlines():
            if found := words(line.replace("Template", "")):
                lines.add(" ".join(found))
    return frozenset(lines)


def _hashes(tokens: list[str]) -> np.ndarray:
    """[n] uint64: each word's hash (Python's, fixed within this process: both sides are hashed here)."""
    return np.array([hash(token) for token in tokens], dtype=np.int64).view(np.uint64)


def run_hashes(word_hashes: np.ndarray, length: int, numbers: np.ndarray | None = None) -> np.ndarray:
    """[n] word hashes -> the hashes of every run of `length` consecutive words ([n - length + 1]); with
    `numbers` ([n] bool, the words that are digits only), the runs made of numbers alone are left out:
    a table's cells or a count (0 0 1 0 ..., 2 3 4 ...) are not a page's words."""
    count = len(word_hashes) - length + 1
    if count <= 0:
        return np.zeros(0, np.uint64)
    runs = np.zeros(count, np.uint64)
    for offset in range(length):  # uint64 arithmetic wraps: the hash is taken mod 2**64
        runs = runs * _MULTIPLIER + word_hashes[offset:offset + count]
    if numbers is not None:
        letters = np.concatenate([[0], np.cumsum(~numbers)])
        runs = runs[letters[length:] - letters[:count] > 0]
    return runs


def among(values: np.ndarray, sorted_unique: np.ndarray) -> np.ndarray:
    """[n] bool: whether each of `values` is in `sorted_unique` (binary search: the training side is sorted once)."""
    if not len(sorted_unique):
        return np.zeros(len(values), bool)
    places = np.minimum(np.searchsorted(sorted_unique, values), len(sorted_unique) - 1)
    return sorted_unique[places] == values


# A pydoc section of members inherited from another class ("Methods inherited from pyarrow.lib.DataType:"),
# and the rule line between sections.
INHERITED = re.compile(r"^(?P<margin>[ |]*)\S[^:]* inherited from [\w.]+:\s*$")
RULE = re.compile(r"^[ |]*-{10,}\s*$")


def own_lines(text: str, template: frozenset[str]) -> list[tuple[str, list[str]]]:
    """(line, its words) for each line of `text` that the page says itself: pydoc's template lines left
    out, and its sections inherited from another class (that class's documentation, copied onto every
    subclass's page: its own page is where it is compared)."""
    lines, inherited = [], None
    for line in text.splitlines():
        if inherited is not None:
            if line.startswith(inherited) and not RULE.match(line):
                continue
            inherited = None
        if found := INHERITED.match(line):
            inherited = found["margin"].rstrip() or None  # a section outside a class margin: that line only
            continue
        tokens = words(line)
        if not tokens or " ".join(tokens) not in template:  # blank lines kept: they end a sentence
            lines.append((line, tokens))
    return lines


class TextHashes:
    """One text's own lines (`own_lines`) as word hashes, sentence hashes and the normalised sentences,
    for comparison and for naming an example."""

    def __init__(self, text: str, template: frozenset[str]):
        own = own_lines(text, template)
        self.tokens = [token for _, tokens in own for token in tokens]
        self.words = _hashes(self.tokens)
        self.numbers = np.array([token.isdigit() for token in self.tokens], dtype=bool)
        self.sentences = [" ".join(found) for piece in SENTENCE_END.split("\n".join(line for line, _ in own))
                          if len(found := words(piece)) >= MIN_SENTENCE_WORDS]
        self.sentence_hashes = np.array([hash(s) for s in self.sentences], dtype=np.int64).view(np.uint64)


class TrainingText:
    """Every training row's text as sorted hash arrays: its sentences, its 13-word runs (and, for short
    queries, its runs of 8-12 words, built when first asked), and its normalised queries."""

    def __init__(self, texts: Iterable[str], queries: Iterable[str], template: frozenset[str] | None = None):
        self.template = template_lines() if template is None else template
        hashed = [TextHashes(text, self.template) for text in dict.fromkeys(texts)]
        self._words = [(h.words, h.numbers) for h in hashed]
        self.sentences = np.unique(np.concatenate([h.sentence_hashes for h in hashed] + [np.zeros(0, np.uint64)]))
        self.runs = {NGRAM: self._runs(NGRAM)}
        self.queries = {" ".join(words(query)) for query in queries}
        self._shared = {}

    def _runs(self, length: int) -> np.ndarray:
        return np.unique(np.concatenate([run_hashes(w, length, numbers) for w, numbers in self._words]
                                        + [np.zeros(0, np.uint64)]))

    def runs_of(self, length: int) -> np.ndarray:
        if length not in self.runs:
            self.runs[length] = self._runs(length)
        return self.runs[length]

    def shared(self, text: str) -> str | None:
        """A sentence or 13-word run of `text` that training holds, or None (remembered per text: the
        demo's check reads again the pages `build_corpus` checked)."""
        if text not in self._shared:
            self._shared[text] = self._find_shared(text)
        return self._shared[text]

    def _find_shared(self, text: str) -> str | None:
        hashed = TextHashes(text, self.template)
        found = among(hashed.sentence_hashes, self.sentences)
        if found.any():
            return hashed.sentences[int(np.argmax(found))]
        found = among(run_hashes(hashed.words, NGRAM), self.runs[NGRAM])  # training holds no run of numbers alone
        if found.any():
            start = int(np.argmax(found))
            return " ".join(hashed.tokens[start:start + NGRAM])
        return None

    def query_in_training(self, query: str) -> str | None:
        """`query`, normalised, when it is a training query or (8+ words) occurs in a training text; or a
        sentence or 13-word run it shares with training; else None."""
        normalised = " ".join(tokens := words(query))
        if normalised in self.queries:
            return normalised
        if len(tokens) in QUERY_RUN_WORDS and among(run_hashes(_hashes(tokens), len(tokens)),
                                                     self.runs_of(len(tokens))).any():
            return normalised
        return self.shared(query)


def find_overlaps(training: TrainingText, task: str, documents: dict, queries: dict) -> list[str]:
    """What of `task`'s documents and queries training holds: one line each, naming the task and id."""
    found = []
    for doc_id, text in documents.items():
        if (shared := training.shared(text)) is not None:
            found.append(f"{task}: document {doc_id!r} shares {shared[:120]!r} with a training row")
    for query_id, query in queries.items():
        if (shared := training.query_in_training(query)) is not None:
            found.append(f"{task}: query {query_id!r} occurs in training ({shared[:120]!r})")
    return found


def check_disjoint(training: TrainingText | list[TrainingText], tasks: dict[str, tuple[dict, dict]]) -> dict[str, int]:
    """Every task ({name: (documents, queries)}) against `training` (one text or several); an
    `OverlapError` naming the first task that shares text and an example, with the count of all found.
    Returns {"tasks", "documents", "queries"}: what was checked."""
    sides = training if isinstance(training, list) else [training]
    found = list(dict.fromkeys(line for name, (documents, queries) in tasks.items() for side in sides
                               for line in find_overlaps(side, name, documents, queries)))
    if found:
        raise OverlapError(f"evaluation shares text with training ({len(found)} found; the first: {found[0]}): "
                           "evaluation would score what the model trained on, so training is refused", found)
    return {"tasks": len(tasks), "documents": sum(len(d) for d, _ in tasks.values()),
            "queries": sum(len(q) for _, q in tasks.values())}


def check_before_training(corpus: dict, rows: list[dict], genres=None) -> dict[str, int]:
    """`make demo`'s check before it trains: every evaluation task (`evaluation_texts`) against every
    training page and query of `corpus` (`training_text`) and the text of every row it trains on."""
    training = training_text(corpus)
    trained = TrainingText((text for row in rows for text in (row["query"], row["positive"], *row.get("negatives", ()))),
                           (row["query"] for row in rows), training.template)
    return check_disjoint([training, trained], evaluation_texts(corpus, genres))


_TRAINING = {}  # digest of the training items -> their TrainingText: built once per process


def training_text(corpus: dict) -> TrainingText:
    """The `TrainingText` of every training item of `corpus` (`training_items`: page and synopsis), the
    superset of any rows a run trains on (synopsis rows, deep-sentence rows cut from those pages)."""
    import hashlib

    from lmk_embed_tools.training.corpora import training_items

    items = training_items(corpus)
    digest = hashlib.sha1()
    for item in items:
        digest.update(item.synopsis.encode() + b"\0" + item.text.encode() + b"\0")
    key = digest.hexdigest()
    if key not in _TRAINING:
        _TRAINING[key] = TrainingText((text for item in items for text in (item.synopsis, item.text)),
                                      (item.synopsis for item in items))
    return _TRAINING[key]


def apart_from_training(corpus: dict) -> tuple[dict, dict[str, int]]:
    """(`corpus` less every evaluation item that shares text with a training item, {source: items left
    out}). Evaluation items: the held-out stdlib modules' and every non-training source's. Training keeps
    all its items; an evaluation page that repeats a training page's sentence or 13-word run (a docstring
    copied between libraries: scipy's phrasing of numpy's) is left out, as an identical page already is."""
    from lmk_embed_tools.training.corpora import TRAIN_SOURCES, is_held_out_module

    training = training_text(corpus)
    kept, dropped = {}, {}
    for source, items in corpus.items():
        evaluated = [source not in TRAIN_SOURCES or (source == "stdlib" and is_held_out_module(item.module))
                     for item in items]  # the complement of `training_items`
        kept[source] = [item for item, is_evaluated in zip(items, evaluated)
                        if not is_evaluated or (training.shared(item.text) is None
                                                and training.query_in_training(item.synopsis) is None)]
        if len(kept[source]) < len(items):
            dropped[source] = len(items) - len(kept[source])
    return kept, dropped


def evaluation_texts(corpus: dict, genres=None) -> dict[str, tuple[dict, dict]]:
    """Every evaluation task's texts, whatever a run samples of them: {kind: (documents, queries)}.

    - the 512 splits and deep tasks: every item (page and synopsis) of the held-out stdlib modules, the
      out-of-domain sources and the validation source (a deep task's query is a synopsis of its source,
      its page a source page less that line);
    - each long genre in `genres` (default every `GENRES`): every page and subject, read as `evaluate
      --task genre:*` reads them; a genre not installed raises ValueError naming it;
    - passkey and needle: every question and needle of their templates, with each first and last name
      they draw from (a needle's haystack is stdlib text by design: only the needle is asked for).
    """
    from lmk_embed_tools.evaluation.genres import GENRES, genre_pages
    from lmk_embed_tools.evaluation.synthetic import FIRST_NAMES, LAST_NAMES, NEEDLES, PASSKEY_QUERY
    from lmk_embed_tools.training.corpora import (OUT_OF_DOMAIN_SOURCES, RESERVED_DIRS, VALIDATION_SOURCE,
                                                  is_held_out_module, source_distributions)

    tasks = {}
    held_out = [item for item in corpus.get("stdlib", []) if is_held_out_module(item.module)]
    for name, items in [("512 split: stdlib held-out modules", held_out)] + [
            (f"deep:{source} and its 512 split", corpus.get(source, [])) for source in (*OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE)]:
        tasks[name] = ({item.name: item.text for item in items}, {item.name: item.synopsis for item in items})
    excluded = source_distributions()
    for genre in (GENRES if genres is None else genres):
        pages = genre_pages(genre, excluded=excluded, reserved_dirs=RESERVED_DIRS)
        tasks[f"genre:{genre} and genre:{genre}-subject"] = ({page.name: page.text for page in pages},
                                                             {page.name: page.subject for page in pages if page.subject})
    # Every template with every first and every last name (paired: a run of words holds one name).
    names = [f"{first} {last}" for first, last in zip(FIRST_NAMES, LAST_NAMES * len(FIRST_NAMES))]
    tasks["passkey"] = ({}, {f"{name}": PASSKEY_QUERY.format(name=name) for name in names})
    tasks["needle"] = ({f"{number}:{name}": fact.format(name=name) for number, (fact, _) in enumerate(NEEDLES) for name in names},
                       {f"{number}:{name}": question.format(name=name) for number, (_, question) in enumerate(NEEDLES)
                        for name in names})
    return tasks


__all__ = ["MIN_SENTENCE_WORDS", "NGRAM", "OverlapError", "TrainingText", "apart_from_training", "check_before_training", "check_disjoint",
           "evaluation_texts", "find_overlaps", "template_lines", "training_text"]
