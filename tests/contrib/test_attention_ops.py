"""com.microsoft attention contrib ops (dynashape/ops/contrib_attention.py, contrib_gqa.py) against onnxruntime's
CPU kernels: Attention, MultiHeadAttention, RotaryEmbedding, GroupQueryAttention.

Each test runs one session over a sequence of changing shapes (batch, sequence and past lengths)
with fresh random data per step, on both executors, float32 and float16 (onnxruntime's CPU
kernels take both, computing half in float32). GroupQueryAttention runs decode loops that feed
the present back as the next past, as onnxruntime-genai does. Where onnxruntime's CPU kernel
refuses an input form (Attention's 4-D mask) the check is against onnxruntime on an equivalent
form instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

import dynashape
from tests.ops.harness import DEVICE, compare, make_model, rand, run_sequence

MS = "com.microsoft"
F32, F16, I32, I64 = TP.FLOAT, TP.FLOAT16, TP.INT32, TP.INT64
NP = {F32: np.float32, F16: np.float16}
EXECUTORS = ["compiled", "interpreter"]
# onnxruntime computes half inputs in float32 and rounds once, as we do: a rounding apart at most
TOL = {F32: {"rtol": 1e-4, "atol": 1e-5}, F16: {"rtol": 2e-3, "atol": 2e-3}}


def _model(op_type, spec, n_outputs, attrs, out_type, out_names=None):
    """One com.microsoft node over ``spec``: per input position (elem_type, rank), or None for an
    absent optional input (an empty name). Graph inputs are in{i} with dynamic dims."""
    types = [s[0] if s else F32 for s in spec]
    ranks = [s[1] if s else 1 for s in spec]
    model = make_model(op_type, len(spec), types, attrs, n_outputs=n_outputs, ranks=ranks, domain=MS)
    node = model.graph.node[0]
    absent = {f"in{i}" for i, s in enumerate(spec) if s is None}
    for i, name in enumerate(node.input):
        if name in absent:
            node.input[i] = ""
    while node.input and node.input[-1] == "":
        node.input.pop()
    kept = [vi for vi in model.graph.input if vi.name not in absent]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for k, o in enumerate(model.graph.output):
        o.type.tensor_type.elem_type = out_type
        if out_names and out_names[k] == "":  # an output the node does not ask for
            node.output[k] = ""
    if out_names:
        named = [o for o in model.graph.output if o.name in set(node.output)]
        del model.graph.output[:]
        model.graph.output.extend(named)
    return model


def _ort(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _loop(model, feeds, update, steps, executor, tol):
    """Run ``steps`` steps through one dynashape session and onnxruntime, comparing every
    output; ``update(step, feeds, want)`` gives the next step's feeds (the present fed back)."""
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    ref = _ort(model)
    names = [o.name for o in model.graph.output]
    for step in range(steps):
        want = ref.run(None, feeds)
        got = sess.run(None, feeds)
        for name, g, w in zip(names, got, want):
            compare(g, w, f"step {step} output {name} (shapes {[np.shape(v) for v in feeds.values()]})", **tol)
        if step + 1 < steps:
            feeds = update(step, feeds, want)


def _run_error(model, feeds, executor="compiled"):
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    sess.run(None, feeds)


