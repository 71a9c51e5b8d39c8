"""The HTTP side of `lmk-embed serve`: one FastAPI app over one `ServedModel` (`build_api`), run
by uvicorn in one process (`build_local_api`, the default) or by each replica of a Ray Serve
deployment (`EmbeddingServer`, with --replicas, --address or --proxy-location).

Every request gets an id (the `x-request-id` header of its answer). `Guard` checks the API key
before anything else, holds the request to its deadline (504), and answers an unexpected fault with
500 "internal error" and the id, the trace going to the log under that id. The model routes read
the body against the byte limit while it streams in (413) and within the read timeout (408), parse
and count it (`protocol`, `ServedModel.check`), take a place in the bounded queue (429 with
`retry-after` when it is full) and only then hand it to the model thread (`batching.Batcher`), which
batches the embeddings queued together into one `ServedModel.embed` call and hands each request
back exactly its own rows. All of this runs on the event loop or, for the token count, a worker
thread, and never waits for the model. A request whose client hangs up is cancelled, and its work
dropped where it has not started.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (`Request`) as types.
import asyncio
import collections
import contextlib
import hashlib
import hmac
import json
import logging
import os
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from . import protocol
from .batching import Batcher
from .protocol import ApiError, Limits

logger = logging.getLogger("lmk_embed_tools.serve")
# The one path open without a key: load balancers and orchestrators probe it.
OPEN_PATHS = ("/health",)
# The header that carries a request's id, in the request and its answer (Ray Serve's too).
REQUEST_ID_HEADER = "x-request-id"
# Sent with a 429: a replica's queue drains in about a batch's time.
RETRY_AFTER_S = 1
# Characters up to which a request's tokens are counted on the event loop itself (about a millisecond
# of tokenizing); a longer one is counted in a worker thread.
INLINE_COUNT_CHARS = 16_384
# Histogram boundaries: requests in one batch, and seconds a request took.
BATCH_SIZE_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64]
LATENCY_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]


class _Tagged:
    """A `prometheus_client` metric called as Ray's are: `inc(value, tags=...)`, `observe(value, tags=...)`."""

    def __init__(self, metric, tag_keys):
        self.metric, self.tag_keys = metric, tag_keys

    def _child(self, tags):
        return self.metric.labels(**tags) if self.tag_keys else self.metric

    def inc(self, value: float = 1, tags: dict | None = None) -> None:
        self._child(tags).inc(value)

    def observe(self, value: float, tags: dict | None = None) -> None:
        self._child(tags).observe(value)


def key_digest(api_key: str | None) -> bytes | None:
    """What a replica keeps of the API key: its SHA-256, so the key itself never leaves the command."""
    return None if api_key is None else hashlib.sha256(api_key.encode("utf-8")).digest()


