"""The held-out genres: built from a source folder (a fake METADATA tree, a fake mdBook), deterministic,
the deep sentence out of its page and from its second half, no overlap with the corpus sources."""

import argparse
import random
import re
from importlib import metadata
from pathlib import Path

import pytest

from lmk_embed_tools.commandline import UsageError
from lmk_embed_tools.evaluation import genres
from lmk_embed_tools.evaluation.genres import (book_pages, chapter_text, deep_evidence_task, readme_pages,
                                               readme_text, subject_task)

WORDS = ("river stone garden lantern market harbor meadow engine signal archive window ladder orchard compass "
         "thread valley beacon candle mirror violin basket castle forest planet rocket saddle tunnel wagon").split()


def prose(seed: str, sentences: int) -> str:
    """Paragraphs of seeded ten-word sentences (wrapped like a README), unique per seed."""
    rng = random.Random(seed)
    lines = [" ".join(["The"] + rng.choices(WORDS, k=8) + [f"{seed.replace('-', '')}{i}."]) for i in range(sentences)]
    return "\n\n".join("\n".join(lines[i:i + 5]) for i in range(0, len(lines), 5))


def count_words(texts):
    return [len(text.split()) for text in texts]


def write_distribution(site: Path, name: str, summary: str, body: str) -> metadata.Distribution:
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nSummary: {summary}\n"
                                   f"Description-Content-Type: text/markdown\n\n{body}\n")
    return metadata.PathDistribution(info)


@pytest.fixture
def site(tmp_path):
    """Five long READMEs, a short one, a corpus one and this project."""
    site = tmp_path / "site"
    badge = "[![build](https://ci.example/badge.svg)](https://ci.example)\n<p align='center'>Hi</p>\n"
    for index, name in enumerate(["alpha", "beta-pkg", "gamma", "delta", "epsilon"]):
        body = f"{badge}# {name}\n\nSee [the docs](https://docs.example/{name}) first.\n\n{prose(name, 160)}"
        write_distribution(site, name, f"The {name} package does many useful things well", body)
    write_distribution(site, "tiny", "A short description for tiny", prose("tiny", 20))
    write_distribution(site, "scikit-learn", "Machine learning in Python here", prose("sk", 160))
    write_distribution(site, "lmk-embed", "Long context text embedders here", prose("lmk", 160))
    return site


def distributions(site):
    return list(metadata.distributions(path=[str(site)]))


def test_readme_pages_clean_dedupe_and_exclude(site):
    pages = readme_pages(distributions(site), excluded={"scikit_learn"})
    assert [p.name for p in pages] == ["alpha", "beta-pkg", "delta", "epsilon", "gamma"]  # sorted, one per name
    alpha = pages[0]
    assert alpha.subject == "The alpha package does many useful things well"
    assert "https://" not in alpha.text and "badge" not in alpha.text and "<p" not in alpha.text
    assert "See the docs first." in alpha.text
    assert pages == readme_pages(list(reversed(distributions(site))), excluded={"Scikit-Learn"})  # order-free


def test_a_name_or_a_text_seen_twice_is_kept_once(site, tmp_path):
    later = tmp_path / "later"
    write_distribution(later, "Beta_Pkg", "A second copy of beta", prose("other", 160))  # later on the path
    alpha = next(d for d in distributions(site) if d.metadata["Name"] == "alpha").metadata.get_payload()
    write_distribution(later, "zeta", "The zeta package does many useful things well", alpha)  # alpha's text
    pages = readme_pages(distributions(site) + distributions(later), excluded={"scikit_learn"})
    assert [p.name for p in pages] == ["alpha", "beta-pkg", "delta", "epsilon", "gamma"]
    assert pages[1].subject == "The beta-pkg package does many useful things well"  # the first found, as importlib


def test_readme_text_keeps_link_text_and_drops_images():
    text = readme_text(".. image:: https://x/y.svg\n   :target: https://x\n|pypi| |build|_\n\nRead `the guide <https://g.example>`_ "
                       "and [this][ref] or <a href='https://h'>that</a> at https://bare.example now.\n\n"
                       "[ref]: https://ref.example\n![logo](logo.png)")
    assert text == "Read the guide and this or that at now."


