"""What one replica of `lmk-embed serve` holds: the checkpoint, and the landmark index to search.

`ServedModel` knows nothing of HTTP or Ray: it embeds checked requests (`protocol`), counts their
tokens, gives landmarks and searches. The Serve deployment (`app`) wraps it, and tests and the
benchmark can call it in-process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .protocol import ApiError, EmbeddingRequest, SearchRequest, check_lengths, shape_vectors

FAMILIES = {"lmk_embedder": "lmk", "recurrent_embedder": "recurrent"}
# Reciprocal rank fusion's constant (Cormack et al. 2009), and how deep each ranking is read for it.
RRF_K = 60
FUSION_DEPTH = 50


def encode_options(model) -> dict:
    """The options of every `encode` the server makes: an LMK checkpoint with landmark pooling reads
    long texts in its windows schedule (never cut at the backbone's positions); the recurrent family
    reads any length as it is."""
    if model.config.model_type == "lmk_embedder" and model.config.pooling == "lmk":
        return {"long_input": "windows"}
    return {}


class ServedModel:
    """A checkpoint loaded for serving. `index`: an `encode-corpus --output-value landmarks` folder
    encoded by this checkpoint (checked), for `search`; `max_input_tokens`: the 413 limit (None: none)."""

    def __init__(self, checkpoint: str, name: str, backend: str = "torch", index: str | None = None,
                 max_input_tokens: int | None = None, num_threads: int | None = None):
        import torch

        from lmk_embed_tools.corpus.worker import load_model

        if num_threads:
            torch.set_num_threads(num_threads)
        onnx = {"name": "onnx", "file": "onnx/model.onnx"} if backend == "onnx" else None
        self.model = load_model({"source": str(checkpoint)}, backend=onnx, num_threads=num_threads)
        self.name, self.max_input_tokens = name, max_input_tokens
        self.family = FAMILIES.get(self.model.config.model_type)
        if self.family is None:
            raise ValueError(f"{checkpoint!r} is a {self.model.config.model_type!r} model, not an lmk-embed checkpoint")
        self.options = encode_options(self.model)
        self.dimension = int(np.asarray(self.model.encode(["dimension probe"], show_progress_bar=False)).shape[-1])
        self.normalized = bool(self.model.config.normalize)
        self.model_limit = self._model_limit()
        self.index = self.lexical = None
        if index is not None:
            self.index = open_index(index, checkpoint)

    def _model_limit(self) -> int | None:
        """The token budget at which this model itself would cut a text (None: it reads any length)."""
        try:
            return self.model.resolve(**self.options).max_length
        except TypeError:  # a backend without `resolve` (ONNX) reads in its own schedule
            return None

    # ---- embeddings -----------------------------------------------------------------------

    def count_tokens(self, texts) -> list[int]:
        """Each text's model tokens, special tokens and prompts left out (what `usage` reports)."""
        from lmk_embed.encoding import encode_content

        return [len(encoding.ids) for encoding in encode_content(self.model.tokenizer, list(texts))]

    def check(self, request: EmbeddingRequest) -> int:
        """413 for a text over `max_input_tokens`, or one the model would have to cut; the request's tokens."""
        counts = self.count_tokens(request.texts)
        check_lengths(counts, self.max_input_tokens)
        if self.model_limit is not None:
            self._check_model_limit(request)
        return sum(counts)

    def _check_model_limit(self, request: EmbeddingRequest) -> None:
        prompt = self.prompt(request)
        if self.family == "lmk":
            resolved = self.model.resolve(prompt=prompt, **self.options)
            truncated = self.model.tokenizer.layout(list(request.texts), resolved.layout).truncated
        else:
            truncated = self.model.tokenizer.build_batch(list(request.texts), prompt=prompt,
                                                         max_length=self.model_limit).truncated
        for index, cut in enumerate(np.asarray(truncated).tolist()):
            if cut:
                raise ApiError(f"`input[{index}]` is longer than this model reads ({self.model_limit} tokens with its "
                               "special tokens); split the text", status=413, param="input", code="input_too_long")

    def prompt(self, request: EmbeddingRequest) -> str | None:
        config = self.model.config
        if request.kind == "query":
            return config.query_prompt(request.task) if self.family == "recurrent" else config.query_prompt or None
        if request.kind == "document":
            return config.document_prompt or None
        return None

    def embed(self, requests: list[EmbeddingRequest]) -> list[np.ndarray]:
        """Each request's vectors, shaped to its `dimensions`. Requests with the same prompt share one
        `encode` call; each gets back exactly its own rows."""
        groups: dict[tuple, list[int]] = {}
        for number, request in enumerate(requests):
            groups.setdefault(request.prompt_key, []).append(number)
        results: list = [None] * len(requests)
        for numbers in groups.values():
            texts = [text for number in numbers for text in requests[number].texts]
            vectors = self.model.encode(texts, prompt=self.prompt(requests[numbers[0]]), show_progress_bar=False,
                                        **self.options)
            vectors = np.asarray(vectors, dtype=np.float32)
            start = 0
            for number in numbers:
                stop = start + len(requests[number].texts)
                results[number] = shape_vectors(vectors[start:stop], requests[number].dimensions, self.normalized)
                start = stop
        return results

    def landmarks(self, request: EmbeddingRequest) -> list[dict]:
        """Per text, its landmark vectors [n, D] and their character spans."""
        if "landmarks" not in getattr(self.model, "output_values", ()) or self.family != "lmk":
            raise ApiError(f"{self.name!r} gives no landmark vectors (a recurrent embedder has one vector per text): "
                           "use /v1/embeddings", status=400, param="model", code="unsupported")
        try:
            output = self.model.encode(list(request.texts), prompt=self.prompt(request), show_progress_bar=False,
                                       output_value="landmarks", **self.options)
        except ValueError as error:  # a pooling without chunk-aligned vectors
            raise ApiError(str(error), param="model", code="unsupported") from None
        return [{"embeddings": shape_vectors(np.asarray(item["embeddings"], dtype=np.float32), request.dimensions,
                                            self.normalized), "spans": [list(map(int, span)) for span in item["spans"]]}
                for item in output]

    # ---- search ---------------------------------------------------------------------------

    def search(self, request: SearchRequest) -> list[list[dict]]:
        """Per query its ranked documents: `dense` is `lmk-embed search` (max-sim, `fuse` with the
        document vector), `lexical` BM25 over the same documents, `hybrid` the two fused by
        reciprocal rank. Every hit names the landmark whose passage matched the query best."""
        if self.index is None:
            raise ApiError("this server has no index: start it with --index DIR (an encode-corpus --output-value "
                           "landmarks folder)", status=404, code="no_index")
        index = self.index
        queries = np.asarray(self.model.encode_query(list(request.queries), show_progress_bar=False), dtype=np.float32)
        if request.mode == "dense":
            results = index.search(queries, top_k=request.top_k, fuse=request.fuse)
            return [[hit_record(hit) for hit in index.passages(hits)] for hits in results]
        if not index.ids:
            return [[] for _ in request.queries]
        lexical = self.lexical_ranking(request.queries, request.top_k if request.mode == "lexical" else FUSION_DEPTH)
        answers = []
        for number, query in enumerate(queries):
            if request.mode == "lexical":
                ranked = lexical[number][: request.top_k]
            else:
                dense = index.search(query[None], top_k=FUSION_DEPTH, fuse=request.fuse)[0]
                ranked = reciprocal_rank_fusion([[hit.row for hit in dense], [row for row, _ in lexical[number]]])
                ranked = ranked[: request.top_k]
            answers.append([self.best_passage(row, score, query) for row, score in ranked])
        return answers

    def lexical_ranking(self, queries, depth: int) -> list[list[tuple[int, float]]]:
        """Per query the best `depth` documents by BM25 (bm25s, English stopwords) as (row, score)."""
        import bm25s

        index = self.index
        if self.lexical is None:  # built on first use: a dense-only server never pays for it
            self.lexical = bm25s.BM25()
            self.lexical.index(bm25s.tokenize(index.texts, stopwords="en", show_progress=False), show_progress=False)
        depth = min(depth, len(index.ids))
        tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        rows, scores = self.lexical.retrieve(tokens, k=depth, show_progress=False)
        return [[(int(row), float(score)) for row, score in zip(r, s) if score > 0] for r, s in zip(rows, scores)]

    def best_passage(self, row: int, score: float, query: np.ndarray) -> dict:
        """A hit for document `row` with `score`, its passage the landmark nearest `query`."""
        index = self.index
        start = int(index.first[row])
        stop = int(index.first[row + 1]) if row + 1 < len(index.first) else len(index.owner)
        best = start + int(np.argmax(index.vectors[start:stop] @ query))
        span = [int(x) for x in index.spans[best]]
        return {"id": index.ids[row], "score": round(float(score), 6), "landmark": best - start, "span": span,
                "text": index.texts[row][span[0]:span[1]]}


def reciprocal_rank_fusion(rankings: list[list[int]]) -> list[tuple[int, float]]:
    """Documents of several rankings scored by the sum of 1 / (RRF_K + rank), best first."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(ranking, 1):
            scores[row] = scores.get(row, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def hit_record(hit) -> dict:
    """A dense hit as `lmk-embed search --json` prints it."""
    return {"id": hit.id, "score": round(hit.score, 6), "landmark": hit.landmark, "span": list(hit.span),
            "text": hit.text}


def open_index(folder, checkpoint):
    """The landmark index of `folder`, refused unless `checkpoint` is the model that encoded it."""
    from lmk_embed_tools.corpus import verify
    from lmk_embed_tools.corpus.search import LandmarkIndex

    folder = Path(folder)
    verify.query_model(verify.read_index_manifest(folder), folder, str(checkpoint))
    return LandmarkIndex.from_corpus(folder)
