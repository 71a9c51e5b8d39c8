"""What one replica of `lmk-embed serve` holds: the checkpoint, and the landmark index to search.

`ServedModel` knows nothing of HTTP or Ray: it embeds checked requests (`protocol`), counts their
tokens, gives landmarks and searches. The Serve deployment (`app`) wraps it, and tests and the
benchmark can call it in-process.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from .protocol import ApiError, EmbeddingRequest, SearchRequest, check_lengths, shape_vectors

FAMILIES = {"lmk_embedder": "lmk", "recurrent_embedder": "recurrent"}
# Texts (or queries) one `encode` call of the model thread reads: between two, work nobody waits for
# any more (a client gone, a deadline passed) is dropped. `encode` itself reads them in batches of 32.
SLICE_TEXTS = 128


# The option specs a checkpoint's configuration file declares, by family (`lmk_embed.encoding.Option`).
OPTION_SPECS = {"lmk": "LMK_OPTIONS", "recurrent": "RECURRENT_OPTIONS"}


def option_names(model, family: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(per-call, fixed) option names of the spec the checkpoint's own configuration file declares;
    ((), ()) for a checkpoint whose code declares none."""
    spec = getattr(importlib.import_module(type(model.config).__module__), OPTION_SPECS[family], ())
    return (tuple(option.name for option in spec if option.per_call),
            tuple(option.name for option in spec if not option.per_call))


