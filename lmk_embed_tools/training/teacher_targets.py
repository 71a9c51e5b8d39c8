"""The teacher's targets for training rows: texts cut to exactly the tokens a student reads
(`cut_to_tokens`), and the teacher's vectors of those texts (`teacher_page_vectors`,
`add_student_teacher_embeddings`), pages read in the teacher's windows where they are longer.

Shared by the recurrent student (`student`), the long-page rows (`long_pages`) and the recipe's
rows (`recipe`); it imports none of them, so none of them imports another back through it.
"""

from __future__ import annotations

import numpy as np

from lmk_embed_tools.window_vectors import check_first_window_weight, embed_windows, first_weighted_means


def teacher_page_vectors(teacher, texts: list[str], window: int | None = None, batch_size: int = 32,
                         first_window_weight: float = 0.0) -> np.ndarray:
    """The teacher's unit vector of each whole text [n, D], every token read, none truncated: one pass
    when the text fits its window; else its windows' unit vectors, averaged with the first weighted by
    `first_window_weight` b (`first_weighted_means`; b = 0, the default, is the windows-mean baseline).

    `teacher` is a SentenceTransformer; `window` defaults to its `max_seq_length`."""
    first_window_weight = check_first_window_weight(first_window_weight)
    window = int(window or teacher.max_seq_length)
    content = max(window - teacher.tokenizer.num_special_tokens_to_add(), 1)

    def encode(flat: list[str]) -> np.ndarray:
        return teacher.encode(flat, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                              show_progress_bar=len(flat) > 10 * batch_size)

    previous, teacher.max_seq_length = teacher.max_seq_length, window
    try:
        windows = embed_windows(encode, teacher.tokenizer, texts, content, None)
    finally:
        teacher.max_seq_length = previous
    return first_weighted_means(windows, first_window_weight)


def cut_to_tokens(tokenizer, texts: list[str], max_tokens: int) -> list[str]:
    """Each text cut to the characters of its first `max_tokens` content tokens (a text that fits is
    unchanged), so the student and the teacher read exactly the same tokens."""
    from lmk_embed.encoding import encode_content

    cut = []
    for text, encoding in zip(texts, encode_content(tokenizer, texts, max_tokens=max_tokens)):
        offsets = encoding.offsets
        cut.append(text if len(offsets) <= max_tokens else text[: offsets[max_tokens - 1][1]])
    return cut


def add_student_teacher_embeddings(rows: list[dict], teacher, query_max_length: int, passage_max_length: int, *,
                                   first_window_weight: float, window: int | None = None,
                                   batch_size: int = 32) -> list[dict]:
    """Cut each row's texts to what the student reads (max length less its EOS) and set `teacher_embeddings`
    to the teacher's vectors [query, positive, negatives...]: queries in one pass, pages as
    `teacher_page_vectors` with `first_window_weight` (windows past the teacher's length). Rounded to
    6 decimals."""
    tokenizer = teacher.tokenizer
    queries = cut_to_tokens(tokenizer, [r["query"] for r in rows], query_max_length - 1)
    per_row = 1 + len(rows[0]["negatives"]) if rows else 0
    pages = cut_to_tokens(tokenizer, [p for r in rows for p in [r["positive"], *r["negatives"]]], passage_max_length - 1)
    query_vectors = teacher_page_vectors(teacher, queries, window, batch_size)
    page_vectors = teacher_page_vectors(teacher, pages, window, batch_size, first_window_weight)
    page_vectors = page_vectors.reshape(len(rows), per_row, -1)
    for i, row in enumerate(rows):
        row["query"], row["positive"], row["negatives"] = queries[i], pages[i * per_row], pages[i * per_row + 1:(i + 1) * per_row]
        vectors = np.concatenate([query_vectors[i][None], page_vectors[i]])
        row["teacher_embeddings"] = np.round(vectors.astype(np.float64), 6).tolist()
    return rows
