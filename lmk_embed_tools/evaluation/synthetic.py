"""LongEmbed-style synthetic retrieval tasks, generated locally from a seed (nothing is downloaded).

Both tasks hide one fact in a long document and ask a question that only that fact answers:

- **passkey**: LongEmbed's filler ("The grass is green. ...") repeated to the target length, with
  "{name}'s pass key is {key}. ..." inserted at a varied depth; the query asks for {name}'s passkey.
- **needle**: real prose (a haystack of text passed in by the caller, e.g. the stdlib docs) with one
  hand-written fact about {name} inserted at a varied depth; the query asks about that fact.

At each length there are `num_documents` candidates (100) and `num_queries` queries (50), each with
exactly one relevant document, as in LongEmbed. Lengths are counted in tokens of a given tokenizer
(`count_tokens`), without special tokens; a document lands within a sentence of its target.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

CountTokens = Callable[[list[str]], list[int]]

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY = "{name}'s pass key is {key}. Remember it. {key} is the pass key for {name}."
PASSKEY_QUERY = "what is the passkey for {name}?"
DEFAULT_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

FIRST_NAMES = (
    "Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hiroshi", "Ines", "Jonas", "Kavya", "Lars",
    "Mireille", "Nikolai", "Olufemi", "Priya", "Quentin", "Rosalind", "Sven", "Tamsin", "Ugo", "Valeria",
    "Wendell", "Ximena", "Yusuf", "Zofia", "Anselm", "Beatrix", "Casimir", "Delphine",
)
LAST_NAMES = (
    "Abernathy", "Bergstrom", "Castellano", "Dunmore", "Eriksen", "Fairbanks", "Galloway", "Hargreaves",
    "Ivanova", "Jablonski", "Kowalczyk", "Lindqvist", "Montague", "Nakamura", "Okonkwo", "Pemberton",
    "Quintero", "Rasmussen", "Szabo", "Thornbury", "Umberto", "Vasquez", "Whitcombe", "Yamaguchi",
)

# Hand-written needles: (fact inserted into the haystack, the question only that fact answers).
NEEDLES: tuple[tuple[str, str], ...] = (
    ("{name} keeps the spare key to the boathouse under the third blue flowerpot.",
     "Where does {name} keep the spare key to the boathouse?"),
    ("The secret ingredient in {name}'s lemon cake is a pinch of cardamom.",
     "What is the secret ingredient in {name}'s lemon cake?"),
    ("{name} learned to juggle flaming torches at a circus school in Lisbon.",
     "Where did {name} learn to juggle flaming torches?"),
    ("{name}'s first bicycle was a red tandem bought from a retired postman.",
     "Who sold {name} their first bicycle?"),
    ("Every winter {name} knits a scarf for the lighthouse keeper on Skerry Island.",
     "Who does {name} knit a scarf for every winter?"),
    ("{name} once walked from Dover to Canterbury carrying a grandfather clock.",
     "What did {name} carry while walking from Dover to Canterbury?"),
    ("The parrot owned by {name} can whistle the first bars of a Schubert sonata.",
     "What can the parrot owned by {name} whistle?"),
    ("{name} grows purple carrots in a greenhouse heated by an old bread oven.",
     "How is {name}'s greenhouse for purple carrots heated?"),
    ("{name} names every houseplant after a famous astronomer.",
     "After whom does {name} name every houseplant?"),
    ("The only film {name} has watched twice in a cinema is a silent comedy about penguins.",
     "Which film has {name} watched twice in a cinema?"),
    ("{name} won a village chess tournament by promoting a pawn to a knight.",
     "How did {name} win the village chess tournament?"),
    ("{name} is afraid of escalators but happily climbs rock faces.",
     "What is {name} afraid of?"),
    ("{name}'s grandmother hid a gold coin inside the spine of an atlas.",
     "Where did {name}'s grandmother hide a gold coin?"),
    ("{name} repairs antique typewriters in a shed behind the railway station.",
     "What does {name} repair in the shed behind the railway station?"),
    ("The wedding cake {name} baked had eleven tiers and a marzipan windmill on top.",
     "What was on top of the wedding cake {name} baked?"),
    ("{name} keeps a diary written entirely in mirror script.",
     "In what script does {name} write a diary?"),
    ("{name} taught a crow to fetch bottle caps in exchange for peanuts.",
     "What did {name} teach a crow to fetch?"),
    ("On Tuesdays {name} plays the tuba in a brass band that rehearses in a laundrette.",
     "Where does the brass band of {name} rehearse?"),
    ("{name} sailed around Iceland in a boat made from recycled doors.",
     "What was the boat {name} sailed around Iceland made from?"),
    ("The password to {name}'s attic is the name of a forgotten Portuguese poet.",
     "What is the password to {name}'s attic?"),
    ("{name} collects ticket stubs from every ferry crossing in Norway.",
     "What does {name} collect from ferry crossings?"),
    ("{name}'s cat sleeps only in a copper saucepan on top of the fridge.",
     "Where does {name}'s cat sleep?"),
    ("{name} measured the height of the town hall using the shadow of a broom.",
     "How did {name} measure the height of the town hall?"),
    ("{name} refuses to eat soup with any spoon other than a wooden one carved by an uncle.",
     "Which spoon does {name} use to eat soup?"),
)


@dataclass
class SyntheticTask:
    """One length of a synthetic task: mteb-style dicts (query id -> text, doc id -> text, qrels).

    `depths[doc_id]` is the depth asked for (0: the start, 1: the end), as a fraction of the
    filler's sentences; `facts[doc_id]` is the inserted sentence."""

    name: str
    length: int
    queries: dict[str, str]
    documents: dict[str, str]
    relevant: dict[str, dict[str, int]]
    facts: dict[str, str] = field(default_factory=dict)
    depths: dict[str, float] = field(default_factory=dict)