class Metrics:
    """The server's Prometheus metrics: requests by route and status, their latency, tokens embedded,
    rejections by reason and batch sizes. Kept here as counts (what the tests read) and exported: in
    one process with `prometheus_client` (`export="process"`, served at `/metrics`), on a Ray Serve
    replica through `ray.serve.metrics` (`export="ray"`: Ray adds the deployment, replica and
    application tags, and its metrics agent serves them)."""

    def __init__(self, export: str | None = None):
        self.counts: collections.Counter = collections.Counter()
        self.exported = self.registry = None
        if export == "ray":
            from ray.serve import metrics

            counter = lambda name, text, tags=(): metrics.Counter(name, text, tag_keys=tags)  # noqa: E731
            histogram = lambda name, text, bounds, tags=(): metrics.Histogram(  # noqa: E731
                name, text, boundaries=bounds, tag_keys=tags)
        elif export == "process":
            import prometheus_client

            self.registry = prometheus_client.CollectorRegistry()
            counter = lambda name, text, tags=(): _Tagged(prometheus_client.Counter(  # noqa: E731
                name, text, tags, registry=self.registry), tags)
            histogram = lambda name, text, bounds, tags=(): _Tagged(prometheus_client.Histogram(  # noqa: E731
                name, text, tags, buckets=bounds, registry=self.registry), tags)
        if export:
            self.exported = {
                "requests": counter("lmk_embed_requests", "HTTP requests answered, by route and status",
                                    ("path", "status")),
                "latency": histogram("lmk_embed_request_seconds", "seconds from arrival to answer, by route",
                                     LATENCY_BOUNDARIES, ("path",)),
                "tokens": counter("lmk_embed_tokens", "model tokens of the texts embedded (usage)"),
                "rejections": counter("lmk_embed_rejections", "requests refused, by reason (the error code)",
                                      ("reason",)),
                "batch_size": histogram("lmk_embed_batch_size", "requests one model call embedded",
                                        BATCH_SIZE_BOUNDARIES),
            }

    def text(self) -> bytes:
        """The metrics in Prometheus' text format (one process)."""
        import prometheus_client

        return prometheus_client.generate_latest(self.registry)

    def request(self, path: str, status: int, seconds: float) -> None:
        self.counts["requests", path, status] += 1
        if self.exported:
            self.exported["requests"].inc(tags={"path": path, "status": str(status)})
            self.exported["latency"].observe(seconds, tags={"path": path})

    def tokens(self, count: int) -> None:
        self.counts["tokens"] += count
        if self.exported and count:  # Ray's counters take positive increments only
            self.exported["tokens"].inc(count)

    def rejected(self, reason: str) -> None:
        self.counts["rejections", reason] += 1
        if self.exported:
            self.exported["rejections"].inc(tags={"reason": reason})

    def batch(self, size: int) -> None:
        self.counts["batches", size] += 1
        if self.exported:
            self.exported["batch_size"].observe(size)


class Frontend:
    """What the routes of one server (or replica) share: the model (`ServedModel`), the `Limits`, the
    key's digest (None: no key), the metrics, the model thread (`Batcher`, batches of at most
    `max_batch_size` requests, waiting up to `batch_wait_ms` for more), and `embed(request, deadline)
    -> vectors` (the batcher's, or a stand-in the tests give). `queued` counts the model requests
    (embeddings, landmarks, searches) admitted and not yet answered (`Limits.max_queued_requests` at
    most)."""

    def __init__(self, served, limits: Limits, api_key_digest: bytes | None = None, embed=None,
                 metrics: Metrics | None = None, max_batch_size: int = 32, batch_wait_ms: float = 0.0):
        self.served, self.limits, self.api_key_digest = served, limits, api_key_digest
        self.metrics = metrics or Metrics()
        self.batcher = Batcher(served, max_batch_size, batch_wait_ms / 1000, on_batch=self.metrics.batch)
        self.embed = embed or self.batcher.embed
        self.queued = 0
        self.created = int(time.time())
        self.where: dict = {}  # on a Ray replica: its id and node, for /health
        self.behind_proxy = False  # on a Ray replica: Ray Serve's proxy gives each request its id
        self.logger = logger  # on a Ray replica: Ray Serve's, which writes the replica's log file

    async def run_model(self, function, *args):
        """`function(*args, alive=...)` on the model thread, in its turn after the work queued before it."""
        return await self.batcher.call(function, *args, deadline=time.monotonic() + self.limits.request_timeout_s)

    def authorized(self, headers) -> bool:
        if self.api_key_digest is None:
            return True
        scheme, _, given = headers.get("authorization", "").partition(" ")
        digest = hashlib.sha256(given.strip().encode("utf-8")).digest()
        return hmac.compare_digest(digest, self.api_key_digest) and scheme.lower() == "bearer"

    @contextlib.asynccontextmanager
    async def place(self):
        """A place in the queue for one model request, from before its body is read to its answer: 429 at
        once when the server already holds `max_queued_requests` (reading, counting, waiting for the
        model or computing), so a burst past the queue is refused without waiting for any of them."""
        if self.queued >= self.limits.max_queued_requests:
            raise ApiError(f"the server is busy: it holds {self.queued} requests, its limit "
                           "(--max-queued-requests); retry after the time in `retry-after`", status=429,
                           type="rate_limit_error", code="server_busy", headers={"retry-after": str(RETRY_AFTER_S)})
        self.queued += 1
        try:
            yield
        finally:
            self.queued -= 1

    async def answer(self, request: Request, work):
        """`await work`, cancelled (499) when the client hangs up first. Behind Ray Serve's proxy, the
        proxy cancels a request whose client has gone."""
        if self.behind_proxy:
            return await work
        return await unless_client_leaves(request, work)