class ServedModel:
    """A checkpoint loaded for serving, read as in-process `encode()` reads it: the checkpoint's own
    options, and per request the options its spec marks per-call. `index`: an `encode-corpus
    --output-value landmarks` folder encoded by this checkpoint (checked), for `search`;
    `max_input_tokens` and `max_request_tokens`: the 413 limits of a text and of a request (None: none)."""

    def __init__(self, checkpoint: str, name: str, backend: str = "torch", index: str | None = None,
                 max_input_tokens: int | None = None, num_threads: int | None = None,
                 max_request_tokens: int | None = None):
        import torch

        from lmk_embed_tools import return_freed_memory
        from lmk_embed_tools.corpus.worker import load_model

        return_freed_memory()  # a replica's RSS stays flat over long texts (glibc keeps freed heap otherwise)
        self.num_threads = num_threads
        if num_threads:
            torch.set_num_threads(num_threads)
        onnx = {"name": "onnx", "file": "onnx/model.onnx"} if backend == "onnx" else None
        self.model = load_model({"source": str(checkpoint)}, backend=onnx, num_threads=num_threads)
        self.name, self.max_input_tokens, self.max_request_tokens = name, max_input_tokens, max_request_tokens
        self.family = FAMILIES.get(self.model.config.model_type)
        if self.family is None:
            raise ValueError(f"{checkpoint!r} is a {self.model.config.model_type!r} model, not an lmk-embed checkpoint")
        self.per_request, self.fixed = option_names(self.model, self.family)
        if not hasattr(self.model, "resolve"):  # a backend that reads in its own schedule takes no options
            self.per_request = ()
        self.dimension = int(np.asarray(self.model.encode(["dimension probe"], show_progress_bar=False)).shape[-1])
        self.index = self.lexical = None
        if index is not None:
            self.index = open_index(index, checkpoint)

    def enter_model_thread(self) -> None:
        """Called first on the thread that runs the model: torch's thread count set there too."""
        if self.num_threads:
            import torch

            torch.set_num_threads(self.num_threads)

    # ---- embeddings -----------------------------------------------------------------------

    def resolve(self, request: EmbeddingRequest):
        """The model's resolved call for `request` (its prompt and per-request options), as `encode()`
        resolves it: a bad option value is a 400 naming it (the family's own rule and message)."""
        options = dict(request.options)
        normalize = options.pop("normalize", None)
        if normalize is not None and not isinstance(normalize, bool):  # the engine reads any value as a truth
            raise ApiError(f"`normalize` must be true or false, got {normalize!r}", param="normalize",
                           code="invalid_value")
        if not hasattr(self.model, "resolve"):
            return None
        try:
            return self.model.resolve(prompt=self.prompt(request), **options)
        except (TypeError, ValueError, OverflowError) as error:
            message = str(error)
            param = next((name for name in options if f"`{name}`" in message or f"{name}=" in message),
                         next(iter(options), None))
            raise ApiError(message, param=param, code="invalid_value") from None

    def check(self, request: EmbeddingRequest, param: str = "input") -> int:
        """The request's tokens (what `usage` reports: each text's model tokens, special tokens and the
        prompt left out), counted in one pass that stops reading a text past `max_input_tokens`. 413
        for a text over `max_input_tokens`, a request over `max_request_tokens`, or a text the model
        would have to cut at its own `max_length` (resolved with the request's options)."""
        from lmk_embed.encoding import encode_content

        resolved = self.resolve(request)
        encodings = encode_content(self.model.tokenizer, list(request.texts), self.max_input_tokens)
        tokens = check_lengths([len(encoding.ids) for encoding in encodings], self.max_input_tokens,
                               self.max_request_tokens, param)
        model_limit = getattr(resolved, "max_length", None)
        if model_limit is not None:
            self._check_model_limit(request, resolved, param)
        if getattr(resolved, "long_input", None) == "windows":
            self._check_window(request, resolved)
        return tokens

    def _check_window(self, request: EmbeddingRequest, resolved) -> None:
        """400 naming `window_length` when a window too small to hold one chunk (the model's own rule,
        `check_window_holds_chunk`) would have to cut a text: the model lets such a window read a text
        that fits it, and raises only while cutting one, so the texts are laid out (only then) as
        `encode()` lays them out, here, before any model work."""
        from lmk_embed.tokenization_lmk import check_window_holds_chunk

        has_start = self.model.tokenizer.start_token_id is not None
        try:
            check_window_holds_chunk(resolved.window_length, resolved.layout.granularity, has_start)
            return
        except ValueError:
            pass
        try:
            self.model.tokenize(list(request.texts), resolved)
        except ValueError as error:
            raise ApiError(str(error), param="window_length", code="invalid_value") from None

    def _check_model_limit(self, request: EmbeddingRequest, resolved, param: str) -> None:
        """413 for the first text the model would cut at its `max_length` (its layout, specials and prompt in)."""
        if self.family == "lmk":
            truncated = self.model.tokenizer.layout(list(request.texts), resolved.layout).truncated
        else:
            truncated = self.model.tokenizer.build_batch(list(request.texts), prompt=resolved.prompt,
                                                         max_length=resolved.max_length).truncated
        for index, cut in enumerate(np.asarray(truncated).tolist()):
            if cut:
                raise ApiError(f"`{param}[{index}]` is longer than this model reads ({resolved.max_length} tokens with "
                               "its special tokens and prompt); split the text, or for a landmark checkpoint send "
                               "`long_input: \"windows\"`", status=413, param=param, code="input_too_long")

    def normalized(self, request: EmbeddingRequest) -> bool:
        """Whether `request`'s vectors are unit vectors (its `normalize`, else the checkpoint's)."""
        return bool(dict(request.options).get("normalize", self.model.config.normalize))

    def prompt(self, request: EmbeddingRequest) -> str | None:
        config = self.model.config
        if request.kind == "query":
            return config.query_prompt(request.task) if self.family == "recurrent" else config.query_prompt or None
        if request.kind == "document":
            return config.document_prompt or None
        return None

    def embed(self, requests: list[EmbeddingRequest], alive=None) -> list[np.ndarray | None]:
        """Each request's vectors [n_texts, dimensions]. Requests with the same prompt and options share
        `encode` calls, of at most `SLICE_TEXTS` texts each; each request gets back exactly its own rows.
        `alive()` is asked before each call: once it says no (nobody waits for the batch) the rest is
        not computed and the requests left get None."""
        groups: dict[tuple, list[int]] = {}
        for number, request in enumerate(requests):
            groups.setdefault(request.prompt_key, []).append(number)
        results: list = [None] * len(requests)
        for numbers in groups.values():
            texts = [text for number in numbers for text in requests[number].texts]
            first = requests[numbers[0]]
            pieces = []
            for start in range(0, len(texts), SLICE_TEXTS):
                if alive is not None and not alive():
                    return results
                pieces.append(np.asarray(self.model.encode(texts[start:start + SLICE_TEXTS], prompt=self.prompt(first),
                                                           show_progress_bar=False, **dict(first.options)),
                                         dtype=np.float32))
            vectors = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            start = 0
            for number in numbers:
                stop = start + len(requests[number].texts)
                results[number] = shape_vectors(vectors[start:stop], requests[number].dimensions,
                                                self.normalized(first))
                start = stop
        return results

    def landmarks(self, request: EmbeddingRequest, alive=None) -> list[dict]:
        """Per text, its landmark vectors (or late chunks: `request.output_value`) [n, D] and their character spans."""
        if "landmarks" not in getattr(self.model, "output_values", ()) or self.family != "lmk":
            raise ApiError(f"{self.name!r} gives no landmark vectors (a recurrent embedder has one vector per text): "
                           "use /v1/embeddings", status=400, param="model", code="unsupported")
        try:
            output = self.model.encode(list(request.texts), prompt=self.prompt(request), show_progress_bar=False,
                                       output_value=request.output_value or "landmarks", **dict(request.options))
        except ValueError as error:  # a pooling without chunk-aligned vectors
            raise ApiError(str(error), param="model", code="unsupported") from None
        return [{"embeddings": shape_vectors(np.asarray(item["embeddings"], dtype=np.float32), request.dimensions,
                                            self.normalized(request)),
                 "spans": [list(map(int, span)) for span in item["spans"]]}
                for item in output]

    # ---- search ---------------------------------------------------------------------------

    def check_queries(self, request: SearchRequest) -> int:
        """The queries' tokens, under the rules of `check` for texts embedded as queries (413 for a query
        over the limits or one the model would cut: never cut silently)."""
        return self.check(EmbeddingRequest(request.queries, kind="query"), param="query")

    def search(self, request: SearchRequest, alive=None) -> list[list[dict]] | None:
        """Per query its ranked documents, as `lmk-embed search` gives them: `dense` max-sim (`fuse`
        with the document vector), `lexical` the index's BM25, `hybrid` both in one query, fused by
        min-max (BM25's share `fuse_weight`, default the index's) or by rank. Every hit names the
        landmark whose passage matched the query best. The queries are read `SLICE_TEXTS` at a time,
        `alive()` asked before each slice (None once it says no)."""
        if self.index is None:
            raise ApiError("this server has no index: start it with --index DIR (an encode-corpus --output-value "
                           "landmarks folder)", status=404, code="no_index")
        index, found = self.index, []
        for start in range(0, len(request.queries), SLICE_TEXTS):
            if alive is not None and not alive():
                return None
            queries = list(request.queries[start:start + SLICE_TEXTS])
            vectors = np.asarray(self.model.encode_query(queries, show_progress_bar=False), dtype=np.float32)
            results = index.search(vectors, top_k=request.top_k, fuse=request.fuse, mode=request.mode, texts=queries,
                                   fusion=request.fusion, fuse_weight=request.fuse_weight)
            found.extend([hit_record(hit) for hit in index.passages(hits)] for hits in results)
        return found


def hit_record(hit) -> dict:
    """A hit as `lmk-embed search --json` prints it."""
    return {"id": hit.id, "score": round(hit.score, 6), "landmark": hit.landmark, "span": list(hit.span),
            "text": hit.text}


def open_index(folder, checkpoint):
    """The landmark index of `folder` (its record and table, no vectors read), refused unless
    `checkpoint` is the model that encoded it."""
    from lmk_embed_tools.corpus import verify
    from lmk_embed_tools.corpus.search import LandmarkIndex

    folder = Path(folder)
    verify.query_model(verify.read_index_manifest(folder), folder, str(checkpoint))
    return LandmarkIndex.from_corpus(folder)
