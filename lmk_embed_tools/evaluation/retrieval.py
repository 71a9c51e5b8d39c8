"""Retrieval evaluation through mteb, offline: an in-memory retrieval task and a model wrapper.

`evaluate_retrieval(model, queries, documents, relevant)` runs `mteb.evaluate` on any model with
`encode_query` / `encode_document` (our AutoModel classes, or a SentenceTransformer) and returns
mteb's scores for the test split (ndcg_at_10, recall_at_1, ...).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _task_class():
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    class InMemoryRetrieval(AbsTaskRetrieval):
        """A retrieval task whose queries, corpus and judgements are given in memory."""

        metadata = TaskMetadata(
            name="InMemoryRetrieval",
            description="Retrieval over documents supplied in memory (e.g. Python's stdlib documentation).",
            reference=None,
            type="Retrieval",
            category="t2t",
            modalities=["text"],
            eval_splits=["test"],
            eval_langs=["eng-Latn"],
            main_score="ndcg_at_10",
            dataset={"path": "in-memory", "revision": "none"},
            date=None,
            domains=None,
            task_subtypes=None,
            license=None,
            annotations_creators=None,
            dialect=None,
            sample_creation=None,
            bibtex_citation=None,
        )

        def __init__(self, queries: dict[str, str], documents: dict[str, str], relevant: dict[str, dict[str, int]]):
            super().__init__()
            self._split = RetrievalSplitData(
                queries=Dataset.from_list([{"id": k, "text": v} for k, v in queries.items()]),
                corpus=Dataset.from_list([{"id": k, "text": v, "title": ""} for k, v in documents.items()]),
                relevant_docs=relevant,
                top_ranked=None,
            )
            self.per_query = None  # filled by `task_specific_scores` during evaluation

        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            self.dataset = {"default": {"test": self._split}}
            self.data_loaded = True

        def task_specific_scores(self, scores, qrels, results, hf_split: str, hf_subset: str) -> dict[str, float]:
            # mteb's hook for extra scores; it is handed the per-query scores, which we keep for paired comparisons.
            self.per_query = {query_id: {"ndcg_at_10": float(s["ndcg_cut_10"]), "recall_at_1": float(s["recall_1"])}
                              for query_id, s in scores.items()}
            return {}

    return InMemoryRetrieval


def _encoder_class():
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta

    class EncoderForMTEB(AbsEncoder):
        """Routes mteb's query / document encoding to `encode_query` / `encode_document`."""

        def __init__(self, model, name: str = "local/embedder", batch_size: int = 16, **encode_kwargs):
            self.model = model
            self.batch_size = batch_size
            self.encode_kwargs = encode_kwargs
            self.mteb_model_meta = ModelMeta.create_empty().model_copy(update={"name": name, "revision": "local"})

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
            texts = [text for batch in inputs for text in batch["text"]]
            is_query = prompt_type is not None and str(getattr(prompt_type, "value", prompt_type)) == "query"
            method = self.model.encode_query if is_query else self.model.encode_document
            embeddings = method(texts, batch_size=self.batch_size, **self.encode_kwargs)
            return np.asarray(embeddings, dtype=np.float32)

    return EncoderForMTEB


def evaluate_retrieval(
    model,
    queries: dict[str, str],
    documents: dict[str, str],
    relevant: dict[str, dict[str, int]],
    *,
    name: str = "local/embedder",
    batch_size: int = 16,
    per_query: bool = False,
    **encode_kwargs,
):
    """mteb's retrieval scores (ndcg_at_10, recall_at_1, ...) of `model` on the given data.

    With `per_query=True`, returns `(scores, {query_id: {"ndcg_at_10": ..., "recall_at_1": ...}})`:
    the per-query values whose means are the scores, for paired comparisons between models.
    """
    import mteb

    task = _task_class()(queries, documents, relevant)
    encoder = _encoder_class()(model, name=name, batch_size=batch_size, **encode_kwargs)
    result = mteb.evaluate(encoder, task, cache=None, show_progress_bar=False)
    scores = result.task_results[0].scores["test"][0]
    scores = {key: float(value) for key, value in scores.items() if isinstance(value, (int, float))}
    if per_query and task.per_query is None:
        raise RuntimeError("mteb did not hand over per-query scores (`task_specific_scores` was not called); "
                           "this mteb version cannot give `per_query=True`.")
    return (scores, task.per_query) if per_query else scores
