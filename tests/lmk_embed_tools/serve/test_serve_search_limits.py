"""`/v1/search` under the rules `/v1/embeddings` keeps, on the app in this process: queries count as
inputs and their tokens against the token limits (413, never cut), `top_k` has an upper bound,
searches take places in the same queue, and a request whose client hangs up is cancelled with its
model work dropped where it has not started."""

import asyncio
import json
import threading

import httpx
import numpy as np
import pytest

from lmk_embed_tools.serve.protocol import MAX_TOP_K
from tests.lmk_embed_tools.serve.test_serve_limits import KEY, LIMITS, app_for, assert_error, assert_healthy, call, words


@pytest.fixture(scope="module")
def index(tmp_path_factory, lmk_checkpoint):
    from lmk_embed_tools.corpus import encode_corpus

    root = tmp_path_factory.mktemp("search-index")
    texts = ["json encoder options and decoders", "the csv module reads rows", "zip archives hold files"]
    (root / "input.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    encode_corpus(str(lmk_checkpoint), str(root / "input.jsonl"), root / "index", output_value="landmarks",
                  show_progress_bar=False)
    return root / "index"


@pytest.fixture(scope="module")
def served(lmk_checkpoint, index):
    from lmk_embed_tools.serve.model import ServedModel

    return ServedModel(str(lmk_checkpoint), "tiny", index=str(index), max_input_tokens=LIMITS.max_input_tokens,
                       max_request_tokens=LIMITS.max_request_tokens, num_threads=1)


SEARCH_TABLE = [
    # (name, body, status, code, param); code None: a 200
    ("queries at the input limit", {"query": ["zip"] * LIMITS.max_inputs}, 200, None, None),
    ("queries over the input limit", {"query": ["zip"] * (LIMITS.max_inputs + 1)}, 413, "too_many_inputs", "query"),
    ("a query at the token limit", {"query": words(LIMITS.max_input_tokens)}, 200, None, None),
    ("a query over the token limit: refused, never cut", {"query": ["zip", words(LIMITS.max_input_tokens + 1)]}, 413,
     "input_too_long", "query"),
    ("queries over the request's token limit", {"query": [words(40), words(21)]}, 413, "request_too_large", "query"),
    ("top_k at its bound", {"query": "zip", "top_k": MAX_TOP_K}, 200, None, None),
    ("top_k over its bound", {"query": "zip", "top_k": MAX_TOP_K + 1}, 400, "invalid_value", "top_k"),
    ("top_k 10**12", {"query": "zip", "top_k": 10**12}, 400, "invalid_value", "top_k"),
    ("top_k 2**70", {"query": "zip", "top_k": 2**70}, 400, "invalid_value", "top_k"),
]


@pytest.mark.parametrize("name, body, status, code, param", SEARCH_TABLE, ids=[row[0] for row in SEARCH_TABLE])
def test_search_error_table(served, name, body, status, code, param):
    _, api = app_for(served)
    response = call(api, "POST", "/v1/search", {"model": "tiny", **body})
    if code is None:
        assert response.status_code == status, response.text
        assert len(response.json()["data"]) == len(body["query"]) if isinstance(body["query"], list) else 1
    else:
        assert_error(response, status, code, param)
    assert_healthy(api)


def test_a_query_the_model_would_cut_is_refused(lmk_checkpoint, index):
    """A landmark checkpoint reading in one pass cuts a text at its max_length (512 here, under the
    server's limit): a query one token longer is refused there, as a text is."""
    from lmk_embed_tools.serve.model import ServedModel
    from lmk_embed_tools.serve.protocol import Limits

    served = ServedModel(str(lmk_checkpoint), "tiny", index=str(index), max_input_tokens=4000, num_threads=1)
    _, api = app_for(served, Limits(max_body_bytes=100_000, max_input_tokens=4000))
    limit = served.model.resolve(prompt=served.model.config.query_prompt or None).max_length
    assert limit == 512
    assert call(api, "POST", "/v1/search", {"query": words(100)}).status_code == 200
    assert_error(call(api, "POST", "/v1/search", {"query": words(limit)}), 413, "input_too_long", "query")


def block_the_model(frontend):
    """A call that holds the model thread until `gate` is set; returns (its task, gate, started)."""
    gate, started = threading.Event(), threading.Event()

    def held(alive):
        started.set()
        gate.wait(30)

    return asyncio.ensure_future(frontend.batcher.call(held)), gate, started


