"""LLMServer (dynashape/serve/llm.py) without Ray: concurrent clients' streams over one PagedEngine
get their lone greedy tokens; a stream closed mid-way frees its blocks; a request that can never
fit is refused; a failing step ends only its own streams."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dynashape import errors
from dynashape.serve.llm import LLMServer
from tests.paged.test_engine import lone, path  # noqa: F401  (fixtures)


@pytest.fixture(params=[False, True], ids=["in-turn", "overlapped"])
def server(path, request):  # noqa: F811
    # overlapped: each step's tokens reach the streams after the next step is launched (the CUDA default)
    s = LLMServer(path, block_size=8, num_blocks=96, max_rows=8, token_budget=64, chunk=16, overlap=request.param)
    yield s
    s.stop()


def test_concurrent_streams_get_their_lone_tokens(server, lone):  # noqa: F811
    rng = np.random.default_rng(3)
    reqs = [(rng.integers(1, 1000, rng.integers(1, 30)).tolist(), int(rng.integers(1, 25))) for _ in range(16)]

    def client(i):
        time.sleep(0.002 * i)  # arrivals spread over the steps
        return list(server.submit(*reqs[i]))
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(client, range(len(reqs))))
    for (prompt, n), out in zip(reqs, outs):
        assert out == lone(prompt, n)
    st = server.stats()
    assert st["kv_blocks_used"] == 0 and st["finished"] == 16 and st["ttft_ms_p50"] is not None
    assert st["itl_ms_p99"] is not None and st["streams"] == 0


def test_a_closed_stream_frees_its_blocks_and_others_go_on(server, lone):  # noqa: F811
    long = server.submit([3, 4, 5], 200)
    short = server.submit([6, 7], 10)
    assert long.next_token(timeout=30) is not None
    long.close()
    assert long.finish_reason == "abort"
    assert list(short) == lone([6, 7], 10) and short.finish_reason == "length"
    deadline = time.time() + 10
    while server.stats()["kv_blocks_used"] and time.time() < deadline:
        time.sleep(0.01)
    assert server.stats()["kv_blocks_used"] == 0 and server.engine.idle


def test_a_request_that_never_fits_is_refused_and_the_server_serves_on(server, lone):  # noqa: F811
    with pytest.raises(errors.KVCapacityError):
        server.submit(list(range(1, 700)), 200)  # 898 positions, the pool holds 768
    assert list(server.submit([9, 10], 5)) == lone([9, 10], 5)


def test_a_failing_step_ends_its_own_streams_only(server, lone, monkeypatch):  # noqa: F811
    real, calls = server.engine._run, []

    def flaky(rows, batch=None):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(rows, batch)
    monkeypatch.setattr(server.engine, "_run", flaky)
    first = server.submit([1, 2, 3], 5)
    with pytest.raises(errors.StreamEndedError, match="injected"):
        list(first)
    assert server.stats()["failed_steps"] == 1 and server.stats()["kv_blocks_used"] == 0
    assert list(server.submit([1, 2, 3], 5)) == lone([1, 2, 3], 5)


def test_stop_ends_running_streams_with_a_typed_error(path):  # noqa: F811
    s = LLMServer(path, block_size=8, num_blocks=96)
    st = s.submit([1, 2], 700)
    assert st.next_token(timeout=30) is not None
    s.stop()
    with pytest.raises(errors.StreamEndedError, match="stopped"):
        list(st)
    with pytest.raises(errors.StreamEndedError):
        s.submit([1], 2)


def test_a_named_conversation_keeps_its_blocks_for_its_next_turn(server, lone):  # noqa: F811
    first = [4, 5, 6]
    out1 = list(server.submit(first, 6, key="chat"))
    assert out1 == lone(first, 6)
    second = first + out1 + [7]
    stream = server.submit(second, 4, key="chat")
    with pytest.raises(errors.InputError, match="generating already"):
        server.submit([1, 2], 3, key="chat")  # one turn at a time
    assert list(stream) == lone(second, 4)
    assert server.stats()["reused_positions"] == len(first) + len(out1) - 1
