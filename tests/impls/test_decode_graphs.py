"""Whole-step decode over KV storages of a bucketed capacity (codegen/step_graph.py,
runtime/decode_graph.py). On CPU (``decode_graphs="on"``) the step function runs as it is: the
same storages, positions, masks and fallbacks as the CUDA graph replays it on a GPU
(DYNASHAPE_TEST_DEVICE=cuda runs these there).

Every decode here is checked step by step against PyTorch eager of the same module, on fresh
random prompts, with the past fed back as the caller got it."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import dynashape
from dynashape.errors import OptionsError
from dynashape.runtime.decode_graph import DecodeGraphs, ahead_rule, bucket_rule
from tests.models import llama

NAMES = llama.input_names()


@pytest.fixture(scope="module")
def path():
    return str(llama.model_path())


@pytest.fixture(scope="module")
def eager():
    return llama.build()


def _session(path, device, bucket="16", **kw):
    kw.setdefault("decode_ahead", "off")  # the counts below are for buckets built in the call
    return dynashape.InferenceSession(path, device=device, decode_graphs="on", kv_bucket=bucket, **kw)


def _decoders(sess) -> list[DecodeGraphs]:
    runner = sess._default.runner
    return [st.step for st in runner.states.values() if st.step is not None]


def _eager_step(eager, ids, past):
    with torch.no_grad():
        out = eager(ids.cpu(), *[p.cpu() for p in past])
    return out[0], list(out[1:])


def _decode(sess, eager, device, steps, batch=2, seed=0, tamper=None):
    """Greedy decode with dynashape and eager side by side; every step's logits and presents
    compared. ``tamper(step, dyn_past, eager_past)`` may change what is fed next."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (batch, 5), generator=g)
    past = [torch.zeros(batch, 2, 0, 16) for _ in range(4)]
    dpast = [p.to(device) for p in past]
    for i in range(steps):
        out = sess.run(None, dict(zip(NAMES, [ids.to(device), *dpast])))
        ref, past = _eager_step(eager, ids, past)
        torch.testing.assert_close(out[0].cpu(), ref, atol=2e-5, rtol=1e-4)
        for a, b in zip(out[1:], past):
            torch.testing.assert_close(a.cpu(), b, atol=2e-5, rtol=1e-4)
        dpast = list(out[1:])
        # the next token: greedy, with a random one now and then (the path must not care)
        ids = ref[:, -1:].argmax(-1) if i % 3 else torch.randint(0, 1000, (batch, 1), generator=g)
        if tamper is not None:
            dpast, past = tamper(i, dpast, past)
    return sess.stats()


@pytest.mark.parametrize("ahead", ["off", "4", "64"])
def test_decode_matches_eager_across_buckets(path, eager, device, ahead):
    sess = _session(path, device, decode_ahead=ahead)
    st = _decode(sess, eager, device, 40)
    # prompt 5, then 39 steps of one token: lengths 6..44 in buckets of 16 -> 16, 32, 48
    assert st["decode_graph_replays"] >= 30
    assert st["decode_graph_bucket_changes"] == 2 and st.get("decode_graph_fallbacks", 0) == 0
    (dec,) = _decoders(sess)  # each layer's rotary and KV writes are one call (step_fusions.py)
    assert dec.plan.source.count("_rope_append(") == 2 and "_kv_write(" not in dec.plan.source
    if ahead == "off":
        assert st["decode_graph_storages"] == 3 and st["decode_graph_builds"] == 3
        assert st.get("decode_graph_ahead_builds", 0) == 0
    else:
        # 32 and 48 built ahead on the thread (4 positions before the end, or at once when the
        # bucket is smaller than 64), then 64, built for a length the decode never reaches
        assert st["decode_graph_ahead_builds"] == 3 and st["decode_graph_storages"] == 4
        assert st["decode_graph_builds"] == 3  # 16 in the call, 32 and 48 taken over from the thread
        (dec,) = _decoders(sess)
        assert [b.cap for b in dec.buckets.values()] == [48] and [b.cap for b in dec.next.values()] == [64]
    # the prefill step's attention reads a causal mask made from the past: the dynamic path
    # serves it, and says why
    assert st["decode_graph_specs_refused"] >= 1
    assert any("mask" in r for r in sess.compiled.refusals)


