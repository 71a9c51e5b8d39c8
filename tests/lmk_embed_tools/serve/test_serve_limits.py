"""`lmk-embed serve`'s guards, on the FastAPI app in this process (no Ray): the API key, every limit
just under and just over, malformed and cut-off bodies, a slow client, the deadline, the bounded
queue, a fault without internals, and per-request options. Each answer: its status, OpenAI's error
shape, an `x-request-id`, and a server still healthy after it."""

import asyncio
import json
import logging

import httpx
import numpy as np
import pytest

from lmk_embed_tools.serve.app import Frontend, build_api, key_digest
from lmk_embed_tools.serve.protocol import Limits

KEY = "sk-test-key"
LIMITS = Limits(max_body_bytes=4000, max_inputs=4, max_input_tokens=40, max_request_tokens=60, request_timeout_s=30,
                read_timeout_s=0.5, max_queued_requests=2)


@pytest.fixture(scope="module")
def served(lmk_checkpoint):
    from lmk_embed_tools.serve.model import ServedModel

    return ServedModel(str(lmk_checkpoint), "tiny", max_input_tokens=LIMITS.max_input_tokens,
                       max_request_tokens=LIMITS.max_request_tokens, num_threads=1)


def app_for(served, limits: Limits = LIMITS, key: str | None = KEY, embed=None):
    frontend = Frontend(served, limits, key_digest(key), embed=embed)
    return frontend, build_api(frontend)


