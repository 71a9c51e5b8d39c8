"""The one retrieval split type of the tooling: training's corpora build their evaluation splits as it
and evaluation scores it, so both import it from here. Also the one rule for a sentence worth asking
about (`is_prose`), which picks the query of training's deep-sentence rows and of evaluation's deep tasks."""

from __future__ import annotations

import re
from dataclasses import dataclass

# A sentence worth asking about: 8-60 words, mostly letters (not code, a table or a command line).
SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 8, 60
MIN_LETTERS = 0.85  # of a sentence's non-space characters
CODE_MARKS = ("{", "}", "=", ";", "::", "->", "()", "`", "$ ", "|", "\\", "<", ">", "#", "*", "_")


def is_prose(sentence: str) -> bool:
    """8-60 words, mostly letters, starting with a capital and ending like a sentence, with none of code's
    marks: the one rule for a sentence a deep-evidence query is made of, in training and in evaluation."""
    letters = sum(c.isalpha() for c in sentence)
    visible = sum(not c.isspace() for c in sentence)
    return (MIN_SENTENCE_WORDS <= len(sentence.split()) <= MAX_SENTENCE_WORDS and sentence[0].isupper()
            and sentence[-1] in ".!?" and letters >= MIN_LETTERS * visible and not any(m in sentence for m in CODE_MARKS))


@dataclass(frozen=True)
class RetrievalData:
    """One retrieval split, mteb-style: {query id: text}, {document id: text}, {query id: {document id: 1}}."""

    name: str
    queries: dict[str, str]
    documents: dict[str, str]
    relevant: dict[str, dict[str, int]]

    def as_tuple(self):
        return self.queries, self.documents, self.relevant


__all__ = ["RetrievalData", "SENTENCE_SPLIT", "is_prose"]
