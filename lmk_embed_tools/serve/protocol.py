"""The wire format of `lmk-embed serve`: OpenAI's embeddings request and response, its error shape,
and the limits a request must keep (`Limits`).

Every request body is checked here, before it reaches a model, and every bad one becomes an
`ApiError`: a 4xx status with OpenAI's body `{"error": {"message", "type", "param", "code"}}`. The
replica only ever sees a checked `EmbeddingRequest`, so nothing a client sends can fail inside it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np
import orjson

from lmk_embed_tools.corpus.search import FUSIONS as SEARCH_FUSIONS  # one list: `search` and the server agree
from lmk_embed_tools.corpus.search import MODES as SEARCH_MODES

ENCODING_FORMATS = ("float", "base64")
# /v1/landmarks: the landmark states, or late chunks (each chunk's mean token state), as encode(output_value=...)
CHUNK_OUTPUTS = ("landmarks", "late_chunks")
INPUT_TYPES = ("query", "document")
# Fields OpenAI's clients send that change nothing here.
IGNORED_FIELDS = ("user",)
# The largest integer a per-request option takes (they are token counts and sizes): past it the
# tokenizer's int64 arithmetic overflows, so a bigger one is a 400 naming the option.
MAX_OPTION_INTEGER = 2**31 - 1
# The most digits a JSON integer may have where it is parsed into a Python int (past it: `OversizeNumber`).
MAX_INTEGER_DIGITS = 19
# The most documents one search query may ask for (`top_k`): 400 above it.
MAX_TOP_K = 1000
# How deep a request body may nest (orjson's own limit): deeper is 400 `invalid_json`.
MAX_JSON_DEPTH = 1024


@dataclass(frozen=True)
class Limits:
    """What one request may ask of a replica; each has a flag of `lmk-embed serve` (the defaults are
    its defaults) and is answered before any model work.

    max_body_bytes: the request body (413 `request_too_large`, counted while it is read).
    max_inputs: texts in one request (413 `too_many_inputs`; OpenAI's own limit is 2,048).
    max_input_tokens: model tokens of one text, prompt and special tokens left out (413
        `input_too_long`); a checkpoint that would cut a text earlier refuses it at its own limit.
    max_request_tokens: model tokens of all the texts of one request (413 `request_too_large`).
    request_timeout_s: from the request's arrival to its answer (504 `timeout`).
    read_timeout_s: for the whole body to arrive (408 `request_timeout`).
    max_queued_requests: embedding requests one replica holds at once, waiting or computing; one
        more gets 429 `server_busy` with `retry-after` at once.
    """

    max_body_bytes: int = 2 * 1024 * 1024
    max_inputs: int = 2048
    max_input_tokens: int = 32768
    max_request_tokens: int = 131072
    request_timeout_s: float = 120.0
    read_timeout_s: float = 30.0
    max_queued_requests: int = 64


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI's error `type`, the field (`param`), a
    `code`, and extra response `headers` (`retry-after`, `www-authenticate`)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.type = message, status, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class EmbeddingRequest:
    """A checked `/v1/embeddings` (or `/v1/landmarks`) body. `kind` is the prompt: None (plain
    `encode`), "query" or "document"; `task` is the recurrent family's query instruction; `options`
    the per-call options of `encode()` the request sets, as sorted (name, value) pairs; `output_value`
    what `/v1/landmarks` returns per chunk ("landmarks" or "late_chunks", as `encode()`), None elsewhere."""

    texts: tuple[str, ...]
    encoding_format: str = "float"
    dimensions: int | None = None
    kind: str | None = None
    task: str | None = None
    options: tuple[tuple[str, object], ...] = ()
    output_value: str | None = None

    @property
    def prompt_key(self) -> tuple:
        """Requests with equal keys are embedded by one `encode` call in a batch."""
        return (self.kind, self.task, self.options)


class OversizeNumber:
    """A JSON number no request field can take (an integer of more than `MAX_INTEGER_DIGITS` digits,
    or one past a double's range), kept as a marker so that the check of the field it sits in
    refuses it by name (400), as it refuses a string where a number belongs."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"a number of {self.digits} digits"


def kind_of(value) -> str:
    """What a wrong value is, for a message: its JSON type, or the size of an `OversizeNumber`."""
    return repr(value) if isinstance(value, OversizeNumber) else type(value).__name__


def _number(text: str):
    return int(text) if len(text.lstrip("-")) <= MAX_INTEGER_DIGITS else OversizeNumber(text)


def _float(text: str):
    value = float(text)
    return value if value - value == 0 else OversizeNumber(text)  # inf (1e400) is no number a field takes


def _refuse_constant(name: str):
    raise ApiError(f"the request body is not valid JSON: {name} is not a JSON number", code="invalid_json")


def parse_json(body: bytes):
    """The request body as JSON, with orjson (400 `invalid_json` for a body that is not JSON or nests
    deeper than `MAX_JSON_DEPTH`). A body holding a number orjson cannot hold (an integer past a
    double's range), kept as an `OversizeNumber`, or an escaped lone surrogate is read again with
    the standard library: the field holding it is then refused by name instead of the whole body."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        message = str(error)
    if message.startswith("depth limit exceeded"):
        raise ApiError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    # Read again: a number orjson cannot hold, and an escaped lone surrogate ("\\ud800", which JSON allows
    # and no text is: `check_texts` names the field).
    if not message.startswith("number") and "surrogate in string" not in message:
        raise ApiError(f"the request body is not valid JSON: {message}", code="invalid_json")
    try:
        return json.loads(body, parse_int=_number, parse_float=_float, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(f"the request body is not valid JSON: {error}", code="invalid_json") from None


def check_object(body) -> dict:
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {kind_of(body)}", code="invalid_body")
    return body


def check_fields(body: dict, known: tuple[str, ...]) -> None:
    for name in body:
        if name not in known and name not in IGNORED_FIELDS:
            raise ApiError(f"unknown field {name!r}; this endpoint takes {', '.join(known)}", param=name,
                           code="unknown_field")


def check_texts(value, param: str = "input", max_items: int | None = None) -> tuple[str, ...]:
    """A string or a non-empty list of strings (at most `max_items`: 413), each encodable as UTF-8
    (no lone surrogate)."""
    if value is None:
        raise ApiError(f"`{param}` is required: a string or a list of strings", param=param, code="missing_field")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise ApiError(f"`{param}` must be a string or a list of strings, got {kind_of(value)}", param=param,
                       code="invalid_type")
    if not texts:
        raise ApiError(f"`{param}` is an empty list: give at least one text", param=param, code="empty_input")
    if max_items is not None and len(texts) > max_items:
        raise ApiError(f"`{param}` holds {len(texts)} {'queries' if param == 'query' else 'texts'}, over this server's limit of {max_items} a request "
                       "(--max-inputs); send them in several requests", status=413, param=param,
                       code="too_many_inputs")
    for index, text in enumerate(texts):
        if not isinstance(text, str):  # token-id arrays included: the server tokenizes with the checkpoint's own tokenizer
            raise ApiError(f"`{param}[{index}]` must be a string, got {kind_of(text)} (token arrays are not "
                           "taken: send text)", param=param, code="invalid_type")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ApiError(f"`{param}[{index}]` holds a lone surrogate at character {error.start}: it is not "
                           "valid Unicode text", param=param, code="invalid_text") from None
    return tuple(texts)


def check_model(value, served: str) -> None:
    if value is None:
        raise ApiError(f"`model` is required: this server serves {served!r}", param="model", code="missing_field")
    if value != served:
        raise ApiError(f"the model {value!r} does not exist here: this server serves {served!r}", status=404,
                       param="model", code="model_not_found")


def check_choice(body: dict, name: str, choices: tuple[str, ...], default):
    value = body.get(name, default)
    if value is not None and value not in choices:
        raise ApiError(f"`{name}` must be one of {', '.join(map(repr, choices))}, got {value!r}", param=name,
                       code="invalid_value")
    return value


def check_options(body: dict, per_request: tuple[str, ...], fixed: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """The per-call options of `encode()` a body sets (`per_request`: the names the checkpoint's option
    spec marks per-call), as sorted (name, value) pairs; an option the spec fixes at conversion
    (`fixed`) is refused naming it. Their values are checked where the model resolves them."""
    for name in fixed:
        if name in body:
            raise ApiError(f"`{name}` is fixed by the checkpoint, not a per-request option; this model takes "
                           f"{', '.join(per_request) or 'none'} per request", param=name, code="fixed_option")
    options = []
    for name in per_request:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, (str, int, float, bool)):
            raise ApiError(f"`{name}` must be a number, a string or a boolean, got {kind_of(value)}",
                           param=name, code="invalid_type")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_OPTION_INTEGER:
            raise ApiError(f"`{name}` must be at most {MAX_OPTION_INTEGER}, got {value}", param=name,
                           code="invalid_value")
        options.append((name, value))
    return tuple(sorted(options))


def parse_embeddings(body, served: str, dimension: int, family: str, landmarks: bool = False,
                     per_request: tuple[str, ...] = (), fixed: tuple[str, ...] = (),
                     max_inputs: int | None = None) -> EmbeddingRequest:
    """Check a `/v1/embeddings` body (or, with `landmarks`, a `/v1/landmarks` one) for a model
    named `served` of width `dimension` and `family` ("lmk" or "recurrent"), whose option spec marks
    `per_request` options per-call and `fixed` ones not; at most `max_inputs` texts."""
    body = check_object(body)
    known = ("input", "model", "encoding_format", "dimensions", "input_type", "task", *per_request,
             *(("output_value",) if landmarks else ()))
    check_fields({name: value for name, value in body.items() if name not in fixed}, known)
    options = check_options(body, per_request, fixed)
    texts = check_texts(body.get("input"), max_items=max_inputs)
    check_model(body.get("model"), served)
    encoding_format = check_choice(body, "encoding_format", ENCODING_FORMATS, "float")
    kind = check_choice(body, "input_type", INPUT_TYPES, None)
    dimensions = body.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= dimension:
            raise ApiError(f"`dimensions` must be an integer from 1 to {dimension} (this model's width), got "
                           f"{dimensions!r}", param="dimensions", code="invalid_value")
    task = body.get("task")
    if task is not None:
        if family != "recurrent":
            raise ApiError("`task` is the recurrent family's query instruction; this model takes `input_type` only",
                           param="task", code="invalid_value")
        if not isinstance(task, str) or not task.strip():
            raise ApiError(f"`task` must be a non-empty string, got {task!r}", param="task", code="invalid_value")
        if kind != "query":
            raise ApiError("`task` instructs queries: send it with `input_type: \"query\"`", param="task",
                           code="invalid_value")
    output_value = check_choice(body, "output_value", CHUNK_OUTPUTS, "landmarks") if landmarks else None
    return EmbeddingRequest(texts, encoding_format, dimensions, kind, task, options, output_value)


def check_lengths(counts: list[int], limit: int | None, request_limit: int | None = None, param: str = "input") -> int:
    """The request's tokens; 413 for the first text (of the field `param`) over `limit` model tokens,
    or for a request over `request_limit` in all (None: no limit). A count over `limit` may be a
    lower bound (the text was tokenized only that far)."""
    if limit is not None:
        for index, count in enumerate(counts):
            if count > limit:
                raise ApiError(f"`{param}[{index}]` has more than {limit} tokens, this server's limit a text "
                               "(--max-input-tokens); split the text", status=413, param=param,
                               code="input_too_long")
    total = sum(counts)
    if request_limit is not None and total > request_limit:
        raise ApiError(f"the request's texts have {total} tokens in all, over this server's limit of {request_limit} "
                       "a request (--max-request-tokens); send them in several requests", status=413, param=param,
                       code="request_too_large")
    return total


def shape_vectors(vectors: np.ndarray, dimensions: int | None, normalized: bool) -> np.ndarray:
    """The first `dimensions` columns, renormalised when the model's vectors are unit vectors (as
    OpenAI shortens its vectors)."""
    if dimensions is None or dimensions == vectors.shape[-1]:
        return vectors
    vectors = vectors[..., :dimensions]
    if normalized:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors


def encode_vector(vector: np.ndarray, encoding_format: str):
    """The vector as a float32 array (orjson writes it as a list of floats, each the shortest text that
    reads back as the same float32), or base64 of its little-endian float32 bytes (OpenAI's `base64`)."""
    vector = np.ascontiguousarray(vector, dtype="<f4")
    if encoding_format == "base64":
        return base64.b64encode(vector.data).decode("ascii")
    return vector


def dump_json(content) -> bytes:
    """A response body: orjson, numpy arrays written directly (no list of Python floats on the way)."""
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def embeddings_response(vectors: np.ndarray, request: EmbeddingRequest, served: str, tokens: int) -> dict:
    data = [{"object": "embedding", "index": index, "embedding": encode_vector(vector, request.encoding_format)}
            for index, vector in enumerate(vectors)]
    return {"object": "list", "data": data, "model": served,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def landmarks_response(output: list[dict], request: EmbeddingRequest, served: str, tokens: int) -> dict:
    data = [{"object": "landmarks", "index": index,
             "landmarks": [{"embedding": encode_vector(vector, request.encoding_format), "span": span}
                           for vector, span in zip(item["embeddings"], item["spans"])]}
            for index, item in enumerate(output)]
    return {"object": "list", "data": data, "model": served, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


@dataclass(frozen=True)
class SearchRequest:
    queries: tuple[str, ...]
    top_k: int = 10
    mode: str = "dense"
    fuse: float = 0.0
    fusion: str = "minmax"
    fuse_weight: float | None = None  # hybrid min-max: BM25's share (None: the index's weight)


def _check_unit_interval(body: dict, name: str, default):
    value = body.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ApiError(f"`{name}` must be a number from 0 to 1, got {value!r}", param=name, code="invalid_value")
    return float(value)


def parse_search(body, served: str, max_inputs: int | None = None) -> SearchRequest:
    """Check a `/v1/search` body: `query` (a string or a list, at most `max_inputs`: 413), `model`,
    `top_k` (1 to `MAX_TOP_K`), `mode`, `fuse`, `fusion` ("minmax" or "rank", for hybrid) and
    `fuse_weight` (BM25's share in min-max fusion)."""
    body = check_object(body)
    check_fields(body, ("query", "model", "top_k", "mode", "fuse", "fusion", "fuse_weight"))
    queries = check_texts(body.get("query"), "query", max_items=max_inputs)
    for index, query in enumerate(queries):
        if not query.strip():
            raise ApiError(f"`query[{index}]` is empty or blank: give text to search for", param="query",
                           code="invalid_value")
    check_model(body.get("model", served), served)
    top_k = body.get("top_k", 10)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
        raise ApiError(f"`top_k` must be an integer from 1 to {MAX_TOP_K}, got {top_k!r}", param="top_k",
                       code="invalid_value")
    mode = check_choice(body, "mode", SEARCH_MODES, "dense")
    fusion = check_choice(body, "fusion", SEARCH_FUSIONS, "minmax")
    return SearchRequest(queries, top_k, mode, _check_unit_interval(body, "fuse", 0.0), fusion,
                         _check_unit_interval(body, "fuse_weight", None))


def search_response(results: list[list[dict]], request: SearchRequest, served: str) -> dict:
    return {"object": "list", "model": served, "mode": request.mode,
            "data": [{"object": "search_result", "index": index, "query": query, "hits": hits}
                     for index, (query, hits) in enumerate(zip(request.queries, results))]}
