"""Fusion passes (dynashape/compile/pipeline.py FUSION_PASSES) on small models built with onnx.helper.

For each pass: the patterns as exporters write them (operand orders swapped, Div vs Mul by the
reciprocal, Reciprocal vs Div(1, .), Pow(x, 2) vs Mul(x, x), with and without weight / bias,
ReduceMean's axes as attribute (opset 17) and as input (opset 18)) must fuse into the expected
``com.dynashape`` op and leave none of the replaced nodes; near misses (a value also read outside
the pattern, another axis, a constant that is off) must not fuse. Every model then runs over a
sequence of changing shapes (dynamic batch / seq) with fresh random inputs in ONE compiled fused
session, ONE interpreter session (the unfused graph) and onnxruntime, which must all agree.

Also: unfusion (a fused Attention whose kernel cannot serve a signature runs the nodes it replaced,
counted in the trace), the causal mask dropped by the decode-step specializations of the Llama test
decoder, Conv + BatchNormalization folding with channels-last layout, and Linear / parallel MatMul
merging on a q/k/v projection block.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

import dynashape  # noqa: E402
from dynashape.errors import ShapeError  # noqa: E402

F32, BOOL = TensorProto.FLOAT, TensorProto.BOOL
RTOL, ATOL = 1e-4, 1e-5
FUSED = "com.dynashape"
ort.set_default_logger_severity(3)


# model building ------------------------------------------------------------------------------------
class Builder:
    """A graph under construction: ``op`` appends a node and returns its output's name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.inputs: list[onnx.ValueInfoProto] = []

    def input(self, name: str, shape, elem_type=F32) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def const(self, value, dtype=np.float32) -> str:
        name = f"c{len(self.inits)}"
        self.inits[name] = np.asarray(value, dtype=dtype)
        return name

    def op(self, op_type: str, *inputs: str, domain: str = "", **attrs) -> str:
        out = f"t{len(self.nodes)}_{op_type.lower()}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"n{len(self.nodes)}", domain=domain,
                                           **attrs))
        return out

    def model(self, outputs: list[str], opset: int = 17) -> onnx.ModelProto:
        inits = [numpy_helper.from_array(v, k) for k, v in self.inits.items()]
        outs = [helper.make_tensor_value_info(o, F32, None) for o in outputs]
        g = helper.make_graph(self.nodes, "fusion_test", self.inputs, outs, initializer=inits)
        domains = sorted({n.domain for n in self.nodes if n.domain})  # contrib ops: version 1
        imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
        return helper.make_model(g, opset_imports=imports, ir_version=8)


def reduce_mean(b: Builder, x: str, axis: int, opset: int) -> str:
    """ReduceMean keeping the axis: axes as an attribute (opset 17) or as an input (opset 18)."""
    if opset >= 18:
        return b.op("ReduceMean", x, b.const([axis], np.int64), keepdims=1)
    return b.op("ReduceMean", x, axes=[axis], keepdims=1)


def randn(rng: np.random.Generator, *shape) -> np.ndarray:
    """Fresh normal data (never zeros)."""
    return rng.standard_normal(shape).astype(np.float32)


# sessions and comparison ---------------------------------------------------------------------------
def sessions(model: onnx.ModelProto, **options):
    fused = dynashape.InferenceSession(model, executor="compiled", fusion=True, **options)
    interp = dynashape.InferenceSession(model, executor="interpreter", **options)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return fused, interp, ref


def fused_ops(sess) -> Counter:
    """op types of the graph the compiled executor runs; fused ops as ``com.dynashape.Op``. Nodes
    kept only for a fused node's unfusion (what its replaced nodes read) run in no specialization
    that does not unfuse (the shape program drops them): they are not counted."""
    g = sess.program.fused
    needed = {id(v) for v in g.outputs}
    live = []
    for n in reversed(g.nodes):
        if any(v is not None and id(v) in needed for v in n.outputs):
            live.append(n)
            needed.update(id(v) for v in n.inputs if v is not None)
    return Counter(_op_name(n) for n in live)


def _op_name(n) -> str:
    # the CPU runs every 2-D float convolution as ConvAct (fuse_conv_activation: its bound kernel
    # keeps the reordered weight); without an activation it is the Conv it was
    if n.domain == FUSED and n.op_type == "ConvAct" and n.attrs.get("activation") == "none":
        return "Conv"
    return f"{FUSED}.{n.op_type}" if n.domain == FUSED else n.op_type


def fused_nodes(sess, op_type: str) -> list:
    return [n for n in sess.program.fused.nodes if n.domain == FUSED and n.op_type == op_type]