def call(api, method: str, path: str, body=None, content=None, headers=None, key: str | None = KEY):
    """One request in this process; `body` is sent as JSON, `content` as it is (bytes or async chunks)."""
    async def go():
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            sent = {**({"authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
            if body is not None:
                return await client.request(method, path, json=body, headers=sent)
            return await client.request(method, path, content=content, headers=sent)
    return asyncio.run(go())


def words(count: int) -> str:
    return " ".join(["word"] * count)


def assert_error(response, status: int, code: str, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code and error["param"] == param
    assert response.headers["x-request-id"]


def assert_healthy(api):
    response = call(api, "GET", "/health", key=None)
    assert response.status_code == 200 and response.json()["status"] == "ok"


def embed_body(texts, **fields):
    return {"model": "tiny", "input": texts, **fields}


async def slow_chunks(body: bytes, pause_s: float):
    for start in range(0, len(body), 8):
        await asyncio.sleep(pause_s)
        yield body[start:start + 8]


async def cut_off(body: bytes):
    yield body[: len(body) // 2]


def test_a_word_is_one_token(served):
    """The table's token counts rest on this: each "word" of `words(n)` is one model token."""
    from lmk_embed.encoding import encode_content

    assert [len(e.ids) for e in encode_content(served.model.tokenizer, [words(40), words(41)])] == [40, 41]


PER_INPUT, PER_REQUEST = LIMITS.max_input_tokens, LIMITS.max_request_tokens
ERROR_TABLE = [
    # (name, request keywords for `call`, status, code, param); code None: a 200
    ("no key", {"body": embed_body("x"), "key": None}, 401, "invalid_api_key", None),
    ("wrong key", {"body": embed_body("x"), "key": "sk-wrong"}, 401, "invalid_api_key", None),
    ("wrong scheme", {"body": embed_body("x"), "key": None, "headers": {"authorization": f"Basic {KEY}"}}, 401,
     "invalid_api_key", None),
    ("right key", {"body": embed_body("x")}, 200, None, None),
    ("models needs the key", {"method": "GET", "path": "/v1/models", "key": None}, 401, "invalid_api_key", None),
    ("body at the limit", {"content": json.dumps(embed_body("x")).ljust(LIMITS.max_body_bytes).encode(),
                           "headers": {"content-type": "application/json"}}, 200, None, None),
    ("body over the limit", {"content": json.dumps(embed_body("x")).ljust(LIMITS.max_body_bytes + 1).encode()}, 413,
     "request_too_large", None),
    ("body over the limit, streamed without a length",
     {"content": slow_chunks(json.dumps(embed_body("x")).ljust(LIMITS.max_body_bytes + 1).encode(), 0)}, 413,
     "request_too_large", None),
    ("inputs at the limit", {"body": embed_body(["a"] * LIMITS.max_inputs)}, 200, None, None),
    ("inputs over the limit", {"body": embed_body(["a"] * (LIMITS.max_inputs + 1))}, 413, "too_many_inputs", "input"),
    ("an input at the token limit", {"body": embed_body(words(PER_INPUT))}, 200, None, None),
    ("an input over the token limit", {"body": embed_body(["a", words(PER_INPUT + 1)])}, 413, "input_too_long",
     "input"),
    ("a request at the token limit", {"body": embed_body([words(PER_INPUT), words(PER_REQUEST - PER_INPUT)])}, 200,
     None, None),
    ("a request over the token limit", {"body": embed_body([words(PER_INPUT), words(PER_REQUEST - PER_INPUT + 1)])},
     413, "request_too_large", "input"),
    ("malformed JSON", {"content": b'{"model": "tiny", "input": '}, 400, "invalid_json", None),
    ("a body cut off mid-stream", {"content": cut_off(json.dumps(embed_body("x")).encode()),
                                   "headers": {"content-length": str(len(json.dumps(embed_body("x"))))}}, 400,
     "incomplete_body", None),
    ("a slow client", {"content": slow_chunks(json.dumps(embed_body(words(20))).encode(), 0.1)}, 408,
     "request_timeout", None),
    ("an input of the wrong type", {"body": embed_body({"text": "x"})}, 400, "invalid_type", "input"),
    ("a token array", {"body": embed_body([[1, 2]])}, 400, "invalid_type", "input"),
    ("an option fixed by the checkpoint", {"body": embed_body("x", pooling="cls")}, 400, "fixed_option", "pooling"),
    ("a bad per-request option", {"body": embed_body("x", granularity=0)}, 400, "invalid_value", "granularity"),
    ("a per-request option of the wrong type", {"body": embed_body("x", normalize="yes")}, 400, "invalid_value",
     "normalize"),
    ("an unknown path", {"path": "/v1/nothing"}, 404, "not_found", None),
]


@pytest.mark.parametrize("name, request_kwargs, status, code, param", ERROR_TABLE, ids=[row[0] for row in ERROR_TABLE])
def test_error_table(served, name, request_kwargs, status, code, param):
    _, api = app_for(served)
    kwargs = {"method": "POST", "path": "/v1/embeddings", **request_kwargs}
    response = call(api, kwargs.pop("method"), kwargs.pop("path"), **kwargs)
    if code is None:
        assert response.status_code == status, response.text
        assert response.headers["x-request-id"]
    else:
        assert_error(response, status, code, param)
        if status == 401:
            assert response.headers["www-authenticate"] == "Bearer"
    assert_healthy(api)


def test_served_vectors_equal_encode_with_the_checkpoint_options_and_per_request_ones(served, lmk_model):
    """No option forced on the checkpoint: a plain request is `encode()`; a per-request option is that
    `encode()` argument."""
    _, api = app_for(served, key=None)
    texts = ["json encoder options", "the csv module reads rows " * 3]
    for fields, options in (({}, {}), ({"granularity": 4}, {"granularity": 4}),
                            ({"long_input": "windows", "window_length": 16}, {"long_input": "windows",
                                                                              "window_length": 16})):
        response = call(api, "POST", "/v1/embeddings", embed_body(texts, **fields), key=None)
        got = np.asarray([item["embedding"] for item in response.json()["data"]])
        expected = np.asarray(lmk_model.encode(texts, show_progress_bar=False, **options))
        assert np.abs(got - expected).max() <= 1e-6, fields
    # Two windows of 16 read a text the one-pass default would refuse at the same limit.
    assert served.model.config.long_input == "one-pass"


def test_the_deadline_answers_504_and_the_server_stays_up(served):
    async def never(request, deadline):
        await asyncio.sleep(60)

    _, api = app_for(served, Limits(**{**LIMITS.__dict__, "request_timeout_s": 0.3}), embed=never)
    assert_error(call(api, "POST", "/v1/embeddings", embed_body("x")), 504, "timeout")
    assert_healthy(api)


def test_a_full_queue_answers_429_at_once_with_retry_after(served):
    """Two requests held by the model fill the queue (2); the third gets 429 while they wait, and
    once they are answered the next request is served."""
    release = asyncio.Event

    async def run():
        gate = release()

        async def held(request, deadline):
            await gate.wait()
            return np.zeros((len(request.texts), served.dimension), dtype=np.float32)

        frontend, api = app_for(served, embed=held)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test",
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            waiting = [asyncio.create_task(client.post("/v1/embeddings", json=embed_body("x"))) for _ in range(2)]
            while frontend.queued < 2:
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/embeddings", json=embed_body("x"))
            gate.set()
            answered = await asyncio.gather(*waiting)
            after = await client.post("/v1/embeddings", json=embed_body("x"))
        return refused, answered, after, frontend

    refused, answered, after, frontend = asyncio.run(run())
    assert_error(refused, 429, "server_busy")
    assert refused.headers["retry-after"] == "1" and refused.json()["error"]["type"] == "rate_limit_error"
    assert [response.status_code for response in answered] == [200, 200] and after.status_code == 200
    assert frontend.queued == 0 and frontend.metrics.counts["rejections", "server_busy"] == 1


def test_a_fault_is_500_internal_error_with_the_request_id_and_the_trace_in_the_log(served, caplog):
    async def broken(request, deadline):
        raise RuntimeError("secret internal detail")

    _, api = app_for(served, embed=broken)
    with caplog.at_level(logging.ERROR, logger="lmk_embed_tools.serve"):
        response = call(api, "POST", "/v1/embeddings", embed_body("x"))
    assert response.status_code == 500
    request_id = response.headers["x-request-id"]
    assert response.json()["error"]["message"] == f"internal error (request id {request_id})"
    assert "secret" not in response.text
    assert any(request_id in record.getMessage() and "secret internal detail" in record.exc_text
               for record in caplog.records if record.exc_text)
    assert_healthy(api)


def test_metrics_count_requests_tokens_and_rejections(served):
    frontend, api = app_for(served)
    call(api, "POST", "/v1/embeddings", embed_body(words(5)))
    call(api, "POST", "/v1/embeddings", embed_body(words(5)), key=None)
    counts = frontend.metrics.counts
    assert counts["requests", "/v1/embeddings", 200] == 1 and counts["requests", "/v1/embeddings", 401] == 1
    assert counts["tokens"] == 5 and counts["rejections", "invalid_api_key"] == 1


def test_recurrent_per_request_options_are_encode_arguments_and_fixed_ones_are_refused(mamba2_checkpoint):
    """The recurrent spec's per-call options (schedule, block_size) are request fields; its fixed
    ones (add_bos_token) are refused naming them; a landmark option is an unknown field here."""
    from transformers import AutoModel

    from lmk_embed_tools.serve.model import ServedModel

    served = ServedModel(str(mamba2_checkpoint), "tiny", num_threads=1)
    model = AutoModel.from_pretrained(mamba2_checkpoint, trust_remote_code=True).eval()
    assert "block_size" in served.per_request and "add_bos_token" in served.fixed
    _, api = app_for(served, key=None)
    texts = ["The json module exposes an API.", "Compact encoding! " * 30]
    for fields in ({}, {"block_size": 16}, {"schedule": "horizontal"}):
        response = call(api, "POST", "/v1/embeddings", embed_body(texts, **fields), key=None)
        got = np.asarray([item["embedding"] for item in response.json()["data"]])
        assert np.abs(got - np.asarray(model.encode(texts, show_progress_bar=False, **fields))).max() <= 1e-6, fields
    assert_error(call(api, "POST", "/v1/embeddings", embed_body("x", add_bos_token=True), key=None), 400,
                 "fixed_option", "add_bos_token")
    assert_error(call(api, "POST", "/v1/embeddings", embed_body("x", granularity=8), key=None), 400,
                 "unknown_field", "granularity")
    assert_error(call(api, "POST", "/v1/embeddings", embed_body("x", block_size=-1), key=None), 400,
                 "invalid_value", "block_size")


ROOMY = Limits(max_body_bytes=1_000_000, max_input_tokens=4000, max_request_tokens=8000)


@pytest.fixture(scope="module")
def roomy(lmk_checkpoint):
    """The tiny LMK checkpoint (g=8) under limits that let a 300-token text and a 5,000-digit number through."""
    from lmk_embed_tools.serve.model import ServedModel

    return ServedModel(str(lmk_checkpoint), "tiny", max_input_tokens=ROOMY.max_input_tokens,
                       max_request_tokens=ROOMY.max_request_tokens, num_threads=1)


def raw_body(fields: str) -> bytes:
    """A body written by hand: `fields` JSON after the model and a text."""
    return ('{"model": "tiny", "input": "x", ' + fields + "}").encode()


BAD_VALUES = [
    # (name, body bytes, code, param): each a 400 naming the field (or the body), never a 500
    ("JSON nested too deep", ('{"model": "tiny", "input": ' + "[" * 5000 + "]" * 5000 + "}").encode(), "invalid_json",
     None),
    ("JSON nested too deep, as a list", ("[" * 100_000 + "]" * 100_000).encode(), "invalid_json", None),
    ("a 5,000-digit integer", raw_body('"dimensions": ' + "7" * 5000), "invalid_value", "dimensions"),
    ("a 5,000-digit integer as an option", raw_body('"granularity": ' + "7" * 5000), "invalid_type", "granularity"),
    ("a 5,000-digit integer as a text", b'{"model": "tiny", "input": [' + b"7" * 5000 + b"]}", "invalid_type", "input"),
    ("a number past a double", raw_body('"granularity": 1e400'), "invalid_type", "granularity"),
    ("NaN", raw_body('"granularity": NaN'), "invalid_json", None),
    ("granularity 2**70", raw_body(f'"granularity": {2**70}'), "invalid_value", "granularity"),
    ("granularity 2**64 - 1", raw_body(f'"granularity": {2**64 - 1}'), "invalid_value", "granularity"),
    ("granularity 2**63", raw_body(f'"granularity": {2**63}'), "invalid_value", "granularity"),
    ("window_length 3 on a 300-token text", json.dumps(embed_body(words(300), long_input="windows",
                                                                  window_length=3)).encode(), "invalid_value",
     "window_length"),
    ("window_length 9 (g + 1) on a 300-token text", json.dumps(embed_body(words(300), long_input="windows",
                                                                          window_length=9)).encode(),
     "invalid_value", "window_length"),
    ("window_length 2**31", json.dumps(embed_body("x", long_input="windows", window_length=2**31)).encode(),
     "invalid_value", "window_length"),
]


@pytest.mark.parametrize("name, content, code, param", BAD_VALUES, ids=[row[0] for row in BAD_VALUES])
def test_every_bad_value_is_a_400_naming_its_field(roomy, name, content, code, param):
    _, api = app_for(roomy, ROOMY)
    response = call(api, "POST", "/v1/embeddings", content=content, headers={"content-type": "application/json"})
    assert_error(response, 400, code, param)
    assert_healthy(api)


def test_a_window_too_small_for_a_chunk_still_reads_a_text_that_fits_it_as_encode_does(roomy, lmk_model):
    """The model applies its window rule only to a text it must cut: a short text is read whole."""
    _, api = app_for(roomy, ROOMY)
    response = call(api, "POST", "/v1/embeddings", embed_body("zip", long_input="windows", window_length=3))
    assert response.status_code == 200, response.text
    expected = lmk_model.encode(["zip"], long_input="windows", window_length=3, show_progress_bar=False)
    assert np.abs(np.asarray(response.json()["data"][0]["embedding"]) - expected[0]).max() <= 1e-6


def test_a_request_holds_its_place_from_its_first_byte_so_a_burst_is_refused_at_once(served):
    """Two clients still sending their bodies fill a queue of 2: a third is refused with 429 before
    either body has arrived (a burst past the queue never waits behind the ones admitted)."""
    async def run():
        frontend, api = app_for(served)
        gate = asyncio.Event()

        async def held_body():
            yield b'{"model": "tiny", '
            await gate.wait()
            yield b'"input": "x"}'

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test",
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            sending = [asyncio.ensure_future(client.post("/v1/embeddings", content=held_body())) for _ in range(2)]
            async with asyncio.timeout(20):
                while frontend.queued < 2:
                    await asyncio.sleep(0.01)
            refused = await client.post("/v1/embeddings", json=embed_body("x"))
            gate.set()
            answered = await asyncio.gather(*sending)
        return refused, answered

    refused, answered = asyncio.run(run())
    assert_error(refused, 429, "server_busy")
    assert [response.status_code for response in answered] == [200, 200]


def test_one_process_serves_its_metrics_in_prometheus_format(served):
    from lmk_embed_tools.serve.app import Metrics

    frontend = Frontend(served, LIMITS, key_digest(KEY), metrics=Metrics(export="process"))
    api = build_api(frontend)
    call(api, "POST", "/v1/embeddings", embed_body(words(5)))
    call(api, "POST", "/v1/embeddings", embed_body(words(5)), key=None)
    assert_error(call(api, "GET", "/metrics", key=None), 401, "invalid_api_key")
    text = call(api, "GET", "/metrics").text
    assert 'lmk_embed_requests_total{path="/v1/embeddings",status="200"} 1.0' in text
    assert 'lmk_embed_rejections_total{reason="invalid_api_key"} 2.0' in text
    assert "lmk_embed_tokens_total 5.0" in text and 'lmk_embed_batch_size_bucket{le="1.0"} 1.0' in text
