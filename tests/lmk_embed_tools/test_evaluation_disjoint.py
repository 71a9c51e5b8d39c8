"""Evaluation is apart from training, by content (`lmk_embed_tools.disjointness`), over everything: every
evaluation task's documents and queries against every training page, query and row, by sentence hashes
and 13-word runs, none dropped for being on several pages.

- A planted overlap in each kind of task (the 512 split's held-out modules, each deep source, a long
  genre's page and its subject, passkey and needle queries) is refused by the check `make demo` runs
  before it trains, in one error naming the task and an example; a clean corpus passes.
- The real pipeline: `build_corpus` over every source (each rendered from a few modules, to stay cheap;
  the check itself has no sample) leaves out the evaluation pages that repeat a training page's text,
  and then no evaluation task nor any installed genre shares text with the demo's training rows.
"""

from __future__ import annotations

import pytest

from lmk_embed_tools import disjointness
from lmk_embed_tools.disjointness import OverlapError, TrainingText, check_before_training, check_disjoint
from lmk_embed_tools.evaluation import genres as genre_module
from lmk_embed_tools.evaluation.genres import GenrePage
from lmk_embed_tools.training import corpora
from lmk_embed_tools.training.corpora import (OUT_OF_DOMAIN_SOURCES, SOURCES, TRAIN_SOURCES, VALIDATION_SOURCE, DocItem,
                                              is_held_out_module, source_items)

TRAINING_SENTENCE = "The spindle counter rotates every bracket twice before the lantern closes its ledger."
TRAINING_RUN = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november"


def item(source: str, module: str, name: str, synopsis: str, text: str) -> DocItem:
    return DocItem(source, module, f"{module}.{name}", "class", synopsis, text)


def held_out_and_trained_modules() -> tuple[str, str]:
    modules = [f"module{n}" for n in range(200)]
    return next(m for m in modules if is_held_out_module(m)), next(m for m in modules if not is_held_out_module(m))


def small_corpus(**planted) -> dict[str, list[DocItem]]:
    """A corpus of invented pages, one per source (and a held-out stdlib module), each its own words;
    `planted` {source: text} appends text to that source's evaluation page."""
    held_out, trained = held_out_and_trained_modules()
    corpus = {source: [] for source in SOURCES}
    corpus["stdlib"].append(item("stdlib", trained, "Ledger", "keeps the spindle ledger",
                                 f"{TRAINING_SENTENCE}\n{TRAINING_RUN}\nIt also keeps seven quiet lanterns beside the gate."))
    for number, source in enumerate(TRAIN_SOURCES[1:]):
        corpus[source].append(item(source, f"train{number}", "Thing", f"trains thing {number}",
                                   f"Training page {number} talks about orchards, rivers and number {number} only."))
    for number, source in enumerate(("stdlib", *OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE)):
        module = held_out if source == "stdlib" else f"eval{number}"
        text = f"Evaluation page {number} describes copper kettles and violet mountains in its own words."
        corpus[source].append(item(source, module, "Kettle", f"evaluation kettle {number}",
                                   text + ("\n" + planted[source] if source in planted else "")))
    return corpus


@pytest.fixture
def small_genres(monkeypatch):
    """Every genre as two invented pages (subjects included); `pages[genre]` may be edited to plant text."""
    pages = {genre: [GenrePage(f"{genre}-{n}", f"the {genre} subject number {n}",
                               f"A {genre} page, number {n}, about herons and the tides of a distant shore.")
                     for n in range(2)] for genre in genre_module.GENRES}
    monkeypatch.setattr(genre_module, "genre_pages", lambda genre, **_: pages[genre])
    return pages


def test_a_clean_corpus_passes_and_every_kind_of_task_is_checked(small_genres):
    checked = check_before_training(small_corpus(), [])
    kinds = 1 + len(OUT_OF_DOMAIN_SOURCES) + 1 + len(genre_module.GENRES) + 2  # 512 split, deep sources, genres, synthetic
    assert checked["tasks"] == kinds and checked["documents"] > 0 and checked["queries"] > 0


