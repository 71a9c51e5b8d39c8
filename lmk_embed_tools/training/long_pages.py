"""Training on long pages, with the user's own windows as the teacher.

The baseline a long-page LMK model must beat is the untouched base read in windows: each window's
vector (windows-max) and their mean (windows-mean). Those vectors cost one forward of the base, so
they are targets as well as rivals:

- **page target**: a page's row carries the base's windows-mean of exactly the text the student
  reads (`add_page_targets`), distilled by the embedding term (`distill_weight`);
- **window target**: each window the student cuts (`long_input="windows"`) is pulled towards the
  base's vector of the same span, computed from the same token ids in the loss
  (`InfoNCEWithWindowDistillation`, `window_distill_weight`), whatever g the batch drew;
- **deep-evidence pairs** (`deep_sentence_rows`): a sentence from deep inside a training page,
  removed from it, is the query for that page, so the landmarks past the first window must carry
  what the page says there, not only its subject.

Pages come from the training sources only (`corpora.training_items`).
"""

from __future__ import annotations

import math
import random
import re

import torch
from torch import nn

from lmk_embed_tools.retrieval_data import SENTENCE_SPLIT, is_prose

from .corpora import DocItem, training_items



def content_budget(max_length: int, min_granularity: int, special_tokens: int = 1) -> int:
    """The most content tokens C an LMK layout of `max_length` holds at every g >= `min_granularity`:
    C + ceil(C / g) landmarks + the start token(s) <= max_length. Cutting pages to C tokens makes the
    student read the whole cut page whatever g a batch draws, so a page target covers what it reads."""
    content = max_length - special_tokens
    while content > 0 and content + math.ceil(content / min_granularity) + special_tokens > max_length:
        content -= 1
    if content <= 0:
        raise ValueError(f"`max_length`={max_length} holds no content at g={min_granularity}.")
    return content


def sentences(text: str) -> list[tuple[int, str]]:
    """(character offset, sentence) of the prose sentences of `text`, in order."""
    found = []
    for paragraph in re.finditer(r"[^\n]+(?:\n(?!\s*\n)[^\n]+)*", text):
        start = paragraph.start()
        for piece in SENTENCE_SPLIT.split(paragraph.group()):
            where = text.find(piece, start)
            start = where + len(piece)
            sentence = " ".join(piece.split())
            if is_prose(sentence):  # the evaluation's deep tasks pick their queries by the same rule
                found.append((where, sentence))
    return found


def deep_sentence_rows(corpus: dict[str, list[DocItem]], tokenizer, content_tokens: int, min_depth: int = 256,
                       max_rows: int | None = None, seed: int = 0) -> list[dict]:
    """Rows (query, positive) from the training sources: the query is one prose sentence that sits
    `min_depth` to `content_tokens` tokens deep in its page, and the positive is the page cut to
    `content_tokens` tokens with that sentence removed. One row per page, pages in a seeded order;
    a sentence found verbatim in another chosen page is skipped (two right answers)."""
    from .teacher_targets import cut_to_tokens

    items = [item for item in training_items(corpus) if len(item.text) > 4 * min_depth]
    items.sort(key=lambda item: item.name)
    rng = random.Random(seed)
    rng.shuffle(items)
    rows = []
    for item in items:
        if max_rows is not None and len(rows) >= max_rows:
            break
        page = cut_to_tokens(tokenizer, [item.text], content_tokens)[0]
        candidates = [(at, s) for at, s in sentences(page) if page.count(s) == 1 and item.synopsis not in s]
        if not candidates:
            continue
        depths = [len(tokenizer(page[:at], add_special_tokens=False)["input_ids"]) for at, _ in candidates]
        deep = [s for (at, s), depth in zip(candidates, depths) if depth >= min_depth]
        if not deep:
            continue
        query = rng.choice(deep)
        rows.append({"query": query, "positive": page.replace(query, " "), "negatives": [], "teacher_scores": None,
                     "task": None, "source": item.source, "name": item.name, "kind": "deep"})
    seen = {}
    for row in rows:
        seen.setdefault(row["query"], []).append(row)
    return [row for row in rows if len(seen[row["query"]]) == 1
            and not any(row["query"] in other["positive"] for other in rows if other is not row)]


def add_page_targets(rows: list[dict], teacher, query_tokens: int, content_tokens: int, window: int,
                     first_window_weight: float = 0.0, batch_size: int = 32) -> list[dict]:
    """Cut each row's query to `query_tokens` and passages to `content_tokens` content tokens (what
    the student reads at every g), and set `teacher_embeddings` to the teacher's vectors [query,
    passages...]: the query in one pass, each passage as the base's windows of `window` tokens,
    averaged (the windows-mean baseline; the first window weighted by `first_window_weight`)."""
    from .teacher_targets import add_student_teacher_embeddings

    # That function cuts to max length less one (the recurrent student's EOS): add it back.
    return add_student_teacher_embeddings(rows, teacher, query_tokens + 1, content_tokens + 1,
                                          first_window_weight=first_window_weight, window=window, batch_size=batch_size)


def deep_page_rows(corpus: dict[str, list[DocItem]], teacher, *, passage_max_length: int, query_max_length: int,
                   min_granularity: int, page_window: int, first_window_weight: float, min_depth: int = 300,
                   max_rows: int | None = None, seed: int = 0) -> list[dict]:
    """The deep-sentence rows of the training sources (`deep_sentence_rows`), each page cut to what the
    student reads at every g (`content_budget` of `passage_max_length`) and given its page target
    (`add_page_targets`: the base's windows of `page_window` tokens, the first weighted by
    `first_window_weight`). Queries are cut to the landmark budget of `query_max_length` less one."""
    content = content_budget(passage_max_length, min_granularity)
    rows = deep_sentence_rows(corpus, teacher.tokenizer, content, min_depth=min_depth, max_rows=max_rows, seed=seed)
    query_tokens = content_budget(query_max_length, min_granularity) - 1
    return add_page_targets(rows, teacher, query_tokens, content, page_window, first_window_weight)