# RotaryEmbedding ----------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_3d_position_ids(interleaved, t, executor):
    rng = np.random.default_rng(1)
    model = _model("RotaryEmbedding", [(t, 3), (I64, 2), (t, 2), (t, 2)], 1, {"interleaved": interleaved}, t)
    feeds = []
    for b, s, n in [(2, 5, 3), (1, 1, 3), (3, 7, 3), (2, 4, 2)]:  # heads come from the cache's width
        feeds.append({"in0": rand((b, s, n * 16), NP[t], rng), "in1": rng.integers(0, 40, (b, s)).astype(np.int64),
                      "in2": rand((40, 8), NP[t], rng, -1, 1), "in3": rand((40, 8), NP[t], rng, -1, 1)})
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[t])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
def test_rotary_4d_offset(t, executor):
    # (B, N, S, H) with one position offset, the positions offset .. offset + S - 1
    rng = np.random.default_rng(2)
    model = _model("RotaryEmbedding", [(t, 4), (I64, 1), (t, 2), (t, 2)], 1, {"interleaved": 1}, t)
    feeds = []
    for b, n, s, off in [(2, 3, 4, 0), (1, 3, 1, 9), (3, 2, 6, 3)]:
        feeds.append({"in0": rand((b, n, s, 16), NP[t], rng), "in1": np.array([off], np.int64),
                      "in2": rand((16, 8), NP[t], rng, -1, 1), "in3": rand((16, 8), NP[t], rng, -1, 1)})
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[t])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("rank", [3, 4])
def test_rotary_partial(rank, executor):
    # rotary_embedding_dim below the head size: the rest of each head passes through
    rng = np.random.default_rng(3)
    attrs = {"num_heads": 4, "rotary_embedding_dim": 8}
    model = _model("RotaryEmbedding", [(F32, rank), (I64, 2), (F32, 2), (F32, 2)], 1, attrs, F32)
    feeds = []
    for b, s in [(2, 3), (1, 6), (2, 1)]:
        x = rand((b, s, 4 * 32) if rank == 3 else (b, 4, s, 32), np.float32, rng)
        feeds.append({"in0": x, "in1": rng.integers(0, 20, (b, s)).astype(np.int64),
                      "in2": rand((20, 4), np.float32, rng, -1, 1), "in3": rand((20, 4), np.float32, rng, -1, 1)})
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[F32])


# Attention ----------------------------------------------------------------------------------
def _mask(kind, b, s, past, rng):
    """A mask_index of ``kind`` that leaves every query row a visible key (key 0, or the start
    of the row's span): a fully masked row softmaxes scores shifted by -10000, whose float32
    rounding would differ by an ulp between two GEMMs."""
    total = past + s
    if kind == "1d":
        return rng.integers(1, total + 1, b).astype(np.int32)
    if kind == "1d_start":
        starts = rng.integers(0, past + 1, b)
        ends = starts + 1 + rng.integers(0, total - starts, b)
        return np.concatenate([ends, starts]).astype(np.int32)
    if kind == "2d":
        m = (rng.random((b, total)) < 0.7).astype(np.int32)
        m[:, 0] = 1
        return m
    m = (rng.random((b, s, total)) < 0.7).astype(np.int32)
    m[:, :, 0] = 1
    return m


MASK_RANK = {"none": None, "1d": 1, "1d_start": 1, "2d": 2, "3d": 3}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", ["none", "1d", "1d_start", "2d", "3d"])
def test_attention_past_masks(mask, unidirectional, t, executor):
    # input (B, S, D) projected by weights (D, 3D) + bias; past (2, B, N, P, H) -> present
    rng = np.random.default_rng(4)
    n, h, d_in = 2, 8, 12
    mr = MASK_RANK[mask]
    spec = [(t, 3), (t, 2), (t, 1), None if mr is None else (I32, mr), (t, 5)]
    model = _model("Attention", spec, 2, {"num_heads": n, "unidirectional": unidirectional}, t)
    w, bias = rand((d_in, 3 * n * h), NP[t], rng, -0.5, 0.5), rand((3 * n * h,), NP[t], rng, -0.5, 0.5)
    feeds = []
    for b, s, p in [(2, 3, 4), (1, 1, 6), (3, 5, 0), (2, 2, 1)]:
        f = {"in0": rand((b, s, d_in), NP[t], rng), "in1": w, "in2": bias,
             "in4": rand((2, b, n, p, h), NP[t], rng)}
        if mr is not None:
            f["in3"] = _mask(mask, b, s, p, rng)
        feeds.append(f)
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[t])