def test_presents_are_views_of_the_storage_and_old_ones_stay_as_handed_out(path, eager, device):
    sess = _session(path, device)
    kept, snapshot = {}, {}

    def keep(i, dpast, past):
        if i == 6:
            kept["p"], snapshot["p"] = dpast[0], dpast[0].clone()
        return dpast, past
    _decode(sess, eager, device, 14, tamper=keep)
    (dec,) = _decoders(sess)
    (b,) = dec.buckets.values()
    assert kept["p"].data_ptr() != b.storages[0].data_ptr() or kept["p"].shape[2] < b.filled
    torch.testing.assert_close(kept["p"], snapshot["p"], atol=0, rtol=0)  # later steps wrote beyond it


def test_storage_beyond_the_length_never_leaks(path, eager, device):
    sess = _session(path, device, bucket="32")

    def garbage(i, dpast, past):
        for dec in _decoders(sess):
            for b in dec.buckets.values():
                for s in b.storages:
                    s.narrow(2, b.filled, s.shape[2] - b.filled).fill_(1e4)  # large and finite
        return dpast, past
    st = _decode(sess, eager, device, 24, tamper=garbage)
    assert st["decode_graph_replays"] >= 15


def test_a_reordered_past_falls_back_and_stays_correct(path, eager, device, monkeypatch):
    monkeypatch.setattr("dynashape.runtime.decode_graph.PAUSE_RUNS", 4)
    sess = _session(path, device)
    replays = {}

    def reorder(i, dpast, past):
        replays[i] = sess.stats().get("decode_graph_replays", 0)
        if 8 <= i < 18:  # beam search: the past gathered along the batch, step after step
            order = torch.tensor([1, 0])
            return [p.index_select(0, order.to(p.device)) for p in dpast], [p.index_select(0, order) for p in past]
        return dpast, past
    st = _decode(sess, eager, device, 30, tamper=reorder)
    assert st["decode_graph_fallbacks"] >= 5  # each reorder while the caller held the storage: counted
    assert st["decode_graph_off_runs"] == 4  # five in a row: the path paused for PAUSE_RUNS runs
    assert st["decode_graph_replays"] - replays[20] >= 5  # then the loop came back to the graphs


def test_numpy_feeds_copy_the_past_in(path, eager):
    sess = _session(path, "cpu")
    ids = np.random.default_rng(1).integers(0, 1000, (1, 4))
    past = [np.zeros((1, 2, 0, 16), np.float32) for _ in range(4)]
    ref_past = [torch.zeros(1, 2, 0, 16) for _ in range(4)]
    for _ in range(10):
        out = sess.run(None, dict(zip(NAMES, [ids, *past])))
        ref, ref_past = _eager_step(eager, torch.from_numpy(ids), ref_past)
        np.testing.assert_allclose(out[0], ref.numpy(), atol=2e-5, rtol=1e-4)
        past, ids = out[1:], ref[:, -1:].argmax(-1).numpy()
    st = sess.stats()
    assert st["decode_graph_replays"] >= 7 and st["decode_graph_past_copies"] >= 7 * 4


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_decode(device, dtype):
    if device == "cpu":
        pytest.skip("half-precision decode runs on the GPU (the CPU run covers the logic in fp32)")
    cfg = {**llama.TINY, "dtype": dtype}
    model = llama.build(cfg)
    sess = dynashape.InferenceSession(str(llama.model_path(cfg)), device=device, decode_graphs="on", kv_bucket="16")
    names = llama.input_names(cfg)
    ids = torch.randint(0, 1000, (2, 5))
    past = [torch.zeros(2, 2, 0, 16, dtype=getattr(torch, dtype)) for _ in range(4)]
    dpast = [p.to(device) for p in past]
    for _ in range(12):
        out = sess.run(None, dict(zip(names, [ids.to(device), *dpast])))
        with torch.no_grad():
            ref = model(ids, *past)
        torch.testing.assert_close(out[0].cpu().float(), ref[0].float(), atol=3e-2, rtol=3e-2)
        dpast, past = list(out[1:]), list(ref[1:])
        ids = ref[0][:, -1:].argmax(-1)
    assert sess.stats()["decode_graph_replays"] >= 8


