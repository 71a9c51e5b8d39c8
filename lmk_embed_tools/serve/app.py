"""The Ray Serve application of `lmk-embed serve`: a FastAPI ingress over replicas of `ServedModel`.

Embedding requests are checked and their tokens counted as they arrive; then `@serve.batch` gathers
the requests that reach a replica within `batch_wait_ms` (at most `max_batch_size` of them) into one
`ServedModel.embed` call, which hands each request back exactly its own rows. The model runs in a
worker thread so the replica keeps answering (and queueing the next batch) while it computes.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations (`Request`) as types.
import asyncio
import json
import os
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
import ray
from ray import serve
from starlette.exceptions import HTTPException

from . import protocol
from .protocol import ApiError

api = FastAPI(title="lmk-embed", docs_url=None, redoc_url=None)


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


@api.exception_handler(ApiError)
async def api_error(_, error: ApiError):
    return error_response(error)


@api.exception_handler(HTTPException)
async def http_error(_, error: HTTPException):  # unknown paths and methods, in OpenAI's shape too
    return error_response(ApiError(str(error.detail), status=error.status_code, code="not_found"
                                   if error.status_code == 404 else "method_not_allowed"))


@api.exception_handler(RequestValidationError)
async def validation_error(_, error: RequestValidationError):
    return error_response(ApiError(f"invalid request: {error.errors()[:1]}", code="invalid_body"))


@api.exception_handler(Exception)
async def server_error(_, error: Exception):  # a fault of the server, never of the request: checked before
    return error_response(ApiError(f"the server failed: {type(error).__name__}: {error}", status=500,
                                   type="server_error", code="internal_error"))


async def read_json(request: Request):
    """The body as JSON, or 400 naming the fault (not JSON, not UTF-8)."""
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(f"the request body is not valid JSON: {error}", code="invalid_json") from None


@serve.deployment(name="lmk-embed", ray_actor_options={"num_cpus": 1})
@serve.ingress(api)
class EmbeddingServer:
    """One replica: the model (and index) of `settings` (`ServedModel`'s arguments), batching set
    by `max_batch_size` and `batch_wait_ms`."""

    def __init__(self, settings: dict, max_batch_size: int = 16, batch_wait_ms: float = 5.0):
        from .model import ServedModel

        self.served = ServedModel(**settings)
        self.created = int(time.time())
        self.embed_batch.set_max_batch_size(max_batch_size)
        self.embed_batch.set_batch_wait_timeout_s(batch_wait_ms / 1000)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def embed_batch(self, requests: list) -> list:
        return await asyncio.to_thread(self.served.embed, requests)

    def parse(self, body, landmarks: bool = False) -> protocol.EmbeddingRequest:
        served = self.served
        return protocol.parse_embeddings(body, served.name, served.dimension, served.family, landmarks)

    @api.post("/v1/embeddings")
    async def embeddings(self, request: Request):
        parsed = self.parse(await read_json(request))
        tokens = await asyncio.to_thread(self.served.check, parsed)
        vectors = await self.embed_batch(parsed)
        return protocol.embeddings_response(vectors, parsed, self.served.name, tokens)

    @api.post("/v1/landmarks")
    async def landmarks(self, request: Request):
        parsed = self.parse(await read_json(request), landmarks=True)
        tokens = await asyncio.to_thread(self.served.check, parsed)
        output = await asyncio.to_thread(self.served.landmarks, parsed)
        data = [{"object": "landmarks", "index": index,
                 "landmarks": [{"embedding": protocol.encode_vector(vector, parsed.encoding_format), "span": span}
                               for vector, span in zip(item["embeddings"], item["spans"])]}
                for index, item in enumerate(output)]
        return {"object": "list", "data": data, "model": self.served.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @api.post("/v1/search")
    async def search(self, request: Request):
        parsed = protocol.parse_search(await read_json(request), self.served.name)
        results = await asyncio.to_thread(self.served.search, parsed)
        return {"object": "list", "model": self.served.name, "mode": parsed.mode,
                "data": [{"object": "search_result", "index": index, "query": query, "hits": hits}
                         for index, (query, hits) in enumerate(zip(parsed.queries, results))]}

    @api.get("/v1/models")
    async def models(self):
        served = self.served
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": self.created,
                                            "owned_by": "lmk-embed", "family": served.family,
                                            "dimension": served.dimension, "search": served.index is not None}]}

    @api.get("/health")
    async def health(self):
        """Ready: a replica answers only once its model is loaded. Names the replica, its node and process,
        so an operator (and the tests) can see where requests land."""
        replica = serve.get_replica_context().replica_id
        return {"status": "ok", "model": self.served.name, "replica": str(getattr(replica, "unique_id", replica)),
                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


def build_application(settings: dict, replicas: int = 1, num_cpus: float = 1, max_batch_size: int = 16,
                      batch_wait_ms: float = 5.0):
    """The bound application: `replicas` copies of the model, each reserving `num_cpus` Ray CPUs."""
    # Serve lets 5 requests into a replica by default: too few to fill a batch. Four batches may wait.
    deployment = EmbeddingServer.options(num_replicas=replicas, ray_actor_options={"num_cpus": num_cpus},
                                         max_ongoing_requests=4 * max_batch_size)
    return deployment.bind(settings, max_batch_size, batch_wait_ms)