def compare(got, want: list[np.ndarray], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, onnxruntime {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape, f"{what}: output {k} has shape {g.shape}, onnxruntime {w.shape}"
        assert g.dtype == w.dtype, f"{what}: output {k} has dtype {g.dtype}, onnxruntime {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{what}: output {k}")


def check_sequence(model: onnx.ModelProto, feeds_seq: list[dict], sess=None, **options):
    """Run every feed through the compiled fused session (``sess``, or a new one), an interpreter
    session and onnxruntime; all must agree. Returns the compiled session."""
    fused, interp, ref = sessions(model, **options)
    fused = sess or fused
    for step, feeds in enumerate(feeds_seq):
        shapes = {k: v.shape for k, v in feeds.items()}
        want = ref.run(None, feeds)
        for w in want:
            assert np.isfinite(w).all(), f"step {step} {shapes}: onnxruntime output not finite (a bad test input)"
        compare(interp.run(None, feeds), want, f"interpreter step {step} {shapes}")
        compare(fused.run(None, feeds), want, f"compiled fused step {step} {shapes}")
    return fused


def spec_of(sess, feeds: dict):
    """The specialization of the compiled session that serves ``feeds`` (after it ran them)."""
    shapes = tuple(tuple(feeds[v.name].shape) for v in sess.compiled.inputs)
    specs = [s for s in sess.compiled.specs if s.accepts(shapes)]
    assert specs, f"no specialization accepts {shapes}"
    return specs[0]


# attention ------------------------------------------------------------------------------------------
D, HEADS, KV_HEADS = 8, 4, 2
NEG_INF = float("-inf")


def _repeat_kv(b: Builder, x: str, groups: int, heads: int, kv_len: int | None = None) -> str:
    """HF's repeat_kv as exported: Reshape(Expand(Unsqueeze(kv, 2), [1, 1, g, 1, 1]), [b, h * g, n, d]);
    the target shape computed from Shape(kv) (torch.onnx), or a constant [0, h * g, n, d] for a static n."""
    u = b.op("Unsqueeze", x, b.const([2], np.int64))
    e = b.op("Expand", u, b.const([1, 1, groups, 1, 1], np.int64))
    if kv_len is not None:
        return b.op("Reshape", e, b.const([0, heads, kv_len, D], np.int64))
    shp = b.op("Shape", x)
    batch = b.op("Slice", shp, b.const([0], np.int64), b.const([1], np.int64))
    rest = b.op("Slice", shp, b.const([2], np.int64), b.const([4], np.int64))
    return b.op("Reshape", e, b.op("Concat", batch, b.const([heads], np.int64), rest, axis=0))


def _reshape_transpose(b: Builder, k: str) -> str:
    """torch.onnx's k.transpose(-1, -2) of a 4-D tensor: Reshape to 3-D, Transpose(0, 2, 1), Reshape back."""
    shp = b.op("Shape", k)

    def part(lo, hi):
        return b.op("Slice", shp, b.const([lo], np.int64), b.const([hi], np.int64))

    mid = b.op("Concat", b.const([-1], np.int64), part(2, 4), axis=0)
    t = b.op("Transpose", b.op("Reshape", k, mid), perm=[0, 2, 1])
    out = b.op("Concat", part(0, 2), part(3, 4), part(2, 3), axis=0)
    return b.op("Reshape", t, out)


def attention_model(scale="div", keys="transpose", mask="none", nan=False, gqa=False, softmax_axis=-1,
                    also_output=None, q_heads=HEADS, kv_len="kv", opset=17, merge_heads=None) -> onnx.ModelProto:
    """softmax(q @ kT * scale [+ mask]) @ v over [batch, heads, seq | kv, D]; the variants as exporters write them.

    scale: div (scores / sqrt D), mul (scores * 1/sqrt D), mul_swapped (1/sqrt D * scores),
    qk (q * D^-1/4 and D^-1/4 * kT), none, per_head (a [1, H, 1, 1] tensor: not a scalar),
    fused_matmul (com.microsoft FusedMatMul(q, kT, alpha)), fused_matmul_transB (FusedMatMul(q, k, alpha,
    transB=1): the keys read as they are).
    keys: input_T (the graph input is kT), transpose (Transpose(k, 0 1 3 2)), reshape (torch.onnx's
    Reshape-Transpose-Reshape). mask: none, add, add_swapped (float), where_drop (True = masked out),
    where_keep (True = kept), where_not (Where(Not(keep), -inf, scores)). nan: Where(IsNaN(p), 0, p).
    also_output: "scores" / "probs": that intermediate is a graph output too (must not fuse); "kT" / "keys":
    the transposed keys / the (repeated) keys are a graph output too (fuses, reading kT as it is).
    softmax_axis: None for no attribute (the default, 1 before opset 13: the coerced 2-D softmax).
    q_heads, kv_len: the query heads and key length (a dim name, or a number for a static dim).
    merge_heads: "only" (the result through Transpose(0, 2, 1, 3) and a Reshape to [batch, seq, heads * D],
    as a model merges its heads), "also" (that, and the result itself an output too).
    """
    b = Builder()
    kvh = KV_HEADS if gqa else HEADS
    q = b.input("q", ["batch", q_heads, "seq", D])
    k = b.input("k", ["batch", kvh, D, kv_len] if keys == "input_T" else ["batch", kvh, kv_len, D])
    v = b.input("v", ["batch", kvh, kv_len, D])
    if gqa:
        static = kv_len if isinstance(kv_len, int) else None
        k, v = (_repeat_kv(b, t, HEADS // KV_HEADS, HEADS, static) for t in (k, v))
    k_in = k
    kt = {"input_T": lambda: k, "transpose": lambda: b.op("Transpose", k, perm=[0, 1, 3, 2]),
          "reshape": lambda: _reshape_transpose(b, k)}[keys]()
    k_t = kt
    if scale == "qk":
        q = b.op("Mul", q, b.const(D ** -0.25))
        kt = b.op("Mul", b.const(D ** -0.25), kt)
    c = 1 / math.sqrt(D)
    if scale == "fused_matmul":  # onnxruntime's optimizer: the scaled product as one contrib node
        s = b.op("FusedMatMul", q, kt, domain="com.microsoft", alpha=c)
    elif scale == "fused_matmul_transB":  # ... reading the keys themselves
        s = b.op("FusedMatMul", q, k_in, domain="com.microsoft", alpha=c, transB=1)
    elif scale == "fused_matmul_transA":  # the query read transposed: not attention's product as such
        s = b.op("FusedMatMul", b.op("Transpose", q, perm=[0, 1, 3, 2]), kt, domain="com.microsoft", alpha=c,
                 transA=1)
    else:
        s = b.op("MatMul", q, kt)
    if scale == "div":
        s = b.op("Div", s, b.const(math.sqrt(D)))
    elif scale == "mul":
        s = b.op("Mul", s, b.const(c))
    elif scale == "mul_swapped":
        s = b.op("Mul", b.const(c), s)
    elif scale == "per_head":
        s = b.op("Mul", s, b.const(np.linspace(0.2, 0.5, q_heads).reshape(1, q_heads, 1, 1)))
    scores = s
    if mask != "none":
        b.input("mask", ["batch", 1, "seq", kv_len], F32 if mask.startswith("add") else BOOL)
    if mask == "add":
        s = b.op("Add", s, "mask")
    elif mask == "add_swapped":
        s = b.op("Add", "mask", s)
    elif mask == "where_drop":
        s = b.op("Where", "mask", b.const(NEG_INF), s)
    elif mask == "where_keep":
        s = b.op("Where", "mask", s, b.const(NEG_INF))
    elif mask == "where_not":
        s = b.op("Where", b.op("Not", "mask"), b.const(NEG_INF), s)
    p = b.op("Softmax", s) if softmax_axis is None else b.op("Softmax", s, axis=softmax_axis)
    probs = p
    if nan:
        p = b.op("Where", b.op("IsNaN", p), b.const(0.0), p)
    out = b.op("MatMul", p, v)
    extra = {"scores": [scores], "probs": [probs], "kT": [k_t], "keys": [k_in], None: []}[also_output]
    if merge_heads:
        merged = b.op("Reshape", b.op("Transpose", out, perm=[0, 2, 1, 3]), b.const([0, 0, -1], np.int64))
        return b.model([merged, *([out] if merge_heads == "also" else []), *extra], opset)
    return b.model([out, *extra], opset)


def mask_feed(rng, kind: str, shape, fully_masked_rows: bool) -> np.ndarray:
    """A mask of ``kind``; every row keeps a key unless ``fully_masked_rows``, which masks some rows whole."""
    keep = rng.random(shape) < 0.6
    rows = keep.reshape(-1, shape[-1])
    rows[np.arange(rows.shape[0]), rng.integers(0, shape[-1], rows.shape[0])] = True
    if fully_masked_rows:
        rows[rng.random(rows.shape[0]) < 0.3] = False
        rows[0] = False  # at least one
    keep = rows.reshape(shape)
    if kind.startswith("add"):
        return np.where(keep, randn(rng, *shape), np.float32(NEG_INF)).astype(np.float32)
    return ~keep if kind == "where_drop" else keep


# (batch, seq, kv): grows, shrinks, repeats, seq 1 (decode-like) and kv 1 among them
ATT_SHAPES = [(2, 5, 7), (1, 1, 9), (3, 4, 4), (2, 5, 7), (1, 9, 1), (2, 1, 6), (4, 3, 12)]


def attention_feeds(rng, keys="transpose", mask="none", nan=False, gqa=False, q_heads=HEADS, shapes=ATT_SHAPES):
    kvh = KV_HEADS if gqa else HEADS
    out = []
    for bs, s, n in shapes:
        f = {"q": randn(rng, bs, q_heads, s, D),
             "k": randn(rng, bs, kvh, D, n) if keys == "input_T" else randn(rng, bs, kvh, n, D),
             "v": randn(rng, bs, kvh, n, D)}
        if mask != "none":
            f["mask"] = mask_feed(rng, mask, (bs, 1, s, n), nan)
        out.append(f)
    return out


ATTENTION_VARIANTS = [
    # scale x keys, no mask
    dict(scale="div", keys="transpose"),
    dict(scale="mul", keys="transpose"),
    dict(scale="mul_swapped", keys="input_T"),
    dict(scale="qk", keys="transpose"),
    dict(scale="none", keys="input_T"),
    dict(scale="div", keys="reshape"),
    dict(scale="mul", keys="input_T", softmax_axis=3),
    dict(scale="fused_matmul", keys="transpose"),
    dict(scale="fused_matmul", keys="input_T", mask="add"),
    dict(scale="fused_matmul_transB", keys="transpose", mask="add"),
    # masks, with and without the NaN cleanup (fully masked rows only with it)
    dict(scale="div", keys="transpose", mask="add"),
    dict(scale="mul", keys="input_T", mask="add_swapped"),
    dict(scale="div", keys="transpose", mask="add", nan=True),
    dict(scale="mul", keys="transpose", mask="where_drop"),
    dict(scale="div", keys="input_T", mask="where_drop", nan=True),
    dict(scale="div", keys="transpose", mask="where_keep"),
    dict(scale="qk", keys="transpose", mask="where_keep", nan=True),
    dict(scale="mul_swapped", keys="transpose", mask="where_not", nan=True),
    dict(scale="div", keys="reshape", mask="where_not"),
    # grouped-query attention (repeat_kv before the transpose)
    dict(scale="div", keys="transpose", gqa=True),
    dict(scale="mul", keys="transpose", mask="where_keep", gqa=True, nan=True),
    dict(scale="div", keys="transpose", mask="add", gqa=True, opset=18),
]


def _variant_id(v: dict) -> str:
    return "-".join(f"{k}={val}" if not isinstance(val, bool) else k for k, val in v.items() if val is not False)


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS, ids=_variant_id)
def test_attention_fuses_and_agrees(variant):
    model = attention_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    # (a) one Attention and none of the replaced nodes: the graph is that node alone
    assert ops == Counter({f"{FUSED}.Attention": 1}), f"fused graph: {dict(ops)}"
    (node,) = fused_nodes(sess, "Attention")
    want_scale = 1.0 if variant["scale"] == "none" else 1 / math.sqrt(D)
    assert node.attrs["scale"] == pytest.approx(want_scale, rel=1e-6)
    keys = variant["keys"]
    assert node.attrs["k_transposed"] == (1 if keys == "input_T" and variant["scale"] != "fused_matmul_transB" else 0)
    assert [i.name for i in node.inputs[:3]] == ["q", "k", "v"]  # before the transposes and the repeats
    assert node.attrs["gqa"] == (HEADS // KV_HEADS if variant.get("gqa") else 0)  # the repeat factor
    assert node.attrs["nan_to_zero"] == int(variant.get("nan", False))
    mask = variant.get("mask", "none")
    kind = {"none": "none", "add": "add", "add_swapped": "add", "where_drop": "drop", "where_keep": "keep",
            "where_not": "keep"}[mask]
    assert node.attrs["mask_kind"] == kind
    if mask != "none":
        assert node.inputs[3].name == "mask"  # Not(keep) read as the keep mask itself
    assert node.unfused, "the replaced nodes are kept on the fused node for unfusion"
    # (c) over changing shapes: compiled fused == interpreter == onnxruntime
    rng = np.random.default_rng(sum(map(ord, _variant_id(variant))))
    feeds = attention_feeds(rng, keys, mask, variant.get("nan", False), variant.get("gqa", False))
    check_sequence(model, feeds, sess=sess)
    assert all(s.trace.unfused == 0 for s in sess.compiled.specs), "the fused kernel serves all these shapes"


@pytest.mark.parametrize("merge", ["only", "also"])
@pytest.mark.parametrize("mask", ["none", "add"])
def test_attention_heads_written_side_by_side(merge, mask):
    """heads_last: where only Transpose(0, 2, 1, 3) reads the result (the heads merged by a Reshape
    after), the kernel writes (B, S, N, D) (the transpose contiguous, the reshape a view); where
    the result is read otherwise too, as (B, N, S, D). Either way as onnxruntime over shapes."""
    model = attention_model("div", "transpose", mask, merge_heads=merge)
    sess = dynashape.InferenceSession(model)
    (node,) = fused_nodes(sess, "Attention")
    assert node.attrs["heads_last"] == (merge == "only")
    rng = np.random.default_rng(11)
    check_sequence(model, attention_feeds(rng, "transpose", mask), sess=sess)


def test_attention_nan_cleanup_zeroes_fully_masked_rows():
    """The fully masked rows of the IsNaN variant really are there, and come out as zeros."""
    model = attention_model(scale="div", mask="where_keep", nan=True)
    sess = dynashape.InferenceSession(model)
    assert fused_nodes(sess, "Attention")[0].attrs["nan_to_zero"] == 1
    rng = np.random.default_rng(5)
    (feeds,) = attention_feeds(rng, mask="where_keep", nan=True, shapes=[(2, 6, 5)])
    out = np.asarray(sess.run(None, feeds)[0])
    dead = ~feeds["mask"].any(axis=-1)  # [batch, 1, seq]: rows with no key kept
    assert dead.any() and not dead.all()
    dead = np.broadcast_to(dead, out.shape[:-1])
    assert np.all(out[dead] == 0.0)
    assert np.all(np.abs(out[~dead]).sum(axis=-1) > 0)


ATTENTION_NO_FUSE = [
    pytest.param(dict(softmax_axis=2), id="softmax-other-axis"),
    pytest.param(dict(also_output="scores"), id="scores-also-output"),
    pytest.param(dict(also_output="probs", mask="where_keep"), id="probs-also-output"),
    pytest.param(dict(scale="per_head"), id="per-head-scale-tensor"),
    pytest.param(dict(scale="fused_matmul_transA"), id="fused-matmul-transA"),
]


@pytest.mark.parametrize("variant", ATTENTION_NO_FUSE)
def test_attention_does_not_fuse(variant):
    model = attention_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.Attention"] == 0, f"fused graph: {dict(ops)}"
    assert ops["Softmax"] == 1 and ops["MatMul"] + ops["FusedMatMul"] == 2
    rng = np.random.default_rng(7)
    check_sequence(model, attention_feeds(rng, mask=variant.get("mask", "none"), shapes=ATT_SHAPES[:4]), sess=sess)


ATTENTION_PARTIAL = [
    pytest.param(dict(keys="transpose", also_output="kT"), {"Transpose": 1}, id="transposed-keys-also-output"),
    pytest.param(dict(keys="transpose", also_output="keys", gqa=True, mask="add"),
                 {"Transpose": 1, "Unsqueeze": 2, "Expand": 2, "Reshape": 2}, id="repeated-keys-also-output"),
]


@pytest.mark.parametrize("variant,kept", ATTENTION_PARTIAL)
def test_attention_fuses_around_values_read_elsewhere(variant, kept):
    """The keys' Transpose (and the GQA repeats) are read elsewhere too: the core still fuses, reading
    the transposed (repeated) keys as they are, and those nodes stay."""
    model = attention_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.Attention"] == 1 and ops["Softmax"] == 0 and ops["MatMul"] == 0, dict(ops)
    assert all(ops[k] == n for k, n in kept.items()), dict(ops)
    (node,) = fused_nodes(sess, "Attention")
    assert node.attrs["k_transposed"] == 1 and node.attrs["gqa"] == 0
    rng = np.random.default_rng(9)
    feeds = attention_feeds(rng, mask=variant.get("mask", "none"), gqa=variant.get("gqa", False), shapes=ATT_SHAPES[:4])
    check_sequence(model, feeds, sess=sess)


@pytest.mark.parametrize("axis,fuses", [(-1, True), (3, True), (None, False), (2, False)],
                         ids=["axis=-1", "axis=3", "default-axis-1", "axis=2"])
def test_attention_softmax_opset12(axis, fuses):
    """Softmax before opset 13 is the coerced 2-D one: over the last axis only with axis 3 / -1 (the
    default, 1, normalises over heads * seq * kv together)."""
    model = attention_model(scale="div", mask="where_keep", softmax_axis=axis, opset=12)
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess)[f"{FUSED}.Attention"] == int(fuses), dict(fused_ops(sess))
    rng = np.random.default_rng(10)
    check_sequence(model, attention_feeds(rng, mask="where_keep", shapes=ATT_SHAPES[:4]), sess=sess)


def test_attention_rank2_not_fused():
    """Attention of rank 2 (no batch or heads): the fused op wants rank >= 3, the pass leaves it."""
    b = Builder()
    q, k, v = b.input("q", ["seq", D]), b.input("k", ["kv", D]), b.input("v", ["kv", D])
    s = b.op("Div", b.op("MatMul", q, b.op("Transpose", k, perm=[1, 0])), b.const(math.sqrt(D)))
    model = b.model([b.op("MatMul", b.op("Softmax", s, axis=-1), v)])
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess)[f"{FUSED}.Attention"] == 0
    rng = np.random.default_rng(8)
    check_sequence(model, [{"q": randn(rng, s, D), "k": randn(rng, n, D), "v": randn(rng, n, D)}
                           for s, n in [(3, 5), (1, 7), (6, 2)]], sess=sess)


# unfusion ---------------------------------------------------------------------------------------------
UNFUSE_SHAPES = [(HEADS, (2, 5)), (1, (2, 5)), (1, (3, 1)), (HEADS, (1, 3)), (1, (2, 5)), (HEADS, (2, 5))]


def _gqa_feeds(rng, kv_len: int):
    out = []
    for qh, (bs, s) in UNFUSE_SHAPES:
        (f,) = attention_feeds(rng, mask="where_keep", gqa=True, q_heads=qh, shapes=[(bs, s, kv_len)])
        out.append(f)
    return out


def test_attention_unfuses_for_broadcast_query_heads():
    """GQA with a dynamic number of query heads (and a static key length, the repeat's target shape
    a constant): with 1 query head the exported graph broadcasts the query over the repeated key
    heads, which the fused kernel (enable_gqa) cannot do: that signature runs the unfused nodes
    (counted in its trace), the others the fused kernel; all agree with onnxruntime."""
    model = attention_model(scale="div", mask="where_keep", gqa=True, q_heads="qh", kv_len=6)
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess) == Counter({f"{FUSED}.Attention": 1})
    assert fused_nodes(sess, "Attention")[0].attrs["gqa"] == HEADS // KV_HEADS
    seq = _gqa_feeds(np.random.default_rng(11), 6)
    check_sequence(model, seq, sess=sess)
    for f in seq:
        spec = spec_of(sess, f)
        ops = Counter(ni.node.op_type for ni in spec.trace.nodes)
        if f["q"].shape[1] == 1:
            assert spec.trace.unfused > 0, "one query head: the fused kernel cannot serve it"
            assert ops["Attention"] == 0 and ops["Softmax"] == 1 and ops["MatMul"] == 2
        else:
            assert spec.trace.unfused == 0 and ops["Attention"] == 1 and ops["Softmax"] == 0
    assert len(sess.compiled.specs) >= 2