def test_an_overlap_planted_in_each_kind_of_task_is_refused(small_genres):
    """A training sentence, or a 13-word run inside other words, in a split's or a deep task's page; a
    training sentence in each genre's page and a training synopsis as its subject; a passkey and a
    needle question asked by a training row: each is found, and training refused in one error."""
    from lmk_embed_tools.evaluation.synthetic import FIRST_NAMES, LAST_NAMES, NEEDLES, PASSKEY_QUERY

    planted = {source: TRAINING_SENTENCE if number % 2 else f"zebra {TRAINING_RUN} zebra"
               for number, source in enumerate(("stdlib", *OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE))}
    for genre in genre_module.GENRES:
        page = small_genres[genre][1]
        small_genres[genre][1] = GenrePage(page.name, "keeps the spindle ledger", f"{page.text}\n{TRAINING_SENTENCE}")
    name = f"{FIRST_NAMES[0]} {LAST_NAMES[0]}"
    rows = [{"query": question.format(name=name), "positive": "An invented page.", "negatives": []}
            for question in (PASSKEY_QUERY, NEEDLES[3][1])]
    with pytest.raises(OverlapError, match="so training is refused") as refused:
        check_before_training(small_corpus(**planted), rows)
    found = refused.value.found
    expected = ["512 split: stdlib held-out modules: document"]
    expected += [f"deep:{source} and its 512 split: document" for source in (*OUT_OF_DOMAIN_SOURCES, VALIDATION_SOURCE)]
    expected += [f"genre:{genre} and genre:{genre}-subject: {kind} '{genre}-1'" for genre in genre_module.GENRES
                 for kind in ("document", "query")]
    expected += ["passkey: query", "needle: query"]
    missing = [start for start in expected if not any(line.startswith(start) for line in found)]
    assert not missing, missing
    assert "\n" not in str(refused.value) and f"({len(found)} found; the first: 512 split" in str(refused.value)


def test_a_trained_rows_text_counts_as_training(small_genres):
    """A row's text outside the corpus's training pages (a window row, a negative) is training too."""
    corpus = small_corpus()
    page = corpus["scientific"][0].text
    row = {"query": "an invented query", "positive": "Nothing here.", "negatives": [page]}
    with pytest.raises(OverlapError, match="deep:scientific"):
        check_before_training(corpus, [row])


def test_nothing_is_dropped_for_being_common():
    """A sentence on many training pages still counts; only pydoc's template lines and the sections a
    page inherits from another class are not the page's own."""
    training = TrainingText([f"Page {n}. {TRAINING_SENTENCE}" for n in range(5)], [])
    assert training.shared(f"Other words. {TRAINING_SENTENCE}") is not None
    template = " |  Data descriptors defined here:\n |  \n |  __dict__\n |      dictionary for instance variables"
    inherited = (" |  Methods inherited from builtins.object:\n |  \n |  " + TRAINING_SENTENCE + "\n |  \n"
                 " |  ------------------------------------------------------------\n |  Own section:\n |  Fresh words.")
    assert TrainingText([template * 3], []).shared(template) is None
    assert TrainingText([TRAINING_SENTENCE], []).shared(inherited) is None
    assert TrainingText([TRAINING_SENTENCE], []).shared(inherited.replace("Fresh words.", TRAINING_SENTENCE)) is not None


def test_a_run_is_found_across_lines_and_a_short_query_inside_a_sentence():
    training = TrainingText([f"zebra {TRAINING_RUN} zebra"], ["keeps the spindle ledger"])
    words = TRAINING_RUN.split()
    assert training.shared(" ".join(words[:6]) + "\n" + " ".join(words[6:])) is not None
    assert training.shared(" ".join(words[:12])) is None  # 12 words: not a 13-word run
    assert training.query_in_training("Keeps the SPINDLE ledger!") is not None  # a training query, normalised
    assert training.query_in_training(" ".join(words[2:11])) is not None  # 9 words inside a training text
    assert training.query_in_training("an unrelated question about copper kettles") is None