async def until(condition, timeout_s: float = 20):
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def test_searches_and_embeddings_share_one_queue(served):
    """With the model busy, a search and an embedding fill a queue of 2: the next of either is 429;
    once the model is free both are answered."""
    async def run():
        frontend, api = app_for(served)
        blocker, gate, started = block_the_model(frontend)
        await until(started.is_set)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test",
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            waiting = [asyncio.ensure_future(client.post("/v1/search", json={"query": "zip"})),
                       asyncio.ensure_future(client.post("/v1/embeddings", json={"model": "tiny", "input": "zip"}))]
            await until(lambda: frontend.queued == 2)
            refused = [await client.post("/v1/search", json={"query": "zip"}),
                       await client.post("/v1/embeddings", json={"model": "tiny", "input": "zip"})]
            gate.set()
            await blocker
            answered = await asyncio.gather(*waiting)
        return refused, answered, frontend

    refused, answered, frontend = asyncio.run(run())
    for response in refused:
        assert_error(response, 429, "server_busy")
    assert [response.status_code for response in answered] == [200, 200] and frontend.queued == 0


async def hang_up(api, path: str, body: dict, gone: asyncio.Event) -> list:
    """One request over ASGI whose client sends its body, then hangs up once `gone` is set; the messages sent back."""
    content = json.dumps(body).encode()
    messages = [{"type": "http.request", "body": content, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {KEY}".encode()),
                         (b"content-length", str(len(content)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000)}
    await api(scope, receive, send)
    return sent


@pytest.mark.parametrize("path, body", [("/v1/search", {"query": ["zip", "csv rows"]}),
                                        ("/v1/embeddings", {"model": "tiny", "input": ["zip", "csv rows"]})])
def test_a_client_that_hangs_up_is_cancelled_and_its_work_dropped(served, monkeypatch, path, body):
    """The model is busy; a request queues behind it and its client hangs up: the request leaves the
    queue at once, the model never computes it, and the next request is answered."""
    computed = []
    for name in ("search", "embed"):
        original = getattr(served, name)
        monkeypatch.setattr(served, name, lambda *args, _original=original, _name=name, **kwargs:
                            computed.append(_name) or _original(*args, **kwargs))

    async def run():
        frontend, api = app_for(served)
        blocker, gate, started = block_the_model(frontend)
        await until(started.is_set)
        gone = asyncio.Event()
        request = asyncio.ensure_future(hang_up(api, path, body, gone))
        await until(lambda: frontend.queued == 1)
        gone.set()
        sent = await request
        queued_after = frontend.queued
        gate.set()
        await blocker
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test",
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            after = await client.post("/v1/embeddings", json={"model": "tiny", "input": "hi"})
        return sent, queued_after, after, frontend

    sent, queued_after, after, frontend = asyncio.run(run())
    assert sent[0]["status"] == 499 and queued_after == 0
    assert after.status_code == 200 and computed == ["embed"]  # only the request after it
    assert frontend.metrics.counts["rejections", "client_closed_request"] == 1


def test_long_work_stops_between_slices_once_nobody_waits(served, monkeypatch):
    """`alive()` is asked before each slice of SLICE_TEXTS: a search of 300 queries whose client left
    after the first slice reads no more; an embedding batch nobody waits for computes nothing."""
    from lmk_embed_tools.serve import model as model_module
    from lmk_embed_tools.serve.protocol import EmbeddingRequest, SearchRequest

    slices = []
    original = served.model.encode_query
    monkeypatch.setattr(served.model, "encode_query", lambda queries, **kwargs: slices.append(len(queries)) or
                        original(queries, **kwargs))
    answers = iter([True, False])
    assert served.search(SearchRequest(tuple(["zip"] * 300)), alive=lambda: next(answers)) is None
    assert slices == [model_module.SLICE_TEXTS]
    assert served.embed([EmbeddingRequest(("zip",))], alive=lambda: False) == [None]
    full = served.search(SearchRequest(tuple(["zip", "csv rows"] * 150)))
    assert len(full) == 300 and full[0] == full[2] and full[1] == full[299]
    vectors = served.embed([EmbeddingRequest(tuple(f"text {n}" for n in range(300)))])[0]
    expected = served.model.encode([f"text {n}" for n in range(300)], show_progress_bar=False)
    assert vectors.shape == (300, served.dimension) and np.abs(vectors - expected).max() <= 1e-6


def test_the_request_checks_use_search_own_choices_and_import_no_torch():
    """The modes and fusions a search request may name are `corpus.search`'s own lists, and reading
    them loads neither torch nor the encoder (the corpus package imports its encoder on first use)."""
    import subprocess
    import sys

    code = ("import sys; from lmk_embed_tools.serve import protocol; from lmk_embed_tools.corpus import search; "
            "assert protocol.SEARCH_MODES is search.MODES and protocol.SEARCH_FUSIONS is search.FUSIONS; "
            "print(sorted(m for m in ('torch', 'lmk_embed_tools.corpus.encode') if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
