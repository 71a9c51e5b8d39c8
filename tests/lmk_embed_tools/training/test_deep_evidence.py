"""The deep-evidence split: each query's evidence lies past the first tokens of its page, is removed
from it, and no query has two right answers."""

from lmk_embed_tools.training.corpora import DocItem, deep_evidence_split



def count_tokens(texts):
    return [len(t.split()) for t in texts]


def page(name: str, filler_words: int, methods: dict[str, str]) -> DocItem:
    body = " ".join(f"{name}-filler{i}" for i in range(filler_words))
    body += "".join(f"\n {m}(self)\n      {summary}\n" for m, summary in methods.items())
    return DocItem("scientific", "pkg", f"pkg.{name}", "class", f"The {name} class.", body)


def method(cls: str, name: str, summary: str) -> DocItem:
    return DocItem("scientific", "pkg", f"pkg.{cls}.{name}", "method", summary, f"{name}(self)\n {summary}")


def test_queries_sit_deep_in_their_pages_and_are_removed_from_them():
    summaries = {f"C{i}": f"Compute the special quantity number {i} of this object." for i in range(6)}
    items = [page(c, 700, {"run": s}) for c, s in summaries.items()]
    items += [method(c, "run", s) for c, s in summaries.items()]
    items += [page("Shallow", 10, {"go": "Start the shallow engine right now."}),
              method("Shallow", "go", "Start the shallow engine right now."),
              page("Extra", 900, {})]
    split = deep_evidence_split({"scientific": items}, "scientific", count_tokens, min_depth=600, max_depth=800)
    assert set(split.queries) == {f"pkg.C{i}.run" for i in range(6)}  # the shallow method is not deep enough
    for query_id, text in split.queries.items():
        (page_id,) = split.relevant[query_id]
        assert page_id == query_id.rsplit(".", 1)[0]
        assert text not in split.documents[page_id]  # the evidence is removed, its context stays
        assert "run(self)" in split.documents[page_id]
    assert "pkg.Extra" in split.documents and "pkg.Shallow" not in split.documents  # long distractors only


def test_a_query_found_verbatim_in_another_page_is_left_out():
    shared = "Return the shared summary line of both classes."
    items = [page("A", 700, {"f": shared}), method("A", "f", shared), page("B", 700, {"g": shared}),
             page("C", 700, {"h": "Only C says this line."}), method("C", "h", "Only C says this line.")]
    split = deep_evidence_split({"scientific": items}, "scientific", count_tokens, min_depth=600)
    assert set(split.queries) == {"pkg.C.h"}
    assert {"pkg.A", "pkg.B", "pkg.C"} <= set(split.documents)  # A's page stays, as a candidate