def token_counter(tokenizer) -> CountTokens:
    """`count_tokens(texts) -> [n_tokens]` without special tokens and without truncation.

    `tokenizer` is a `tokenizers.Tokenizer`, a path to a `tokenizer.json` (or a folder holding
    one), or a transformers fast tokenizer (its Rust backend is copied, so truncation settings of
    the caller's object are left alone)."""
    import copy
    from pathlib import Path

    from tokenizers import Tokenizer

    if isinstance(tokenizer, (str, Path)):
        path = Path(tokenizer)
        backend = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    elif isinstance(tokenizer, Tokenizer):
        backend = copy.deepcopy(tokenizer)
    else:
        backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.no_truncation()  # MiniLM's tokenizer.json truncates at 128 by default
    backend.no_padding()

    def count(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in backend.encode_batch(list(texts), add_special_tokens=False)]

    return count


def _names(rng: random.Random, n: int) -> list[str]:
    pool = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
    if n > len(pool):
        raise ValueError(f"at most {len(pool)} distinct names, asked for {n}")
    return rng.sample(pool, n)


def _fill(sentences: Sequence[str], counts: Sequence[int], start: int, budget: int, count_tokens: CountTokens) -> list[str]:
    """Sentences taken cyclically from `start`, whole while they fit in `budget` tokens, then the
    longest word prefix of the next one that still fits (so every length is met to a few tokens)."""
    taken, total, index = [], 0, start
    while total < budget:
        position = index % len(sentences)
        if total + counts[position] > budget:
            words = sentences[position].split()
            prefixes = [" ".join(words[:k]) for k in range(1, len(words))]
            fitting = [p for p, n in zip(prefixes, count_tokens(prefixes) if prefixes else []) if total + n <= budget]
            if fitting:
                taken.append(fitting[-1])
            break
        taken.append(sentences[position])
        total += counts[position]
        index += 1
    return taken


def _documents(name: str, length: int, facts: list[str], questions: list[str], sentences: Sequence[str],
               counts: Sequence[int], count_tokens: CountTokens, rng: random.Random, num_queries: int) -> SyntheticTask:
    """Insert `facts[i]` into a filler of `length` tokens at a depth spread over [0, 1]; the first
    `num_queries` documents (in a shuffled order) get a query."""
    fact_tokens = count_tokens(facts)
    depths = [(i + 0.5) / len(facts) for i in range(len(facts))]
    rng.shuffle(depths)
    documents, task_facts, task_depths = {}, {}, {}
    for i, (fact, depth) in enumerate(zip(facts, depths)):
        start = rng.randrange(len(sentences))
        filler = _fill(sentences, counts, start, max(length - fact_tokens[i], 0), count_tokens)
        cut = round(depth * len(filler))
        before, after = " ".join(filler[:cut]), " ".join(filler[cut:])
        text = " ".join(part for part in (before, fact, after) if part)
        doc_id = f"{name}-{length}-doc{i:03d}"
        documents[doc_id] = text
        task_facts[doc_id] = fact
        task_depths[doc_id] = depth
    order = list(documents)
    rng.shuffle(order)
    queries, relevant = {}, {}
    for doc_id in order[:num_queries]:
        i = int(doc_id.rsplit("doc", 1)[1])
        query_id = doc_id.replace("-doc", "-q")
        queries[query_id] = questions[i]
        relevant[query_id] = {doc_id: 1}
    return SyntheticTask(name, length, queries, documents, relevant, task_facts, task_depths)


