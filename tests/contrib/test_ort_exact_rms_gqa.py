"""SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization and GroupQueryAttention (float32,
CPU) against onnxruntime's CPU kernels, to the bit, in both executors.

An int4 model built by onnxruntime-genai (MatMulNBits at accuracy level 4) quantizes each of these
ops' outputs to int8 in the next product: one ulp can move an int8 value, and the move stays in the
KV cache (issue 35: 3 of 8 prompts left onnxruntime-genai's greedy tokens within 256 steps while
these ops were 3e-8 to 7e-7 off). The orders are onnxruntime 1.32's (csrc/elementwise.c
ort_rms_row, ort_rope_f32, ort_gqa_attn_f32 say which): rows below and from 16 elements (MLAS's
AVX2 LayerNorm kernel from 16), tails of every length modulo 8; GQA's prompt (tiled online
softmax, one and several key blocks), continued prompt, decode (GEMV), a first token alone, a
local window, partial rotary, two batch rows, head sizes 16 to 128; a decode at 1, 2 and 16
intra-op threads on both sides (onnxruntime splits the keys across its threads where they outnumber
batch x heads). The softmax inside follows
MLAS's AVX-512F kernels: on a CPU without AVX-512F onnxruntime runs others, and these tests skip
(as tests/ops/test_ort_softmax.py)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynashape
from dynashape.ops import native

pytestmark = pytest.mark.skipif(
    "avx512f" not in native.cpuinfo("flags").split() or native.library("elementwise") is None,
    reason="onnxruntime's bits are followed where it runs MLAS's AVX-512F kernels (and need the native build)")

MS = "com.microsoft"
EXECUTORS = ["compiled", "interpreter"]


def _opsets():
    return [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]


def _ort(model: bytes):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _assert_bits(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape, f"{what}: output {i} of shape {g.shape}, onnxruntime's {w.shape}"
        differ = int((g.view(np.uint32) != w.view(np.uint32)).sum())
        assert differ == 0, f"{what}: {differ} of {g.size} values of output {i} differ from onnxruntime's " \
                            f"(max {np.abs(g.astype(np.float64) - w).max():.3g})"


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("h", [4, 8, 15, 16, 17, 20, 23, 31, 64, 100, 103])
def test_simplified_layer_norm_gives_onnxruntimes_bits(h, executor):
    eps = 1e-6
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y", "inv"], axis=-1, epsilon=eps)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "r", h]),
                                        helper.make_tensor_value_info("w", TensorProto.FLOAT, [h])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "inv")])
    model = helper.make_model(g, opset_imports=_opsets()).SerializeToString()
    sess, ref = dynashape.InferenceSession(model, executor=executor), _ort(model)
    rng = np.random.default_rng(h)
    before = native.counters().get("ort_simplified_ln_native_calls", 0)
    for rows in (1, 7, 300, 2):  # changing shapes, fresh values of changing magnitude
        feeds = {"x": (rng.standard_normal((2, rows, h)) * rng.uniform(0.01, 30, (2, rows, 1))).astype(np.float32),
                 "w": rng.standard_normal(h).astype(np.float32)}
        _assert_bits(sess.run(None, feeds), ref.run(None, feeds), f"h {h}, rows {rows}")
    assert native.counters().get("ort_simplified_ln_native_calls", 0) > before


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("h,bias,skip_rank", [(4, False, 3), (16, True, 3), (17, False, 2), (64, False, 3),
                                              (64, True, 2), (103, True, 3)])
def test_skip_simplified_layer_norm_gives_onnxruntimes_bits(h, bias, skip_rank, executor):
    eps = 1e-6
    ins = ["x", "s", "w"] + (["b"] if bias else [])
    node = helper.make_node("SkipSimplifiedLayerNormalization", ins, ["y", "", "", "t"], domain=MS, epsilon=eps)
    skip_shape = ["a", "r", h] if skip_rank == 3 else ["r", h]  # a skip without the batch dim broadcasts
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "r", h]),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, skip_shape)]
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                                for n in ("y", "t")])
    rng = np.random.default_rng(h + bias)
    g.initializer.append(numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "w"))
    if bias:
        g.initializer.append(numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "b"))
    model = helper.make_model(g, opset_imports=_opsets()).SerializeToString()
    sess, ref = dynashape.InferenceSession(model, executor=executor), _ort(model)
    before = native.counters().get("skip_ln_native_calls", 0)
    for rows in (1, 9, 200, 3):
        x = (rng.standard_normal((2, rows, h)) * rng.uniform(0.01, 30, (2, rows, 1))).astype(np.float32)
        s = rng.standard_normal((2, rows, h) if skip_rank == 3 else (rows, h)).astype(np.float32)
        feeds = {"x": x, "s": s}
        _assert_bits(sess.run(None, feeds), ref.run(None, feeds), f"h {h}, rows {rows}")
    assert native.counters().get("skip_ln_native_calls", 0) > before


def _gqa_model(n, nk, hd, max_pos, rotary_dim, window, rotary=1, separate=False):
    """One GroupQueryAttention node; ``separate``: query, key and value as three inputs (qkv, k, v),
    else packed in qkv."""
    d = n * hd if separate else (n + 2 * nk) * hd
    inv = 1.0 / (10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim))
    ang = np.arange(max_pos)[:, None] * inv[None]
    kv = ["k", "v"] if separate else ["", ""]
    node = helper.make_node("GroupQueryAttention", ["qkv", *kv, "pk", "pv", "sk", "tl", "cos", "sin"],
                            ["y", "prk", "prv"], domain=MS, num_heads=n, kv_num_heads=nk, scale=float(hd ** -0.5),
                            local_window_size=window, do_rotary=rotary, rotary_interleaved=0)
    extra = [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["b", "s", nk * hd]) for x in kv if x]
    g = helper.make_graph(
        [node], "gqa",
        [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["b", "s", d]), *extra,
         helper.make_tensor_value_info("pk", TensorProto.FLOAT, ["b", nk, "p", hd]),
         helper.make_tensor_value_info("pv", TensorProto.FLOAT, ["b", nk, "p", hd]),
         helper.make_tensor_value_info("sk", TensorProto.INT32, ["b"]),
         helper.make_tensor_value_info("tl", TensorProto.INT32, [])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in ("y", "prk", "prv")],
        [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos"),
         numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin")])
    return helper.make_model(g, opset_imports=_opsets()).SerializeToString(), d


# (heads, kv heads, head size, max positions, rotary dim, window, [(batch, past, new tokens)])
GQA_CASES = [
    (4, 2, 16, 64, 16, -1, [(1, 0, 8), (1, 8, 1), (1, 9, 1), (1, 0, 1), (1, 10, 5), (2, 0, 33), (2, 33, 1)]),
    (8, 2, 64, 300, 64, -1, [(1, 0, 37), (1, 37, 1), (1, 200, 1), (1, 0, 129)]),
    (4, 4, 32, 64, 16, 5, [(1, 0, 12), (1, 12, 1), (2, 20, 1), (1, 0, 1)]),  # partial rotary, a window
    # head size 128: keys in blocks of L2 / (32 * 128) (512 on a 2 MB L2), so two blocks here
    (2, 1, 128, 700, 128, -1, [(1, 0, 600), (1, 560, 1)]),
]


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("case", range(len(GQA_CASES)))
def test_group_query_attention_gives_onnxruntimes_bits(case, executor):
    n, nk, hd, max_pos, rd, window, steps = GQA_CASES[case]
    model, d = _gqa_model(n, nk, hd, max_pos, rd, window)
    sess, ref = dynashape.InferenceSession(model, executor=executor), _ort(model)
    rng = np.random.default_rng(case)
    before = native.counters().get("ort_gqa_native_calls", 0)
    for b, past, s in steps:
        total = past + s
        feeds = {"qkv": (rng.standard_normal((b, s, d)) * rng.uniform(0.5, 4)).astype(np.float32),
                 "pk": rng.standard_normal((b, nk, past, hd)).astype(np.float32),
                 "pv": rng.standard_normal((b, nk, past, hd)).astype(np.float32),
                 "sk": np.full(b, total - 1, np.int32), "tl": np.array(total, np.int32)}
        _assert_bits(sess.run(None, feeds), ref.run(None, feeds), f"batch {b}, past {past}, {s} new tokens")
    assert native.counters().get("ort_gqa_native_calls", 0) >= before + len(steps)


# decode over keys around and past one key block (L2 / (32 head size): 512 keys at head size 128 on a
# 2 MB L2, the size these cases are made for): (heads, kv heads, head size, window, [(batch, past)])
SPLIT_CASES = [(2, 1, 128, -1, [(1, 500), (1, 511), (1, 512), (1, 559), (1, 560), (2, 600), (1, 1100)]),
               (1, 1, 128, -1, [(1, 560), (2, 513), (1, 1030)]),
               (3, 1, 128, 300, [(1, 560), (2, 700)]),  # a window: the first block all masked at 700
               (4, 2, 64, -1, [(1, 1023), (1, 1100), (3, 1100)])]  # 1024-key blocks


def _decode_feeds(rng, b, past, nk, hd, d):
    return {"qkv": (rng.standard_normal((b, 1, d)) * rng.uniform(0.5, 4)).astype(np.float32),
            "pk": rng.standard_normal((b, nk, past, hd)).astype(np.float32),
            "pv": rng.standard_normal((b, nk, past, hd)).astype(np.float32),
            "sk": np.full(b, past, np.int32), "tl": np.array(past + 1, np.int32)}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("threads", [1, 2, 16])
@pytest.mark.parametrize("case", range(len(SPLIT_CASES)))
def test_gqa_decode_gives_onnxruntimes_bits_at_the_same_thread_count(case, threads, executor):
    """onnxruntime's decode splits the keys into blocks across its threads where they outnumber batch x
    heads and the keys span more than one block ("flash decoding": each block's softmax on its own, the
    blocks merged in order, another rounding than one pass): its intra-op thread count decides its bits.
    With intra_op_num_threads the same on both sides, ours are its, at every count (16 threads on this
    2-core machine: the split depends on the count, not on the cores or the threads' schedule)."""
    n, nk, hd, window, steps = SPLIT_CASES[case]
    model, d = _gqa_model(n, nk, hd, 1200, hd, window)
    so = ort.SessionOptions()
    so.log_severity_level, so.intra_op_num_threads = 3, threads
    ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    ours = dynashape.SessionOptions()
    ours.intra_op_num_threads = threads
    sess = dynashape.InferenceSession(model, ours, executor=executor)
    rng = np.random.default_rng(100 + case)
    for b, past in steps:
        feeds = _decode_feeds(rng, b, past, nk, hd, d)
        _assert_bits(sess.run(None, feeds), ref.run(None, feeds), f"{threads} threads, batch {b}, past {past}")
    if executor == "compiled":  # the decode steps ran the kernel bound to the constant caches (contrib_gqa)
        assert sess.stats()["bound_kernels"] >= 1


@pytest.mark.parametrize("rotary, separate", [(0, False), (1, True), (0, True)])
def test_gqa_decode_steps_without_rotary_or_with_separate_kv_give_onnxruntimes_bits(rotary, separate):
    """The bound decode step (cpu_gqa.DecodeStep: rotary, presents and attention in one C call) on
    the op's other forms: no rotary, and key and value as inputs of their own."""
    n, nk, hd = 4, 2, 32
    model, d = _gqa_model(n, nk, hd, 64, hd, -1, rotary=rotary, separate=separate)
    sess, ref = dynashape.InferenceSession(model), _ort(model)
    rng = np.random.default_rng(7 + rotary + 2 * separate)
    before = native.counters().get("ort_gqa_native_calls", 0)
    for b, past in [(1, 3), (1, 4), (2, 9), (1, 30)]:
        feeds = _decode_feeds(rng, b, past, nk, hd, d)
        if separate:
            feeds.update(k=rng.standard_normal((b, 1, nk * hd)).astype(np.float32),
                         v=rng.standard_normal((b, 1, nk * hd)).astype(np.float32))
        _assert_bits(sess.run(None, feeds), ref.run(None, feeds), f"batch {b}, past {past}")
    assert native.counters().get("ort_gqa_native_calls", 0) >= before + 4


@pytest.mark.parametrize("threads", [1, 16])
def test_gqa_ragged_decode_and_prefill_do_not_split(threads):
    """Rows of different lengths (561 and 700 keys) and a 600-token prompt: onnxruntime does not split
    those by its threads (the same bits at 1 and 16), and neither do we."""
    model, d = _gqa_model(2, 1, 128, 1300, 128, -1)
    so = ort.SessionOptions()
    so.log_severity_level, so.intra_op_num_threads = 3, threads
    ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    ours = dynashape.SessionOptions()
    ours.intra_op_num_threads = threads
    sess = dynashape.InferenceSession(model, ours)
    rng = np.random.default_rng(9)
    ragged = _decode_feeds(rng, 2, 699, 1, 128, d)
    ragged["sk"] = np.array([560, 699], np.int32)
    prompt = {"qkv": rng.standard_normal((1, 600, d)).astype(np.float32),
              "pk": np.zeros((1, 1, 0, 128), np.float32), "pv": np.zeros((1, 1, 0, 128), np.float32),
              "sk": np.array([599], np.int32), "tl": np.array(600, np.int32)}
    for what, feeds in (("ragged decode", ragged), ("prompt", prompt)):
        _assert_bits(sess.run(None, feeds), ref.run(None, feeds), f"{threads} threads, {what}")


def test_onnxruntimes_gqa_decode_bits_depend_on_its_thread_count():
    """What the test above guards: onnxruntime's 16-thread decode over 561 keys (two blocks, two
    heads) differs from its 1-thread one, and the 16-thread bits are the same every run and with 4
    threads (the split is a function of the count, whichever thread computes which block)."""
    model, d = _gqa_model(2, 1, 128, 700, 128, -1)
    feeds = _decode_feeds(np.random.default_rng(7), 1, 560, 1, 128, d)

    def run(threads):
        so = ort.SessionOptions()
        so.log_severity_level, so.intra_op_num_threads = 3, threads
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    one, many = run(1), run(16)
    assert (one != many).any()
    for again in (run(16), run(16), run(4)):
        np.testing.assert_array_equal(again, many)


@pytest.mark.parametrize("h", [16, 64, 100])
def test_decomposed_rms_norm_gives_onnxruntimes_fused_bits(h):
    """A Llama export's RMS norm as separate nodes (Pow, ReduceMean, Add, Sqrt, Div, Mul, Mul):
    onnxruntime's optimizer fuses it into SimplifiedLayerNormalization and dynashape's into RMSNorm,
    which computes in that kernel's order."""
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("ReduceMean", ["p", "ax"], ["m"]),
             helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["r"]),
             helper.make_node("Div", ["one", "r"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["w", "xn"], ["y"])]
    rng = np.random.default_rng(h)
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "ax"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "w")]
    g = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", h])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    sess, ref = dynashape.InferenceSession(model), _ort(model)
    for s in (1, 50, 7):
        x = (rng.standard_normal((2, s, h)) * rng.uniform(0.1, 10)).astype(np.float32)
        _assert_bits(sess.run(None, {"x": x}), ref.run(None, {"x": x}), f"h {h}, {s} rows")