def test_a_genre_not_installed_is_named(monkeypatch):
    def missing(genre, **_):
        raise ValueError(f"genre {genre!r}: not installed here")

    monkeypatch.setattr(genre_module, "genre_pages", missing)
    with pytest.raises(ValueError, match="genre 'readme': not installed"):
        check_before_training(small_corpus(), [])


# ---- the real pipeline, on a few modules of every source ---------------------------------------------

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


@pytest.fixture(scope="module")
def corpus():
    """`build_corpus` over every source, each rendered from its `SAMPLE` modules (in this process)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(corpora, "_cached_source_items", lambda source, cache: source_items(source, modules=list(SAMPLE[source])))
        yield corpora.build_corpus(None, sources=SOURCES)


def test_the_sample_reaches_every_kind_of_task(corpus):
    assert {is_held_out_module(item.module) for item in corpus["stdlib"]} == {True, False}
    assert all(corpus[source] for source in SOURCES)


def test_no_evaluation_task_shares_text_with_the_demos_training_rows(corpus, minilm_path):
    """The demo's rows (synopsis rows and deep-sentence rows) and every installed genre's pages."""
    from transformers import AutoTokenizer

    from lmk_embed_tools.training.long_pages import deep_sentence_rows
    from lmk_embed_tools.training.recipe import docs_training_rows

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path))
    rows = docs_training_rows(corpus, num_negatives=0) + deep_sentence_rows(corpus, tokenizer, content_tokens=480)
    installed = []
    for genre in genre_module.GENRES:
        try:
            genre_module.genre_pages(genre, excluded=corpora.source_distributions(), reserved_dirs=corpora.RESERVED_DIRS)
            installed.append(genre)
        except ValueError:  # reported: the demo's check refuses a missing genre
            print(f"genre {genre} is not installed here")
    checked = check_before_training(corpus, rows, genres=installed)
    assert checked["documents"] > 100 and checked["queries"] > 100


def test_build_corpus_leaves_out_what_an_evaluation_page_repeats(corpus):
    """Every evaluation item left in the corpus passes the check, and a planted copy is left out."""
    training = disjointness.training_text(corpus)
    evaluated = [item for source, items in corpus.items() for item in items
                 if source not in TRAIN_SOURCES or (source == "stdlib" and is_held_out_module(item.module))]
    assert evaluated and all(training.shared(item.text) is None for item in evaluated)
    trained = next(item for item in corpus["stdlib"] if not is_held_out_module(item.module) and training.shared(item.text))
    copy = DocItem("scientific", "copied", "copied.Page", "class", "a page of its own", trained.text)
    kept, dropped = disjointness.apart_from_training({**corpus, "scientific": [*corpus["scientific"], copy]})
    assert dropped == {"scientific": 1} and copy not in kept["scientific"]
    assert check_disjoint(training, {"scientific": ({i.name: i.text for i in kept["scientific"]}, {})})["documents"] > 0


def test_training_and_evaluation_pick_a_deep_sentence_by_one_rule():
    """Training's deep-sentence rows and evaluation's deep tasks choose their query sentences by one rule."""
    from lmk_embed_tools import retrieval_data
    from lmk_embed_tools.evaluation import genres
    from lmk_embed_tools.training import long_pages

    assert long_pages.is_prose is genres.is_prose is retrieval_data.is_prose
    assert long_pages.SENTENCE_SPLIT is genres.SENTENCE_SPLIT is retrieval_data.SENTENCE_SPLIT
    text = "Call f(x) = y; then return it to the caller at once.\n\nThe parser reads every line of the file in order."
    assert [s for _, s in long_pages.sentences(text)] == ["The parser reads every line of the file in order."]


def test_runs_of_numbers_alone_are_not_words():
    numbers = " ".join(str(n) for n in range(2, 30))
    training = TrainingText([f"Counts follow: {numbers}."], [])
    assert training.shared(f"Sizes are: {numbers}.") is None
    assert TrainingText([f"matrix {numbers}"], []).shared(f"matrix {numbers}") is not None
