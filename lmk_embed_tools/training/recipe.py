"""The fine-tuning recipe and its data: documentation pairs, mined negatives, a teacher's vectors.

`docs_training_rows` turns the training sources of `corpora` into rows of the training-file
schema (`query`, `positive`, `negatives`, ...), which `finetune.train` reads like any user's file.
`add_teacher_embeddings` adds the teacher's vector of every text in a row (`teacher_embeddings`),
and `add_teacher_scores` its scores over the row's candidates (`teacher_scores`, for KL). The
teacher is the untouched base model with its own pooling: distilling it keeps what the base
knows while the student learns the new pooling.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from lmk_embed.configuration_lmk import DEFAULT_GRANULARITIES

from .corpora import DocItem, training_items
from .mining import mine_negatives


def docs_training_rows(corpus: dict[str, list[DocItem]], num_negatives: int = 1, max_rows: int | None = None,
                       seed: int = 0) -> list[dict]:
    """Rows from the training sources (stdlib held-out modules excluded), shuffled with `seed`.

    With `max_rows`, the rows are a seeded sample drawn evenly across sources, so a short run still
    sees every source. Each row records its `source`.
    """
    items = training_items(corpus)
    negatives = mine_negatives(items, num_negatives, seed=seed)
    rows = [{"query": item.synopsis, "positive": item.text, "negatives": [items[j].text for j in negatives[i]],
             "teacher_scores": None, "task": None, "source": item.source, "name": item.name}
            for i, item in enumerate(items)]
    rng = random.Random(seed)
    rng.shuffle(rows)
    if max_rows is not None and max_rows < len(rows):
        by_source: dict[str, list[dict]] = {}
        for row in rows:
            by_source.setdefault(row["source"], []).append(row)
        picked, queues = [], [iter(v) for v in by_source.values()]
        while len(picked) < max_rows and queues:
            for queue in list(queues):
                row = next(queue, None)
                if row is None:
                    queues.remove(queue)
                elif len(picked) < max_rows:
                    picked.append(row)
        rng.shuffle(picked)
        rows = picked
    return rows


def _teacher_vectors(rows: list[dict], teacher, query_max_length: int, passage_max_length: int, batch_size: int):
    """The teacher's unit vectors: queries [rows, D], and each row's candidates [rows, 1 + negatives, D]."""
    import numpy as np

    teacher.max_seq_length = query_max_length
    queries = teacher.encode([r["query"] for r in rows], batch_size=batch_size, normalize_embeddings=True)
    teacher.max_seq_length = passage_max_length
    passages = [p for r in rows for p in [r["positive"], *r["negatives"]]]
    encoded = teacher.encode(passages, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=True)
    per_row = 1 + len(rows[0]["negatives"]) if rows else 0
    return np.asarray(queries), np.asarray(encoded).reshape(len(rows), per_row, -1)


def add_teacher_scores(rows: list[dict], teacher, query_max_length: int, passage_max_length: int,
                       batch_size: int = 32) -> list[dict]:
    """Set each row's `teacher_scores` to the teacher's cosine similarities [positive, negatives...].

    `teacher` is a SentenceTransformer (e.g. the untouched base); its `max_seq_length` is set per side.
    """
    queries, candidates = _teacher_vectors(rows, teacher, query_max_length, passage_max_length, batch_size)
    for row, query, row_candidates in zip(rows, queries, candidates):
        row["teacher_scores"] = [float(s) for s in row_candidates @ query]
    return rows


def add_teacher_embeddings(rows: list[dict], teacher, query_max_length: int, passage_max_length: int,
                           batch_size: int = 32) -> list[dict]:
    """Set each row's `teacher_embeddings` to the teacher's unit vectors [query, positive, negatives...].

    `teacher` is a SentenceTransformer (e.g. the untouched base); its `max_seq_length` is set per side.
    Values are rounded to 6 decimals (the file stays small; cosine changes by < 1e-5).
    """
    import numpy as np

    queries, candidates = _teacher_vectors(rows, teacher, query_max_length, passage_max_length, batch_size)
    for row, query, row_candidates in zip(rows, queries, candidates):
        vectors = np.concatenate([query[None], row_candidates])
        row["teacher_embeddings"] = np.round(vectors.astype(np.float64), 6).tolist()
    return rows


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """Rows as jsonl in the training-file schema (extra keys such as `source` are kept for the record)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({k: v for k, v in row.items() if v is not None}) + "\n")
    return path


