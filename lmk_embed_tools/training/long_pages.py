"""Training on long pages, with the user's own windows as the teacher.

The baseline a long-page LMK model must beat is the untouched base read in windows: each window's
vector (windows-max) and their mean (windows-mean). Those vectors cost one forward of the base, so
they are targets as well as rivals:

- **page target**: a page's row carries the base's windows-mean of exactly the text the student
  reads (`add_page_targets`), distilled by the embedding term (`distill_weight`);
- **window target**: each window the student cuts (`long_input="windows"`) is pulled towards the
  base's vector of the same span, computed from the same token ids in the loss
  (`LongPageLoss`, `window_distill_weight`), whatever g the batch drew;
- **landmark target**: each landmark is pulled towards the base's late chunk of its own chunk, read in
  the same window (`landmark_distill_weight`): a landmark is at least what late chunking gives the base;
- **max-sim**: InfoNCE on the score the index serves, a passage's best landmark (`maxsim_weight`);
- **deep-evidence pairs** (`deep_sentence_rows`): a sentence from deep inside a training page,
  removed from it, is the query for that page, so the landmarks past the first window must carry
  what the page says there, not only its subject; and `window_sentence_rows`: a sentence removed
  from a short window of a page, that window the positive, BM25's best other windows of the same
  source its hard negatives.

Pages come from the training sources only (`corpora.training_items`).
"""

from __future__ import annotations

import math
import random
import re

import torch
from torch import nn

from lmk_embed.modeling_lmk import late_chunk_states
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


def sentence_pattern(sentence: str) -> re.Pattern:
    """A prose sentence as `sentences` gives it (whitespace runs made one space) -> the pattern of its
    words with any whitespace between them: how it stands in the raw text, line breaks included."""
    return re.compile(r"\s+".join(re.escape(word) for word in sentence.split()))


def shares_words(query: str, text: str, run: int = 6) -> bool:
    """Whether `text` holds any `run` consecutive words of `query` (a near-copy: a false negative)."""
    words, flat = query.split(), " ".join(text.split())
    return any(" ".join(words[i:i + run]) in flat for i in range(max(len(words) - run + 1, 1)))


def window_sentence_rows(corpus: dict[str, list[DocItem]], tokenizer, window_tokens: int, max_rows: int | None = None,
                         per_page: int = 2, max_windows: int = 8, num_negatives: int = 1, seed: int = 0) -> list[dict]:
    """Self-made deep rows at the index's unit: the query is one prose sentence inside a window of
    `window_tokens` content tokens of a training page (a window past the first where the page has more;
    the first `max_windows` windows of a page), and the positive is that window with the sentence
    removed. Its `num_negatives` hard negatives are the windows of other pages of the same source that
    BM25 ranks highest for the query, never one that shares six words running with it. Up to `per_page`
    rows a page, pages in a seeded order; a query found twice in its page, or in two rows, is left out."""
    import bm25s
    import numpy as np

    from lmk_embed.encoding import encode_content

    items = sorted(training_items(corpus), key=lambda item: item.name)
    rng = random.Random(seed)
    rng.shuffle(items)
    encodings = encode_content(tokenizer, [item.text for item in items], max_tokens=window_tokens * max_windows)
    windows: list[tuple[int, str, str]] = []  # (page, source, text): every window read, the negatives' pool
    rows = []
    for page, (item, encoding) in enumerate(zip(items, encodings)):
        offsets = encoding.offsets[:window_tokens * max_windows]
        texts = [item.text[offsets[start][0]:offsets[min(start + window_tokens, len(offsets)) - 1][1]]
                 for start in range(0, len(offsets), window_tokens)]
        windows += [(page, item.source, text) for text in texts]
        candidates = list(range(1, len(texts))) or [0]
        rng.shuffle(candidates)
        made = 0
        for index in candidates:
            if made == per_page or (max_rows is not None and len(rows) >= max_rows):
                break
            text, found = texts[index], []
            for _, sentence in sentences(text):
                matches = list(sentence_pattern(sentence).finditer(item.text))
                inside = list(sentence_pattern(sentence).finditer(text))
                # once in the page, and not cut by the window's edges (a fragment reads as a sentence)
                if len(matches) == 1 and len(inside) == 1 and 0 < inside[0].start() and inside[0].end() < len(text) \
                        and item.synopsis not in sentence:
                    found.append((sentence, inside[0]))
            if not found:
                continue
            query, match = rng.choice(found)
            rows.append({"query": query, "positive": text[:match.start()] + " " + text[match.end():], "negatives": [],
                         "teacher_scores": None, "task": None, "source": item.source, "name": item.name,
                         "kind": "window", "page": page})
            made += 1
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["query"]] = counts.get(row["query"], 0) + 1
    rows = [row for row in rows if counts[row["query"]] == 1]
    by_source: dict[str, list[int]] = {}
    for position, (_, source, _) in enumerate(windows):
        by_source.setdefault(source, []).append(position)
    for source, positions in by_source.items():
        asking = [row for row in rows if row["source"] == source]
        if not asking or num_negatives == 0:
            continue
        retriever = bm25s.BM25()
        retriever.index(bm25s.tokenize([windows[p][2] for p in positions], stopwords="en", show_progress=False),
                        show_progress=False)
        k = min(num_negatives + 30, len(positions))
        ranked, _ = retriever.retrieve(bm25s.tokenize([row["query"] for row in asking], stopwords="en",
                                                      show_progress=False), k=k, show_progress=False, n_threads=1)
        for row, found in zip(asking, np.asarray(ranked).tolist()):
            for position in (positions[i] for i in found):
                page, _, text = windows[position]
                if len(row["negatives"]) < num_negatives and page != row["page"] and not shares_words(row["query"], text):
                    row["negatives"].append(text)
    kept = [row for row in rows if len(row["negatives"]) == num_negatives]
    for row in kept:
        del row["page"]
    return kept


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