def test_options():
    assert bucket_rule("pow2")(17) == 32 and bucket_rule("pow2")(3) == 16
    assert bucket_rule("256")(1) == 256 and bucket_rule(96)(101) == 192
    assert bucket_rule("openvino")(100) == 272  # 100 + 128 + 36 = 264, rounded up to 16
    for bad in ("zero", "100"):  # not a multiple of 16
        with pytest.raises(OptionsError):
            bucket_rule(bad)
    with pytest.raises(OptionsError):
        dynashape.InferenceSession(str(llama.model_path()), decode_graphs="sometimes")
    assert ahead_rule("off") == 0 and ahead_rule(None) == 0 and ahead_rule("8") == 8
    assert ahead_rule("auto", torch.device("cuda")) == 64 and ahead_rule("auto", torch.device("cpu")) == 0
    for bad in ("-1", "soon"):
        with pytest.raises(OptionsError, match="decode_ahead"):
            dynashape.InferenceSession(str(llama.model_path()), decode_ahead=bad)


def test_a_failed_build_ahead_is_built_again_in_the_call_and_refused_there(path, eager, device, monkeypatch):
    """The thread's build raises what a failed capture raises: the step that passes the end of the
    bucket builds it itself; when that fails too, it says why and the dynamic path serves the key
    from then on, still correct."""
    from dynashape.impls import CannotCapture
    calls = []
    real = DecodeGraphs._make_impl

    def failing(self, key, b, ins, warm):
        calls.append(b.cap)
        if b.cap > 16:
            raise CannotCapture("no capture at this capacity (test)")
        return real(self, key, b, ins, warm)
    monkeypatch.setattr(DecodeGraphs, "_make_impl", failing)
    sess = _session(path, device, decode_ahead="4")
    st = _decode(sess, eager, device, 20)
    assert calls == [16, 32, 32] and st["decode_graph_ahead_builds"] == 1 and st["decode_graph_ahead_failures"] == 1
    assert st["decode_graph_refused"] == 1 and st["decode_graph_off_runs"] >= 6
    assert any("no capture at this capacity" in r for r in sess.compiled.refusals)


def test_synchronising_while_the_thread_captures_is_safe(path, eager, device):
    """CUDA forbids a device-wide synchronize anywhere in the process during a capture, and a
    capture makes the GPU's default generator the graph's: the caller's torch.cuda.synchronize()
    and a GPU torch.multinomial (sampling) after every step, and another thread's synchronize /
    empty_cache / randn / multinomial in a loop, wait for the thread's captures
    (impls/capture_guard.py); every graph built ahead is taken over, every step still equals eager."""
    if not str(device).startswith("cuda"):
        pytest.skip("captures need a GPU (the guard's logic: tests/impls/test_capture_guard.py)")
    stop = threading.Event()
    errors = []

    def hammer():
        try:
            while not stop.is_set():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.multinomial(torch.rand(8, device=device), 1)
                torch.randn(16, device=device).normal_()
        except Exception as e:  # noqa: BLE001  reported by the assertion below
            errors.append(e)
    other = threading.Thread(target=hammer, daemon=True)
    other.start()
    try:
        sess = _session(path, device, decode_ahead="4")

        def sync(i, dpast, past):
            torch.multinomial(torch.rand(4, device=device), 1)
            torch.cuda.synchronize()
            return dpast, past
        st = _decode(sess, eager, device, 40, tamper=sync)
        assert getattr(torch.cuda.synchronize, "dynashape_capture_guard", False)  # while the session lives
        assert getattr(torch.multinomial, "dynashape_capture_guard", False)
    finally:
        stop.set()
        other.join(5)
    assert errors == []
    assert st["decode_graph_ahead_builds"] == 3 and st.get("decode_graph_ahead_failures", 0) == 0
    assert st["decode_graph_bucket_changes"] == 2


def test_the_default_builds_ahead_on_cuda_only(path):
    assert dynashape.InferenceSession(path, decode_graphs="on").compiled.decode_ahead == 0
    if torch.cuda.is_available():
        assert dynashape.InferenceSession(path, device="cuda").compiled.decode_ahead == 64


