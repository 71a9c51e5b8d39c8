"""`lmk-embed serve` with the tiny recurrent (Mamba2) checkpoint on a two-node local Ray cluster
(`ray.cluster_utils.Cluster`, one CPU per node): the `openai` client and httpx against it, its two
replicas on both nodes, and one replica killed during a burst."""

import asyncio
import os
import signal
import time

import httpx
import numpy as np
import pytest

from tests.lmk_embed_tools.serve.servers import decode_base64, running_server

pytestmark = pytest.mark.slow
TEXTS = ["The json module exposes an API.", "Compact encoding! " * 60, "x"]


@pytest.fixture(scope="module")
def server(mamba2_checkpoint, tmp_path_factory):
    from ray.cluster_utils import Cluster

    # One proxy (on the head node) sends every request to the replica beside it unless told not to;
    # the cluster's processes read this from the environment they are started in.
    pytest.MonkeyPatch().setenv("RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING", "0")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        log = tmp_path_factory.mktemp("serve-log") / "serve.log"
        # Two replicas of one CPU each on two nodes of one CPU: Ray must place one on each.
        with running_server(mamba2_checkpoint, "--replicas", "2", "--num-cpus", "1", "--address", cluster.address,
                            log_path=log) as url:
            yield url
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def model(mamba2_checkpoint):
    from transformers import AutoModel

    return AutoModel.from_pretrained(mamba2_checkpoint, trust_remote_code=True).eval()


def post(server, body):
    return httpx.post(f"{server}/v1/embeddings", json=body, timeout=60)


def test_openai_client_vectors_equal_encode(server, model):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    expected = np.asarray(model.encode(TEXTS, show_progress_bar=False))
    for options in ({"encoding_format": "float"}, {}):  # {}: the client asks for base64 and decodes it
        response = client.embeddings.create(model="tiny", input=TEXTS, **options)
        assert np.abs(np.asarray([d.embedding for d in response.data]) - expected).max() <= 1e-6
    base64 = post(server, {"model": "tiny", "input": TEXTS, "encoding_format": "base64"}).json()
    assert np.abs(np.stack([decode_base64(d["embedding"]) for d in base64["data"]]) - expected).max() <= 1e-6


def test_input_type_and_task_are_encode_query_and_encode_document(server, model):
    cases = [({"input_type": "query"}, model.encode_query(TEXTS, show_progress_bar=False)),
             ({"input_type": "query", "task": "Find the module"}, model.encode_query(TEXTS, task="Find the module",
                                                                                     show_progress_bar=False)),
             ({"input_type": "document"}, model.encode_document(TEXTS, show_progress_bar=False))]
    for options, expected in cases:
        body = post(server, {"model": "tiny", "input": TEXTS, **options}).json()
        assert np.abs(np.asarray([d["embedding"] for d in body["data"]]) - expected).max() <= 1e-6


@pytest.mark.parametrize("body, status, param, words", [
    ({"model": "tiny", "input": "x", "task": "find"}, 400, "task", "input_type"),
    ({"model": "tiny", "input": "x", "input_type": "query", "task": ""}, 400, "task", "non-empty"),
    ({"model": "tiny", "input": "x", "dimensions": 65}, 400, "dimensions", "from 1 to 64"),
])
def test_recurrent_errors(server, body, status, param, words):
    response = post(server, body)
    assert response.status_code == status and response.json()["error"]["param"] == param
    assert words in response.json()["error"]["message"]


def test_landmarks_are_refused_for_a_recurrent_model(server):
    response = httpx.post(f"{server}/v1/landmarks", json={"model": "tiny", "input": "x"}, timeout=60)
    assert response.status_code == 400 and "no landmark vectors" in response.json()["error"]["message"]


def replicas(server, wanted: int = 2, tries: int = 40) -> dict:
    """{replica: (pid, node)} seen by /health (requests spread over the replicas)."""
    seen = {}
    for _ in range(tries):
        health = httpx.get(f"{server}/health", timeout=30).json()
        seen[health["replica"]] = (health["pid"], health["node"])
        if len(seen) >= wanted:
            break
    return seen


def test_the_replicas_are_spread_over_both_nodes(server):
    seen = replicas(server)
    assert len(seen) == 2 and len({node for _, node in seen.values()}) == 2, seen


def test_a_replica_killed_during_a_burst_is_restarted(server, model):
    """Kill one of the two replicas mid-burst: Serve starts a new one; no answer holds a wrong
    vector, and every request after the restart succeeds."""
    before = replicas(server)
    assert len(before) == 2
    victim = next(iter(before.values()))[0]
    texts = [f"burst text {number} " * (1 + number % 7) for number in range(60)]
    expected = np.asarray(model.encode(texts, show_progress_bar=False))

    async def burst():
        limit = asyncio.Semaphore(8)
        async with httpx.AsyncClient(base_url=server, timeout=60) as http:
            async def one(number):
                async with limit:
                    if number == 20:
                        os.kill(victim, signal.SIGKILL)
                    response = await http.post("/v1/embeddings", json={"model": "tiny", "input": texts[number]})
                    return number, response
            return await asyncio.gather(*(one(number) for number in range(len(texts))))

    for number, response in asyncio.run(burst()):
        if response.status_code == 200:  # a request on the killed replica may fail, never answer wrongly
            assert np.abs(np.asarray(response.json()["data"][0]["embedding"]) - expected[number]).max() <= 1e-6
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = replicas(server, tries=10)
        if len(after) == 2 and victim not in {pid for pid, _ in after.values()}:
            break
        time.sleep(1)
    assert len(after) == 2 and victim not in {pid for pid, _ in after.values()}, after
    for number in range(0, 60, 6):
        response = post(server, {"model": "tiny", "input": texts[number]})
        assert response.status_code == 200
        assert np.abs(np.asarray(response.json()["data"][0]["embedding"]) - expected[number]).max() <= 1e-6