def _ort_version() -> tuple[int, ...]:
    import onnxruntime as ort
    return tuple(int(p) for p in ort.__version__.split(".")[:2])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_attention_qkv_sizes_bias_scale(with_bias, t, executor):
    # V wider than Q/K (qkv_hidden_sizes), with or without a bias input, an attention_bias
    # broadcast over the batch
    if not with_bias and _ort_version() < (1, 32):
        pytest.skip("onnxruntime's CPU Attention crashes without a bias input before 1.32")
    rng = np.random.default_rng(5)
    n, dq, dv = 2, 16, 24
    attrs = {"num_heads": n, "qkv_hidden_sizes": [dq, dq, dv], "scale": 0.3}
    spec = [(t, 3), (t, 2), (t, 1) if with_bias else None, (I32, 2), None, (t, 4)]
    model = _model("Attention", spec, 1, attrs, t)
    feeds = []
    for b, s in [(2, 4), (1, 7), (3, 1)]:
        f = {"in0": rand((b, s, 10), NP[t], rng), "in1": rand((10, 2 * dq + dv), NP[t], rng, -0.5, 0.5),
             "in3": _mask("2d", b, s, 0, rng), "in5": rand((1, n, s, s), NP[t], rng)}
        if with_bias:
            f["in2"] = rand((2 * dq + dv,), NP[t], rng, -0.5, 0.5)
        feeds.append(f)
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[t])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_attention_4d_mask_as_3d(executor):
    # onnxruntime's CPU kernel refuses Megatron's (B, 1, M, M) mask; its rows past .. past + S - 1
    # over the first T keys are the 3-D mask onnxruntime takes
    rng = np.random.default_rng(6)
    n, h = 2, 8
    spec = [(F32, 3), (F32, 2), (F32, 1), (I32, 4), (F32, 5)]
    ours = dynashape.InferenceSession(_model("Attention", spec, 2, {"num_heads": n}, F32), device=DEVICE,
                                      executor=executor)
    ref = _ort(_model("Attention", spec[:3] + [(I32, 3)] + spec[4:], 2, {"num_heads": n}, F32))
    w, bias = rand((16, 3 * n * h), np.float32, rng, -0.5, 0.5), rand((3 * n * h,), np.float32, rng)
    for b, s, p, m in [(2, 3, 2, 8), (1, 1, 5, 6), (2, 4, 0, 4)]:
        mask4 = (rng.random((b, 1, m, m)) < 0.7).astype(np.int32)
        mask4[..., 0] = 1
        f = {"in0": rand((b, s, 16), np.float32, rng), "in1": w, "in2": bias,
             "in4": rand((2, b, n, p, h), np.float32, rng)}
        want = ref.run(None, {**f, "in3": np.ascontiguousarray(mask4[:, 0, p:p + s, :p + s])})
        got = ours.run(None, {**f, "in3": mask4})
        for g, wt in zip(got, want):
            compare(g, wt, f"4-D mask {mask4.shape}, past {p}", **TOL[F32])


def test_attention_refusals():
    rng = np.random.default_rng(7)
    f = {"in0": rand((1, 2, 16), np.float32, rng), "in1": rand((16, 48), np.float32, rng)}
    with pytest.raises(dynashape.errors.DynashapeError, match="do_rotary"):
        _run_error(_model("Attention", [(F32, 3), (F32, 2)], 1, {"num_heads": 2, "do_rotary": 1}, F32), f)
    with pytest.raises(dynashape.errors.DynashapeError, match="shared buffer"):
        _run_error(_model("Attention", [(F32, 3), (F32, 2), None, None, (F32, 5), None, (I32, 1)], 2,
                          {"num_heads": 2, "past_present_share_buffer": 1}, F32),
                   {**f, "in4": rand((2, 1, 2, 4, 8), np.float32, rng), "in6": np.array([2], np.int32)})
    with pytest.raises(dynashape.errors.DynashapeError, match="both past and attention_bias"):
        _run_error(_model("Attention", [(F32, 3), (F32, 2), None, None, (F32, 5), (F32, 4)], 2, {"num_heads": 2}, F32),
                   {**f, "in4": rand((2, 1, 2, 4, 8), np.float32, rng), "in5": rand((1, 2, 2, 6), np.float32, rng)})