def test_off_leaves_the_dynamic_path(path, eager):
    sess = dynashape.InferenceSession(path, decode_graphs="off")
    st = _decode(sess, eager, "cpu", 6)
    assert not any(k.startswith("decode_graph") for k in st)


def test_a_new_conversation_reuses_the_storage_once_the_caller_let_go(path, eager, device):
    sess = _session(path, device, bucket="32")
    _decode(sess, eager, device, 10, seed=1)
    before = sess.stats()
    _decode(sess, eager, device, 10, seed=2)  # a new prompt: the old presents are gone with the first loop
    st = sess.stats()
    assert st.get("decode_graph_fallbacks", 0) == 0 and st["decode_graph_builds"] == before["decode_graph_builds"]
    assert st["decode_graph_replays"] - before["decode_graph_replays"] >= 8


def test_a_longer_prefill_does_not_disturb_the_decode_graphs(path, eager, device):
    sess = _session(path, device, bucket="64")
    _decode(sess, eager, device, 6, seed=3)
    builds = sess.stats()["decode_graph_builds"]
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 1000, (2, 40), generator=g)  # a longer prompt: its arena is larger
    past = [torch.zeros(2, 2, 0, 16) for _ in range(4)]
    out = sess.run(None, dict(zip(NAMES, [ids.to(device), *[p.to(device) for p in past]])))
    ref, rpast = _eager_step(eager, ids, past)
    dpast = list(out[1:])
    del out
    for _ in range(5):
        ids = ref[:, -1:].argmax(-1)
        out = sess.run(None, dict(zip(NAMES, [ids.to(device), *dpast])))
        ref, rpast = _eager_step(eager, ids, rpast)
        torch.testing.assert_close(out[0].cpu(), ref, atol=2e-5, rtol=1e-4)
        dpast = list(out[1:])
        del out
    assert sess.stats()["decode_graph_builds"] == builds  # same key, same bucket: the same graph


def test_io_binding_decode_steps_are_served_by_the_graphs(path, eager, device):
    """onnxruntime's IOBinding decode loop: inputs bound, the logits and presents bound to the
    caller's preallocated tensors, the presents fed back as the next pasts. The whole-step graph
    serves each step (the binding copies its outputs in), and every output is eager's."""
    sess = _session(path, device)
    _decode(sess, eager, device, 4, seed=5)
    replays = sess.stats().get("decode_graph_replays", 0)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 1000, (2, 1), generator=g)
    past = [torch.randn(2, 2, 6, 16, generator=g) for _ in range(4)]
    dpast = [p.to(device) for p in past]
    for _step in range(6):
        b = sess.io_binding()
        b.bind_input_tensor("input_ids", ids.to(device))
        for name, p in zip(NAMES[1:], dpast):
            b.bind_input_tensor(name, p)
        logits = torch.empty(2, 1, 1000, device=device)
        b.bind_output_tensor("logits", logits)
        presents = [torch.empty(2, 2, past[0].shape[2] + 1, 16, device=device) for _ in range(4)]
        for name, p in zip(llama.output_names()[1:], presents):
            b.bind_output_tensor(name, p)
        sess.run_with_iobinding(b)
        ref, past = _eager_step(eager, ids, past)
        torch.testing.assert_close(logits.cpu(), ref, atol=2e-5, rtol=1e-4)
        for got, want in zip(presents, past):
            torch.testing.assert_close(got.cpu(), want, atol=2e-5, rtol=1e-4)
        dpast, ids = presents, ref[:, -1:].argmax(-1)
    st = sess.stats()
    assert st["decode_graph_bound_runs"] >= 6 and st["decode_graph_replays"] >= replays + 5


# ---- decoders that take an attention_mask (as HF optimum exports them) --------------------------
MASKED = {**llama.TINY, "mask_input": True}


@pytest.fixture(scope="module")
def masked():
    return str(llama.model_path(MASKED)), llama.build(MASKED)


