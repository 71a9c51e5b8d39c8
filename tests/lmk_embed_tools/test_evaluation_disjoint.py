"""Evaluation is apart from training, by content: no evaluation document shares a normalised sentence
or a 13-word run with the text of any training row, and no evaluation query occurs in training.

The tasks are the real ones, built by the real functions: the demo's splits (`evaluation_splits`),
validation (`validation_split`), every `deep:*` source (`deep_task_corpus`, the same cross-source
deduplication as the splits) and every genre the machine has installed (its pages, which hold every
`genre:*` document and deep query, and their subjects). The training rows are the demo's: the
(synopsis, page) rows (`docs_training_rows`) and the deep-sentence rows (`deep_sentence_rows`).
Validation (its split and deep:systems), where settings are chosen, shares no page with a test task either.

Sampled, to stay cheap: rendering every corpus source takes minutes, so each source contributes the
modules of `SAMPLE` (rendered in this process; the cross-source deduplication runs on them as
`build_corpus` runs it on every module), and genre `book` reads its smallest installed book. A
planted overlap, a sentence or a 13-word run of a training page put into an evaluation document, or
a training synopsis asked as a query, is found.
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import pytest

from lmk_embed_tools.evaluation.genres import GENRES, genre_pages
from lmk_embed_tools.evaluation_jobs import deep_task_corpus
from lmk_embed_tools.retrieval_data import RetrievalData
from lmk_embed_tools.training import corpora
from lmk_embed_tools.training.corpora import (OUT_OF_DOMAIN_SOURCES, RESERVED_DIRS, SOURCES, VALIDATION_SOURCE,
                                              evaluation_splits, is_held_out_module, source_distributions, source_items,
                                              validation_split)
from lmk_embed_tools.training.long_pages import deep_sentence_rows
from lmk_embed_tools.training.recipe import docs_training_rows

# Modules per source: stdlib ones on both sides of the in-domain hold-out, one or two of every other source.
SAMPLE = {
    "stdlib": ("argparse", "pathlib", "tempfile", "difflib", "pickle", "json", "csv", "shutil", "heapq", "textwrap",
               "functools", "logging"),
    "torch": ("torch.optim",),
    "huggingface": ("tokenizers.normalizers", "huggingface_hub.utils"),
    "arrays": ("numpy.linalg", "numpy.fft"),
    "tools": ("packaging.version", "filelock"),
    "scientific": ("scipy.spatial.distance",),
    "symbolic": ("networkx.classes",),
    "systems": ("_pytest.monkeypatch", "pluggy"),
}
NGRAM = 13
MIN_SENTENCE_WORDS = 8  # shorter sentences ("Return the result.") are common phrasing, not a shared page
WORD = re.compile(r"\w+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")


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
    bases = [object, Exception, ValueError, list, dict, tuple, set, int, str, bytes, type, abc.ABC, typing.Generic[T],
             typing.Protocol, enum.Enum]
    classes = [types.new_class("Template", (base,)) for base in bases if base is not enum.Enum]
    classes.append(enum.Enum("Template", "A B"))
    classes.append(typing.NamedTuple("Template", [("a", int)]))
    return classes


def template_lines() -> set[str]:
    """The lines pydoc writes on pages whatever their subject ("Data descriptors defined here:",
    "__weakref__", a builtin's inherited docstring), as lower-cased words."""
    import pydoc

    lines = set()
    for cls in _template_classes():
        for line in pydoc.render_doc(cls, renderer=pydoc.plaintext).splitlines():
            if found := words(line.replace("Template", "")):
                lines.add(" ".join(found))
    return lines


TEMPLATE = template_lines()


def own_text(text: str) -> str:
    """`text` without pydoc's template lines (`TEMPLATE`)."""
    return "\n".join(line for line in text.splitlines() if " ".join(words(line)) not in TEMPLATE)


@functools.lru_cache(maxsize=None)  # a page is read by several checks
def normalised_sentences(text: str) -> frozenset[str]:
    """The sentences of `text`'s own lines of `MIN_SENTENCE_WORDS` words or more, as their lower-cased words."""
    return frozenset(" ".join(found) for piece in SENTENCE_END.split(own_text(text))
                     if len(found := words(piece)) >= MIN_SENTENCE_WORDS)


@functools.lru_cache(maxsize=None)
def ngrams(text: str) -> frozenset[tuple[str, ...]]:
    """The 13-word runs of `text`'s own lines."""
    tokens = words(own_text(text))
    return frozenset(tuple(tokens[i:i + NGRAM]) for i in range(len(tokens) - NGRAM + 1))


class TrainingText:
    """What training rows hold: the sentences and 13-word runs of one training page each (a run found on
    two or more pages is the template pydoc writes on every class page, "Data descriptors defined here:
    __dict__ ...", or a docstring inherited from builtins: shared phrasing, not a page), and the text of
    every row, where a query must not occur."""

    def __init__(self, rows: list[dict]):
        pages = {}  # a page's rows (its synopsis row, its deep-sentence row) count as one page
        for row in rows:
            pages.setdefault(row["name"], []).extend([row["query"], row["positive"], *row["negatives"]])
        self.sentences = self._of_one_page([set().union(*map(normalised_sentences, texts)) for texts in pages.values()])
        self.ngrams = self._of_one_page([set().union(*map(ngrams, texts)) for texts in pages.values()])
        self.queries = {" ".join(words(row["query"])) for row in rows}
        self.flat = "\n".join(" ".join(words(text)) for texts in pages.values() for text in texts)

    @staticmethod
    def _of_one_page(per_page: list[set]) -> set:
        counts = Counter(key for keys in per_page for key in keys)
        return {key for key, count in counts.items() if count == 1}

    def overlaps(self, task: str, documents: dict[str, str], queries: dict[str, str]) -> list[str]:
        """What of `documents` and `queries` training holds, named by task and id."""
        found = []
        for doc_id, text in documents.items():
            shared = sorted(normalised_sentences(text) & self.sentences) or sorted(map(" ".join, ngrams(text) & self.ngrams))
            if shared:
                found.append(f"{task} document {doc_id!r} shares {shared[0][:120]!r}")
        for query_id, query in queries.items():  # a training query, or a sentence long enough to be one page's
            normalised = " ".join(words(query))
            if normalised in self.queries or (len(normalised.split()) >= MIN_SENTENCE_WORDS and normalised in self.flat):
                found.append(f"{task} query {query_id!r} occurs in training: {query[:120]!r}")
        return found


@pytest.fixture(scope="module")
def corpus(monkeypatch_module):
    """`build_corpus` over every source, each rendered from its `SAMPLE` modules (in this process)."""
    monkeypatch_module.setattr(corpora, "_cached_source_items",
                               lambda source, cache: source_items(source, modules=list(SAMPLE[source])))
    return corpora.build_corpus(None, sources=SOURCES)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def training(corpus, minilm_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    rows = docs_training_rows(corpus, num_negatives=0) + deep_sentence_rows(corpus, tokenizer, content_tokens=480)
    assert {row["kind"] for row in rows if "kind" in row} == {"deep"} and len(rows) > 300
    return TrainingText(rows)


def evaluation_tasks(corpus, count_tokens) -> list[RetrievalData]:
    """The demo's splits, validation and every deep:* task, on `corpus`."""
    tasks = evaluation_splits(corpus) + [validation_split(corpus)]
    for source in (*OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE):
        deep = deep_task_corpus(source, lambda sources: {s: corpus[s] for s in sources})
        tasks.append(corpora.deep_evidence_split(deep, source, count_tokens, min_depth=100))
    return tasks


def genre_tasks() -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Per installed genre: (its pages' texts, its subjects), read as `evaluate --task genre:*` reads them;
    the smallest book only for `book`."""
    tasks = {}
    for genre in GENRES:
        root = None
        if genre == "book":
            from lmk_embed_tools.evaluation.genres import _is_book, rust_docs_root

            try:
                books = [p for p in rust_docs_root().iterdir() if p.is_dir() and _is_book(p)]
            except ValueError:
                continue
            smallest = min(books, key=lambda book: sum(1 for _ in book.rglob("*.html")))
            root = pytest.importorskip("tempfile").mkdtemp()
            (__import__("pathlib").Path(root) / smallest.name).symlink_to(smallest)
        try:
            pages = genre_pages(genre, excluded=source_distributions(), reserved_dirs=RESERVED_DIRS, root=root)
        except ValueError:  # not installed here
            continue
        tasks[genre] = ({page.name: page.text for page in pages}, {page.name: page.subject for page in pages if page.subject})
    return tasks


def test_the_sample_reaches_every_kind_of_task(corpus):
    held_out = {is_held_out_module(item.module) for item in corpus["stdlib"]}
    assert held_out == {True, False}
    assert all(corpus[source] for source in SOURCES)


@pytest.fixture(scope="module")
def tasks(corpus) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """Every evaluation task on `corpus` and every installed genre: {name: (documents, queries)}."""
    count_tokens = lambda texts: [len(words(text)) for text in texts]  # noqa: E731  (depths in words: any count will do)
    found = {task.name: (task.documents, task.queries) for task in evaluation_tasks(corpus, count_tokens)}
    assert all(documents for documents, _ in found.values()), [name for name, (documents, _) in found.items() if not documents]
    genres = genre_tasks()
    assert genres, "no genre is installed"
    return found | {f"genre:{genre}": pages_and_subjects for genre, pages_and_subjects in genres.items()}


def test_no_evaluation_task_shares_text_with_training(tasks, training):
    found = [overlap for name, (documents, queries) in tasks.items() for overlap in training.overlaps(name, documents, queries)]
    assert not found, "\n".join(found[:20])


def test_validation_shares_no_page_with_a_test_task(tasks):
    """A choice made on validation (the validation split, deep:systems) is made on pages no test task holds."""
    tested = dict(tasks)
    validation = {name: tested.pop(name) for name in tasks if VALIDATION_SOURCE in name}
    assert len(validation) == 2
    rows = [{"name": doc_id, "query": queries.get(doc_id, ""), "positive": text, "negatives": []}
            for documents, queries in validation.values() for doc_id, text in documents.items()]
    chosen_on = TrainingText(rows)
    found = [overlap for name, (documents, queries) in tested.items() for overlap in chosen_on.overlaps(name, documents, queries)]
    assert not found, "\n".join(found[:20])


def test_a_planted_overlap_is_found(corpus, training):
    items = corpora.training_items(corpus)
    sentence = next(s for item in items for s in sorted(normalised_sentences(item.text)) if s in training.sentences)
    run = next(" ".join(gram) for item in items for gram in sorted(ngrams(item.text)) if gram in training.ngrams)
    assert training.overlaps("planted", {"d": f"Unrelated words here. {sentence}. More words."}, {}) != []
    assert training.overlaps("planted", {"d": f"zebra {run} zebra"}, {}) != []
    assert training.overlaps("planted", {}, {"q": items[0].synopsis}) != []
    assert training.overlaps("clean", {"d": "A page that no training row holds, in words of its own."}, {"q": "zebra"}) == []


def test_training_and_evaluation_pick_a_deep_sentence_by_one_rule():
    """Training's deep-sentence rows and evaluation's deep tasks choose their query sentences by one rule."""
    from lmk_embed_tools import retrieval_data
    from lmk_embed_tools.evaluation import genres
    from lmk_embed_tools.training import long_pages

    assert long_pages.is_prose is genres.is_prose is retrieval_data.is_prose
    assert long_pages.SENTENCE_SPLIT is genres.SENTENCE_SPLIT is retrieval_data.SENTENCE_SPLIT
    text = "Call f(x) = y; then return it to the caller at once.\n\nThe parser reads every line of the file in order."
    assert [s for _, s in long_pages.sentences(text)] == ["The parser reads every line of the file in order."]