class ClientGone(ApiError):
    def __init__(self):
        super().__init__("the client closed the connection before the answer", status=499,
                         code="client_closed_request")


async def unless_client_leaves(request: Request, work):
    """`await work`, unless the client hangs up first (ASGI's `http.disconnect`, which the server sends
    once the body has been read and the connection closes): then `work` is cancelled (its model work
    dropped where it has not started) and `ClientGone` raised."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():  # cancelled above: it ends at its next step
        raise ClientGone()
    return task.result()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def json_response(content: dict) -> Response:
    """A 200 whose body orjson writes (`protocol.dump_json`): FastAPI's own path would walk every float."""
    return Response(protocol.dump_json(content), media_type="application/json")


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def send_error(send, error: ApiError, request_id: str | None) -> None:
    """An error answer sent straight over ASGI (from `Guard`, outside the app), with the request id
    unless a proxy in front adds it."""
    body = json.dumps(error.body()).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *([(REQUEST_ID_HEADER.encode(), request_id.encode())] if request_id else []),
               *((name.encode(), value.encode()) for name, value in error.headers.items())]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware around the routes: the request id, the key, the deadline, the 500 without
    internals, and the request metrics."""

    def __init__(self, app, frontend: Frontend):
        self.app, self.frontend = app, frontend

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        frontend, path = self.frontend, scope.get("path", "")
        headers = Headers(scope=scope)
        # Behind Ray Serve's proxy the request already has its id (the client's, or one the proxy made),
        # and the proxy puts it on the answer; here alone, the app gives one.
        request_id = headers.get(REQUEST_ID_HEADER) if frontend.behind_proxy else None
        request_id = request_id or uuid.uuid4().hex
        started, status, arrived = False, 500, time.monotonic()

        async def send_with_id(message):
            nonlocal started, status
            if message["type"] == "http.response.start":
                started, status = True, message["status"]
                if not frontend.behind_proxy:
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (REQUEST_ID_HEADER.encode(), request_id.encode())]}
            await send(message)

        async def refuse(error: ApiError):
            nonlocal status
            status = error.status
            frontend.metrics.rejected(error.code)
            await send_error(send, error, None if frontend.behind_proxy else request_id)

        try:
            if path not in OPEN_PATHS and not frontend.authorized(headers):
                return await refuse(ApiError("missing or wrong API key: send `Authorization: Bearer KEY`", status=401,
                                             code="invalid_api_key", headers={"www-authenticate": "Bearer"}))
            try:
                async with asyncio.timeout(frontend.limits.request_timeout_s):
                    await self.app(scope, receive, send_with_id)
            except TimeoutError:
                if not started:
                    await refuse(ApiError(f"the request took longer than this server's limit of "
                                          f"{frontend.limits.request_timeout_s:g} s (--request-timeout-s)", status=504,
                                          type="server_error", code="timeout"))
        except Exception:
            frontend.logger.exception("request %s failed", request_id)
            if not started:
                status = 500
                await send_error(send, ApiError(f"internal error (request id {request_id})", status=500,
                                                type="server_error", code="internal_error"),
                                 None if frontend.behind_proxy else request_id)
        finally:
            frontend.metrics.request(path if path in ROUTES else "other", status, time.monotonic() - arrived)


async def read_json(request: Request, limits: Limits):
    """The body as JSON, read while it streams in: 413 past `max_body_bytes` (a declared
    content-length over it before a byte is read), 408 when it has not all arrived within
    `read_timeout_s`, 400 when it is cut off, not UTF-8 or not JSON (`protocol.parse_json`)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(f"content-length {declared!r} is not a number of bytes", code="invalid_body")
        declared = int(declared)
    too_large = ApiError(f"the request body is over this server's limit of {limits.max_body_bytes} bytes "
                         "(--max-body-bytes); send fewer texts a request", status=413, code="request_too_large")
    if declared is not None and declared > limits.max_body_bytes:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(f"the request body did not arrive within {limits.read_timeout_s:g} s (--read-timeout-s): "
                       f"{size} bytes came", status=408, code="request_timeout") from None
    except ClientDisconnect:
        raise ApiError(f"the request body was cut off after {size} bytes", code="incomplete_body") from None
    if declared is not None and size != declared:
        raise ApiError(f"the request body ended after {size} of its {declared} bytes", code="incomplete_body")
    return protocol.parse_json(b"".join(chunks))