def _decode_masked(sess, model, device, steps, seed=0, garbage=False):
    """Greedy decode of a left-padded batch (the second prompt is two tokens shorter), the mask
    growing by a one each step; logits compared with eager at every step."""
    names = llama.input_names(MASKED)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (2, 5), generator=g)
    am = torch.ones(2, 5, dtype=torch.int64)
    am[1, :2] = 0
    past = [torch.zeros(2, 2, 0, 16) for _ in range(4)]
    dpast = [p.to(device) for p in past]
    for _ in range(steps):
        out = sess.run(None, dict(zip(names, [ids.to(device), am.to(device), *dpast])))
        with torch.no_grad():
            ref = model(ids, am, *past)
        torch.testing.assert_close(out[0].cpu(), ref[0], atol=2e-5, rtol=1e-4)
        dpast, past = list(out[1:]), list(ref[1:])
        ids = ref[0][:, -1:].argmax(-1)
        am = torch.cat([am, torch.ones(2, 1, dtype=torch.int64)], 1)
        if garbage:  # what lies beyond the length in the storages and the padded mask: never read
            for dec in _decoders(sess):
                for b in dec.buckets.values():
                    for s in b.storages:
                        s.narrow(2, b.filled, s.shape[2] - b.filled).fill_(1e4)
                    for p in b.pads:
                        p.narrow(1, b.filled, p.shape[1] - b.filled).fill_(1)
    return sess.stats()


def test_a_decoder_with_an_attention_mask_replays_one_graph_per_bucket(masked, device):
    path, model = masked
    sess = _session(path, device)
    st = _decode_masked(sess, model, device, 30, garbage=True)
    # prompt 5, then 29 one-token steps: lengths 6..34 in buckets of 16 -> 16, 32, 48
    assert st["decode_graph_builds"] == 3 and st["decode_graph_replays"] >= 25
    assert st.get("decode_graph_fallbacks", 0) == 0
    (dec,) = _decoders(sess)
    assert dec.plan.padded == [("x_attention_mask", 1)]  # read padded to the capacity, not refreshed
    assert "x_attention_mask" not in dec.plan.inputs


def test_every_guard_made_while_building_is_checked_by_accepts(masked):
    """Guards the code generator makes after the trace (the step plan's ``seq >= 2`` of a prefill)
    are in ``accepts``: left out, the prefill's specialization took the decode steps too, and the
    whole-step decode never came."""
    path, model = str(llama.model_path(MASKED)), masked[1]  # the path again: another export may prune it
    sess = _session(path, "cpu")
    _decode_masked(sess, model, "cpu", 4)
    specs = sess.compiled.specs
    assert len(specs) == 2 and any(s.step is not None for s in specs)
    for spec in specs:
        inputs = {d.symbol for d in spec.trace.input_dims if d.defines}
        made = {g.key for g in spec.trace.guards if g.expr.free <= inputs}
        assert made == set(spec.accepted_guards)


def test_a_mask_that_hides_past_tokens_is_honoured(masked, device):
    """Tokens of the past masked out step by step (as a caller drops a turn) change the logits
    exactly as in eager: the graph reads the mask, not only the length."""
    path, model = masked
    sess = _session(path, device)
    names = llama.input_names(MASKED)
    ids = torch.randint(0, 1000, (2, 6))
    am = torch.ones(2, 6, dtype=torch.int64)
    past = [torch.zeros(2, 2, 0, 16) for _ in range(4)]
    dpast = [p.to(device) for p in past]
    for step in range(8):
        if step >= 2:
            am[step % 2, step] = 0  # hide one more past token, in one row or the other
        out = sess.run(None, dict(zip(names, [ids.to(device), am.to(device), *dpast])))
        with torch.no_grad():
            ref = model(ids, am, *past)
        torch.testing.assert_close(out[0].cpu(), ref[0], atol=2e-5, rtol=1e-4)
        dpast, past = list(out[1:]), list(ref[1:])
        ids = torch.randint(0, 1000, (2, 1))
        am = torch.cat([am, torch.ones(2, 1, dtype=torch.int64)], 1)
    assert sess.stats()["decode_graph_replays"] >= 5


# ---- an HF decoder as users export it (transformers' LlamaForCausalLM, dynamo) ------------------
@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from tests.models import hf_llama

    return str(hf_llama.model_path()), hf_llama.build(), hf_llama