def test_attention_unfuses_with_computed_repeat_shape():
    model = attention_model(scale="div", mask="where_keep", gqa=True, q_heads="qh")
    sess = dynashape.InferenceSession(model)
    assert fused_nodes(sess, "Attention")[0].attrs["gqa"] == HEADS // KV_HEADS
    seq = _gqa_feeds(np.random.default_rng(12), 7)
    check_sequence(model, seq, sess=sess)
    assert any(spec_of(sess, f).trace.unfused > 0 for f in seq)


def test_attention_gqa_rejects_query_heads_that_do_not_match():
    model = attention_model(scale="div", gqa=True, q_heads="qh", kv_len=6)
    sess = dynashape.InferenceSession(model)
    (f,) = attention_feeds(np.random.default_rng(13), gqa=True, q_heads=2, shapes=[(2, 5, 6)])
    # 2 query heads over 4 key heads: the unfused MatMul cannot broadcast them, and both executors
    # must say so as the typed shape error naming that node, not some internal failure
    expected = r"node '\w+' \(MatMul\).*dimensions \S*2\)? and 4 do not broadcast"
    with pytest.raises(ShapeError, match=expected):
        dynashape.InferenceSession(model, executor="interpreter").run(None, f)
    with pytest.raises(ShapeError, match=expected):
        sess.run(None, f)