# Routes by path (others are counted as "other" in the metrics).
ROUTES = ("/v1/embeddings", "/v1/landmarks", "/v1/search", "/v1/models", "/health", "/metrics")


def build_api(frontend: Frontend) -> FastAPI:
    """The FastAPI app of one replica: its routes over `frontend`, inside `Guard`."""
    api = FastAPI(title="lmk-embed", docs_url=None, redoc_url=None, openapi_url=None)
    add_error_handlers(api, frontend)
    add_model_routes(api, frontend)
    add_info_routes(api, frontend)
    api.add_middleware(Guard, frontend=frontend)
    return api


def add_error_handlers(api: FastAPI, frontend: Frontend) -> None:
    """Every refusal in OpenAI's error shape, counted by its code."""

    @api.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        frontend.metrics.rejected(error.code)
        return error_response(error)

    @api.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):  # unknown paths and methods, in OpenAI's shape too
        code = "not_found" if error.status_code == 404 else "method_not_allowed"
        return await api_error(request, ApiError(str(error.detail), status=error.status_code, code=code))

    @api.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        return await api_error(request, ApiError(f"invalid request: {error.errors()[:1]}", code="invalid_body"))


def add_model_routes(api: FastAPI, frontend: Frontend) -> None:
    """/v1/embeddings, /v1/landmarks and /v1/search: checked, counted, queued, then the model."""
    served, limits = frontend.served, frontend.limits

    async def embedding_request(request: Request, landmarks: bool = False):
        """The body parsed (400) and its tokens counted (413)."""
        parsed = protocol.parse_embeddings(await read_json(request, limits), served.name, served.dimension,
                                           served.family, landmarks, served.per_request, served.fixed,
                                           limits.max_inputs)
        return parsed, await count(served.check, parsed, parsed.texts)

    async def count(check, parsed, texts):
        """`check(parsed)` on the event loop for a short request (a thread hop would cost more than the
        count), in a worker thread beside it for a long one (the loop keeps answering meanwhile)."""
        if sum(map(len, texts)) <= INLINE_COUNT_CHARS:
            return check(parsed)
        return await asyncio.to_thread(check, parsed)

    @api.post("/v1/embeddings")
    async def embeddings(request: Request):
        async with frontend.place():
            parsed, tokens = await embedding_request(request)
            vectors = await frontend.answer(request, frontend.embed(parsed,
                                                                    time.monotonic() + limits.request_timeout_s))
        frontend.metrics.tokens(tokens)
        return json_response(protocol.embeddings_response(vectors, parsed, served.name, tokens))

    @api.post("/v1/landmarks")
    async def landmarks(request: Request):
        async with frontend.place():
            parsed, tokens = await embedding_request(request, landmarks=True)
            output = await frontend.answer(request, frontend.run_model(served.landmarks, parsed))
        frontend.metrics.tokens(tokens)
        return json_response(protocol.landmarks_response(output, parsed, served.name, tokens))

    @api.post("/v1/search")
    async def search(request: Request):
        async with frontend.place():
            parsed = protocol.parse_search(await read_json(request, limits), served.name, limits.max_inputs)
            if served.index is None:
                raise ApiError("this server has no index: start it with --index DIR (an encode-corpus "
                               "--output-value landmarks folder)", status=404, code="no_index")
            tokens = await count(served.check_queries, parsed, parsed.queries)
            results = await frontend.answer(request, frontend.run_model(served.search, parsed))
        frontend.metrics.tokens(tokens)
        return json_response(protocol.search_response(results, parsed, served.name))


