"""The LLM app (dynashape/serve/llm_app.py) on a real local Ray cluster (loopback only), CPU
replicas of the tiny exported Llama: OpenAI-compatible completions (whole and streamed), chat with
the folder's tokenizer, concurrent streams through the handle, a client that disconnects
mid-stream (its blocks freed), a request that can never fit (400), a replica killed mid-stream
(only its own streams end, with StreamEndedError). Every finished stream's tokens equal the lone
greedy run's. Marked ``serve``."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dynashape.errors import StreamEndedError
from tests.paged.test_engine import CFG, lone, path  # noqa: F401  (fixtures)
from tests.test_generate import _word_tokenizer

serve = pytest.importorskip("ray.serve", reason="needs the extra dynashape[serve] (ray[serve])")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.serve
ray = pytest.importorskip("ray")
PORT = 8198


@pytest.fixture(scope="module")
def cluster(path, tmp_path_factory):  # noqa: F811
    from dynashape.serve.llm_app import build_llm_app

    folder = tmp_path_factory.mktemp("llm")
    shutil.copy(path, folder / "model.onnx")
    _word_tokenizer(folder / "tokenizer.json")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": PORT})
        opts = dict(block_size=8, num_blocks=128, max_rows=8, token_budget=64, chunk=16)
        one = serve.run(build_llm_app(str(folder), name="llm", **opts), name="llm", route_prefix="/")
        two = serve.run(build_llm_app(str(folder), name="pair", replicas=2, **opts), name="pair",
                        route_prefix="/pair")
        yield {"one": one, "two": two}
    finally:
        serve.shutdown()
        ray.shutdown()


def post(route: str, body: dict, stream: bool = False):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    conn.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if stream:
        return conn, r
    return r.status, json.loads(r.read())


def sse_tokens(r) -> tuple[list[int], str | None]:
    toks, reason = [], None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        ch = ev["choices"][0]
        if "token" in ch:
            toks.append(ch["token"])
        reason = ch.get("finish_reason") or reason
    return toks, reason


def test_completions_whole_and_streamed_equal_the_lone_run(cluster, lone):  # noqa: F811
    prompt = [5, 17, 300, 42]
    status, out = post("/v1/completions", {"prompt": prompt, "max_tokens": 12})
    assert status == 200 and out["choices"][0]["tokens"] == lone(prompt, 12)
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert out["choices"][0]["text"] == " ".join(f"w{t}" for t in lone(prompt, 12))
    conn, r = post("/v1/completions", {"prompt": prompt, "max_tokens": 12, "stream": True}, stream=True)
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    assert sse_tokens(r) == (lone(prompt, 12), "length")
    conn.close()


def test_chat_through_the_tokenizer_and_bad_requests(cluster, lone):  # noqa: F811
    status, out = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5 w6"}],
                                                "max_tokens": 6})
    assert status == 200 and out["object"] == "chat.completion"
    text = out["choices"][0]["message"]["content"]
    assert text == " ".join(f"w{t}" for t in out["choices"][0]["tokens"]) and len(out["choices"][0]["tokens"]) == 6
    status, out = post("/v1/completions", {"prompt": list(range(1, 900)), "max_tokens": 200})
    assert status == 400 and out["error"]["type"] == "KVCapacityError"
    status, out = post("/v1/completions", {"prompt": [], "max_tokens": 3})
    assert status == 400 and "prompt" in out["error"]["message"]
    status, out = post("/v1/completions", {"prompt": [1, 2], "temperature": -1})
    assert status == 400 and out["error"]["type"] == "OptionsError"


def test_concurrent_streams_through_the_handle(cluster, lone):  # noqa: F811
    from dynashape.serve.llm_app import tokens
    rng = np.random.default_rng(5)
    reqs = [(rng.integers(1, 1000, rng.integers(1, 30)).tolist(), int(rng.integers(1, 20))) for _ in range(12)]
    with ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(lambda r: list(tokens(cluster["one"], *r)), reqs))
    for (p, n), out in zip(reqs, outs):
        assert out == lone(p, n)


def test_a_client_that_disconnects_frees_its_blocks(cluster):
    conn, r = post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 900, "stream": True}, stream=True)
    r.readline()  # the first event is there
    conn.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        st = cluster["one"].stats.remote().result()
        if st["kv_blocks_used"] == 0 and st["aborted"] >= 1:
            break
        time.sleep(0.2)
    assert st["kv_blocks_used"] == 0 and st["aborted"] >= 1
    assert st["memory"]["kv_blocks_used"] == 0 and st["memory"]["kv_pool_bytes"] > 0  # memory_stats beside


def test_a_killed_replica_ends_only_its_own_streams(cluster, lone):  # noqa: F811
    from dynashape.serve.llm_app import tokens
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("SERVE_REPLICA::pair#")]
    assert len(replicas) == 2
    # 8 conversations of 123 positions (16 blocks of 8 each): all 8 on one replica would still fit its 8 rows and
    # 128 blocks, so every stream begins at once, without preemptions or waits (10 of 243 positions once left one
    # waiting for blocks while the test waited for it to begin)
    reqs = [([7 + i, 8, 9], 120) for i in range(8)]
    results: dict = {}
    streaming = threading.Semaphore(0)  # released by each stream at its fifth token

    def one(i):
        got = []
        try:
            for t in tokens(cluster["two"], *reqs[i]):
                got.append(t)
                if len(got) == 5:
                    streaming.release()
                # a reader slower than the steps (120 tokens take it > 1 s): every stream is still open at
                # the kill (a 2 ms sleep and a kill at 0.5 s once let every stream end before it, CI)
                time.sleep(0.01)
            results[i] = got
        except StreamEndedError as e:
            results[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for _ in reqs:  # every stream has begun: the kill finds them all open
        assert streaming.acquire(timeout=60)
    ray.kill(ray.get_actor(replicas[0]["name"], namespace="serve"), no_restart=False)
    for t in threads:
        t.join(120)
    ended = [i for i, v in results.items() if isinstance(v, StreamEndedError)]
    done = [i for i, v in results.items() if not isinstance(v, Exception)]
    assert len(results) == len(reqs) and ended and done, results
    for i in done:
        assert results[i] == lone(*reqs[i])


def post_as(route: str, body: dict, conversation: str):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    conn.request("POST", route, json.dumps(body), {"Content-Type": "application/json",
                                                   "serve_multiplexed_model_id": conversation})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def test_a_conversations_turns_go_to_the_replica_that_holds_its_blocks(cluster, lone):  # noqa: F811
    first = [11, 12, 13, 14]
    status, one = post_as("/pair/v1/completions", {"prompt": first, "max_tokens": 6}, "chat-7")
    assert status == 200 and one["choices"][0]["tokens"] == lone(first, 6)
    second = first + one["choices"][0]["tokens"] + [15]
    status, two = post_as("/pair/v1/completions", {"prompt": second, "max_tokens": 4}, "chat-7")
    assert status == 200 and two["choices"][0]["tokens"] == lone(second, 4)
    assert two["replica"] == one["replica"]
    st = cluster["two"].options(multiplexed_model_id="chat-7").stats.remote().result()
    assert st["replica"] == one["replica"] and st["reused_positions"] >= len(first) + 5