def _attention_3d_mask_model() -> onnx.ModelProto:
    """Rank-3 attention ([batch * heads, seq, D]) with a rank-3 additive mask [m, seq, kv] whose
    first dim is dynamic too: the exported graph broadcasts scores and mask both ways."""
    b = Builder()
    q, k, v = b.input("q", ["bh", "seq", D]), b.input("k", ["bh", "kv", D]), b.input("v", ["bh", "kv", D])
    b.input("mask", ["m", "seq", "kv"])
    s = b.op("Mul", b.op("MatMul", q, b.op("Transpose", k, perm=[0, 2, 1])), b.const(1 / math.sqrt(D)))
    p = b.op("Softmax", b.op("Add", s, "mask"), axis=-1)
    return b.model([b.op("MatMul", p, v)])


def _feeds_3d(rng, bh, m, s, n):
    return {"q": randn(rng, bh, s, D), "k": randn(rng, bh, n, D), "v": randn(rng, bh, n, D),
            "mask": mask_feed(rng, "add", (m, s, n), False)}


def test_attention_3d_mask_served_when_it_broadcasts_to_the_scores():
    model = _attention_3d_mask_model()
    sess = dynashape.InferenceSession(model)
    (node,) = fused_nodes(sess, "Attention")
    assert node.attrs["mask_kind"] == "add" and node.attrs["k_transposed"] == 0
    rng = np.random.default_rng(12)
    seq = [_feeds_3d(rng, *shape) for shape in [(3, 3, 4, 6), (3, 1, 4, 6), (2, 2, 1, 5), (5, 1, 7, 2)]]
    check_sequence(model, seq, sess=sess)
    assert all(s.trace.unfused == 0 for s in sess.compiled.specs)


def test_attention_3d_mask_that_expands_the_scores_unfuses():
    model = _attention_3d_mask_model()
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess)[f"{FUSED}.Attention"] == 1
    rng = np.random.default_rng(14)
    # bh 1 with m 3: the mask broadcasts the scores (and the output) up to 3; bh 3 with m 3 is plain
    seq = [_feeds_3d(rng, *shape) for shape in [(3, 3, 4, 6), (1, 3, 4, 6), (1, 2, 2, 5), (3, 3, 4, 6)]]
    check_sequence(model, seq, sess=sess)
    for f in seq:
        spec = spec_of(sess, f)
        expands = f["q"].shape[0] == 1 and f["mask"].shape[0] > 1
        assert (spec.trace.unfused > 0) == expands, f"shapes {[a.shape for a in f.values()]}"


# masks dropped: the Llama test decoder ------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    from tests.models import llama as llama_mod

    path = llama_mod.model_path()
    dims = {"batch": dynashape.Dimension(1, llama_mod.MAX_BATCH), "seq": dynashape.Dimension(1, llama_mod.MAX_SEQ),
            "past": dynashape.Dimension(0, llama_mod.MAX_PAST)}
    sess = dynashape.InferenceSession(str(path), dim_params=dims)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return llama_mod, sess, ref


def _attention_calls(source: str) -> list[str]:
    """The argument lists of the fused Attention calls in a specialization's generated code."""
    return re.findall(r"k_Attention\w*\(([^)]*)\)", source)


def test_llama_fused_graph(llama):
    _, sess, _ = llama
    ops = fused_ops(sess)
    cfg = llama[0].TINY
    assert ops[f"{FUSED}.Attention"] == cfg["layers"]
    assert ops[f"{FUSED}.RMSNorm"] == 2 * cfg["layers"] + 1
    assert ops[f"{FUSED}.Silu"] == cfg["layers"]  # on CPU the gate's Mul stays (fuse_silu_mul: CUDA)
    assert ops["Softmax"] == 0 and ops["Expand"] == 0 and ops["ReduceMean"] == 0 and ops["Sigmoid"] == 0
    for node in fused_nodes(sess, "Attention"):
        assert node.attrs["gqa"] == 2 and node.attrs["mask_kind"] == "keep" and len(node.inputs) == 4  # 4 q heads, 2 kv


@pytest.mark.parametrize("batch", [1, 2])
def test_llama_decode_drops_causal_mask(llama, batch):
    """Prefill (seq > 1) keeps the causal mask; every decode step (seq 1) sees it all true and drops
    it; results equal onnxruntime's over the loop, with a growing KV cache."""
    mod, sess, ref = llama
    names, cfg = mod.input_names(), mod.TINY
    rng = np.random.default_rng(20 + batch)
    past = [np.zeros((batch, cfg["kv_heads"], 0, cfg["head_dim"]), np.float32) for _ in names[1:]]
    for step, s in enumerate([5, 1, 1, 1, 3, 1, 1]):
        feeds = dict(zip(names, [rng.integers(0, cfg["vocab"], (batch, s)).astype(np.int64), *past]))
        want = ref.run(None, feeds)
        compare(sess.run(None, feeds), want, f"llama batch {batch} step {step} (seq {s})")
        past = want[1:]
        spec = spec_of(sess, feeds)
        att = [ni for ni in spec.trace.nodes if ni.node.op_type == "Attention"]
        assert len(att) == cfg["layers"] and spec.trace.unfused == 0
        calls = _attention_calls(spec.source)
        assert len(calls) == cfg["layers"]
        if s == 1:
            assert all(ni.drop_inputs == frozenset({3}) for ni in att), f"step {step}: decode keeps the mask"
            assert all(c.rsplit(",", 1)[1].strip() == "None" for c in calls), calls
        else:
            assert all(not ni.drop_inputs for ni in att), f"step {step}: a causal prefill mask was dropped"
            assert all(c.rsplit(",", 1)[1].strip() != "None" for c in calls), calls


# normalisations ------------------------------------------------------------------------------------------
H = 16
NORM_SHAPES = [(2, 5), (1, 1), (3, 7), (2, 5), (1, 12), (4, 2)]