def chunk_index(attention_mask: torch.Tensor, landmark_mask: torch.Tensor, has_start: bool = True) -> torch.Tensor:
    """The chunk of each content token of LMK rows: [R, T] masks -> [R, T] int64, the number of
    landmarks before the token in its row (the chunk its next landmark closes), -1 at the start token,
    the landmarks and padding."""
    landmarks = landmark_mask.long()
    content = attention_mask.bool() & ~landmarks.bool()
    if has_start:
        content[:, 0] = False
    return torch.where(content, landmarks.cumsum(-1) - landmarks, -1)


@torch.no_grad()
def teacher_late_chunks(teacher, content_ids: list[list[int]], chunks: list[torch.Tensor],
                        template: tuple[list[int], list[int]]) -> list[torch.Tensor]:
    """The teacher's late chunks of each window (late chunking: its token states of the whole window,
    mean-pooled over each chunk): content_ids, R lists of a window's content ids (`window_content_ids`),
    chunks, R [n_tokens] int64 (each content token's chunk, 0..n_r-1, `chunk_index`) -> R [n_r, D].
    The window is read with the teacher's own special tokens, as `teacher_window_vectors` reads it."""
    prefix, suffix = template
    rows = [prefix + ids + suffix for ids in content_ids]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), teacher.tokenizer.pad_token_id or 0, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)], attention_mask[i, :len(row)] = torch.tensor(row), 1
    device = next(teacher.parameters()).device
    teacher.eval()
    features = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
                "token_type_ids": torch.zeros_like(input_ids).to(device)}
    states = teacher(features)["token_embeddings"]  # [R, T, D], before the teacher's pooling
    chunk_of = torch.full(input_ids.shape, -1, dtype=torch.long, device=device)  # the teacher's layout's chunks
    for row, (ids, chunk) in enumerate(zip(content_ids, chunks)):
        chunk_of[row, len(prefix):len(prefix) + len(ids)] = chunk.to(device)
    return [target if len(chunk) else target[:0] for target, chunk in
            zip(late_chunk_states(states, chunk_of, features["attention_mask"]), chunks)]


