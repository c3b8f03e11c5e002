"""Shape-aware batching without Ray: policy from declared dims, plan/merge/split, the replica."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dynashape
from dynashape.errors import ConversationLostError, InputShapeError, OptionsError, ServerBusyError
from dynashape.serve import ModelReplica, bucket, derive_policy, merge, plan, split
from dynashape.serve.conversations import Conversation, ConversationStore
from dynashape.serve.local import LocalServer
from tests.models import llama, transformers_models

TEXT_IN = {"x": ["batch", "seq", 4], "mask": ["batch", "seq"]}
TEXT_OUT = {"y": ["batch", "seq", 4], "z": ["batch", 4]}


def fake_model(feeds: dict) -> dict:
    """A model whose padded positions must not matter: y = x * mask, z = sum of y over seq."""
    y = feeds["x"] * feeds["mask"][..., None]
    return {"y": y, "z": y.sum(axis=1)}


@pytest.fixture(scope="module")
def bert():
    return str(transformers_models.model_path("bert"))


@pytest.fixture(scope="module")
def decoder():
    return str(llama.model_path())


def text_request(rng, b: int, n: int) -> dict:
    return {"x": rng.standard_normal((b, n, 4)).astype(np.float32), "mask": np.ones((b, n), np.float32)}


# ---- policy --------------------------------------------------------------------------------------
def test_policy_reads_batch_and_pad_axes_from_declared_dims():
    p = derive_policy(TEXT_IN, TEXT_OUT, pad={"x": 0.0}, mask="mask", pad_multiple=8)
    assert p.batches and p.batch_symbol == "batch"
    assert p.batch_axes == {"x": 0, "mask": 0} and p.output_batch_axes == {"y": 0, "z": 0}
    assert p.pad_symbol == "seq" and p.pad_axes == {"x": 1, "mask": 1} and p.output_pad_axes == {"y": 1}
    assert p.pad_values == {"x": 0.0, "mask": 0}


def test_policy_refuses_what_dims_cannot_prove():
    p = derive_policy({"a": [3, "n"]}, {"o": [3]})
    assert not p.batches and "batch dim" in p.why_not_batched
    p = derive_policy({"a": ["b", 4]}, {"o": ["b * 2", 4]})
    assert not p.batches and "computed from the batch dim" in p.why_not_batched
    with pytest.raises(OptionsError, match="mask"):
        derive_policy(TEXT_IN, TEXT_OUT, pad={"x": 0.0})
    with pytest.raises(OptionsError, match="without pad"):
        derive_policy(TEXT_IN, TEXT_OUT, mask="mask")
    with pytest.raises(OptionsError, match="cannot be cut"):
        derive_policy(TEXT_IN, {"y": ["batch", "seq + 1"]}, pad={"x": 0.0}, mask="mask")
    with pytest.raises(OptionsError, match="no input declares"):
        derive_policy(TEXT_IN, TEXT_OUT, batch_symbol="nope")


def test_state_pairs_by_name_and_given():
    p = derive_policy({"ids": ["b", "s"], "past_key_0": ["b", 2, "p", 8]},
                      {"logits": ["b", "s", 10], "present_key_0": ["b", 2, "p + s", 8]})
    assert p.state == {"past_key_0": "present_key_0"}
    with pytest.raises(OptionsError, match="expected an input and an output"):
        derive_policy(TEXT_IN, TEXT_OUT, state={"x": "nope"})


# ---- plan / merge / split ------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 20)), min_size=1, max_size=12),
       st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**31 - 1))
def test_merged_runs_equal_each_request_alone(reqs, max_batch, multiple, seed):
    rng = np.random.default_rng(seed)
    policy = derive_policy(TEXT_IN, TEXT_OUT, pad={"x": 0.0}, mask="mask", pad_multiple=multiple)
    items = [text_request(rng, b, n) for b, n in reqs]
    runs = plan(policy, items, max_batch)
    assert sorted(i for run in runs for i in run) == list(range(len(items)))
    for run in runs:
        group = [items[i] for i in run]
        assert len(run) == 1 or sum(f["x"].shape[0] for f in group) <= max_batch
        assert len({bucket(f["x"].shape[1], multiple) for f in group}) == 1
        feeds, meta = merge(policy, group)
        assert feeds["x"].shape[1] % multiple == 0
        for i, out in zip(run, split(policy, fake_model(feeds), meta)):
            want = fake_model(items[i])
            assert out["y"].shape == want["y"].shape
            np.testing.assert_allclose(out["y"], want["y"], rtol=1e-6)
            np.testing.assert_allclose(out["z"], want["z"], rtol=1e-5, atol=1e-6)


def test_without_padding_only_equal_shapes_join():
    policy = derive_policy(TEXT_IN, TEXT_OUT)
    rng = np.random.default_rng(0)
    items = [text_request(rng, 1, n) for n in (5, 6, 5, 5, 6)]
    assert plan(policy, items, 8) == [[0, 2, 3], [1, 4]]
    assert plan(policy, items, 2) == [[0, 2], [3], [1, 4]]
    assert plan(policy, items, 1) == [[i] for i in range(5)]


def test_ready_shapes_run_first_and_odd_requests_alone():
    policy = derive_policy(TEXT_IN, TEXT_OUT)
    rng = np.random.default_rng(1)
    items = [text_request(rng, 1, 5), text_request(rng, 1, 9), text_request(rng, 1, 9)]
    assert plan(policy, items, 8, ready=lambda sig, n: n == 2) == [[1, 2], [0]]
    odd = {"x": items[0]["x"], "mask": np.ones((2, 5), np.float32)}  # rows that would not line up
    missing = {"x": items[0]["x"]}
    assert plan(policy, [items[0], odd, missing, items[0]], 8) == [[0, 3], [1], [2]]


# ---- the replica on real models ------------------------------------------------------------------
def test_replica_batches_padded_text_like_single_runs(bert, device):
    rep = ModelReplica(bert, device=device, max_batch=8, pad={"input_ids": 0}, mask="attention_mask", pad_multiple=8)
    ref = dynashape.InferenceSession(bert)
    rng = np.random.default_rng(2)
    for _ in range(3):  # sequences of changing shapes, fresh inputs each time
        reqs = [{"input_ids": rng.integers(0, 1000, (b, n)), "attention_mask": np.ones((b, n), np.int64)}
                for b, n in zip(rng.integers(1, 3, 9), rng.integers(2, 30, 9))]
        for req, out in zip(reqs, rep.infer_many(reqs)):
            want = ref.run(None, req)
            np.testing.assert_allclose(out["last_hidden_state"], want[0], atol=1e-4)
            np.testing.assert_allclose(out["pooler_output"], want[1], atol=1e-4)
    s = rep.stats()
    assert s["counts"]["requests_run"] == 27 and s["counts"]["runs"] < 27
    assert max(s["batch_requests"]) > 1 and s["counts"]["padded_elements"] > 0


def test_a_bad_request_fails_alone(bert, device):
    rep = ModelReplica(bert, device=device, max_batch=8)
    rng = np.random.default_rng(3)
    good = {"input_ids": rng.integers(0, 1000, (1, 6)), "attention_mask": np.ones((1, 6), np.int64)}
    bad = {"input_ids": rng.integers(0, 1000, (1, 6, 2)), "attention_mask": np.ones((1, 6), np.int64)}
    outs = rep.infer_many([good, bad, good, "not a dict"])
    assert isinstance(outs[1], dynashape.errors.InputError) and "input_ids" in str(outs[1])
    assert isinstance(outs[3], dynashape.errors.InputTypeError)
    want = dynashape.InferenceSession(bert).run(None, good)
    for o in (outs[0], outs[2]):
        np.testing.assert_allclose(o["last_hidden_state"], want[0], atol=1e-5)
    assert rep.stats()["counts"]["errors"] == 2


def decode_reference(path: str, prompt: np.ndarray, steps: list[np.ndarray]) -> list[np.ndarray]:
    sess = dynashape.InferenceSession(path)
    names = [a.name for a in sess.get_inputs()]
    past = {n: np.zeros((prompt.shape[0], 2, 0, 16), np.float32) for n in names[1:]}
    logits = []
    for ids in [prompt, *steps]:
        outs = sess.run(None, {"input_ids": ids, **past})
        logits.append(outs[0])
        past = dict(zip(names[1:], outs[1:]))
    return logits


def test_conversations_keep_their_cache_and_expire(decoder, device):
    clock = [0.0]
    rep = ModelReplica(decoder, device=device, conversation_timeout_s=10)
    rep.conversations.clock = lambda: clock[0]
    rng = np.random.default_rng(4)
    prompts = {k: rng.integers(0, 1000, (1, n)) for k, n in (("a", 5), ("b", 3))}
    steps = {k: [rng.integers(0, 1000, (1, 1)) for _ in range(4)] for k in prompts}
    got = {k: [rep.step(k, {"input_ids": p}, start=True)["logits"]] for k, p in prompts.items()}
    for i in range(4):  # interleaved: each keeps its own cache
        for k in prompts:
            out = rep.step(k, {"input_ids": steps[k][i]})
            got[k].append(out["logits"])
            assert int(out["past_length"]) == prompts[k].shape[1] + i + 1
    for k in prompts:
        for g, w in zip(got[k], decode_reference(decoder, prompts[k], steps[k])):
            np.testing.assert_allclose(g, w, atol=1e-4)
    with pytest.raises(InputShapeError):  # a bad step leaves the conversation as it was
        rep.step("a", {"input_ids": rng.integers(0, 1000, (2, 1))})
    assert int(rep.step("a", {"input_ids": steps["a"][0]})["past_length"]) == 10
    clock[0] = 11.0
    with pytest.raises(ConversationLostError, match="start it again"):
        rep.step("a", {"input_ids": steps["a"][0]})
    assert rep.stats()["conversations"]["expired"] == 2


def test_conversation_store_evicts_least_recent():
    store = ConversationStore(timeout_s=100, max_live=2)
    for k in "abc":
        store.put(k, Conversation(request=None))
    assert list(store.live) == ["b", "c"] and store.evicted == 1
    assert store.get("a") is None and store.drop("b") and not store.drop("b")


def test_local_server_batches_and_refuses_beyond_its_queue(bert, device):
    rep = ModelReplica(bert, device=device, max_batch=4)
    rng = np.random.default_rng(5)
    reqs = [{"input_ids": rng.integers(0, 1000, (1, 8)), "attention_mask": np.ones((1, 8), np.int64)}
            for _ in range(12)]
    server = LocalServer(rep, max_wait_ms=50, max_queue=64)
    try:
        futs = [server.submit(r) for r in reqs]
        ref = dynashape.InferenceSession(bert)
        for r, f in zip(reqs, futs):
            np.testing.assert_allclose(f.result(30)["last_hidden_state"], ref.run(None, r)[0], atol=1e-5)
        assert max(rep.stats()["batch_requests"]) > 1
    finally:
        server.close()
    full = LocalServer(rep, max_wait_ms=1000, max_queue=2)
    try:
        full.cond.acquire()  # hold the worker off so that the queue fills
        try:
            full.queue.extend([(reqs[0], 0.0, None)] * 2)
        finally:
            full.cond.release()
        with pytest.raises(ServerBusyError, match="queue full"):
            full.submit(reqs[0])
    finally:
        full.queue.clear()
        full.close()


def test_metrics_tell_listeners_and_survive_a_failing_one():
    from dynashape.serve.metrics import Metrics

    m, seen = Metrics(), []
    m.listeners += [lambda *a: seen.append(a), lambda *a: 1 / 0]
    m.run("4x32", requests=3, rows=4, ms=2.5)
    m.queued(1.0)
    snap = m.snapshot()
    assert seen == [("4x32", 3, 4, 2.5)] and snap["counts"]["listener_errors"] == 1
    assert snap["batch_rows"] == {4: 1} and snap["latency_ms"]["4x32"]["p50"] == 2.5 and snap["queue_ms"]["n"] == 1
