"""`lmk-embed serve` with the tiny LMK checkpoint and a landmark index, through real clients: the
`openai` package and httpx against a running server, in both modes: one process (the default) and
Ray Serve (`--replicas 1`), each started once for the module with its API key from the environment.
The guards' full table runs on the app in process (test_serve_limits.py, test_serve_search_limits.py);
here the rows that depend on the HTTP server (uvicorn, or Ray's proxy) in front of it."""

import asyncio
import copy
import ipaddress
import json
import os
import random
import time

import httpx
import numpy as np
import pytest

from tests.lmk_embed_tools.corpus.indexes import write_indexes
from tests.lmk_embed_tools.serve.servers import decode_base64, running_server

pytestmark = pytest.mark.slow
MAX_INPUT_TOKENS = 3000
KEY = "sk-serve-test"
AUTH = {"authorization": f"Bearer {KEY}"}
TEXTS = ["json encoder options", "the csv module reads rows and writes them back " * 40, "zip"]
LONG = "regular expressions match text; " * 200  # past the backbone's one-pass budget: read in windows
WINDOWS = {"long_input": "windows"}


@pytest.fixture(scope="module")
def index(tmp_path_factory, lmk_checkpoint):
    return write_indexes(tmp_path_factory.mktemp("serve-index"), lmk_checkpoint)


# The modes: the flags that pick them.
MODES = {"one process": (), "ray": ("--replicas", "1")}


@pytest.fixture(scope="module", params=list(MODES))
def mode(request):
    return request.param


@pytest.fixture(scope="module")
def server(lmk_checkpoint, index, tmp_path_factory, mode):
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    with running_server(lmk_checkpoint, "--index", str(index), "--max-input-tokens", str(MAX_INPUT_TOKENS),
                        "--max-batch-size", "8", "--batch-wait-ms", "10", "--read-timeout-s", "2",
                        "--max-body-bytes", "200000", "--max-inputs", "64", *MODES[mode], log_path=log,
                        env={"LMK_EMBED_API_KEY": KEY}) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def encode(model, texts, **kwargs):
    """In-process vectors (what the server must give: the checkpoint's own options, and the request's)."""
    return np.asarray(model.encode(texts, show_progress_bar=False, **kwargs))


def post(server, path, body, **kwargs):
    return httpx.post(f"{server}{path}", json=body, timeout=60, headers=AUTH, **kwargs)


def test_openai_client_vectors_equal_encode_float_and_base64(client, lmk_model):
    texts = TEXTS + [LONG]
    expected = encode(lmk_model, texts, **WINDOWS)
    # Unasked, the client requests base64 and decodes it itself; asked for base64, it hands over the strings.
    for encoding_format in ("float", None, "base64"):
        options = {"encoding_format": encoding_format} if encoding_format else {}
        response = client.embeddings.create(model="tiny", input=texts, extra_body=WINDOWS, **options)
        got = np.asarray([decode_base64(item.embedding) if encoding_format == "base64" else item.embedding
                          for item in response.data], dtype=np.float32)
        assert np.abs(got - expected).max() <= 1e-6
        assert [item.index for item in response.data] == list(range(len(texts)))
    counter = copy.deepcopy(lmk_model.tokenizer.backend_tokenizer)
    counter.no_truncation()
    counter.no_padding()
    tokens = sum(len(counter.encode(text, add_special_tokens=False).ids) for text in texts)
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens  # model tokens, no specials


def test_base64_is_little_endian_float32_and_a_string_input_is_one_text(server, lmk_model):
    body = post(server, "/v1/embeddings", {"model": "tiny", "input": "zip", "encoding_format": "base64"}).json()
    assert len(body["data"]) == 1 and body["object"] == "list" and body["model"] == "tiny"
    assert np.abs(decode_base64(body["data"][0]["embedding"]) - encode(lmk_model, ["zip"])[0]).max() <= 1e-6


def test_input_type_is_encode_query_and_encode_document(server, lmk_model):
    for input_type, method in (("query", lmk_model.encode_query), ("document", lmk_model.encode_document)):
        body = post(server, "/v1/embeddings", {"model": "tiny", "input": TEXTS, "input_type": input_type}).json()
        expected = np.asarray(method(TEXTS, show_progress_bar=False))
        assert np.abs(np.asarray([d["embedding"] for d in body["data"]]) - expected).max() <= 1e-6