# The recipe `make demo` and `make train-full` use, chosen by the sweeps (training/recipes/sweep.py on
# CPU, gpu_sweep.py at GPU scale, `lmk-embed demo ablate` on CPU; results beside them and in the README):
# LoRA at 1e-3 on the top half of MiniLM's layers, InfoNCE (in-batch negatives only) plus 2.5 x the
# cosine distance to the untouched base model's vectors (of the passage at 256 tokens). Both were
# chosen on the validation source, which is neither trained on nor tested: the weight 2.5 rather
# than 5, and tau 0.1 rather than the paper's 0.02 (0.05 and 0.2 scored lower; docs/recipe.md).
# Passages are trained at 512 tokens, g drawn per batch from the paper's {32, 64, 128, 256};
# inference uses g=32. Hidden-state dropout 0.1 is on; attention-probability dropout is off: on
# CPU, sampling its masks at 512 tokens costs more than the rest of the step, while hidden dropout
# costs about 15%. Batches group rows of similar length: a step costs about two thirds as much,
# so the same time buys half as many steps again (the demo's budget is 150 steps, not 100).
RECIPE = {
    "finetune": "lora",
    "learning_rate": 1e-3,
    "lora_r": 16,
    "lora_alpha": 16,
    "lora_layers": [3, 4, 5],
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "per_device_train_batch_size": 16,
    "group_by_length": True,
    "num_negatives": 0,
    "query_max_length": 32,
    "passage_max_length": 512,
    "temperature": 0.1,
    "distill_weight": 2.5,
    "teacher_max_length": 256,
    "splitter": "variable",
    "granularity": 32,
    "granularities": list(DEFAULT_GRANULARITIES),  # the paper's set, as LMKConfig defaults it
    # The bases are extended to 4096 positions (interpolated rows after the original 512): inputs
    # of at most 512 tokens are the unextended model exactly, so training at 512 is unchanged.
    "max_positions": 4096,
    "position_extension": "interpolate",
    # Skipped position ids on passages (PoSE) help past 512 but cost up to 0.01 nDCG@10 at 512
    # (`lmk-embed demo ablate position_skipping=True`, docs/long-inputs.md): off, as the headline is at 512.
    "position_skipping": False,
    "position_skipping_share": 1.0,
    # Long texts are read in landmark windows of the original 512 positions (so texts that fit 512 are
    # read exactly as before), every landmark pooled: on the validation source at 4,096 tokens this beat
    # one extended pass (0.663 against 0.640 nDCG@10; docs/long-inputs.md). LMK pooling only.
    "long_input": "windows",
}
CONVERSION_KEYS = ("splitter", "granularity", "granularities", "max_positions", "position_extension", "long_input")

# The one checkpoint's long pages (docs/long-inputs.md): the LMK model also trains on deep-sentence rows
# (a prose sentence 300-992 tokens deep in a training page, removed from it, is the query), read in the
# checkpoint's own windows of 512 with the window term; the (synopsis, page) rows stay as above: cut to
# what the recipe reads at 512 tokens, they fit one window and train exactly as before (the window term
# weighs only pages read in more than one window). CLS trains on the (synopsis, page) rows alone.
# Round 4 teaches the index's unit: window rows (a sentence removed from a 256-token window of a training
# page, a BM25 hard negative from another page of its source), every landmark pulled towards the base's
# late chunk of its chunk (`landmark_distill_weight`), and InfoNCE on max-sim, the score the index serves.
LONG_PAGES = {
    "passage_max_length": 1024,  # a deep row's page: 992 content tokens at every g >= 32
    "query_max_length": 64,  # a deep sentence has 8-60 words
    "passage_long_input": "windows",
    "passage_window_length": 512,  # the checkpoint's W: a page of at most 512 tokens is one window, one pass
    "window_distill_weight": 1.0,
    "min_depth": 300,
    "page_window": 256,  # a deep row's page target: the base's windows-mean of 256-token windows
    "first_window_weight": 0.0,
    "window_rows": 800,  # `window_sentence_rows`: the query a sentence of a window, its window the positive
    "window_row_length": 256,  # the index's window: a window row's text fits it at every g
    "window_negatives": 1,  # BM25 hard negatives per window row (windows of other pages of the same source)
    "landmark_distill_weight": 1.0,
    "maxsim_weight": 1.0,
    "index_window_length": 256,  # the window an index reads landmarks in (config.index_window_length)
}
LONG_PAGE_TRAINING_KEYS = ("passage_max_length", "query_max_length", "passage_long_input", "passage_window_length",
                           "window_distill_weight", "landmark_distill_weight", "maxsim_weight")


def training_fields(recipe: dict) -> dict:
    """The recipe's `TrainConfig` fields: its LMK layout keys go to the conversion instead, and the
    teacher's max length to the rows (`add_teacher_embeddings`)."""
    return {k: v for k, v in recipe.items() if k not in (*CONVERSION_KEYS, "teacher_max_length")}


def long_page_fields(long_pages: dict, window_teacher: str) -> dict:
    """The `TrainConfig` fields the LMK run adds to `training_fields(RECIPE)` for its long pages."""
    return {**{key: long_pages[key] for key in LONG_PAGE_TRAINING_KEYS}, "window_teacher": window_teacher}


def cut_rows_to_recipe(rows: list[dict], tokenizer, recipe: dict) -> list[dict]:
    """(synopsis, page) rows cut to the content the recipe's LMK layout reads at every g (its
    `query_max_length` and `passage_max_length`, landmarks counted), so that a longer training budget
    reads them as the recipe does: each page fits one window of 512 tokens."""
    from .long_pages import content_budget
    from .teacher_targets import cut_to_tokens

    smallest = min(recipe["granularities"])
    query_tokens = content_budget(recipe["query_max_length"], smallest)
    page_tokens = content_budget(recipe["passage_max_length"], smallest)
    queries = cut_to_tokens(tokenizer, [row["query"] for row in rows], query_tokens)
    pages = cut_to_tokens(tokenizer, [row["positive"] for row in rows], page_tokens)
    negatives = [cut_to_tokens(tokenizer, row["negatives"], page_tokens) if row["negatives"] else [] for row in rows]
    return [{**row, "query": query, "positive": page, "negatives": negative}
            for row, query, page, negative in zip(rows, queries, pages, negatives)]
