"""onnxruntime's quantized BERT contrib ops (dynashape/ops/contrib_qattention.py) against its CPU
kernels: QAttention and QEmbedLayerNormalization, what quantize_dynamic writes into a BERT that
onnxruntime's transformers optimizer fused.

Each test runs one session over a sequence of changing (batch, sequence, past) shapes with fresh
random data per step, on both executors; weights, tables and their quantization parameters are
initializers, as in a quantized model. onnx's shape inference knows no com.microsoft op, so the
models give their outputs' types.

onnxruntime's uint8 x int8 GEMM on AVX2 without VNNI (vpmaddubsw) saturates each pair of products
to int16, so its integer product is wrong where two adjacent weights are large: the int8 weights
compared with onnxruntime here lie in [-64, 63] (255 * 64 * 2 < 32767: no pair can saturate, and
onnxruntime is exact). Full-range int8 weights are checked against an exact numpy reference, and
against onnxruntime with dynashape's u8s8 saturation switch on.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.ops import contrib_qattention, linalg
from tests.contrib.test_attention_ops import MASK_RANK, _mask  # the same mask kinds as the float Attention
from tests.ops.harness import DEVICE, compare, run_sequence

MS = "com.microsoft"
F32, U8, I8, I32 = TP.FLOAT, TP.UINT8, TP.INT8, TP.INT32
NP = {F32: np.float32, U8: np.uint8, I8: np.int8, I32: np.int32}
EXECUTORS = ["compiled", "interpreter"]
# float32 throughout, as onnxruntime: only the order of the attention's sums differs
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _model(op_type, spec, out_types, attrs=None):
    """One com.microsoft node. ``spec[i]`` is (elem_type, rank) for a graph input with dynamic
    dims, a numpy array for an initializer, or None for an absent input (an empty name).
    Inputs are in{i}; outputs out{k} typed by ``out_types``."""
    inputs, inits, names = [], [], []
    for i, s in enumerate(spec):
        name = f"in{i}"
        if s is None:
            names.append("")
            continue
        names.append(name)
        if isinstance(s, np.ndarray):
            inits.append(numpy_helper.from_array(s, name))
        else:
            t, rank = s
            inputs.append(helper.make_tensor_value_info(name, t, [f"d{i}_{k}" for k in range(rank)]))
    while names and names[-1] == "":
        names.pop()
    outs = [helper.make_tensor_value_info(f"out{k}", t, None) for k, t in enumerate(out_types)]
    node = helper.make_node(op_type, names, [o.name for o in outs], domain=MS, **(attrs or {}))
    g = helper.make_graph([node], op_type.lower(), inputs, outs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def _ort(model):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# QAttention -------------------------------------------------------------------------------------
def _weights(wt, d_in, n3, rng, full_range=False):
    """Weights, and a zero point inside their range. int8 in [-64, 63] unless ``full_range``
    (onnxruntime's AVX2 pair sums stay within int16 then: see the module's docstring)."""
    if wt == U8:
        return rng.integers(0, 256, (d_in, n3)).astype(np.uint8)
    lo, hi = (-128, 128) if full_range else (-64, 64)
    return rng.integers(lo, hi, (d_in, n3)).astype(np.int8)


def _wparams(wt, n3, per_column, rng):
    """weight_scale and weight_zero_point: one value, or one per column. The scales keep Q, K and V
    of order 1: larger attention scores make a near one-hot softmax that magnifies the float32
    rounding of the sums (which onnxruntime orders otherwise)."""
    shape = (n3,) if per_column else ()
    ws = rng.uniform(0.001, 0.004, shape).astype(np.float32)
    if wt == U8:
        wz = rng.integers(100, 156, shape).astype(np.uint8)
    else:
        wz = rng.integers(-8, 8, shape).astype(np.int8)
    return ws, wz


def _qinput(b, s, d_in, rng):
    """A quantized input as DynamicQuantizeLinear gives it: uint8, its scale, its zero point."""
    return (rng.integers(0, 256, (b, s, d_in)).astype(np.uint8), np.array(rng.uniform(0.005, 0.015), np.float32),
            np.array(rng.integers(100, 156), np.uint8))




def _qattention_model(n, d_in, h, wt, per_column, rng, mask_rank, with_past, n_outputs, attrs=None,
                      full_range=False):
    n3 = 3 * n * h
    w = _weights(wt, d_in, n3, rng, full_range)
    bias = rng.uniform(-0.5, 0.5, n3).astype(np.float32)
    ws, wz = _wparams(wt, n3, per_column, rng)
    spec = [(U8, 3), w, bias, (F32, 0), ws, None if mask_rank is None else (I32, mask_rank), (U8, 0), wz,
            (F32, 5) if with_past else None]
    model = _model("QAttention", spec, [F32] * n_outputs, {"num_heads": n, **(attrs or {})})
    return model, (w, bias, ws, wz)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", ["none", "1d", "1d_start", "2d", "3d"])
def test_qattention_past_masks(mask, unidirectional, executor):
    rng = np.random.default_rng(1)
    n, h, d_in = 2, 8, 12
    model, _ = _qattention_model(n, d_in, h, U8, False, rng, MASK_RANK[mask], True, 2,
                                 {"unidirectional": unidirectional})
    feeds = []
    for b, s, p in [(2, 3, 4), (1, 1, 6), (3, 5, 0), (2, 2, 1)]:
        x, xs, xz = _qinput(b, s, d_in, rng)
        f = {"in0": x, "in3": xs, "in6": xz, "in8": rng.uniform(-2, 2, (2, b, n, p, h)).astype(np.float32)}
        if mask != "none":
            f["in5"] = _mask(mask, b, s, p, rng)
        feeds.append(f)
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_qattention_key_lengths_in_the_c_kernel(executor):
    """A right-padded batch's mask_index (one key length a row) at sizes the C attention serves:
    the kernel masks by the lengths (no bias tensor) and writes the heads side by side; rows
    padded, full and with lengths past the sequence, against onnxruntime."""
    from dynashape.ops import native
    rng = np.random.default_rng(7)
    n, h, d_in = 4, 16, 32
    model, _ = _qattention_model(n, d_in, h, U8, False, rng, 1, False, 1)
    feeds = []
    for b, s in [(2, 64), (1, 48), (3, 64), (2, 40)]:
        x, xs, xz = _qinput(b, s, d_in, rng)
        lens = rng.integers(1, s + 1, b).astype(np.int32)
        lens[-1] = s + 3 if b > 1 else lens[-1]
        feeds.append({"in0": x, "in3": xs, "in6": xz, "in5": lens})
    before = native.counters().get("attention_native_calls", 0)
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL)
    if native.library("attention") is not None and DEVICE == "cpu":
        assert native.counters().get("attention_native_calls", 0) >= before + len(feeds)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("per_column", [False, True], ids=["per_tensor", "per_column"])
@pytest.mark.parametrize("wt", [U8, I8], ids=["u8", "s8"])
def test_qattention_weights(wt, per_column, executor):
    # weight scale and zero point per tensor or per column, uint8 or int8 weights; a pruned model's
    # input hidden size (40) differs from the attention's (3 heads of 16)
    rng = np.random.default_rng(2)
    n, h, d_in = 3, 16, 40
    model, _ = _qattention_model(n, d_in, h, wt, per_column, rng, 2, False, 2)
    feeds = []
    for b, s in [(2, 5), (1, 1), (3, 9), (1, 4)]:
        x, xs, xz = _qinput(b, s, d_in, rng)
        feeds.append({"in0": x, "in3": xs, "in6": xz, "in5": _mask("2d", b, s, 0, rng)})
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_qattention_without_optional_inputs(executor):
    # no zero points (0), no mask, no past; only the output asked for
    rng = np.random.default_rng(3)
    n, h, d_in = 2, 8, 16
    n3 = 3 * n * h
    w = _weights(I8, d_in, n3, rng)
    spec = [(U8, 3), w, rng.uniform(-1, 1, n3).astype(np.float32), (F32, 1), np.array([0.01], np.float32)]
    model = _model("QAttention", spec, [F32], {"num_heads": n})
    feeds = [{"in0": _qinput(b, s, d_in, rng)[0], "in3": np.array([0.02], np.float32)} for b, s in [(1, 3), (2, 6)]]
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_qattention_attributes(executor):
    # scale and mask_filter_value (small, so masked keys keep a visible weight); do_rotary, which
    # onnxruntime's CPU kernel reads and ignores
    rng = np.random.default_rng(4)
    n, h, d_in = 2, 8, 12
    model, _ = _qattention_model(n, d_in, h, I8, True, rng, 2, False, 1,
                                 {"scale": 0.2, "mask_filter_value": -2.0, "unidirectional": 1, "do_rotary": 1})
    feeds = []
    for b, s in [(2, 4), (1, 7), (3, 1)]:
        x, xs, xz = _qinput(b, s, d_in, rng)
        feeds.append({"in0": x, "in3": xs, "in6": xz, "in5": _mask("2d", b, s, 0, rng)})
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("wt", [U8, I8], ids=["u8", "s8"])
def test_qattention_decode_loop(wt, executor):
    # a prompt then decode steps, the present fed back as the next past, a (B, T) padding mask
    # growing with it; then a new sequence with another batch size
    rng = np.random.default_rng(5)
    n, h, d_in = 2, 8, 16
    model, _ = _qattention_model(n, d_in, h, wt, wt == I8, rng, 2, True, 2, {"unidirectional": 1})
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    ref = _ort(model)
    for b, prompt, steps in [(2, 5, 4), (3, 3, 3)]:
        past = np.zeros((2, b, n, 0, h), np.float32)
        lengths = rng.integers(1, prompt + 1, b)
        lengths[0] = prompt
        s = prompt
        for step in range(steps):
            x, xs, xz = _qinput(b, s, d_in, rng)
            total = past.shape[3] + s
            mask = np.ones((b, total), np.int32)
            for r in range(b):  # the prompt's right padding stays masked in later steps
                mask[r, lengths[r]:prompt] = 0
            f = {"in0": x, "in3": xs, "in6": xz, "in5": mask, "in8": past}
            want = ref.run(None, f)
            got = sess.run(None, f)
            for k, (g, wv) in enumerate(zip(got, want)):
                compare(g, wv, f"batch {b} step {step} output {k}", **TOL)
            past, s = want[1], 1


def _reference(x, xs, xz, w, ws, wz, bias, n, mask_2d=None):
    """QAttention in numpy: the exact integer product (int64), float32 scaling as onnxruntime, then
    softmax attention in float64 (no past, bidirectional, an optional (B, T) padding mask)."""
    acc = (x.astype(np.int64) - int(xz)) @ (w.astype(np.int64) - wz.astype(np.int64))
    qkv = acc.astype(np.float32) * (ws.astype(np.float32) * xs) + bias
    b, s, n3 = qkv.shape
    hid = n3 // 3
    hs = hid // n
    q, k, v = (qkv[..., i * hid:(i + 1) * hid].reshape(b, s, n, hs).transpose(0, 2, 1, 3).astype(np.float64)
               for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    if mask_2d is not None:
        scores = scores + np.where(mask_2d > 0, 0.0, -10000.0)[:, None, None, :]
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, hid)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_qattention_full_range_int8_exact(executor):
    # full-range int8 weights: exact against numpy. onnxruntime agrees with the exact product on a
    # machine with VNNI; on AVX2 without it (vpmaddubsw) it saturates pair sums to int16, which
    # dynashape's u8s8 saturation switch reproduces: it must match one of the two
    rng = np.random.default_rng(6)
    n, h, d_in = 2, 16, 64
    model, (w, bias, ws, wz) = _qattention_model(n, d_in, h, I8, True, rng, 2, False, 1, full_range=True)
    w[0::2, :8], w[1::2, :8] = -128, -128  # pairs of K that saturate with a large input
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "in1"))
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    ref = _ort(model)
    for b, s in [(2, 5), (1, 8), (3, 2)]:
        x, xs, xz = _qinput(b, s, d_in, rng)
        x[..., :4] = 255
        mask = _mask("2d", b, s, 0, rng)
        f = {"in0": x, "in3": xs, "in6": xz, "in5": mask}
        got = sess.run(None, f)[0]
        compare(got, _reference(x, xs, xz, w, ws, wz, bias, n, mask).astype(np.float32), f"exact {b}x{s}", **TOL)
        prev = linalg.set_u8s8_saturation(True)  # read by the kernel at each call
        try:
            got_sat = sess.run(None, f)[0]
        finally:
            linalg.set_u8s8_saturation(prev)
        assert not np.allclose(got, got_sat, **TOL), "no pair sum saturates: the test checks nothing"
        want = ref.run(None, f)[0]
        compare(got if np.allclose(got, want, **TOL) else got_sat, want, f"onnxruntime {b}x{s}", **TOL)


def test_qattention_refusals():
    rng = np.random.default_rng(7)
    n, h, d_in = 2, 8, 16
    x, xs, xz = _qinput(1, 3, d_in, rng)
    f = {"in0": x, "in3": xs, "in6": xz}
    model, _ = _qattention_model(n, d_in, h, U8, False, rng, None, True, 2, {"past_present_share_buffer": 1})
    with pytest.raises(dynashape.errors.DynashapeError, match="shared buffer"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, {**f, "in8": np.zeros((2, 1, n, 4, h), np.float32)})
    # a weight scale neither per tensor nor per column
    model, _ = _qattention_model(n, d_in, h, U8, False, rng, None, False, 1)
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.full(5, 0.01, np.float32), "in4"))
    with pytest.raises(dynashape.errors.DynashapeError, match="weight_scale"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, f)
    # input hidden size differs from the weight's rows
    model, _ = _qattention_model(n, d_in, h, U8, False, rng, None, False, 1)
    with pytest.raises(dynashape.errors.DynashapeError, match="QAttention"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, {**f, "in0": _qinput(1, 3, d_in + 1, rng)[0]})


# QEmbedLayerNormalization -------------------------------------------------------------------------
def _qtable(shape, qt, rng, lo=-1.0, hi=1.0):
    """A float table quantized per tensor: (q, scale, zero point)."""
    v = rng.uniform(lo, hi, shape).astype(np.float32)
    qmin, qmax = (0, 255) if qt == U8 else (-128, 127)
    scale = np.float32((v.max() - min(v.min(), 0.0)) / (qmax - qmin))
    zp = int(np.clip(np.round(qmin - min(v.min(), 0.0) / scale), qmin, qmax))
    q = np.clip(np.round(v / scale) + zp, qmin, qmax).astype(NP[qt])
    return q, np.array(scale, np.float32), np.array(zp, NP[qt])


def _qembed_model(qt, rng, with_segment, with_mask, vocab=50, max_pos=16, n_seg=2, hidden=32, epsilon=None):
    tables = [_qtable((vocab, hidden), qt, rng), _qtable((max_pos, hidden), qt, rng),
              _qtable((n_seg, hidden), qt, rng) if with_segment else None,
              _qtable((hidden,), qt, rng, 0.5, 1.5), _qtable((hidden,), qt, rng, -0.3, 0.3)]
    spec = [(I32, 2), (I32, 2) if with_segment else None]
    spec += [t[0] if t is not None else None for t in tables]
    spec += [(I32, 2) if with_mask else None]
    spec += [t[1] if t is not None else None for t in tables]
    spec += [t[2] if t is not None else None for t in tables]
    attrs = {} if epsilon is None else {"epsilon": epsilon}
    return _model("QEmbedLayerNormalization", spec, [F32, I32], attrs)


def _embed_feeds(rng, shapes, with_segment, with_mask, vocab=50):
    feeds = []
    for b, s in shapes:
        f = {"in0": rng.integers(0, vocab, (b, s)).astype(np.int32)}
        if with_segment:
            f["in1"] = rng.integers(0, 2, (b, s)).astype(np.int32)
        if with_mask:
            m = np.ones((b, s), np.int32)
            for r in range(b):
                m[r, rng.integers(1, s + 1):] = 0
            m[0, -1] = 2  # onnxruntime counts only the ones
            f["in7"] = m
        feeds.append(f)
    return feeds


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("with_mask", [True, False], ids=["mask", "no_mask"])
@pytest.mark.parametrize("with_segment", [True, False], ids=["segment", "no_segment"])
@pytest.mark.parametrize("qt", [U8, I8], ids=["u8", "s8"])
def test_qembed_layer_norm(qt, with_segment, with_mask, executor):
    rng = np.random.default_rng(8)
    model = _qembed_model(qt, rng, with_segment, with_mask)
    feeds = _embed_feeds(rng, [(2, 7), (1, 1), (3, 16), (2, 4)], with_segment, with_mask)
    run_sequence(model, feeds, references=("ort",), executor=executor, **TOL)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_qembed_epsilon(executor):
    rng = np.random.default_rng(9)
    model = _qembed_model(U8, rng, False, True, epsilon=0.05)
    run_sequence(model, _embed_feeds(rng, [(2, 5), (1, 9)], False, True), references=("ort",), executor=executor,
                 **TOL)


def test_qembed_tables_dequantized_once():
    rng = np.random.default_rng(10)
    model = _qembed_model(U8, rng, True, False)
    sess = dynashape.InferenceSession(model, device=DEVICE, executor="interpreter")
    feeds = _embed_feeds(rng, [(2, 3), (1, 5), (2, 2)], True, False)
    sess.run(None, feeds[0])
    n = len(contrib_qattention._DEQUANT)
    for f in feeds[1:]:
        sess.run(None, f)
    assert len(contrib_qattention._DEQUANT) == n


def test_qembed_refusals():
    rng = np.random.default_rng(11)
    model = _qembed_model(U8, rng, True, False)
    f = {"in0": np.array([[3, 5]], np.int32), "in1": np.zeros((1, 2), np.int32)}
    with pytest.raises(dynashape.errors.DynashapeError, match="out of range|index"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, {**f, "in0": np.array([[3, 50]], np.int32)})
    # a table quantized per row: onnxruntime's kernel takes per-tensor parameters only
    model = _qembed_model(U8, rng, True, False)
    model.graph.initializer[5].CopyFrom(numpy_helper.from_array(np.full(50, 0.01, np.float32), "in8"))
    with pytest.raises(dynashape.errors.DynashapeError, match="word_embedding_scale"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, f)
    # a segment table without segment_ids (onnxruntime refuses it too)
    model = _qembed_model(U8, rng, True, False)
    model.graph.node[0].input[1] = ""
    keep = [vi for vi in model.graph.input if vi.name != "in1"]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    with pytest.raises(dynashape.errors.DynashapeError, match="all be given or all be absent"):
        dynashape.InferenceSession(model, device=DEVICE).run(None, {"in0": f["in0"]})


@pytest.mark.parametrize("with_segment", [False, True])
def test_qembed_layer_norm_bound_to_its_tables(with_segment):
    """Constant tables: the compiled runner's QEmbedLayerNormalization is bound to them (dequantized
    once, the C embedding pass) and gives the interpreter's results bit for bit; a sequence longer
    than the position table still raises the op's error."""
    rng = np.random.default_rng(11)
    model = _qembed_model(U8, rng, with_segment, True)
    comp = dynashape.InferenceSession(model, device=DEVICE)
    ref = dynashape.InferenceSession(model, device=DEVICE, executor="interpreter")
    for f in _embed_feeds(rng, [(2, 5), (1, 16), (3, 9)], with_segment, True):
        for g, w in zip(comp.run(None, f), ref.run(None, f)):
            np.testing.assert_array_equal(g, w)
    if DEVICE == "cpu":
        assert comp.compiled.stats["bound_kernels"] >= 1
    with pytest.raises(dynashape.errors.DynashapeError):
        comp.run(None, _embed_feeds(rng, [(1, 17)], with_segment, True)[0])
    assert comp.run(None, _embed_feeds(rng, [(2, 5)], with_segment, True)[0])[0].shape == (2, 5, 32)