def test_dimensions_shorten_and_renormalise(server, lmk_model):
    body = post(server, "/v1/embeddings", {"model": "tiny", "input": TEXTS, "dimensions": 8}).json()
    got = np.asarray([d["embedding"] for d in body["data"]])
    full = encode(lmk_model, TEXTS)[:, :8]
    assert got.shape == (3, 8)
    assert np.abs(got - full / np.linalg.norm(full, axis=1, keepdims=True)).max() <= 1e-6


@pytest.mark.parametrize("output_value", ["landmarks", "late_chunks"])
def test_landmarks_are_every_landmark_with_its_span(server, lmk_model, output_value):
    """/v1/landmarks gives what encode(output_value=...) gives: the landmark states (the default), or
    the late chunks (each chunk's mean token state) with `output_value: "late_chunks"`."""
    texts = [TEXTS[1], LONG]
    extra = {} if output_value == "landmarks" else {"output_value": output_value}
    body = post(server, "/v1/landmarks", {"model": "tiny", "input": texts, **WINDOWS, **extra}).json()
    expected = lmk_model.encode(texts, output_value=output_value, long_input="windows", show_progress_bar=False)
    for item, want in zip(body["data"], expected):
        got = np.asarray([landmark["embedding"] for landmark in item["landmarks"]])
        assert got.shape == want["embeddings"].shape and np.abs(got - want["embeddings"]).max() <= 1e-6
        assert [tuple(landmark["span"]) for landmark in item["landmarks"]] == [tuple(s) for s in want["spans"]]
    refused = post(server, "/v1/landmarks", {"model": "tiny", "input": ["x"], "output_value": "tokens"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "output_value"


def test_models_and_health(server, client):
    assert [model.id for model in client.models.list().data] == ["tiny"]
    health = httpx.get(f"{server}/health").json()  # open without the key
    assert health["status"] == "ok" and health["model"] == "tiny"


LONGER = "word " * (MAX_INPUT_TOKENS + 10)
ERROR_TABLE = [
    # (path, body (a str is sent as it is), status, param, words in the message)
    ("/v1/embeddings", "{not json", 400, None, "not valid JSON"),
    ("/v1/embeddings", "[1, 2]", 400, None, "JSON object"),
    ("/v1/embeddings", {"model": "tiny", "input": []}, 400, "input", "empty list"),
    ("/v1/embeddings", {"model": "tiny"}, 400, "input", "required"),
    ("/v1/embeddings", {"model": "tiny", "input": ["ok", 3]}, 400, "input", "input[1]` must be a string"),
    ("/v1/embeddings", {"model": "tiny", "input": [[101, 102]]}, 400, "input", "token arrays"),
    ("/v1/embeddings", '{"model": "tiny", "input": ["ok", "\\ud800"]}', 400, "input", "lone surrogate"),
    ("/v1/embeddings", {"model": "other", "input": "x"}, 404, "model", "does not exist"),
    ("/v1/embeddings", {"input": "x"}, 400, "model", "`model` is required"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "dimensions": 33}, 400, "dimensions", "from 1 to 32"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "dimensions": 0}, 400, "dimensions", "from 1 to 32"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "encoding_format": "int8"}, 400, "encoding_format", "one of"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "input_type": "passage"}, 400, "input_type", "one of"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "task": "find"}, 400, "task", "recurrent"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "temperature": 1}, 400, "temperature", "unknown field"),
    ("/v1/embeddings", {"model": "tiny", "input": ["x", LONGER]}, 413, "input", f"more than {MAX_INPUT_TOKENS} tokens"),
    ("/v1/embeddings", {"model": "tiny", "input": ["x", LONG]}, 413, "input", "longer than this model reads"),
    ("/v1/landmarks", {"model": "tiny", "input": ""} , None, None, None),  # an empty text has no landmarks: 200
    ("/v1/search", {"query": ["  "]}, 400, "query", "blank"),
    ("/v1/search", {"query": "x", "mode": "semantic"}, 400, "mode", "one of"),
    ("/v1/search", {"query": "x", "top_k": 0}, 400, "top_k", "from 1 to 1000"),
    ("/v1/search", {"query": "x", "top_k": 10**12}, 400, "top_k", "from 1 to 1000"),
    ("/v1/search", {"query": "x", "top_k": 2**70}, 400, "top_k", "from 1 to 1000"),
    ("/v1/search", {"query": ["x"] * 65}, 413, "query", "65 queries"),
    ("/v1/search", {"query": ["x", LONGER]}, 413, "query", f"more than {MAX_INPUT_TOKENS} tokens"),
    ("/v1/embeddings", '{"model": "tiny", "input": ' + "[" * 5000 + "]" * 5000 + "}", 400, None, "deeper than 1024"),
    ("/v1/embeddings", '{"model": "tiny", "input": "x", "dimensions": ' + "7" * 5000 + "}", 400, "dimensions",
     "5000 digits"),
    ("/v1/embeddings", {"model": "tiny", "input": "x", "granularity": 2**70}, 400, "granularity", "positive integer"),
    ("/v1/embeddings", {"model": "tiny", "input": "word " * 300, "long_input": "windows", "window_length": 3}, 400,
     "window_length", "must hold one chunk"),
    ("/v1/search", {"query": "x", "fuse": 2}, 400, "fuse", "from 0 to 1"),
    ("/v1/search", {"query": "x", "mode": "hybrid", "fusion": "sum"}, 400, "fusion", "one of"),
    ("/v1/search", {"query": "x", "mode": "hybrid", "fuse_weight": -0.5}, 400, "fuse_weight", "from 0 to 1"),
    ("/v1/nothing", {}, 404, None, "Not Found"),
]


