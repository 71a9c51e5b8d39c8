"""Text overlap by content: sentence hashes and 13-word runs (`TrainingText`), the core of
`lmk_embed_tools.disjointness` (which checks every evaluation task before `make demo` trains) and
of `corpora.build_corpus` (which leaves out the evaluation pages that repeat training text). It
imports nothing of the package, so both can use it.
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


__all__ = ["MIN_SENTENCE_WORDS", "NGRAM", "OverlapError", "TrainingText", "check_disjoint", "find_overlaps",
           "template_lines"]