def passkey_task(length: int, count_tokens: CountTokens, seed: int = 0, num_documents: int = 100,
                 num_queries: int = 50) -> SyntheticTask:
    """LongEmbed's passkey task at `length` tokens: a random full name and a 4-5 digit key per document."""
    rng = random.Random(f"passkey-{seed}-{length}")
    names = _names(rng, num_documents)
    keys = [str(rng.randrange(1000, 100000)) for _ in names]
    facts = [PASSKEY.format(name=n, key=k) for n, k in zip(names, keys)]
    questions = [PASSKEY_QUERY.format(name=n) for n in names]
    sentences = [s + "." for s in FILLER.rstrip(".").split(". ")]
    return _documents("passkey", length, facts, questions, sentences, count_tokens(sentences), count_tokens, rng, num_queries)


def haystack_sentences(texts: Sequence[str], min_words: int = 5, max_words: int = 60) -> list[str]:
    """Prose sentences from documentation pages (pydoc text): margins ("|") stripped, lines that look
    like code or signatures dropped, the rest split into sentences of `min_words` to `max_words` words."""
    sentences = []
    for text in texts:
        lines = [re.sub(r"^[\s|]+", "", line).strip() for line in text.splitlines()]
        prose = [line for line in lines if len(line.split()) >= 3 and _letters(line) > 0.8 and not line.endswith(")")]
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(prose)):
            if min_words <= len(sentence.split()) <= max_words and sentence[0].isupper() and _letters(sentence) > 0.8:
                sentences.append(sentence)
    return sentences


def _letters(text: str) -> float:
    """The share of letters and spaces in `text` (prose is mostly letters; code is not)."""
    return sum(c.isalpha() or c == " " for c in text) / max(len(text), 1)


def needle_task(length: int, count_tokens: CountTokens, haystack: Sequence[str], seed: int = 0,
                num_documents: int = 100, num_queries: int = 50, needles=NEEDLES,
                haystack_counts: Sequence[int] | None = None) -> SyntheticTask:
    """One hand-written needle about a random person per document, hidden in `haystack` prose.

    `haystack` is a list of sentences (see `haystack_sentences`); each document reads it from a
    random starting sentence. (needle, person) pairs are distinct, so each question has one answer.
    `haystack_counts` (the sentences' token counts) saves recounting when several lengths share a haystack."""
    if not haystack:
        raise ValueError("`haystack` is empty: pass prose sentences (e.g. haystack_sentences(pages))")
    counts = count_tokens(list(haystack)) if haystack_counts is None else haystack_counts
    rng = random.Random(f"needle-{seed}-{length}")
    names = _names(rng, num_documents)
    templates = [needles[i % len(needles)] for i in range(num_documents)]
    rng.shuffle(templates)
    facts = [fact.format(name=n) for (fact, _), n in zip(templates, names)]
    questions = [question.format(name=n) for (_, question), n in zip(templates, names)]
    return _documents("needle", length, facts, questions, haystack, counts, count_tokens, rng, num_queries)


def synthetic_tasks(kind: str, lengths: Sequence[int], count_tokens: CountTokens, haystack: Sequence[str] = (),
                    seed: int = 0, num_documents: int = 100, num_queries: int = 50) -> list[SyntheticTask]:
    """`kind` ("passkey" or "needle") at every length; the haystack's sentences are counted once."""
    if kind == "passkey":
        return [passkey_task(n, count_tokens, seed, num_documents, num_queries) for n in lengths]
    if kind == "needle":
        counts = count_tokens(list(haystack)) if haystack else []
        return [needle_task(n, count_tokens, haystack, seed, num_documents, num_queries, haystack_counts=counts)
                for n in lengths]
    raise ValueError(f"unknown synthetic task {kind!r}: passkey or needle")