def max_sim_scores(queries: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """Late interaction as the index serves it: queries [B, D], documents N [n_i, D] landmark states ->
    [B, N], each document's best cosine similarity over its landmarks (differentiable)."""
    flat = nn.functional.normalize(torch.cat(documents).float(), dim=-1)
    owner = torch.repeat_interleave(torch.arange(len(documents), device=flat.device),
                                    torch.tensor([len(d) for d in documents], device=flat.device))
    similarity = nn.functional.normalize(queries.float(), dim=-1) @ flat.T  # [B, landmarks]
    best = similarity.new_full((similarity.shape[0], len(documents)), float("-inf"))
    return best.scatter_reduce(1, owner.expand_as(similarity), similarity, reduce="amax", include_self=True)


class LongPageLoss(nn.Module):
    """The LMK model's loss for long pages and the index it serves, a sum of weighted terms:

    - InfoNCE on the page vectors (the mean of a page's landmarks, as `encode()` gives it);
    - `weight` x the cosine distance to each row's `teacher_embeddings` (the page target, as
      `InfoNCEWithEmbeddingDistillation`);
    - `window_weight` x the mean cosine distance between each passage window's landmark mean and the
      teacher's vector of the same span (`teacher_window_vectors`), over the windows of pages read in
      more than one window (`cut_windows`);
    - `landmark_weight` x the mean cosine distance between every passage landmark state and the
      teacher's late chunk of its own chunk, read in the same window (`teacher_late_chunks`): each
      landmark is asked to be at least what late chunking gives the base;
    - `maxsim_weight` x InfoNCE on the score the index serves: each query against every passage of the
      batch (in-batch and hard negatives), a passage scored by its best landmark (`max_sim_scores`).

    The LMK model reads each column once: its rows are windows ([R, T], `window_document` [R] when a
    text was cut) and the page vectors [B, D] come from the model's own windows loop, as in `encode()`.
    """

    def __init__(self, model, teacher, temperature: float, weight: float, window_weight: float,
                 landmark_weight: float = 0.0, maxsim_weight: float = 0.0, gather_across_devices: bool = False):
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

        self.model, self.weight, self.window_weight = model, weight, window_weight
        self.landmark_weight, self.maxsim_weight, self.temperature = landmark_weight, maxsim_weight, temperature
        self.infonce = MultipleNegativesRankingLoss(model, scale=1 / temperature, gather_across_devices=gather_across_devices)
        self.embedder = model.transformers_model
        if self.embedder.config.model_type != "lmk_embedder" or self.embedder.config.pooling != "lmk":
            raise ValueError("The long-page terms (window, landmark, max-sim) apply to LMK models with lmk pooling.")
        if teacher is None and (window_weight > 0 or landmark_weight > 0):
            raise ValueError("The window and landmark terms need a teacher (`window_teacher`).")
        self.teacher = teacher.eval().requires_grad_(False) if teacher is not None else None
        self.template = special_template(teacher.tokenizer) if teacher is not None else None
        self.has_start = self.embedder.tokenizer.cls_token_id is not None

    def column(self, features: dict) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """One column -> (page vectors [B, D], per row (window) its landmark states [n_r, D], the page of
        each row [R]). Cut texts run through the model's own windows loop (`embed_windows`, bounded
        groups, as `encode()`); a page's vector is the mean of its landmark states (lmk pooling)."""
        document = features.get("window_document")
        if document is None:
            inputs = {name: features[name] for name in ("input_ids", "attention_mask", "landmark_mask", "position_ids")
                      if name in features}
            pages, hidden = self.embedder.embed_rows(**inputs)
            mask = inputs["landmark_mask"].bool()
            states = [hidden[row][mask[row]] for row in range(mask.shape[0])]
            return pages, states, torch.arange(len(states), device=pages.device)
        pages, states = self.embedder.embed_windows(features, int(document.max()) + 1, with_states=True)
        return pages, states, document

    def forward(self, sentence_features, labels):
        columns = [self.column(features) for features in sentence_features]
        pages = [page for page, _, _ in columns]
        loss = self.infonce.compute_loss_from_embeddings(pages, None)
        if self.weight > 0 and labels is not None:
            student = torch.stack(pages, dim=1)  # [B, columns, D]
            teacher = labels.to(student.dtype).view(student.shape[0], student.shape[1], -1)
            loss = loss + self.weight * (1 - nn.functional.cosine_similarity(student, teacher, dim=-1).mean())
        window_distances, landmark_distances = [], []
        for features, (_, states, _) in zip(sentence_features[1:], columns[1:]):  # passages only
            cut = cut_windows(features)
            if self.window_weight > 0 and cut.any():
                ids = window_content_ids(features["input_ids"][cut], features["attention_mask"][cut],
                                         features["landmark_mask"][cut], self.has_start)
                target = teacher_window_vectors(self.teacher, ids, self.template)
                windows = torch.stack([states[row].mean(0) for row in cut.nonzero().flatten().tolist()])
                window_distances.append(1 - nn.functional.cosine_similarity(windows, target.to(windows.dtype), dim=-1))
            if self.landmark_weight > 0:
                ids = window_content_ids(features["input_ids"], features["attention_mask"], features["landmark_mask"],
                                         self.has_start)
                chunk = chunk_index(features["attention_mask"], features["landmark_mask"], self.has_start)
                targets = teacher_late_chunks(self.teacher, ids, [row[row >= 0] for row in chunk], self.template)
                for landmarks, target in zip(states, targets):
                    if len(target) == len(landmarks):  # an empty text: a landmark and no chunk to read
                        landmark_distances.append(1 - nn.functional.cosine_similarity(
                            landmarks.float(), target.to(landmarks.device), dim=-1))
        if window_distances:
            loss = loss + self.window_weight * torch.cat(window_distances).mean()
        if landmark_distances:
            loss = loss + self.landmark_weight * torch.cat(landmark_distances).mean()
        if self.maxsim_weight > 0:
            documents = []
            for _, states, owner in columns[1:]:  # every passage of the batch, column by column
                per_page = [[] for _ in range(int(owner.max()) + 1)]
                for row, page in enumerate(owner.tolist()):
                    per_page[page].append(states[row])
                documents += [torch.cat(parts) for parts in per_page]
            scores = max_sim_scores(pages[0], documents) / self.temperature  # [B, B * passage columns]
            target = torch.arange(scores.shape[0], device=scores.device)  # row i's positive: column 1, page i
            loss = loss + self.maxsim_weight * nn.functional.cross_entropy(scores, target)
        return loss