def test_an_hf_llama_export_decodes_on_one_graph_per_bucket(hf, device):
    """transformers makes its mask by gathering attention_mask[batch, key] over a Range of the
    keys, and repeats the KV heads: the step reads the mask padded to the capacity, the gather's
    indices are made at the capacity once per bucket (checked against the model's own at the
    real length), and the attention reads the storages without the repeat."""
    path, model, mod = hf
    names = mod.input_names()
    sess = _session(path, device)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 1000, (2, 5), generator=g)
    am = torch.ones(2, 6, dtype=torch.int64)
    am[1, :3] = 0  # a left-padded second row (its first past slot and two tokens)
    past = [torch.randn(2, 2, 1, 16, generator=g) for _ in range(4)]
    dpast = [p.to(device) for p in past]
    for _step in range(24):
        out = sess.run(None, dict(zip(names, [ids.to(device), am.to(device), *dpast])))
        with torch.no_grad():
            ref = model(ids, am, *past)
        # a padded query sees no key: its row is the exporter's choice, so the last ones are compared
        torch.testing.assert_close(out[0][:, -1:].cpu(), ref[0][:, -1:], atol=2e-5, rtol=1e-4)
        dpast, past = list(out[1:]), list(ref[1:])
        ids = ref[0][:, -1:].argmax(-1)
        am = torch.cat([am, torch.ones(2, 1, dtype=torch.int64)], 1)
    st = sess.stats()
    assert st["decode_graph_builds"] == 2 and st["decode_graph_replays"] >= 20  # buckets 16 and 32
    assert st.get("decode_graph_fallbacks", 0) == 0
    (dec,) = _decoders(sess)
    assert dec.plan.cap and dec.plan.padded == [("x_attention_mask", 1)]
    assert not any("Expand" in line or "expand" in line for line in dec.plan.source.splitlines()
                   if "KS" in line.split("=")[-1])  # no repeat of the storages


def test_a_capacity_value_that_is_not_a_prefix_is_refused(hf, monkeypatch):
    """A value made at the capacity must begin with what the model makes at the real length:
    where it does not, the bucket is refused (counted, with the reason) and the dynamic path
    serves; the results stay right."""
    from dynashape.runtime import decode_graph as dg

    monkeypatch.setattr(dg, "_prefix_equal", lambda big, small: False)
    path, model, mod = hf
    sess = dynashape.InferenceSession(path, decode_graphs="on", kv_bucket="16")
    names = mod.input_names()
    ids = torch.randint(0, 1000, (1, 4))
    am = torch.ones(1, 5, dtype=torch.int64)
    past = [torch.randn(1, 2, 1, 16) for _ in range(4)]
    dpast = list(past)
    for _ in range(5):
        out = sess.run(None, dict(zip(names, [ids, am, *dpast])))
        with torch.no_grad():
            ref = model(ids, am, *past)
        torch.testing.assert_close(out[0][:, -1:], ref[0][:, -1:], atol=2e-5, rtol=1e-4)
        dpast, past = list(out[1:]), list(ref[1:])
        ids = ref[0][:, -1:].argmax(-1)
        am = torch.cat([am, torch.ones(1, 1, dtype=torch.int64)], 1)
    st = sess.stats()
    assert st["decode_graph_refused"] >= 1 and st.get("decode_graph_replays", 0) == 0
    assert any("differs from the model's" in r for r in sess.compiled.refusals)


def test_the_cuda_fusions_decode_correctly_on_the_cpu_too(eager, device, monkeypatch):
    """The fusions that run on CUDA only (the residual add in the product, the SwiGLU gate in the down
    projection, the RMSNorm folded into the product: compile/fuse_residual.py) switched on for a CPU
    session, and the weights in CUDA's layout, so that CI runs their torch forms inside whole-step
    decode."""
    from dynashape.compile import linear_layout, pipeline
    monkeypatch.setattr(pipeline, "RESIDUAL_FUSION_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(linear_layout, "_cpu", linear_layout._cuda)
    sess = _session(str(llama.model_path()), device)
    ops = {n.op_type for n in sess.program.fused.nodes}
    assert {"MatMulAdd", "GatedMatMulAdd", "RMSNormLinear"} <= ops, ops
    st = _decode(sess, eager, device, 24)
    assert st["decode_graph_replays"] >= 15 and st.get("decode_graph_fallbacks", 0) == 0

