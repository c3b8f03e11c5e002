"""The rotate-half rotary embedding fusion (compile/fuse_rotary.py) and its op (ops/rotary.py).

The Llama test decoder's exported rotaries (two a layer) become RotaryHalf nodes and the session
still matches the torch module; small hand-built graphs of the pattern fuse in every operand
order and slice spelling, and near misses do not, each checked against onnx's reference
evaluator; the Triton kernel (CUDA only) matches the torch form.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import dynashape
from dynashape.compile.pipeline import compile_graph
from dynashape.frontend.options import ParseOptions
from dynashape.frontend.parse import parse_model
from dynashape.ops import rotary
from tests.models import llama

FUSED = "com.dynashape"
INT64_MAX = 2**63 - 1
D = 8


def _fused_counts(program) -> Counter:
    return Counter(f"{FUSED}.{n.op_type}" if n.domain == FUSED else n.op_type for n in program.fused.nodes)


# the Llama test decoder -----------------------------------------------------------------------------
def test_llama_rotaries_fuse():
    program = compile_graph(parse_model(onnx.load(str(llama.model_path())), ParseOptions()))
    ops = _fused_counts(program)
    assert ops[f"{FUSED}.RotaryHalf"] == 2 * llama.TINY["layers"]
    assert ops["Neg"] == 0
    for node in program.fused.nodes:
        if node.op_type == "RotaryHalf":
            assert [n.op_type for n in node.unfused] == ["Mul", "Slice", "Neg", "Slice", "Concat", "Mul", "Add"]


def test_llama_session_matches_eager():
    sess = dynashape.InferenceSession(str(llama.model_path()))
    eager = llama.build()
    cfg, names = llama.TINY, llama.input_names()
    g = torch.Generator().manual_seed(3)
    for batch, seq, past in [(1, 1, 0), (2, 3, 5), (3, 4, 6), (1, 2, 1), (2, 1, 4)]:
        ids = torch.randint(0, cfg["vocab"], (batch, seq), generator=g)
        kv = [torch.randn(batch, cfg["kv_heads"], past, cfg["head_dim"], generator=g) for _ in names[1:]]
        got = sess.run(None, dict(zip(names, [ids, *kv])))
        with torch.no_grad():
            want = eager(ids, *kv)
        for k, (a, w) in enumerate(zip(got, want)):
            what = f"batch {batch} seq {seq} past {past} output {k}"
            torch.testing.assert_close(torch.as_tensor(np.asarray(a)), w, atol=1e-5, rtol=1e-5,
                                       msg=lambda m, what=what: f"{what}: {m}")
    assert sess.compiled.specs and all(spec.trace.unfused == 0 for spec in sess.compiled.specs)


# hand-built graphs -----------------------------------------------------------------------------------
def rotary_model(x_first=True, cat_first=True, a_first=True, end=INT64_MAX, axis=-1, steps=True, half=D // 2,
                 also_read=None, cos_shape=("s", D)) -> onnx.ModelProto:
    """y = x * cos + cat([-x[..., half:], x[..., :half]], -1) * sin, x [b, n, s, D]. ``also_read``
    names an intermediate (a, x2, n, x1, c, b) that is a second graph output."""
    inits = {"h": [half], "zero": [0], "end": [end], "axes": [axis], "one": [1]}
    steps_in = ["one"] if steps else []
    nodes = [
        helper.make_node("Mul", ["x", "cos"] if x_first else ["cos", "x"], ["a"]),
        helper.make_node("Slice", ["x", "h", "end", "axes", *steps_in], ["x2"]),
        helper.make_node("Neg", ["x2"], ["n"]),
        helper.make_node("Slice", ["x", "zero", "h", "axes", *steps_in], ["x1"]),
        helper.make_node("Concat", ["n", "x1"], ["c"], axis=axis),
        helper.make_node("Mul", ["c", "sin"] if cat_first else ["sin", "c"], ["b"]),
        helper.make_node("Add", ["a", "b"] if a_first else ["b", "a"], ["y"]),
    ]
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f32, ["b", "n", "s", D]),
              helper.make_tensor_value_info("cos", f32, list(cos_shape)),
              helper.make_tensor_value_info("sin", f32, list(cos_shape))]
    outputs = [helper.make_tensor_value_info(o, f32, None) for o in ["y"] + ([also_read] if also_read else [])]
    g = helper.make_graph(nodes, "rotary", inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(rng, model: onnx.ModelProto, b: int, n: int, s: int) -> dict:
    dims = {"b": b, "n": n, "s": s}
    cs = [dims.get(d.dim_param, d.dim_value) for d in model.graph.input[1].type.tensor_type.shape.dim]
    return {"x": rng.standard_normal((b, n, s, D)).astype(np.float32),
            "cos": rng.standard_normal(cs).astype(np.float32),
            "sin": rng.standard_normal(cs).astype(np.float32)}


def _check(model: onnx.ModelProto, fused: int, seed: int = 0) -> None:
    sess = dynashape.InferenceSession(model)
    counts = _fused_counts(sess.program)
    assert counts[f"{FUSED}.RotaryHalf"] == fused, counts
    if fused:
        assert counts["Neg"] == 0 and counts["Concat"] == 0
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(seed)
    for b, n, s in [(1, 2, 1), (2, 3, 5), (3, 1, 2), (1, 2, 1)]:
        feeds = _feeds(rng, model, b, n, s)
        want = ref.run(None, feeds)
        got = sess.run(None, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-6, err_msg=f"{(b, n, s)}")


@pytest.mark.parametrize("x_first", [True, False])
@pytest.mark.parametrize("cat_first", [True, False])
@pytest.mark.parametrize("a_first", [True, False])
def test_operand_orders_fuse(x_first, cat_first, a_first):
    _check(rotary_model(x_first, cat_first, a_first), 1)


@pytest.mark.parametrize("kw", [dict(end=INT64_MAX), dict(end=D), dict(end=1000), dict(axis=3), dict(steps=False),
                                dict(cos_shape=(1, 1, "s", D)), dict(cos_shape=("b", 1, "s", D)),
                                dict(cos_shape=(D,))],
                         ids=["int64max", "end-d", "end-beyond", "axis-rank-1", "no-steps", "cos-4d", "cos-batch",
                              "cos-1d"])
def test_spellings_fuse(kw):
    _check(rotary_model(**kw), 1)


@pytest.mark.parametrize("also_read", ["a", "x2", "n", "x1", "c", "b"])
def test_intermediate_read_elsewhere_not_fused(also_read):
    _check(rotary_model(also_read=also_read), 0)


@pytest.mark.parametrize("half", [3, 5])
def test_other_split_not_fused(half):
    _check(rotary_model(half=half), 0)


def test_cos_that_enlarges_x_runs_unfused():
    """cos [b, n, s, D] with x [1, n, s, D]: the kernel would write x's shape; the shape function
    refuses it and the replaced nodes run (the graph's broadcast result)."""
    model = rotary_model(cos_shape=("c", "n", "s", D))
    sess = dynashape.InferenceSession(model)
    assert _fused_counts(sess.program)[f"{FUSED}.RotaryHalf"] == 1
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((1, 2, 3, D)).astype(np.float32),
             "cos": rng.standard_normal((4, 2, 3, D)).astype(np.float32),
             "sin": rng.standard_normal((4, 2, 3, D)).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = np.asarray(sess.run(None, feeds)[0])
    assert got.shape == (4, 2, 3, D)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [spec.trace.unfused for spec in sess.compiled.specs] == [1]
    feeds = {k: v[:1] for k, v in feeds.items()}  # cos [1, n, s, D]: the fused kernel serves
    np.testing.assert_allclose(np.asarray(sess.run(None, feeds)[0]), ReferenceEvaluator(model).run(None, feeds)[0],
                               rtol=1e-5, atol=1e-6)
    assert sorted(spec.trace.unfused for spec in sess.compiled.specs) == [0, 1]


# the Triton kernel ------------------------------------------------------------------------------------
def _cuda_triton():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if rotary.triton is None:
        pytest.skip("no triton")


def _reference(x, cos, sin):
    """The torch form in fp32, rounded once to x's dtype: what the kernel computes."""
    return rotary.rotary_half_torch(x.float(), cos.float(), sin.float()).to(x.dtype)


TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", ["llama", "contiguous", "rank3", "odd-half", "cos-full", "rank2", "wide"])
def test_triton_kernel_matches_torch(dtype, case):
    _cuda_triton()
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    b, s, heads, d = 2, 5, 3, 16
    if case == "llama":  # [b, s, heads, d] seen as [b, heads, s, d]; cos [1, 1, s, d]
        x, cs = randn(b, s, heads, d).transpose(1, 2), (1, 1, s, d)
    elif case == "contiguous":
        x, cs = randn(b, heads, s, d), (s, d)
    elif case == "rank3":
        x, cs = randn(s, b, d).transpose(0, 1), (1, s, d)
    elif case == "odd-half":  # d = 96, h = 48: the block is wider than the row
        x, cs = randn(b, s, heads, 96).transpose(1, 2), (1, 1, s, 96)
    elif case == "cos-full":
        x, cs = randn(b, heads, s, d), (b, heads, s, d)
    elif case == "rank2":
        x, cs = randn(s, d), (d,)
    else:  # the largest row the kernel takes, x a slice of a wider tensor
        x, cs = randn(b, heads, s, 2 * 1024)[..., 1024:], (b, 1, s, 1024)
    cos, sin = randn(*cs), randn(*cs)
    got = rotary._rotary_half(x, cos, sin)
    assert got.is_contiguous() and got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, _reference(x, cos, sin), **TOL[dtype])
    torch.testing.assert_close(got, rotary.rotary_half_torch(x, cos, sin), **TOL[dtype])


def test_triton_kernel_under_cuda_graph_capture():
    _cuda_triton()
    x = torch.randn(2, 3, 4, 64, device="cuda").transpose(1, 2)
    cos, sin = torch.randn(1, 1, 3, 64, device="cuda"), torch.randn(1, 1, 3, 64, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rotary._rotary_half(x, cos, sin)  # compiled before the capture, as a session's warm-up does
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rotary._rotary_half(x, cos, sin)
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        cos.copy_(torch.randn_like(cos))
        sin.copy_(torch.randn_like(sin))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, rotary.rotary_half_torch(x, cos, sin), atol=1e-5, rtol=1e-5)
