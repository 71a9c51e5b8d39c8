"""Retrieval evaluation: one code path (mteb's) for every number this project reports."""

from .retrieval import evaluate_retrieval

__all__ = ["evaluate_retrieval"]