def special_template(tokenizer) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after a text's content ([CLS] and [SEP] for BERT)."""
    content = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(content) + 1):
        if full[start:start + len(content)] == content:
            return full[:start], full[start + len(content):]
    raise ValueError("cannot find where the teacher's tokenizer puts a text's content among its special tokens.")


def window_content_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor, landmark_mask: torch.Tensor,
                       has_start: bool = True) -> list[list[int]]:
    """The content token ids of each LMK row (a window): input_ids / attention_mask / landmark_mask
    [R, T] -> R lists, without the start token and the landmarks."""
    keep = attention_mask.bool() & ~landmark_mask.bool()
    if has_start:
        keep[:, 0] = False
    return [row[mask].tolist() for row, mask in zip(input_ids, keep)]


@torch.no_grad()
def teacher_window_vectors(teacher, content_ids: list[list[int]], template: tuple[list[int], list[int]]) -> torch.Tensor:
    """The teacher's unit vector of each window's content [R, D]: the same ids with the teacher's own
    special tokens, through the teacher's whole module stack (its pooling and normalisation). For a
    text whose tokens the teacher's tokenizer gives the same ids, this is `teacher.encode(text)`."""
    prefix, suffix = template
    rows = [prefix + ids + suffix for ids in content_ids]
    width = max(len(row) for row in rows)
    pad = teacher.tokenizer.pad_token_id or 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)], attention_mask[i, :len(row)] = torch.tensor(row), 1
    device = next(teacher.parameters()).device
    teacher.eval()  # the trainer switches every module of the loss to training mode: no dropout in targets
    features = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
                "token_type_ids": torch.zeros_like(input_ids).to(device)}
    vectors = teacher(features)["sentence_embedding"]
    return nn.functional.normalize(vectors.float(), dim=-1)


def cut_windows(features: dict) -> torch.Tensor:
    """[R] bool: the rows of a column that are windows of a page read in more than one window. A page
    that fits one window is pulled to its page target only, so short pages train as without the term."""
    document = features.get("window_document")
    if document is None:
        return torch.zeros(features["input_ids"].shape[0], dtype=torch.bool)
    return torch.bincount(document)[document] > 1


class InfoNCEWithWindowDistillation(nn.Module):
    """InfoNCE on the page vectors, plus `weight` x the cosine distance to each row's
    `teacher_embeddings` (the page target, as `InfoNCEWithEmbeddingDistillation`), plus
    `window_weight` x the mean cosine distance between each passage window's landmark mean and the
    teacher's vector of the same span (`teacher_window_vectors`), over the windows of pages read in
    more than one window (`cut_windows`).

    The LMK model reads each column once: its rows are windows ([R, T], `window_document` [R] when a
    text was cut), their landmark means are the window vectors [R, D], and the page vectors [B, D]
    come from the model's own windows loop, as in `encode()`.
    """

    def __init__(self, model, teacher, temperature: float, weight: float, window_weight: float,
                 gather_across_devices: bool = False):
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        self.model, self.weight, self.window_weight = model, weight, window_weight
        self.infonce = MultipleNegativesRankingLoss(model, scale=1 / temperature, gather_across_devices=gather_across_devices)
        self.embedder = model.transformers_model
        if self.embedder.config.model_type != "lmk_embedder" or self.embedder.config.pooling != "lmk":
            raise ValueError("`window_distill_weight` applies to LMK models with lmk pooling.")
        self.teacher = teacher.eval().requires_grad_(False)
        self.template = special_template(teacher.tokenizer)
        self.has_start = self.embedder.tokenizer.cls_token_id is not None

    def column(self, features: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One column's (page vectors [B, D], window vectors [R, D]). Cut texts run through the model's
        own windows loop (`embed_windows`, bounded groups, as `encode()`); a window's vector is the mean
        of its landmark states, which is what lmk pooling computes."""
        document = features.get("window_document")
        if document is None:
            inputs = {name: features[name] for name in ("input_ids", "attention_mask", "landmark_mask", "position_ids")
                      if name in features}
            windows = self.embedder(**inputs).embeddings
            return windows, windows
        pages, states = self.embedder.embed_windows(features, int(document.max()) + 1, with_states=True)
        return pages, torch.stack([row.mean(0) for row in states])

    def forward(self, sentence_features, labels):
        columns = [self.column(features) for features in sentence_features]
        pages = [page for page, _ in columns]
        loss = self.infonce.compute_loss_from_embeddings(pages, None)
        if self.weight > 0 and labels is not None:
            student = torch.stack(pages, dim=1)  # [B, columns, D]
            teacher = labels.to(student.dtype).view(student.shape[0], student.shape[1], -1)
            loss = loss + self.weight * (1 - nn.functional.cosine_similarity(student, teacher, dim=-1).mean())
        distances = []
        for features, (_, windows) in zip(sentence_features[1:], columns[1:]):  # passages only
            cut = cut_windows(features)
            if not cut.any():
                continue
            ids = window_content_ids(features["input_ids"][cut], features["attention_mask"][cut],
                                     features["landmark_mask"][cut], self.has_start)
            target = teacher_window_vectors(self.teacher, ids, self.template).to(windows.dtype)
            distances.append(1 - nn.functional.cosine_similarity(windows[cut], target, dim=-1))
        if distances:
            loss = loss + self.window_weight * torch.cat(distances).mean()
        return loss