def test_a_summary_found_in_another_page_or_too_short_is_no_query(tmp_path):
    site = tmp_path / "site"
    write_distribution(site, "one", "Shared words in two pages here", prose("one", 160))
    write_distribution(site, "two", "Too short", prose("two", 160) + "\n\nShared words in two pages here")
    pages = readme_pages(distributions(site))
    assert [p.subject for p in pages] == ["", ""]
    assert "Shared words in two pages here" in pages[1].text  # not its own summary: it stays


def test_readme_genre_is_disjoint_from_every_corpus_source():
    """On the installed set: no page of a distribution that a training, validation or evaluation source
    reads (found from the import names, independently of the exclusion list), nor of this project."""
    from lmk_embed_tools.training.corpora import RESERVED_DIRS, SOURCE_MODULES, source_distributions

    names = {p.name for p in readme_pages(excluded=source_distributions(), reserved_dirs=RESERVED_DIRS)}
    installed = metadata.packages_distributions()
    used = {genres.normalized_name(dist) for modules in SOURCE_MODULES.values() for module in modules
            for dist in installed.get(module.split(".")[0], [])}
    assert {"torch", "numpy", "scipy", "sympy", "pytest", "transformers"} <= used
    assert not names & used
    assert "lmk-embed" not in names


def write_book(folder: Path, chapters: dict[str, tuple[str, str]], script: str = "book-1a2b.js"):
    """An mdBook folder: index.html, its script, one page per chapter ({path: (title, body)}) and print.html."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / script).write_text("")
    page = ("<html><nav><p>Table of contents: {title}</p></nav><main><h1 id='x'><a href='#x'>{title}</a></h1>\n"
            "{body}<pre><code>fn main() {{\n    println!(\"hi\");\n}}</code></pre><script>var s = 1;</script>"
            "</main><footer>footer words</footer></html>")
    (folder / "index.html").write_text(page.format(title="Index", body="<p>short</p>"))
    (folder / "print.html").write_text(page.format(title="All", body="".join(b for _, b in chapters.values())))
    for path, (title, body) in chapters.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(page.format(title=title, body=body))


def paragraphs(seed: str, sentences: int = 160) -> str:
    return "".join(f"<p>{p}</p>\n" for p in prose(seed, sentences).split("\n\n"))


@pytest.fixture
def html_root(tmp_path):
    root = tmp_path / "html"
    write_book(root / "guide", {"ch01.html": ("Ownership and Borrowing", paragraphs("g1")),
                                "ch02/intro.html": ("Introduction", paragraphs("g2")),
                                "ch03.html": ("Traits", paragraphs("g3")),
                                "short.html": ("Short Chapter", paragraphs("g4", 10))})
    write_book(root / "guide" / "ja", {"ch01.html": ("Translated", paragraphs("ja"))}, script="book.js")  # nested
    write_book(root / "manual", {"a.html": ("Traits", paragraphs("m1")), "b.html": ("Closures in Depth", paragraphs("m2")),
                                 "c.html": ("Pattern Syntax", paragraphs("m3"))})
    (root / "notabook").mkdir()
    (root / "notabook" / "x.html").write_text(f"<main><h1>Loose</h1>{paragraphs('nb')}</main>")
    return root


def test_book_pages_read_main_content_and_skip_nested_books(html_root):
    pages = book_pages(html_root)
    assert [p.name for p in pages] == ["guide/ch01", "guide/ch02/intro", "guide/ch03", "manual/a", "manual/b", "manual/c"]
    subjects = {p.name: p.subject for p in pages}
    # "Introduction" is generic and "Traits" names two chapters: neither is a query.
    assert subjects == {"guide/ch01": "Ownership and Borrowing", "guide/ch02/intro": "", "guide/ch03": "",
                        "manual/a": "", "manual/b": "Closures in Depth", "manual/c": "Pattern Syntax"}
    text = pages[0].text
    assert "Ownership and Borrowing" not in text and "Table of contents" not in text and "footer" not in text
    assert "var s" not in text and "println!" in text
    assert book_pages(html_root) == pages


def test_chapter_text_takes_the_first_h1_else_h2():
    title, text = chapter_text("<main><h2>Section</h2><p>Words\n  wrapped here.</p><h1>Chapter</h1><p>More.</p></main>")
    assert (title, text) == ("Chapter", "Section\n\nWords wrapped here.\n\nMore.")
    assert chapter_text("<main><h2>Only <code>h2</code></h2><p>Body.</p></main>") == ("Only h2", "Body.")


def test_missing_books_name_what_is_missing(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no mdBook"):
        book_pages(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no rustc
    with pytest.raises(ValueError, match="rustc"):
        genres.rust_docs_root()


def test_reserved_folders_are_never_read(html_root, site, tmp_path, monkeypatch):
    reserved = html_root / "man"
    write_book(reserved, {"a.html": ("Reserved Chapter", paragraphs("r1"))})
    write_book(html_root / "guide" / "man", {"a.html": ("Reserved Too", paragraphs("r2"))}, script="x.js")
    (html_root / "guide" / "man" / "index.html").unlink()  # not a nested book: only reserved keeps it out
    man_site = tmp_path / "man-site"
    write_distribution(man_site, "manpkg", "A reserved distribution here", prose("man", 160))
    read = []
    real_read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self) or real_read_text(self, *a, **k))
    real_dist_read = metadata.PathDistribution.read_text
    monkeypatch.setattr(metadata.PathDistribution, "read_text",
                        lambda self, name: read.append(self._path / name) or real_dist_read(self, name))
    folders = (str(reserved), str(html_root / "guide" / "man"), str(man_site))
    pages = book_pages(html_root, reserved_dirs=folders)
    readmes = readme_pages(distributions(site) + distributions(man_site), reserved_dirs=folders)
    assert read and not [p for p in read if genres.is_under(p, folders)]
    assert not [p for p in pages if "man" in p.name.split("/")] and "manpkg" not in [p.name for p in readmes]
    assert "guide/man/a" in [p.name for p in book_pages(html_root)]  # it is a chapter when not reserved
    with pytest.raises(ValueError, match="reserved"):
        book_pages(reserved, reserved_dirs=folders)


def words_before(text: str, fragment: str) -> int:
    return len(text[:text.index(fragment)].split())


@pytest.mark.parametrize("source", ["readme", "book"])
def test_deep_evidence_queries_come_from_the_second_half_and_leave_their_page(source, site, html_root):
    pages = readme_pages(distributions(site)) if source == "readme" else book_pages(html_root)
    data = deep_evidence_task(source, pages, count_words, min_depth=600, max_depth=3800, max_queries=3, max_documents=5)
    again = deep_evidence_task(source, pages, count_words, min_depth=600, max_depth=3800, max_queries=3, max_documents=5)
    assert data == again and data.name == f"{source} deep evidence"
    assert len(data.queries) == 3 and len(data.documents) == min(5, len(pages))
    originals = {p.name: p.text for p in pages}
    flat = {name: " ".join(text.split()) for name, text in originals.items()}
    for query_id, query in data.queries.items():
        assert data.relevant[query_id] == {query_id: 1}
        page = flat[query_id]
        assert 8 <= len(query.split()) <= 60 and page.count(query) == 1
        assert page.index(query) >= len(page) / 2 - 1  # in the second half (spaces collapsed)
        assert 600 <= words_before(page, query) <= 3800
        assert query not in " ".join(data.documents[query_id].split())
        assert not [n for n, t in flat.items() if n != query_id and query in t]
    fillers = set(data.documents) - set(data.queries)
    assert all(data.documents[n] == originals[n] for n in fillers)
    other = deep_evidence_task(source, pages, count_words, max_queries=3, max_documents=5, seed=1)
    assert other.queries != data.queries


def test_deep_evidence_respects_depth_and_sizes(site):
    pages = readme_pages(distributions(site))
    assert deep_evidence_task("readme", pages, count_words, max_depth=500).queries == {}  # the second half starts deeper
    data = deep_evidence_task("readme", pages, count_words, max_queries=10, max_documents=2)
    assert len(data.documents) == 2 and len(data.queries) == 2
    with pytest.raises(ValueError, match="max_documents"):
        deep_evidence_task("readme", pages, count_words, max_documents=0)


def test_a_deep_sentence_found_in_another_page_is_no_query(tmp_path):
    site = tmp_path / "site"
    text = prose("solo", 200)
    tail = [s for s in re.split(r"(?<=\.)\s+", text) if s][100:]
    write_distribution(site, "solo", "The solo package summary line", text)
    write_distribution(site, "copycat", "The copycat package summary line", prose("copy", 160) + "\n\n" + " ".join(tail))
    pages = readme_pages(distributions(site))
    data = deep_evidence_task("readme", pages, count_words, max_queries=10, max_documents=10)
    assert "solo" not in data.queries  # every sentence of its second half is in copycat too


def test_subject_task_asks_the_summary_of_pages_that_have_one(html_root):
    pages = book_pages(html_root)
    data = subject_task("book", pages, max_queries=10, max_documents=4)
    assert data == subject_task("book", pages, max_queries=10, max_documents=4)
    with_subject = {p.name: p.subject for p in pages if p.subject}
    assert data.queries == {name: with_subject[name] for name in data.queries} and len(data.queries) >= 2
    assert len(data.documents) == 4 and data.name == "book subject"


def test_genre_tasks_on_the_command_line(monkeypatch):
    from lmk_embed_tools import evaluation_jobs

    args = argparse.Namespace(task=["genre:poem"], max_lengths=[512], queries=5, documents=10, seed=0)
    with pytest.raises(UsageError, match="genre:readme"):
        evaluation_jobs.task_jobs(args, None)
    args.task = ["genre:readme"]
    with pytest.raises(UsageError, match="--tokenizer"):
        evaluation_jobs.task_jobs(args, None)

    def no_books(*a, **k):
        raise ValueError("genre 'book': no Rust documentation here")

    monkeypatch.setattr(genres, "rust_docs_root", no_books)
    args.task = ["genre:book-subject"]
    with pytest.raises(UsageError, match="no Rust documentation"):
        evaluation_jobs.task_jobs(args, None)
    args.task, args.max_lengths = ["genre:readme-subject"], [256, 512]
    jobs = evaluation_jobs.task_jobs(args, None)
    assert [(name, length) for name, length, _ in jobs] == [("readme subject", 256), ("readme subject", 512)]
    assert jobs[0][2] is jobs[1][2] and 0 < len(jobs[0][2].queries) <= 5


# ---- notes and nodeapi: files under a system folder ---------------------------------------------------


def bullets(seed: str, sentences: int) -> str:
    """`prose` as release notes: each paragraph a bullet, wrapped with a hanging indent, then a merge note."""
    return "\n\n".join(" * " + "\n   ".join(paragraph.splitlines()) + "\n   (merge 1a2b3c4d xx/topic later to maint)."
                       for paragraph in prose(seed, sentences).split("\n\n"))


@pytest.fixture
def notes_root(tmp_path):
    """Three long releases (one gzipped), a short one."""
    import gzip

    root = tmp_path / "RelNotes"
    root.mkdir()
    for version in ("2.1.0", "2.3.0"):
        (root / f"{version}.txt").write_text(f"Git {version} Release Notes\n=====\n\nUpdates since\n-----\n\n{bullets(version, 160)}\n")
    with gzip.open(root / "2.2.0.txt.gz", "wt") as file:
        file.write(f"Git v2.2.0 Release Notes\n========\n\n{bullets('2.2.0', 160)}\n")
    (root / "2.0.1.txt").write_text(f"Git 2.0.1\n====\n\n{bullets('2.0.1', 20)}\n")
    return root


@pytest.fixture
def node_root(tmp_path):
    """Markdown module pages (one gzipped), `all` and `index`, a generic title and a shared one."""
    import gzip

    root = tmp_path / "api"
    root.mkdir()

    def page(title, seed):
        return (f"# {title}\n\n<!--introduced_in=v0.10.0-->\n\n> Stability: 2 - Stable\n\nSee [the guide](https://x.example/{seed}) "
                f"first.\n\n```js\nconst secret = require('code{seed}');\n```\n\n## Methods\n\n{prose(seed, 160)}\n")

    for name, title in (("fs", "File system"), ("net", "Net"), ("cluster", "Modules"), ("module", "Modules"),
                        ("documentation", "About"), ("all", "All"), ("index", "Index")):
        (root / f"{name}.md").write_text(page(title, name))
    with gzip.open(root / "http.md.gz", "wt") as file:
        file.write(page("HTTP", "http"))
    (root / "tiny.md").write_text(page("Tiny", "tiny").replace(prose("tiny", 160), prose("tiny", 10)))
    return root


def test_notes_pages_read_plain_and_gzipped_files_cleaned(notes_root):
    pages = genres.notes_pages(notes_root)
    assert [p.name for p in pages] == ["2.1.0", "2.2.0", "2.3.0"] and not any(p.subject for p in pages)
    text = pages[1].text
    assert "Release Notes" not in text and "===" not in text and "---" not in text and " * " not in text
    assert "merge" not in text and "\n" not in text.replace("\n\n", "")  # a bullet is one line, its own paragraph
    assert pages == genres.notes_pages(notes_root) == genres.genre_pages("notes", root=notes_root)


def test_nodeapi_pages_drop_code_links_and_comments(node_root):
    pages = genres.nodeapi_pages(node_root)
    assert [p.name for p in pages] == ["cluster", "documentation", "fs", "http", "module", "net"]  # no all, index, tiny
    subjects = {p.name: p.subject for p in pages}
    assert subjects == {"cluster": "", "documentation": "", "fs": "File system", "http": "HTTP", "module": "", "net": "Net"}
    fs = pages[2].text
    assert "File system" not in fs and "secret" not in fs and "https://" not in fs and "introduced_in" not in fs
    assert "See the guide first." in fs and "Methods" in fs and "#" not in fs
    assert pages == genres.genre_pages("nodeapi", root=node_root)


@pytest.mark.parametrize("genre", ["notes", "nodeapi"])
def test_notes_and_nodeapi_deep_queries_leave_their_page_from_its_second_half(genre, notes_root, node_root):
    pages = genres.genre_pages(genre, root=notes_root if genre == "notes" else node_root)
    data = deep_evidence_task(genre, pages, count_words, max_queries=3, max_documents=5)
    assert data == deep_evidence_task(genre, pages, count_words, max_queries=3, max_documents=5)
    assert len(data.queries) == 3 and len(data.documents) == min(5, len(pages))
    for name, query in data.queries.items():
        text = next(p.text for p in pages if p.name == name)
        assert query not in " ".join(data.documents[name].split())
        assert 600 <= words_before(text, query.split()[-1]) and text.index(query.split()[-1]) >= len(text) / 2


def test_missing_notes_or_node_folder_names_it(tmp_path, monkeypatch):
    from lmk_embed_tools import evaluation_jobs

    for genre in ("notes", "nodeapi"):
        with pytest.raises(ValueError, match=re.escape(str(tmp_path / "none"))):
            genres.genre_pages(genre, root=tmp_path / "none")
    monkeypatch.setattr(genres, "NODE_API_ROOT", tmp_path / "none")
    args = argparse.Namespace(task=["genre:nodeapi-subject"], max_lengths=[512], queries=5, documents=10, seed=0)
    with pytest.raises(UsageError, match=f"genre 'nodeapi': no \\*.md files under '{re.escape(str(tmp_path / 'none'))}'"):
        evaluation_jobs.task_jobs(args, None)
    args.task = ["genre:notes-subject"]
    with pytest.raises(UsageError, match="no natural queries"):
        evaluation_jobs.task_jobs(args, None)


def test_notes_and_nodeapi_never_read_reserved_folders(notes_root, node_root, monkeypatch):
    read = []
    real_read = genres._read
    monkeypatch.setattr(genres, "_read", lambda path: read.append(path) or real_read(path))
    reserved = (str(notes_root / "2.2.0.txt.gz"), "/usr/share/man")
    assert [p.name for p in genres.notes_pages(notes_root, reserved_dirs=reserved)] == ["2.1.0", "2.3.0"]
    for genre, root in (("notes", notes_root), ("nodeapi", node_root), ("nodeapi", "/usr/share/man")):
        with pytest.raises(ValueError, match="reserved"):
            genres.genre_pages(genre, root=root, reserved_dirs=(str(root),))
    assert read and not [p for p in read if genres.is_under(p, reserved)]