def rms_norm_model(square="pow", form="reciprocal", weight="1d", opset=17, axis=-1, eps_first=False,
                   also_output=None, other_square=False) -> onnx.ModelProto:
    """x * rsqrt(mean(x^2, -1) + eps) * w as exporters write it.

    square: pow (Pow(x, 2)) / mul (Mul(x, x)); form: div (x / sqrt), reciprocal (x * Reciprocal(sqrt)),
    reciprocal_swapped (Reciprocal(sqrt) * x), div1 (x * Div(1, sqrt)); weight: none / 1d / 1d_swapped /
    3d ([1, 1, H]); eps_first: Add(eps, mean); also_output: mean / sqrt, that intermediate is an output too;
    other_square: the mean is of another input's square (not an RMSNorm of x)."""
    b = Builder()
    x = b.input("x", ["batch", "seq", H])
    src = b.input("y", ["batch", "seq", H]) if other_square else x
    sq = b.op("Pow", src, b.const(2.0)) if square == "pow" else b.op("Mul", src, src)
    mean = reduce_mean(b, sq, axis, opset)
    eps = b.const(1e-6)
    sd = b.op("Sqrt", b.op("Add", eps, mean) if eps_first else b.op("Add", mean, eps))
    if form == "div":
        y = b.op("Div", x, sd)
    elif form == "reciprocal":
        y = b.op("Mul", x, b.op("Reciprocal", sd))
    elif form == "reciprocal_swapped":
        y = b.op("Mul", b.op("Reciprocal", sd), x)
    else:
        y = b.op("Mul", x, b.op("Div", b.const(1.0), sd))
    w = np.random.default_rng(0).uniform(0.5, 1.5, H).astype(np.float32)
    if weight == "1d":
        y = b.op("Mul", y, b.const(w))
    elif weight == "1d_swapped":
        y = b.op("Mul", b.const(w), y)
    elif weight == "3d":
        y = b.op("Mul", y, b.const(w.reshape(1, 1, H)))
    extra = {"mean": [mean], "sqrt": [sd], None: []}[also_output]
    return b.model([y, *extra], opset)


def layer_norm_model(square="pow", form="div", weight=True, bias=True, opset=17, axis=-1, bias_first=False,
                     also_output=None) -> onnx.ModelProto:
    """d = x - mean(x); d / sqrt(mean(d^2) + eps) * w + b (older exports of nn.LayerNorm)."""
    b = Builder()
    x = b.input("x", ["batch", "seq", H])
    d = b.op("Sub", x, reduce_mean(b, x, -1, opset))
    sq = b.op("Pow", d, b.const(2.0)) if square == "pow" else b.op("Mul", d, d)
    var = reduce_mean(b, sq, axis, opset)
    sd = b.op("Sqrt", b.op("Add", var, b.const(1e-5)))
    if form == "div":
        y = b.op("Div", d, sd)
    else:
        y = b.op("Mul", b.op("Reciprocal", sd), d)
    rng = np.random.default_rng(1)
    if weight:
        y = b.op("Mul", y, b.const(rng.uniform(0.5, 1.5, H)))
    if bias:
        bv = b.const(rng.standard_normal(H))
        y = b.op("Add", bv, y) if bias_first else b.op("Add", y, bv)
    extra = {"var": [var], "centred": [d], None: []}[also_output]
    return b.model([y, *extra], opset)


def norm_feeds(rng, names=("x",), shapes=NORM_SHAPES, scale=3.0):
    return [{n: (randn(rng, bs, s, H) * scale + 1.0).astype(np.float32) for n in names} for bs, s in shapes]


RMS_VARIANTS = [
    dict(square="pow", form="reciprocal", weight="1d", opset=17),
    dict(square="pow", form="reciprocal", weight="1d", opset=18),
    dict(square="mul", form="div", weight="1d_swapped", opset=17),
    dict(square="mul", form="div1", weight="none", opset=18),
    dict(square="pow", form="reciprocal_swapped", weight="3d", opset=17, eps_first=True),
    dict(square="pow", form="div", weight="none", opset=18, eps_first=True),
    dict(square="mul", form="reciprocal", weight="1d", opset=17, axis=2),
]


@pytest.mark.parametrize("variant", RMS_VARIANTS, ids=_variant_id)
def test_rms_norm_fuses_and_agrees(variant):
    model = rms_norm_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops == Counter({f"{FUSED}.RMSNorm": 1}), f"fused graph: {dict(ops)}"
    (node,) = fused_nodes(sess, "RMSNorm")
    assert node.attrs["epsilon"] == pytest.approx(1e-6)
    assert len(node.inputs) == (1 if variant["weight"] == "none" else 2)
    if len(node.inputs) == 2:
        assert node.inputs[1].const.shape == (H,)
    check_sequence(model, norm_feeds(np.random.default_rng(2)), sess=sess)


RMS_NO_FUSE = [
    pytest.param(dict(axis=1), id="mean-over-seq"),
    pytest.param(dict(axis=1, opset=18), id="mean-over-seq-axes-input"),
    pytest.param(dict(also_output="mean"), id="mean-also-output"),
    pytest.param(dict(also_output="sqrt", form="div"), id="sqrt-also-output"),
    pytest.param(dict(other_square=True), id="square-of-another-tensor"),
]


@pytest.mark.parametrize("variant", RMS_NO_FUSE)
def test_rms_norm_does_not_fuse(variant):
    model = rms_norm_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.RMSNorm"] == 0 and ops["ReduceMean"] == 1, f"fused graph: {dict(ops)}"
    names = ("x", "y") if variant.get("other_square") else ("x",)
    check_sequence(model, norm_feeds(np.random.default_rng(3), names, NORM_SHAPES[:4]), sess=sess)


def test_rms_norm_weight_of_higher_rank_keeps_output_rank():
    b = Builder()
    x = b.input("x", ["seq", H])
    mean = reduce_mean(b, b.op("Pow", x, b.const(2.0)), -1, 17)
    y = b.op("Mul", x, b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean, b.const(1e-6)))))
    y = b.op("Mul", y, b.const(np.random.default_rng(0).uniform(0.5, 1.5, (1, 1, H))))
    model = b.model([y])
    rng = np.random.default_rng(4)
    check_sequence(model, [{"x": randn(rng, s, H)} for s in (3, 1, 6)])


LAYER_NORM_VARIANTS = [
    dict(square="pow", form="div", weight=True, bias=True, opset=17),
    dict(square="pow", form="div", weight=True, bias=True, opset=18, bias_first=True),
    dict(square="mul", form="reciprocal", weight=True, bias=False, opset=17),
    dict(square="mul", form="div", weight=False, bias=False, opset=18),
    dict(square="pow", form="reciprocal", weight=True, bias=True, opset=17, axis=2),
    dict(square="pow", form="div", weight=False, bias=True, opset=17),
]


@pytest.mark.parametrize("variant", LAYER_NORM_VARIANTS, ids=_variant_id)
def test_layer_norm_decomposition_fused_and_agrees(variant):
    """The normalisation is fused (into LayerNorm: fuse_layer_norm runs before fuse_rms_norm, whose
    pattern the inner part of a LayerNorm also is): nothing of the variance chain is left; results agree."""
    model = layer_norm_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.LayerNorm"] + ops[f"{FUSED}.RMSNorm"] == 1, f"fused graph: {dict(ops)}"
    assert ops["Sqrt"] == ops["Pow"] == ops["Reciprocal"] == ops["Div"] == ops["Mul"] == 0, dict(ops)
    check_sequence(model, norm_feeds(np.random.default_rng(5)), sess=sess)


@pytest.mark.parametrize("variant", LAYER_NORM_VARIANTS, ids=_variant_id)
def test_layer_norm_fuses_into_one_node(variant):
    sess = dynashape.InferenceSession(layer_norm_model(**variant))
    ops = fused_ops(sess)
    bias_alone = variant["bias"] and not variant["weight"]  # kept as an Add after a LayerNorm without weight
    assert ops == Counter({f"{FUSED}.LayerNorm": 1, **({"Add": 1} if bias_alone else {})}), dict(ops)
    (node,) = fused_nodes(sess, "LayerNorm")
    assert node.attrs["epsilon"] == pytest.approx(1e-5)
    assert len(node.inputs) == 1 + variant["weight"] + (variant["bias"] and variant["weight"])