# MultiHeadAttention -------------------------------------------------------------------------
MHA_MASK_RANK = {"none": None, "1d": 1, "2d": 2, "3d": 3}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", ["none", "1d", "2d", "3d"])
def test_mha_past_masks(mask, unidirectional, t, executor):
    # query/key/value (B, S, D) + bias, past_key/past_value (B, N, P, H) -> present_key/value
    rng = np.random.default_rng(8)
    n, h = 2, 8
    mr = MHA_MASK_RANK[mask]
    spec = [(t, 3), (t, 3), (t, 3), (t, 1), None if mr is None else (I32, mr), None, (t, 4), (t, 4)]
    model = _model("MultiHeadAttention", spec, 3, {"num_heads": n, "unidirectional": unidirectional}, t)
    bias = rand((3 * n * h,), NP[t], rng, -0.5, 0.5)
    feeds = []
    for b, s, p in [(2, 3, 4), (1, 1, 6), (3, 5, 0), (2, 2, 1)]:
        f = {"in0": rand((b, s, n * h), NP[t], rng), "in1": rand((b, s, n * h), NP[t], rng),
             "in2": rand((b, s, n * h), NP[t], rng), "in3": bias,
             "in6": rand((b, n, p, h), NP[t], rng), "in7": rand((b, n, p, h), NP[t], rng)}
        if mr is not None:
            f["in4"] = _mask(mask, b, s, p, rng)
        feeds.append(f)
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[t])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
def test_mha_cross_bnsh_attention_bias_qk(t, executor):
    # key/value already (B, N, L, H): only the query takes its bias; attention_bias (B, 1, S, L);
    # the fourth output is the scaled, biased Q*K' before the softmax
    rng = np.random.default_rng(9)
    n, h = 4, 8
    spec = [(t, 3), (t, 4), (t, 4), (t, 1), (I32, 2), (t, 4)]
    model = _model("MultiHeadAttention", spec, 4, {"num_heads": n, "scale": 0.25}, t)
    feeds = []
    for b, s, length in [(2, 3, 5), (1, 4, 2), (3, 1, 7)]:
        feeds.append({"in0": rand((b, s, n * h), NP[t], rng), "in1": rand((b, n, length, h), NP[t], rng),
                      "in2": rand((b, n, length, h), NP[t], rng), "in3": rand((3 * n * h,), NP[t], rng),
                      "in4": _mask("2d", b, length, 0, rng),
                      "in5": rand((b, 1, s, length), NP[t], rng)})
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[t])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_mha_cross_unidirectional(executor):
    # more keys than queries: onnxruntime masks every query row but the last one
    rng = np.random.default_rng(10)
    model = _model("MultiHeadAttention", [(F32, 3), (F32, 3), (F32, 3)], 4, {"num_heads": 2, "unidirectional": 1},
                   F32, out_names=["out0", "", "", "out3"])
    feeds = [{"in0": rand((b, s, 16), np.float32, rng), "in1": rand((b, length, 16), np.float32, rng),
              "in2": rand((b, length, 16), np.float32, rng)} for b, s, length in [(2, 3, 5), (1, 4, 9), (2, 2, 2)]]
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL[F32])


def test_mha_packed_refused():
    rng = np.random.default_rng(11)
    model = _model("MultiHeadAttention", [(F32, 3), (F32, 5)], 1, {"num_heads": 2}, F32)
    with pytest.raises(dynashape.errors.DynashapeError, match="packed"):
        _run_error(model, {"in0": rand((1, 2, 16), np.float32, rng), "in1": rand((1, 3, 2, 2, 8), np.float32, rng)})


# GroupQueryAttention ------------------------------------------------------------------------
N_Q, N_KV, HEAD = 4, 2, 16


def _gqa_model(t, attrs, *, packed=False, rotary=False, extra=(), n_outputs=3):
    """query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos, sin,
    position_ids, attention_bias, head_sink; ``extra`` names the optional inputs from 9 on."""
    spec = [(t, 3), None if packed else (t, 3), None if packed else (t, 3), (t, 4), (t, 4), (I32, 1), (I32, 0),
            (t, 2) if rotary else None, (t, 2) if rotary else None]
    ranks = {9: (I64, 2), 10: (t, 4), 11: (t, 1)}
    spec += [ranks[i] if i in extra else None for i in range(9, 12)]
    return _model("GroupQueryAttention", spec, n_outputs, {"num_heads": N_Q, "kv_num_heads": N_KV, **attrs}, t)