@pytest.mark.parametrize("path, body, status, param, words", ERROR_TABLE, ids=[f"{r[0]}-{i}" for i, r in enumerate(ERROR_TABLE)])
def test_error_table(server, path, body, status, param, words):
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{server}{path}", content=content, headers={"content-type": "application/json", **AUTH},
                          timeout=60)
    if status is None:
        assert response.status_code == 200
        return
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"


def test_openai_client_raises_on_a_bad_request(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="empty list"):
        client.embeddings.create(model="tiny", input=[])


def test_a_burst_gives_every_request_its_own_vectors(server, lmk_model):
    """120 requests at concurrency 16, one to three texts of mixed lengths, some as queries: batched
    together on the replica, each answer must be its own inputs' vectors."""
    rng = random.Random(0)
    words = "json csv zip regular expression module reads rows files archive text encoder".split()
    requests = []
    for number in range(120):
        texts = [" ".join(rng.choices(words, k=rng.choice((1, 5, 40, 150)))) + f" {number}"
                 for _ in range(rng.randint(1, 3))]
        requests.append({"model": "tiny", "input": texts, **({"input_type": "query"} if number % 3 == 0 else {})})

    async def burst():
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=server, timeout=120, headers=AUTH) as http:
            async def one(body):
                async with limit:
                    return (await http.post("/v1/embeddings", json=body)).json()
            return await asyncio.gather(*(one(body) for body in requests))

    answers = asyncio.run(burst())
    plain = [t for body in requests if "input_type" not in body for t in body["input"]]
    queries = [t for body in requests if "input_type" in body for t in body["input"]]
    expected = dict(zip(plain, encode(lmk_model, plain)))
    expected_query = dict(zip(queries, np.asarray(lmk_model.encode_query(queries, show_progress_bar=False))))
    for body, answer in zip(requests, answers):
        table = expected_query if "input_type" in body else expected
        got = np.asarray([item["embedding"] for item in answer["data"]])
        assert np.abs(got - np.stack([table[t] for t in body["input"]])).max() <= 1e-6