def keras_layer_norm_model(mean="ReduceMean", also_output=None) -> onnx.ModelProto:
    """Keras' LayerNormalization as tf2onnx writes it (its batch-norm form, twelve nodes; the means
    as GlobalAveragePool of the 3-D input, or ReduceMean): s = gamma / sqrt(var + eps),
    y = x * s + (beta - mean * s)."""
    b = Builder()
    x = b.input("x", ["batch", "seq", H])
    rng = np.random.default_rng(11)

    def avg(v):
        return b.op("GlobalAveragePool", v) if mean == "GlobalAveragePool" else reduce_mean(b, v, -1, 17)
    m = avg(x)
    d = b.op("Sub", x, m)
    var = avg(b.op("Mul", d, d))
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, b.const(1e-3))))
    s = b.op("Mul", inv, b.const(rng.uniform(0.5, 1.5, H)))
    shift = b.op("Sub", b.const(rng.standard_normal(H)), b.op("Mul", m, s))
    y = b.op("Add", b.op("Mul", x, s), shift)
    return b.model([y] + ([s] if also_output == "scale" else []))


@pytest.mark.parametrize("mean", ["ReduceMean", "GlobalAveragePool"])
def test_keras_layer_norm_fuses_and_agrees(mean):
    model = keras_layer_norm_model(mean)
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess) == Counter({f"{FUSED}.LayerNorm": 1}), dict(fused_ops(sess))
    (node,) = fused_nodes(sess, "LayerNorm")
    assert node.attrs["epsilon"] == pytest.approx(1e-3) and len(node.inputs) == 3
    check_sequence(model, norm_feeds(np.random.default_rng(12)), sess=sess)


def test_keras_layer_norm_with_its_scale_read_elsewhere_stays():
    model = keras_layer_norm_model("GlobalAveragePool", also_output="scale")
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess)[f"{FUSED}.LayerNorm"] == 0
    check_sequence(model, norm_feeds(np.random.default_rng(13), shapes=NORM_SHAPES[:3]), sess=sess)


LAYER_NORM_NO_FUSE = [
    pytest.param(dict(axis=1), id="variance-over-seq"),
    pytest.param(dict(axis=1, opset=18), id="variance-over-seq-axes-input"),
    pytest.param(dict(also_output="var"), id="variance-also-output"),
    pytest.param(dict(also_output="centred"), id="centred-also-output"),
]


@pytest.mark.parametrize("variant", LAYER_NORM_NO_FUSE)
def test_layer_norm_does_not_fuse(variant):
    model = layer_norm_model(**variant)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.LayerNorm"] == 0 and ops["Sub"] == 1, f"fused graph: {dict(ops)}"
    if variant.get("also_output") != "centred":  # the centred x is an input, which RMSNorm(d) may take
        assert ops[f"{FUSED}.RMSNorm"] == 0 and ops["ReduceMean"] == 2 and ops["Sqrt"] == 1, dict(ops)
    check_sequence(model, norm_feeds(np.random.default_rng(7), shapes=NORM_SHAPES[:4]), sess=sess)


# activations ----------------------------------------------------------------------------------------------
SQRT2 = math.sqrt(2)


def gelu_model(form: str, half=0.5, sqrt2=SQRT2, cubic=0.044715, one=1.0, also_output=None):
    """GELU written out. erf forms: 0.5 * x * (1 + Erf(x / sqrt 2)) with the product associated
    and ordered in the ways exporters write it; tanh forms: GPT-2's new GELU with Pow(x, 3) or x * x * x."""
    b = Builder()
    x = b.input("x", ["batch", "seq", H])
    if form.startswith("erf"):
        if form == "erf_div":  # torch.onnx (BERT): Mul(Mul(x, Add(Erf(Div(x, sqrt2)), 1)), 0.5)
            inner = b.op("Erf", b.op("Div", x, b.const(sqrt2)))
            add = b.op("Add", inner, b.const(one))
            y = b.op("Mul", b.op("Mul", x, add), b.const(half))
        elif form == "erf_half_first":  # Mul(Mul(x, 0.5), Add(1, Erf(x * 1/sqrt2)))
            inner = b.op("Erf", b.op("Mul", x, b.const(1 / sqrt2)))
            add = b.op("Add", b.const(one), inner)
            y = b.op("Mul", b.op("Mul", x, b.const(half)), add)
        else:  # erf_swapped: Mul(Add(...), Mul(0.5, x)), Erf(Mul(1/sqrt2, x))
            inner = b.op("Erf", b.op("Mul", b.const(1 / sqrt2), x))
            add = b.op("Add", inner, b.const(one))
            y = b.op("Mul", add, b.op("Mul", b.const(half), x))
    else:
        c = b.const(math.sqrt(2 / math.pi))
        if form == "tanh_pow":  # GPT-2: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
            cube = b.op("Mul", b.const(cubic), b.op("Pow", x, b.const(3.0)))
            inner = b.op("Tanh", b.op("Mul", c, b.op("Add", x, cube)))
            add = b.op("Add", b.const(one), inner)
            y = b.op("Mul", b.op("Mul", b.const(half), x), add)
        else:  # tanh_mul: x * x * x, operands swapped, 0.5 applied last
            cube = b.op("Mul", b.op("Mul", b.op("Mul", x, x), x), b.const(cubic))
            inner = b.op("Tanh", b.op("Mul", b.op("Add", cube, x), c))
            add = b.op("Add", inner, b.const(one))
            y = b.op("Mul", b.op("Mul", x, add), b.const(half))
    extra = {"inner": [inner], None: []}[also_output]
    return b.model([y, *extra])


GELU_FORMS = ["erf_div", "erf_half_first", "erf_swapped", "tanh_pow", "tanh_mul"]


@pytest.mark.parametrize("form", GELU_FORMS)
def test_gelu_fuses_and_agrees(form):
    model = gelu_model(form)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops == Counter({f"{FUSED}.Gelu": 1}), f"fused graph: {dict(ops)}"
    (node,) = fused_nodes(sess, "Gelu")
    assert node.attrs["approximate"] == ("none" if form.startswith("erf") else "tanh")
    assert [i.name for i in node.inputs] == ["x"]
    check_sequence(model, norm_feeds(np.random.default_rng(8), scale=2.0), sess=sess)


GELU_NO_FUSE = [
    pytest.param("tanh_pow", dict(cubic=0.04), id="tanh-cubic-constant-off"),
    pytest.param("tanh_mul", dict(half=0.6), id="tanh-half-constant-off"),
    pytest.param("erf_div", dict(sqrt2=1.5), id="erf-sqrt2-constant-off"),
    pytest.param("erf_half_first", dict(one=2.0), id="erf-one-constant-off"),
    pytest.param("erf_div", dict(also_output="inner"), id="erf-also-output"),
    pytest.param("tanh_pow", dict(also_output="inner"), id="tanh-also-output"),
]


@pytest.mark.parametrize("form,kw", GELU_NO_FUSE)
def test_gelu_does_not_fuse(form, kw):
    model = gelu_model(form, **kw)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.Gelu"] == 0, f"fused graph: {dict(ops)}"
    assert ops["Erf" if form.startswith("erf") else "Tanh"] == 1
    check_sequence(model, norm_feeds(np.random.default_rng(9), shapes=NORM_SHAPES[:3], scale=2.0), sess=sess)


def test_gelu_times_gate_fuses():
    b = Builder()
    x, up = b.input("x", ["batch", "seq", H]), b.input("up", ["batch", "seq", H])
    add = b.op("Add", b.op("Erf", b.op("Div", x, b.const(math.sqrt(2)))), b.const(1.0))
    g = b.op("Mul", b.op("Mul", x, add), b.const(0.5))
    model = b.model([b.op("Mul", g, up)])
    rng = np.random.default_rng(10)
    check_sequence(model, norm_feeds(rng, ("x", "up"), NORM_SHAPES[:3]))
    assert fused_ops(dynashape.InferenceSession(model))[f"{FUSED}.Gelu"] == 1