def _gqa_step(t, b, s, past, lengths, total, rng, *, packed=False, rotary=None, extra=None):
    """Feeds for one call: ``past`` the (past_key, past_value) pair, ``lengths`` each row's total."""
    x = NP[t]
    f = {"in3": past[0], "in4": past[1], "in5": np.asarray(lengths, np.int32) - 1,
         "in6": np.array(total, np.int32)}
    if packed:
        f["in0"] = rand((b, s, (N_Q + 2 * N_KV) * HEAD), x, rng)
    else:
        f.update(in0=rand((b, s, N_Q * HEAD), x, rng), in1=rand((b, s, N_KV * HEAD), x, rng),
                 in2=rand((b, s, N_KV * HEAD), x, rng))
    if rotary is not None:
        f["in7"], f["in8"] = rotary
    f.update(extra or {})
    return f


def _conversations(t, model, executor, rng, *, packed=False, rotary=False, capacity=0, extra_fn=None,
                   prompts=((2, 5, 3), (1, 3, 2))):
    """For each (batch, prompt length, decode steps): the prompt (empty past, or a zero past of
    ``capacity``), then one-token steps with the present fed back as past, all in one session."""
    x = NP[t]
    caches = (rand((64, 8), x, rng, -1, 1), rand((64, 8), x, rng, -1, 1)) if rotary else None
    steps = []
    for b, prompt, decode in prompts:
        steps.append((b, prompt, prompt, decode))
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    ref = _ort(model)
    names = [o.name for o in model.graph.output]
    for b, prompt, _, decode in steps:
        zero = np.zeros((b, N_KV, capacity, HEAD), x)
        past, total, s = (zero, zero.copy()), prompt, prompt
        for step in range(decode + 1):
            extra = extra_fn(b, s, total, rng) if extra_fn else None
            f = _gqa_step(t, b, s, past, [total] * b, total, rng, packed=packed, rotary=caches, extra=extra)
            want, got = ref.run(None, f), sess.run(None, f)
            for name, g, w in zip(names, got, want):
                compare(g, w, f"batch {b} step {step} output {name}", **TOL[t])
            past, total, s = (want[1], want[2]), total + 1, 1


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("variant", ["plain", "packed", "rotary", "rotary_interleaved_packed", "capacity"])
def test_gqa_decode(variant, t, executor):
    # prompt then decode, present fed back; two conversations of other batch sizes in one session
    rng = np.random.default_rng(12)
    packed = "packed" in variant
    rotary = "rotary" in variant
    attrs = {"do_rotary": 1} if rotary else {}
    if "interleaved" in variant:
        attrs["rotary_interleaved"] = 1
    model = _gqa_model(t, attrs, packed=packed, rotary=rotary)
    # "capacity": a past buffer longer than the sequence, kept whole (present = max(past, total))
    _conversations(t, model, executor, rng, packed=packed, rotary=rotary, capacity=12 if variant == "capacity" else 0)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("attrs", [{"local_window_size": 2}, {"local_window_size": 0}, {"softcap": 0.7},
                                   {"smooth_softmax": 1}, {"scale": 0.2}, {"causal": 0}],
                         ids=["window", "window0", "softcap", "smooth_softmax", "scale", "noncausal"])
def test_gqa_attrs(attrs, executor):
    rng = np.random.default_rng(13)
    _conversations(F32, _gqa_model(F32, attrs), executor, rng, prompts=((2, 5, 4),))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
def test_gqa_bias_sink_qk(t, executor):
    # attention_bias (B, 1, S, T), per-head sinks, and the softmaxed Q*K' as a fourth output
    rng = np.random.default_rng(14)
    model = _gqa_model(t, {"softcap": 1.5, "qk_output": 2}, extra=(10, 11), n_outputs=4)
    sink = rand((N_Q,), NP[t], rng)

    def extra(b, s, total, rng):
        return {"in10": rand((b, 1, s, total), NP[t], rng), "in11": sink}
    _conversations(t, model, executor, rng, extra_fn=extra)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("qk_output", [1, 2])