def test_dense_search_equals_the_search_command(server, index, capsys):
    from lmk_embed_tools import cli

    queries = ["csv rows", "zip archives"]
    assert cli.main(["search", str(index), *queries, "--top-k", "3", "--fuse", "0.25", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    body = post(server, "/v1/search", {"query": queries, "top_k": 3, "fuse": 0.25}).json()
    served = [{"query": item["query"], "rank": rank, **hit} for item in body["data"]
              for rank, hit in enumerate(item["hits"], 1)]
    assert served == lines


def test_lexical_and_hybrid_search(server, index, capsys):
    """BM25 is the index's own; hybrid is `lmk-embed search --mode hybrid`, its fusion and weight per request."""
    from lmk_embed_tools import cli

    lexical = post(server, "/v1/search", {"query": "csv module rows", "mode": "lexical", "top_k": 2}).json()
    hits = lexical["data"][0]["hits"]
    assert hits[0]["id"] == "d1" and hits[0]["text"]  # the one document holding those words
    for body in ({}, {"fusion": "rank"}, {"fuse_weight": 1.0}):
        hybrid = post(server, "/v1/search", {"query": "csv module rows", "mode": "hybrid", "top_k": 4, **body}).json()
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in body.items()]
        assert cli.main(["search", str(index), "csv module rows", "--mode", "hybrid", "--top-k", "4", "--json",
                         *flags]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [{k: v for k, v in line.items() if k not in ("query", "rank")} for line in lines] == \
            hybrid["data"][0]["hits"]
        assert {hit["id"] for hit in hybrid["data"][0]["hits"]} == {"d0", "d1", "d2", "d3"}
    assert hybrid["data"][0]["hits"][0]["id"] == "d1"  # BM25 alone (weight 1): first in the lexical ranking


def test_through_the_proxy_the_key_is_required_and_every_answer_has_a_request_id(server):
    import openai
    from openai import OpenAI

    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{server}/v1", api_key="sk-wrong", max_retries=0).embeddings.create(model="tiny", input="x")
    refused = httpx.post(f"{server}/v1/embeddings", json={"model": "tiny", "input": "x"}, timeout=60)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    answered = post(server, "/v1/embeddings", {"model": "tiny", "input": "x"})
    assert answered.status_code == 200
    assert refused.headers["x-request-id"] and answered.headers["x-request-id"] != refused.headers["x-request-id"]


def test_through_the_proxy_an_oversize_body_and_a_slow_client_are_refused(server):
    """A 1 MB body (limit 200,000 bytes) gets 413 before it is read; a client that sends 8 bytes every
    half second gets 408 once the read timeout (2 s) has passed. The server answers after both."""
    text = "x" * 1_000_000
    response = httpx.post(f"{server}/v1/embeddings", json={"model": "tiny", "input": text}, headers=AUTH, timeout=60)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"

    def slowly():
        body = json.dumps({"model": "tiny", "input": "zip"}).encode()  # 5 pieces: 2.5 s
        for start in range(0, len(body), 8):
            time.sleep(0.5)
            yield body[start:start + 8]

    try:
        response = httpx.post(f"{server}/v1/embeddings", content=slowly(), headers=AUTH, timeout=30)
        assert response.status_code == 408 and response.json()["error"]["code"] == "request_timeout"
    except httpx.WriteError:  # the server answered and closed while the client was still sending: also bounded
        pass
    assert post(server, "/v1/embeddings", {"model": "tiny", "input": "x"}).status_code == 200


def test_one_process_listens_on_its_port_only(server, mode):
    """The default server is one process with one listening socket: --host:--port."""
    if mode != "one process":
        pytest.skip("Ray's own processes: the next test")
    import psutil

    port = int(server.rsplit(":", 1)[1])
    serving = next(c.pid for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.laddr.port == port)
    listening = [c.laddr for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.pid == serving]
    assert [(address.ip, address.port) for address in listening] == [("127.0.0.1", port)]


def test_the_local_ray_listens_on_loopback_only(server, mode):
    """With --host 127.0.0.1 the command starts its Ray bound to loopback: no process of the server's
    session (gcs_server, raylet, workers, the proxy, the metrics agent) listens on another address,
    but for the one port Ray 2.60 binds on every interface whatever its options: each Serve replica's
    inter-deployment gRPC server (`[::]:0`, behind Ray's token authentication)."""
    if mode != "ray":
        pytest.skip("Ray mode only")
    import psutil

    port = int(server.rsplit(":", 1)[1])
    serving = next(c.pid for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.laddr.port == port)
    session = os.getsid(serving)
    listening = [c for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.pid
                 and _session(c.pid) == session]
    outside = [(c.laddr, _name(c.pid)) for c in listening if not _loopback(c.laddr.ip)]
    replica_grpc = [(address, name) for address, name in outside
                    if address.ip == "::" and name.startswith("ray::ServeReplica")]
    assert listening and outside == replica_grpc and len(replica_grpc) <= 1, outside


def _session(pid: int):
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


def _name(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return "?"


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def test_a_client_that_hangs_up_leaves_the_queue(server):
    """64 queries sent over a raw connection closed before the answer: the server drops the request
    (its queue empties) and answers the next one."""
    import socket

    host, port = server.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"query": [f"csv rows {number}" for number in range(64)], "top_k": 3}).encode()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /v1/search HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                           + f"authorization: Bearer {KEY}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.monotonic() + 60
    while httpx.get(f"{server}/health", timeout=30).json()["queued"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(f"{server}/health", timeout=30).json()["queued"] == 0
    assert post(server, "/v1/embeddings", {"model": "tiny", "input": "hi"}).status_code == 200