def silu_model(swapped=False, other=False, sigmoid_read_twice=False, sigmoid_output=False):
    b = Builder()
    x = b.input("x", ["batch", "seq", H])
    y_in = b.input("y", ["batch", "seq", H]) if other else x
    s = b.op("Sigmoid", x)
    y = b.op("Mul", s, y_in) if swapped else b.op("Mul", y_in, s)
    outs = [y]
    if sigmoid_read_twice:
        outs.append(b.op("Add", s, x))
    if sigmoid_output:
        outs.append(s)
    return b.model(outs)


@pytest.mark.parametrize("swapped", [False, True], ids=["x*sigmoid", "sigmoid*x"])
def test_silu_fuses_and_agrees(swapped):
    model = silu_model(swapped)
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess) == Counter({f"{FUSED}.Silu": 1})
    check_sequence(model, norm_feeds(np.random.default_rng(11), scale=2.0), sess=sess)


@pytest.mark.parametrize("kw", [dict(other=True), dict(sigmoid_read_twice=True)], ids=["sigmoid-times-other",
                                                                                     "sigmoid-read-twice"])
def test_silu_does_not_fuse(kw):
    model = silu_model(**kw)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.Silu"] == 0 and ops["Sigmoid"] == 1
    names = ("x", "y") if kw.get("other") else ("x",)
    check_sequence(model, norm_feeds(np.random.default_rng(12), names, NORM_SHAPES[:3]), sess=sess)


def test_silu_not_fused_when_sigmoid_is_a_graph_output():
    model = silu_model(sigmoid_output=True)
    rng = np.random.default_rng(13)
    check_sequence(model, norm_feeds(rng, shapes=NORM_SHAPES[:3]))
    assert fused_ops(dynashape.InferenceSession(model))["Sigmoid"] == 1


# Linear and parallel MatMuls -------------------------------------------------------------------------------
IN, OUT = 12, 10


def linear_model(x_rank=3, bias="1d", bias_first=False, mm_output=False, weight_input=False):
    b = Builder()
    x = b.input("x", ["batch", "seq", IN][3 - x_rank:])
    rng = np.random.default_rng(0)
    w = b.input("w", [IN, OUT]) if weight_input else b.const(rng.standard_normal((IN, OUT)) / 3)
    mm = b.op("MatMul", x, w)
    bv = b.const(rng.standard_normal(OUT).reshape({"1d": (OUT,), "2d": (1, OUT), "3d": (1, 1, OUT)}[bias]))
    y = b.op("Add", bv, mm) if bias_first else b.op("Add", mm, bv)
    return b.model([y, mm] if mm_output else [y])


def linear_feeds(rng, x_rank=3, extra=None, shapes=NORM_SHAPES):
    out = []
    for bs, s in shapes:
        f = {"x": randn(rng, *(bs, s, IN)[3 - x_rank:])}
        f.update({k: randn(rng, *shape) for k, shape in (extra or {}).items()})
        out.append(f)
    return out


@pytest.mark.parametrize("kw", [dict(), dict(bias_first=True), dict(bias="2d"), dict(x_rank=2, bias="2d"),
                                dict(x_rank=2, bias_first=True)], ids=_variant_id)
def test_linear_fuses_and_agrees(kw):
    model = linear_model(**kw)
    sess = dynashape.InferenceSession(model)
    assert fused_ops(sess) == Counter({f"{FUSED}.Linear": 1})
    (node,) = fused_nodes(sess, "Linear")
    assert node.inputs[1].const.shape == (OUT, IN) and node.inputs[2].const.shape == (OUT,)
    check_sequence(model, linear_feeds(np.random.default_rng(14), kw.get("x_rank", 3)), sess=sess)


@pytest.mark.parametrize("kw", [dict(mm_output=True), dict(weight_input=True)], ids=_variant_id)
def test_linear_does_not_fuse(kw):
    model = linear_model(**kw)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.Linear"] == 0 and ops["MatMul"] == 1 and ops["Add"] == 1
    extra = {"w": (IN, OUT)} if kw.get("weight_input") else None
    check_sequence(model, linear_feeds(np.random.default_rng(15), 3, extra, NORM_SHAPES[:3]), sess=sess)


def test_linear_bias_of_higher_rank_keeps_output_rank():
    model = linear_model(x_rank=2, bias="3d")
    check_sequence(model, linear_feeds(np.random.default_rng(16), 2, shapes=NORM_SHAPES[:3]))


def qkv_model(biases=(True, True, True), outs=(16, 8, 8), consumer=False):
    """q, k, v projections of one input (GQA-like sizes), each with or without a bias."""
    b = Builder()
    x = b.input("x", ["batch", "seq", IN])
    rng = np.random.default_rng(1)
    res = []
    for has_bias, n in zip(biases, outs):
        y = b.op("MatMul", x, b.const(rng.standard_normal((IN, n)) / 3))
        if has_bias:
            y = b.op("Add", y, b.const(rng.standard_normal(n)))
        res.append(y)
    if consumer:  # the projections read further on, not only graph outputs
        res = [b.op("Relu", r) for r in res]
    return b.model(res)


QKV_VARIANTS = [
    pytest.param(dict(biases=(True, True, True)), "Linear", id="all-biases"),
    pytest.param(dict(biases=(False, False, False)), "MatMul", id="no-biases"),
    pytest.param(dict(biases=(False, False, False), outs=(8, 8, 8), consumer=True), "MatMul",
                 id="no-biases-equal-sizes-read-on"),
    pytest.param(dict(biases=(True, True, True), consumer=True), "Linear", id="all-biases-read-on"),
]


@pytest.mark.parametrize("kw,kind", QKV_VARIANTS)
def test_parallel_projections_merge(kw, kind):
    """q / k / v projections of one input become one product (weights side by side) and 3 Slices."""
    model = qkv_model(**kw)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    products = ops["MatMul"] + ops[f"{FUSED}.Linear"]
    assert products == 1, f"one product expected, fused graph: {dict(ops)}"
    assert ops["Slice"] == 3 and ops["Add"] == 0
    merged = [n for n in sess.program.fused.nodes if n.op_type == kind]
    assert len(merged) == 1
    outs = kw.get("outs", (16, 8, 8))
    w = merged[0].inputs[1].const
    assert w.shape == ((IN, sum(outs)) if kind == "MatMul" else (sum(outs), IN))
    if kind == "Linear":
        assert merged[0].inputs[2].const.shape == (sum(outs),)
    check_sequence(model, linear_feeds(np.random.default_rng(17)), sess=sess)


def test_parallel_projections_mixed_biases():
    """Two projections with a bias and one without: the biased pair merges into one Linear, the
    plain product stays on its own (two products in all)."""
    model = qkv_model(biases=(True, False, True))
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.Linear"] == 1 and ops["MatMul"] == 1 and ops["Slice"] == 2, dict(ops)
    check_sequence(model, linear_feeds(np.random.default_rng(18)), sess=sess)


def quant_qkv_model(contrib: bool, per_column: bool, zero_points: bool) -> onnx.ModelProto:
    """One activation quantized once (DynamicQuantizeLinear) and read by three 8-bit products, as
    onnxruntime's quantize_dynamic writes them (MatMulInteger -> Cast -> Mul(scales) -> Add bias) or
    as its transformers optimizer's MatMulIntegerToFloat (``contrib``); weight scales per tensor or
    per column, zero points given (and not all zero) or absent."""
    b = Builder()
    x = b.input("x", ["batch", "seq", IN])
    rng = np.random.default_rng(2)
    xq, xs, xz = (f"x{s}" for s in ("q", "s", "z"))
    b.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [xq, xs, xz], name="dql"))
    res = []
    for n in (16, 8, 8):
        w = b.const(rng.integers(-128, 128, (IN, n)), np.int8)
        ws = b.const(rng.random(n if per_column else ()) * 0.01 + 1e-3)
        wz = b.const(rng.integers(-3, 4, n if per_column else ()), np.int8) if zero_points else ""
        bias = b.const(rng.standard_normal(n))
        if contrib:
            res.append(b.op("MatMulIntegerToFloat", xq, w, xs, ws, xz, wz, bias, domain="com.microsoft"))
            continue
        acc = b.op("MatMulInteger", xq, w, xz, *([wz] if wz else []))
        y = b.op("Mul", b.op("Cast", acc, to=1), b.op("Mul", xs, ws))
        res.append(b.op("Add", y, bias))
    return b.model(res)