def test_gqa_qk_output(qk_output, executor):
    rng = np.random.default_rng(15)
    _conversations(F32, _gqa_model(F32, {"qk_output": qk_output}, n_outputs=4), executor, rng, prompts=((2, 4, 2),))


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("t", [F32, F16])
def test_gqa_ragged_batch(t, executor):
    # rows of different lengths: a right-padded prompt, then decode steps whose rows write their
    # token after their own past (the present is zero past each row's end, as onnxruntime's)
    rng = np.random.default_rng(16)
    model = _gqa_model(t, {"do_rotary": 1}, rotary=True)
    caches = (rand((32, 8), NP[t], rng, -1, 1), rand((32, 8), NP[t], rng, -1, 1))
    b, prompt = 3, 5
    lengths = np.array([5, 3, 4])
    empty = np.zeros((b, N_KV, 0, HEAD), NP[t])
    first = _gqa_step(t, b, prompt, (empty, empty), lengths, prompt, rng, rotary=caches)

    def update(step, feeds, want):
        nonlocal lengths
        lengths = lengths + 1
        return _gqa_step(t, b, 1, (want[1], want[2]), lengths, int(lengths.max()), rng, rotary=caches)
    _loop(model, first, update, 4, executor, TOL[t])


@pytest.mark.parametrize("executor", EXECUTORS)
def test_gqa_continued_prompt_position_ids(executor):
    # batch 1: a prompt, then chunks of several tokens after the past (positions from the past's
    # length), then explicit position_ids for decode steps
    rng = np.random.default_rng(17)
    model = _gqa_model(F32, {"do_rotary": 1}, rotary=True, extra=(9,))
    caches = (rand((48, 8), np.float32, rng, -1, 1), rand((48, 8), np.float32, rng, -1, 1))
    empty = np.zeros((1, N_KV, 0, HEAD), np.float32)
    pos = lambda s, start: {"in9": np.arange(start, start + s, dtype=np.int64).reshape(1, s)}  # noqa: E731
    # a prompt's position_ids count as one offset in onnxruntime: 5, 6, 7, 8 here
    first = _gqa_step(F32, 1, 4, (empty, empty), [4], 4, rng, rotary=caches,
                      extra={"in9": np.array([[5, 1, 7, 2]], np.int64)})
    chunks = [3, 2, 1, 1]
    total = 4

    def update(step, feeds, want):
        nonlocal total
        s = chunks[step]
        extra = pos(s, total + 3)
        total += s
        return _gqa_step(F32, 1, s, (want[1], want[2]), [total], total, rng, rotary=caches, extra=extra)
    _loop(model, first, update, len(chunks) + 1, executor, TOL[F32])


def test_gqa_refusals():
    rng = np.random.default_rng(18)
    empty = np.zeros((2, N_KV, 0, HEAD), np.float32)
    f = _gqa_step(F32, 2, 3, (empty, empty), [2, 3], 3, rng)
    # a continued prompt (several tokens after a past) takes one row only, as in onnxruntime
    with pytest.raises(dynashape.errors.DynashapeError, match="batch size 1"):
        _run_error(_gqa_model(F32, {}), {**f, "in6": np.array(5, np.int32)})
    with pytest.raises(dynashape.errors.UnsupportedOpError, match="k_norm_epsilon"):
        _run_error(_gqa_model(F32, {"k_norm_epsilon": 1e-6}), f)
    past = np.zeros((2, N_KV, 4, HEAD), np.float32)
    with pytest.raises(dynashape.errors.DynashapeError, match="total_sequence_length 7"):
        _run_error(_gqa_model(F32, {}), _gqa_step(F32, 2, 1, (past, past), [5, 5], 7, rng))
    if DEVICE == "cpu":  # on a GPU the check would cost a sync: the scatter's own bound check fails there
        with pytest.raises(dynashape.errors.DynashapeError, match=r"must lie in \[0, 5\)"):
            _run_error(_gqa_model(F32, {}), _gqa_step(F32, 2, 1, (past, past), [6, 5], 5, rng))