def add_info_routes(api: FastAPI, frontend: Frontend) -> None:
    """/v1/models, /metrics and /health."""
    served = frontend.served

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": frontend.created,
                                            "owned_by": "lmk-embed", "family": served.family,
                                            "dimension": served.dimension, "search": served.index is not None}]}

    @api.get("/metrics")
    async def metrics():
        """The one process's metrics in Prometheus' text format (on Ray, Ray's metrics agent serves them)."""
        if frontend.metrics.registry is None:
            raise ApiError("metrics are served by Ray's metrics agent here (the address `lmk-embed serve` printed)",
                           status=404, code="not_found")
        return Response(frontend.metrics.text(), media_type="text/plain; version=0.0.4")

    @api.get("/health")
    async def health():
        """Ready: a replica answers only once its model is loaded. Names the replica, its node and process,
        so an operator (and the tests) can see where requests land."""
        return {"status": "ok", "model": served.name, **frontend.where, "pid": os.getpid(), "queued": frontend.queued}


def build_local_api(settings: dict, limits: Limits, api_key: str | None = None, max_batch_size: int = 32,
                    batch_wait_ms: float = 0.0) -> FastAPI:
    """The app of the one-process server: the model of `settings` (`ServedModel`'s arguments) loaded
    here, its model thread, and the routes."""
    from .model import ServedModel

    frontend = Frontend(ServedModel(**settings), limits, key_digest(api_key), max_batch_size=max_batch_size,
                        batch_wait_ms=batch_wait_ms, metrics=Metrics(export="process"))
    api = build_api(frontend)
    api.state.frontend = frontend
    return api


def replica_class():
    """The Ray Serve deployment class (Ray imported only when serving on Ray)."""
    from ray import serve

    @serve.deployment(name="lmk-embed", ray_actor_options={"num_cpus": 1})
    @serve.ingress()
    class EmbeddingServer:
        """One replica: the model (and index) of `settings` (`ServedModel`'s arguments), `limits`, the
        key's digest, and its own model thread (`Batcher`) batching as the one-process server does."""

        def __init__(self, settings: dict, limits: Limits, api_key_digest: bytes | None = None,
                     max_batch_size: int = 32, batch_wait_ms: float = 0.0):
            from .model import ServedModel

            import ray

            self.frontend = Frontend(ServedModel(**settings), limits, api_key_digest, metrics=Metrics(export="ray"),
                                     max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms)
            self.frontend.behind_proxy = True
            self.frontend.logger = logging.getLogger("ray.serve")
            replica = serve.get_replica_context().replica_id
            self.frontend.where = {"replica": str(getattr(replica, "unique_id", replica)),
                                   "node": ray.get_runtime_context().get_node_id()}

        def __serve_build_asgi_app__(self):
            return build_api(self.frontend)

    return EmbeddingServer


def build_application(settings: dict, limits: Limits, api_key: str | None = None, replicas: int = 1,
                      num_cpus: float = 1, max_batch_size: int = 32, batch_wait_ms: float = 0.0):
    """The bound Ray Serve application: `replicas` copies of the model, each reserving `num_cpus` Ray CPUs."""
    # Ray lets a replica take more requests than its queue holds, so that the ones past the queue reach
    # the app and get their 429 at once instead of waiting in Ray's router; the probes and checks too.
    deployment = replica_class().options(num_replicas=replicas, ray_actor_options={"num_cpus": num_cpus},
                                         max_ongoing_requests=2 * limits.max_queued_requests + 32)
    return deployment.bind(settings, limits, key_digest(api_key), max_batch_size, batch_wait_ms)