@pytest.mark.parametrize("contrib", [False, True], ids=["quantize_dynamic", "MatMulIntegerToFloat"])
@pytest.mark.parametrize("per_column,zero_points", [(False, False), (True, True), (False, True)])
def test_parallel_quantized_projections_merge_bit_for_bit(contrib, per_column, zero_points):
    """Three 8-bit products of one quantized activation become one (weights side by side, scales,
    zero points and biases per column) and three Slices; the results are the unmerged ones bit for
    bit (the interpreter runs the graph as it was) and onnxruntime's within float32 rounding."""
    model = quant_qkv_model(contrib, per_column, zero_points)
    sess = dynashape.InferenceSession(model)
    kind = "MatMulIntegerToFloat" if contrib else "QMatMulCentered"
    merged = [n for n in sess.program.fused.nodes if n.op_type == kind]
    assert len(merged) == 1 and merged[0].inputs[1 if contrib else 3].const.shape == (IN, 32)
    assert fused_ops(sess)["Slice"] == 3
    interp = dynashape.InferenceSession(model, executor="interpreter")
    feeds = linear_feeds(np.random.default_rng(19))
    for f in feeds:
        for got, want in zip(sess.run(None, f), interp.run(None, f)):
            assert np.array_equal(got, want)
    check_sequence(model, feeds, sess=sess)


# Conv + BatchNormalization, channels last ----------------------------------------------------------------
def conv_bn_model(conv_output=False):
    """Conv(3x3, bias) -> BN -> Relu -> depthwise Conv(no bias) -> BN -> Relu, and a 1x1 Conv -> BN ->
    Relu branch, concatenated on channels; dynamic batch and spatial dims."""
    b = Builder()
    x = b.input("x", ["batch", 3, "h", "w"])
    rng = np.random.default_rng(0)

    def bn(t, c):
        return b.op("BatchNormalization", t, b.const(rng.uniform(0.5, 1.5, c)), b.const(rng.standard_normal(c)),
                    b.const(rng.standard_normal(c)), b.const(rng.uniform(0.5, 2.0, c)), epsilon=1e-3)

    c1 = b.op("Conv", x, b.const(rng.standard_normal((8, 3, 3, 3)) / 3), b.const(rng.standard_normal(8)),
              pads=[1, 1, 1, 1])
    a = b.op("Relu", bn(c1, 8))
    dw = b.op("Conv", a, b.const(rng.standard_normal((8, 1, 3, 3)) / 2), pads=[1, 1, 1, 1], group=8)
    a = b.op("Relu", bn(dw, 8))
    c2 = b.op("Conv", x, b.const(rng.standard_normal((4, 3, 1, 1))))
    br = b.op("Relu", bn(c2, 4))
    y = b.op("Concat", a, br, axis=1)
    return b.model([y, c1] if conv_output else [y])


CONV_SHAPES = [(1, 8, 8), (2, 13, 7), (3, 5, 16), (1, 8, 8), (2, 1, 1)]


def conv_feeds(rng, shapes=CONV_SHAPES):
    return [{"x": randn(rng, bs, 3, h, w)} for bs, h, w in shapes]


def test_conv_bn_folds_and_runs_channels_last():
    model = conv_bn_model()
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    # on the CPU each convolution takes its Relu as a post-op (fuse_conv_activation)
    assert ops["BatchNormalization"] == 0 and ops["Conv"] + ops[f"{FUSED}.ConvAct"] == 3, dict(ops)
    g = sess.program.fused
    for n in g.nodes:
        if n.op_type in ("Conv", "ConvAct"):
            assert len(n.inputs) == 3, "the folded bias"
            assert getattr(n.outputs[0], "layout", None) == "nhwc"
            assert n.inputs[1].const.is_contiguous(memory_format=torch.channels_last)
        if n.op_type in ("Relu", "Concat"):
            assert getattr(n.outputs[0], "layout", None) == "nhwc"
    assert any(n.op_type == "BatchNormalization" for n in sess.program.graph.nodes), "the interpreter's graph"
    check_sequence(model, conv_feeds(np.random.default_rng(19)), sess=sess)


def test_conv_bn_not_folded_when_conv_output_is_read():
    model = conv_bn_model(conv_output=True)
    sess = dynashape.InferenceSession(model)
    ops = fused_ops(sess)
    assert ops["BatchNormalization"] == 1 and ops["Conv"] + ops[f"{FUSED}.ConvAct"] == 3, dict(ops)
    check_sequence(model, conv_feeds(np.random.default_rng(20), CONV_SHAPES[:3]), sess=sess)


def test_channels_last_by_device_and_dtype(monkeypatch):
    """NHWC on CPU; on CUDA only for half-precision convs (fp32 cuDNN measured faster in NCHW)."""
    from dynashape.compile.channels_last import channels_last_pass
    from dynashape.ir.copy import copy_graph

    graph = dynashape.InferenceSession(conv_bn_model()).program.graph

    def layouts(device, half=False):
        g = copy_graph(graph)
        if half:
            for n in g.nodes:
                if n.op_type == "Conv":
                    n.inputs[1].const = n.inputs[1].const.half()
        g = channels_last_pass(device)(g)
        return {getattr(n.outputs[0], "layout", None) for n in g.nodes if n.op_type == "Conv"}

    assert layouts("cpu") == {"nhwc"}
    assert layouts("cuda") == {None} and layouts("cuda:1", half=True) == {"nhwc"}
    monkeypatch.setenv("DYNASHAPE_CHANNELS_LAST", "1")
    assert layouts("cuda") == {"nhwc"}
    monkeypatch.setenv("DYNASHAPE_CHANNELS_LAST", "0")
    assert layouts("cpu") == {None}


def _split_qdq_model() -> onnx.ModelProto:
    """Conv -> Q -> DQ -> Split (channels) -> Concat -> MaxPool -> Conv: a YOLO C2f-like block of a
    QDQ model, every op of it between convolutions."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) / 4).astype(np.float32), "W1"),
             numpy_helper.from_array((rng.standard_normal((6, 8, 1, 1)) / 4).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array([4, 4], np.int64), "parts")]
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c1", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
             helper.make_node("Split", ["dq", "parts"], ["a", "b"], axis=1),
             helper.make_node("Concat", ["b", "a"], ["cat"], axis=1),
             helper.make_node("MaxPool", ["cat"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "W2"], ["y"])]
    g = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_qdq_split_and_concat_keep_channels_last_between_convolutions():
    model = _split_qdq_model()
    sess = dynashape.InferenceSession(model)
    g = sess.program.fused
    marked = {_op_name(n): getattr(n.outputs[0], "layout", None) for n in g.nodes}
    for op in ("Conv", "Split", "Concat", "MaxPool"):  # Q/DQ may be fused into one FakeQuant
        assert marked.get(op) == "nhwc", marked
    assert all(getattr(n.outputs[0], "layout", None) == "nhwc" for n in g.nodes
               if n.op_type in ("QuantizeLinear", "DequantizeLinear", "FakeQuant"))
    rng = np.random.default_rng(4)
    check_sequence(model, [{"x": rng.standard_normal((n, 4, h, w)).astype(np.float32)}
                           for n, h, w in [(1, 9, 12), (3, 16, 16), (1, 9, 12), (2, 7, 5)]], sess=sess)


@pytest.mark.parametrize("shape,k,s,p", [((2, 16, 20, 24), 3, 2, 1), ((1, 8, 33, 17), 2, 2, 0),
                                         ((1, 4, 12, 12), 5, 1, 2)])
def test_cpu_max_pool_over_nchw_equals_torchs(shape, k, s, p):
    """ops/pool.py pools an NCHW input channels-last on CPU: the same values as torch's NCHW pool."""
    from dynashape.ops.pool import _maxpool
    x = torch.randn(shape)
    y = _maxpool(x, kernel_shape=[k, k], strides=[s, s], pads=[p] * 4, _n_outputs=1)
    y = y[0] if isinstance(y, (tuple, list)) else y
    assert torch.equal(y, torch.nn.functional.max_pool2d(x, k, s, p))
