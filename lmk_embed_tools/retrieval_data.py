"""The one retrieval split type of the tooling: training's corpora build their evaluation splits as it
and evaluation scores it, so both import it from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetrievalData:
    """One retrieval split, mteb-style: {query id: text}, {document id: text}, {query id: {document id: 1}}."""

    name: str
    queries: dict[str, str]
    documents: dict[str, str]
    relevant: dict[str, dict[str, int]]

    def as_tuple(self):
        return self.queries, self.documents, self.relevant


__all__ = ["RetrievalData"]
