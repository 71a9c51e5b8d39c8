"""Retrieval evaluation: one code path (mteb's) for every number this project reports.

retrieval.py     a full mteb run on in-memory data (the demo's tables)
metrics.py       mteb's scorer on a ranked run (the same numbers, for the long-context runner)
synthetic.py     LongEmbed-style passkey and needle tasks, generated from a seed
genres.py        held-out long pages of other genres (installed READMEs, the Rust books)
retrievers.py    dense, landmark multi-vector and BM25 retrievers
cache.py         on-disk corpus embeddings, keyed by model hash + settings + data hash
longcontext.py   every retriever on every task at every max length; BEIR and mteb loaders
analyses.py      attention by position and landmark locality (the LMK paper's Figures 2 and 4)
table.py, report.py   tables, PNGs and JSON
"""

from .retrieval import evaluate_retrieval

__all__ = ["evaluate_retrieval"]
