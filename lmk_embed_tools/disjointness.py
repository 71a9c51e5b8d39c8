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

from lmk_embed_tools.training.corpora import apart_from_training, training_text
from lmk_embed_tools.training.overlap import (MIN_SENTENCE_WORDS, NGRAM, OverlapError, TrainingText, check_disjoint,
                                              find_overlaps, template_lines)


def check_before_training(corpus: dict, rows: list[dict], genres=None) -> dict[str, int]:
    """`make demo`'s check before it trains: every evaluation task (`evaluation_texts`) against every
    training page and query of `corpus` (`training_text`) and the text of every row it trains on."""
    training = training_text(corpus)
    trained = TrainingText((text for row in rows for text in (row["query"], row["positive"], *row.get("negatives", ()))),
                           (row["query"] for row in rows), training.template)
    return check_disjoint([training, trained], evaluation_texts(corpus, genres))


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
