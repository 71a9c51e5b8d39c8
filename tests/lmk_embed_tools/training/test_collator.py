"""The training collator gives queries and passages their own max lengths through sentence-transformers'
public collator options (`router_mapping`, a per-task `max_length`), by column position."""

import torch

from lmk_embed_tools.training.finetune import EmbeddingDataCollator


class RecordingPreprocess:
    """Stands in for `SentenceTransformer.preprocess`: records each column's call."""

    def __init__(self):
        self.calls = []

    def __call__(self, inputs, prompt=None, **kwargs):
        self.calls.append((list(inputs), kwargs))
        return {"input_ids": torch.zeros(len(inputs), 1, dtype=torch.long)}


def test_first_column_is_the_query_and_the_rest_passages():
    preprocess = RecordingPreprocess()
    collator = EmbeddingDataCollator(preprocess_fn=preprocess, query_max_length=16, passage_max_length=48)
    features = [{"question": "q1", "label": 1.0, "positive": "p1", "negative": "n1"},
                {"question": "q2", "label": 0.0, "positive": "p2", "negative": "n2"}]
    batch = collator(features)
    by_column = {inputs[0][:1]: kwargs for inputs, kwargs in preprocess.calls}
    assert by_column == {"q": {"task": "query", "max_length": 16}, "p": {"task": "passage", "max_length": 48},
                         "n": {"task": "passage", "max_length": 48}}
    assert sorted(batch) == ["label", "negative_input_ids", "positive_input_ids", "question_input_ids"]  # no *_task keys
    assert batch["label"].tolist() == [1.0, 0.0]

    collator.passage_max_length = 64  # changed after construction: the next batch uses it
    preprocess.calls.clear()
    collator([{"anchor": "a", "positive": "p"}])
    assert [kwargs["max_length"] for _, kwargs in preprocess.calls] == [16, 64]
    assert [kwargs["task"] for _, kwargs in preprocess.calls] == ["query", "passage"]
