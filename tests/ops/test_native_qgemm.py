"""8-bit products in C (ops/csrc/qgemm.c through ops/qgemm.py) against the torch paths they replace:
the same integers and the same float32 roundings, so equal bit for bit; for every kind of A (float32
quantized dynamically, centered float32, uint8, int8), every weight form (int8 without zero point,
int8 / uint8 with one or per-column zero points), sizes that are no multiple of the tiles, leading
dims, the builds for other CPUs, threads, and the fallbacks counted. The ops that call it are
compared with their torch path over changing shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.ops import contrib_qattention, contrib_qmatmul, fused_quant, integer_gemm, linalg, native, qgemm
from tests.native_report import needs_native

from .harness import other_build

pytestmark = needs_native("qgemm")

SIZES = [(1, 1, 1), (3, 5, 7), (4, 64, 64), (9, 33, 130), (17, 256, 64), (64, 100, 192), (2, 300, 65)]


def _weight(g, k, n, form):
    """B (K, N) and its zero point: int8 without / with a zero zero point, int8 per-column zero
    points, uint8 with one zero point, uint8 per-column."""
    if form in ("s8", "s8-zero", "s8-col"):
        b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
        zp = {"s8": None, "s8-zero": torch.zeros((), dtype=torch.int8),
              "s8-col": torch.randint(-20, 20, (n,), dtype=torch.int8, generator=g)}[form]
    else:
        b = torch.randint(0, 256, (k, n), dtype=torch.uint8, generator=g)
        zp = (torch.randint(100, 156, (), dtype=torch.uint8, generator=g) if form == "u8"
              else torch.randint(100, 156, (n,), dtype=torch.uint8, generator=g))
    return b, zp


FORMS = ["s8", "s8-zero", "s8-col", "u8", "u8-col"]


def _torch(monkeypatch, fn, *args):
    """``fn(*args)`` with the C kernels off (the torch paths)."""
    with monkeypatch.context() as m:
        m.setenv("DYNASHAPE_NATIVE", "0")
        return fn(*args)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["u8", "s8", "centered"])
def test_integer_sums_equal_the_exact_product(form, kind):
    g = torch.Generator().manual_seed(hash((form, kind)) % 1000)
    for m, k, n in SIZES:
        b, zb = _weight(g, k, n, form)
        if kind == "centered":
            za = int(torch.randint(0, 256, (), generator=g))
            a = torch.randint(0, 256, (2, m, k), generator=g)
            xc = (a - za).to(torch.float32)
            got = qgemm.product(xc, qgemm.A_CENTERED, integer_gemm.prepared_b(b, zb), a_zp=za)
        else:
            lo, hi = (0, 256) if kind == "u8" else (-128, 128)
            a = torch.randint(lo, hi, (2, m, k), dtype=torch.uint8 if kind == "u8" else torch.int8, generator=g)
            za = int(torch.randint(lo, hi, (), generator=g))
            got = qgemm.product(a, qgemm.A_U8 if kind == "u8" else qgemm.A_S8, integer_gemm.prepared_b(b, zb), a_zp=za)
        want = (a.to(torch.float64) - za) @ (b.to(torch.float64) - (0 if zb is None else zb.to(torch.float64)))
        assert got is not None and got.dtype == torch.int32 and got.shape == (2, m, n)
        assert torch.equal(got.to(torch.float64), want), (m, k, n)


@pytest.mark.parametrize("form", FORMS)
def test_dynamic_quant_matmul_equals_the_torch_path(monkeypatch, form):
    """DynQuantMatMul (what fuse_dynamic_quant makes of quantize_dynamic's pattern): A's range and
    quantization, the product, float32(sum) * float32(xs * ws) [+ bias], bit for bit."""
    g = torch.Generator().manual_seed(FORMS.index(form))
    for i, (m, k, n) in enumerate(SIZES):
        b, zb = _weight(g, k, n, form)
        ws = torch.rand(n if i % 2 else 1, generator=g) * 0.01 + 1e-3
        bias = torch.randn(n, generator=g) if i % 3 else None
        x = torch.randn(3, m, k, generator=g) * (i + 1)
        if i == 2:
            x = x.abs()  # a range with zero as its lower end: zero point 0
        before = native.counters().get("qgemm_native_calls", 0)
        got = fused_quant._dyn_quant_matmul(x, b, ws, zb, bias)
        assert native.counters()["qgemm_native_calls"] == before + 1
        want = _torch(monkeypatch, fused_quant._dyn_quant_matmul, x, b, ws, zb, bias)
        assert torch.equal(got, want), (m, k, n)


def test_centered_product_and_dynamic_quantize_agree(monkeypatch):
    """DynQuantize then QMatMulCentered (one quantization for several products): as the torch path."""
    g = torch.Generator().manual_seed(7)
    for m, k, n in SIZES:
        b, zb = _weight(g, k, n, "s8")
        ws, bias = torch.rand(n, generator=g) * 0.01, torch.randn(n, generator=g)
        x = torch.randn(m, k, generator=g)
        xc, xs, xz = fused_quant._dyn_quantize(x)
        got = fused_quant._qmatmul_centered(xc, xs, xz, b, ws, zb, bias)
        want = _torch(monkeypatch, fused_quant._qmatmul_centered, xc, xs, xz, b, ws, zb, bias)
        assert torch.equal(got, want)


def test_into_out_and_noncontiguous_a():
    g = torch.Generator().manual_seed(8)
    b, zb = _weight(g, 40, 70, "u8")
    a = torch.randint(0, 256, (40, 12), dtype=torch.uint8, generator=g).t()  # (12, 40), not contiguous
    want = integer_gemm.qmatmul(a.contiguous(), b, torch.tensor(3, dtype=torch.uint8), zb)
    out = torch.empty(12, 70, dtype=torch.int32)
    got = qgemm.product(a, qgemm.A_U8, integer_gemm.prepared_b(b, zb), a_zp=3, out=out)
    assert got is out and torch.equal(out.double(), want.double())


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nonfinite_range_takes_the_torch_path(monkeypatch, value):
    g = torch.Generator().manual_seed(9)
    b, zb = _weight(g, 16, 8, "s8")
    x = torch.randn(4, 16, generator=g)
    x[1, 3] = value
    ws = torch.tensor([0.01])
    assert qgemm.product(x, qgemm.A_DYNAMIC, integer_gemm.prepared_b(b, zb), b_scale=ws) is None
    got = fused_quant._dyn_quant_matmul(x, b, ws, zb)
    want = _torch(monkeypatch, fused_quant._dyn_quant_matmul, x, b, ws, zb)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_not_served_where_the_torch_path_alone_does_it(monkeypatch):
    """A 3-D B, the u8s8 saturation switch, a CUDA-less fallback: None or the torch path; with the
    C kernels off the fallback is counted."""
    g = torch.Generator().manual_seed(10)
    b3 = torch.randint(-128, 128, (2, 8, 4), dtype=torch.int8, generator=g)
    a = torch.randint(0, 256, (2, 3, 8), dtype=torch.uint8, generator=g)
    assert qgemm.product(a, qgemm.A_U8, integer_gemm.prepared_b(b3, None)) is None
    b, _ = _weight(g, 8, 4, "s8")
    prev = linalg.set_u8s8_saturation(True)
    try:
        before = native.counters().get("qgemm_native_calls", 0)
        integer_gemm.qmatmul(a[0], b)
        assert native.counters().get("qgemm_native_calls", 0) == before
    finally:
        linalg.set_u8s8_saturation(prev)
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    before = native.counters().get("qgemm_torch_fallbacks", 0)
    assert qgemm.product(a[0], qgemm.A_U8, integer_gemm.prepared_b(b, None)) is None
    assert native.counters()["qgemm_torch_fallbacks"] == before + 1


def test_threads_give_the_same_numbers(monkeypatch):
    """Two threads (blocks shared, or row tiles for one block): exact sums either way."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    g = torch.Generator().manual_seed(11)
    for m, k, n in [(37, 70, 300), (50, 64, 64), (5, 300, 130)]:
        b, zb = _weight(g, k, n, "s8")
        x = torch.randn(m, k, generator=g)
        ws = torch.rand(n, generator=g) * 0.01
        outs = []
        for min_work in (0, 1 << 62):
            monkeypatch.setattr(qgemm, "_THREAD_MIN_WORK", min_work)
            outs.append(fused_quant._dyn_quant_matmul(x, b, ws, zb))
        assert torch.equal(*outs)


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
@pytest.mark.parametrize("form", ["s8", "u8-col"])
def test_other_cpu_builds_give_the_same_numbers(monkeypatch, tmp_path, arch, form):
    """The AVX2 (vpmaddwd, int16 pairs) and plain-C products other CPUs get: the same numbers."""
    fn = other_build("qgemm", "qgemm", qgemm._kernel(), arch, tmp_path)
    outs = {}
    for which, kernel, int8 in (("native", qgemm._kernel(), qgemm._int8_weights()), (arch, fn, False)):
        monkeypatch.setattr(qgemm, "_kernel", lambda k=kernel: k)
        monkeypatch.setattr(qgemm, "_int8_weights", lambda v=int8: v)
        g = torch.Generator().manual_seed(12)
        res = []
        for m, k, n in SIZES:
            b, zb = _weight(g, k, n, form)  # fresh weights: their layout is the build's
            x = torch.randn(m, k, generator=g)
            res.append(fused_quant._dyn_quant_matmul(x, b, torch.tensor([0.01]), zb, torch.randn(n, generator=g)))
        outs[which] = res
    for a, b in zip(outs["native"], outs[arch]):
        assert torch.equal(a, b)


def test_contrib_products_equal_their_torch_paths(monkeypatch):
    """MatMulIntegerToFloat, DynamicQuantizeMatMul and QAttention's projection over changing
    shapes: the C call gives the torch path's numbers."""
    g = torch.Generator().manual_seed(13)
    for k, n, m in [(48, 96, 1), (48, 96, 7), (20, 63, 32), (20, 63, 5), (33, 30, 6)]:
        b, zb = _weight(g, k, n, "s8-col")
        bs, bias = torch.rand(n, generator=g) * 0.01, torch.randn(n, generator=g)
        a = torch.randint(0, 256, (2, m, k), dtype=torch.uint8, generator=g)
        az, as_ = torch.tensor(131, dtype=torch.uint8), torch.tensor(0.02)
        x = torch.randn(2, m, k, generator=g)
        calls = [(contrib_qmatmul._matmul_integer_to_float, (a, b, as_, bs, az, zb, bias)),
                 (contrib_qmatmul._dynamic_quantize_matmul, (x, b, bs, zb, bias)),
                 (contrib_qattention._projection, (a, b, bias, as_, bs, az, zb))]
        for fn, args in calls:
            before = native.counters().get("qgemm_native_calls", 0)
            got = fn(*args)
            assert native.counters()["qgemm_native_calls"] == before + 1
            assert torch.equal(got, _torch(monkeypatch, fn, *args))


def test_quantized_model_matches_onnxruntime_over_shapes():
    """quantize_dynamic's pattern in a model (DynamicQuantizeLinear, MatMulInteger, Cast, Mul, Add)
    against onnxruntime over changing shapes: the C path gives its numbers."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    import dynashape
    rng = np.random.default_rng(14)
    k, n = 40, 72
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0.004, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["X"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "W", "xz", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TP.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y0"]),
             helper.make_node("Add", ["y0", "bias"], ["Y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TP.FLOAT, ["b", "s", k])],
                              [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    sess = dynashape.InferenceSession(model)
    before = native.counters().get("qgemm_native_calls", 0)
    shapes = [(1, 5), (3, 17), (2, 1), (1, 64), (3, 17)]
    for b, s in shapes:
        x = rng.standard_normal((b, s, k)).astype(np.float32)
        (got,) = sess.run(None, {"X": x})
        (want,) = ref.run(None, {"X": x})
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert native.counters()["qgemm_native_calls"] >= before + len(shapes)


def test_dyn_quantize_equals_the_torch_path(monkeypatch):
    """DynQuantize in one call (dq_centered): centered values, scale and zero point as the torch
    path's for ranges on both sides of zero, one side only, all zeros; into ``out`` too."""
    g = torch.Generator().manual_seed(15)
    for i, shape in enumerate([(1,), (7, 33), (2, 16, 64), (3, 5, 129), (4, 300)]):
        x = torch.randn(shape, generator=g) * (i + 0.5)
        for v in (x, x.abs(), -x.abs(), torch.zeros_like(x)):
            before = native.counters().get("qgemm_native_calls", 0)
            got = fused_quant._dyn_quantize(v)
            assert native.counters()["qgemm_native_calls"] == before + 1
            want = _torch(monkeypatch, fused_quant._dyn_quantize, v)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            out = (torch.empty(shape), torch.empty(()), torch.empty((), dtype=torch.uint8))
            assert fused_quant._dyn_quantize(v, out=out) is out
            assert all(torch.equal(a, b) for a, b in zip(out, want))


def test_dynamic_quantize_linear_equals_the_torch_path(monkeypatch):
    """DynamicQuantizeLinear in one call (dq_u8): uint8 values, scale and zero point as the torch
    path's, ranges on both sides of zero, one side only, all zeros, ties of x / scale; into ``out``."""
    from dynashape.ops import quant
    g = torch.Generator().manual_seed(24)
    for i, shape in enumerate([(1,), (7, 33), (2, 16, 64), (3, 5, 129), (4, 300)]):
        x = torch.randn(shape, generator=g) * (i + 0.5)
        ties = torch.round(x * 4) / 4  # many values on exact halves of the scale's steps
        for v in (x, x.abs(), -x.abs(), torch.zeros_like(x), ties):
            before = native.counters().get("qgemm_native_calls", 0)
            got = quant._dynamic_quantize(v)
            assert native.counters()["qgemm_native_calls"] == before + 1
            want = _torch(monkeypatch, quant._dynamic_quantize, v)
            assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
            out = (torch.empty(shape, dtype=torch.uint8), torch.empty(()), torch.empty((), dtype=torch.uint8))
            assert quant._dynamic_quantize(v, out=out) is out
            assert all(torch.equal(a, b) for a, b in zip(out, want))


@pytest.mark.parametrize("a_dtype,b_dtype,y_dtype", [(torch.uint8, torch.int8, torch.uint8),
                                                     (torch.int8, torch.int8, torch.int8),
                                                     (torch.uint8, torch.uint8, torch.int8)])
def test_qlinear_matmul_requantized_in_c_equals_the_torch_path(monkeypatch, a_dtype, b_dtype, y_dtype):
    """QLinearMatMul: the product and onnxruntime's requantization (round half to even, zero point,
    saturation) in the C call, per-tensor and per-column multipliers; bit for bit."""
    from dynashape.ops import quant
    g = torch.Generator().manual_seed(16)
    lo, hi = (0, 256) if a_dtype == torch.uint8 else (-128, 128)
    for i, (m, k, n) in enumerate(SIZES):
        b, zb = _weight(g, k, n, "s8-col" if b_dtype == torch.int8 else "u8")
        a = torch.randint(lo, hi, (2, m, k), dtype=a_dtype, generator=g)
        az = torch.tensor(int(torch.randint(lo, hi, (), generator=g)), dtype=a_dtype)
        bs = torch.rand(n if i % 2 else 1, generator=g) * 0.02 + 1e-3
        ys = torch.tensor(0.05 + 0.3 * float(torch.rand((), generator=g)))
        yz = torch.tensor(3 if y_dtype == torch.uint8 else -5, dtype=y_dtype)
        args = (a, torch.tensor(0.02), az, b, bs, zb, ys, yz)
        before = native.counters().get("qgemm_native_calls", 0)
        got = quant._qlinear_matmul(*args)
        assert native.counters()["qgemm_native_calls"] == before + 1
        want = _torch(monkeypatch, quant._qlinear_matmul, *args)
        assert got.dtype == want.dtype == y_dtype and torch.equal(got, want), (m, k, n)


def _concurrently(fn, args_list):
    """fn(*args) for each args in its own thread, all started together; the results in order."""
    import threading
    got = [None] * len(args_list)
    start = threading.Barrier(len(args_list))

    def work(i, args):
        start.wait()
        got[i] = fn(*args)
    threads = [threading.Thread(target=work, args=(i, a)) for i, a in enumerate(args_list)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_threads_of_a_session_share_a_weight_safely():
    """Several Python threads asking for the same fresh weight's layout at once (sessions serve
    requests from threads): every product is the exact one."""
    g = torch.Generator().manual_seed(17)
    ws = torch.tensor([0.01])
    for _ in range(5):
        b, zb = _weight(g, 96, 130, "s8")
        args = [(torch.randn(7, 96, generator=g), b, ws, zb) for _ in range(6)]
        got = _concurrently(fused_quant._dyn_quant_matmul, args)
        for a, y in zip(args, got):
            assert torch.equal(y, fused_quant._dyn_quant_matmul(*a))


BATCHED = [((2, 3), (2, 3)), ((4, 1), (1, 5)), ((), (3,)), ((2,), ())]  # batch dims of A and of B (broadcast)


def _operands(g, dtype, lead, m, k):
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    return (torch.randint(lo, hi, (*lead, m, k), dtype=dtype, generator=g),
            torch.tensor(int(torch.randint(lo, hi, (), generator=g)), dtype=dtype))


@pytest.mark.parametrize("a_dtype,b_dtype", [(torch.uint8, torch.uint8), (torch.int8, torch.uint8),
                                             (torch.uint8, torch.int8), (torch.int8, torch.int8)])
def test_batched_products_of_two_changing_operands_are_exact(a_dtype, b_dtype):
    """qbmm (both operands change every call: attention's QLinearMatMuls): the int32 sums equal
    float64's exact product, over broadcast batch dims, row and column tails, and K past one chunk
    of 256 (where the float32 partial sums hand over to int32)."""
    g = torch.Generator().manual_seed(21)
    for (la, lb), (m, k, n) in zip(BATCHED * 2, [(1, 1, 1), (5, 7, 3), (64, 16, 64), (9, 300, 33),
                                                 (4, 257, 17), (3, 600, 40), (13, 64, 70), (2, 1, 130)]):
        a, za = _operands(g, a_dtype, la, m, k)
        b, zb = _operands(g, b_dtype, lb, k, n)
        got = qgemm.batched(a, b, int(za), int(zb))
        want = (a.double() - int(za)) @ (b.double() - int(zb))
        assert got.dtype == torch.int32 and torch.equal(got.double(), want), (la, lb, m, k, n)


@pytest.mark.parametrize("y_dtype", [torch.uint8, torch.int8])
def test_batched_qlinear_matmul_equals_the_torch_path(monkeypatch, y_dtype):
    """QLinearMatMul of two activations (4-D, as a quantized BERT's scores and weighted sums) in one
    qbmm call: bit for bit the torch path (exact product, onnxruntime's requantization); a
    transposed (non-contiguous) B too."""
    from dynashape.ops import quant
    g = torch.Generator().manual_seed(22)
    for lead, (m, k, n) in [((2, 4), (16, 8, 16)), ((1, 2), (7, 300, 5)), ((3, 1), (1, 16, 9))]:
        a, az = _operands(g, torch.uint8, lead, m, k)
        b, bz = _operands(g, torch.uint8, lead, n, k)
        b = b.transpose(-1, -2)  # keys read transposed, as attention's scores do
        ys = torch.tensor(0.05 + 0.5 * float(torch.rand((), generator=g)))
        yz = torch.tensor(7 if y_dtype == torch.uint8 else -3, dtype=y_dtype)
        args = (a, torch.tensor(0.02), az, b, torch.tensor(0.03), bz, ys, yz)
        before = native.counters().get("qgemm_native_calls", 0)
        got = quant._qlinear_matmul(*args)
        assert native.counters()["qgemm_native_calls"] == before + 1
        want = _torch(monkeypatch, quant._qlinear_matmul, *args)
        assert got.dtype == want.dtype == y_dtype and torch.equal(got, want), (lead, m, k, n)


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_batched_products_of_other_cpu_builds(monkeypatch, tmp_path, arch):
    """The plain-C tile other CPUs get (no AVX-512): the same sums."""
    fn = other_build("qgemm", "qbmm", qgemm._batched_kernel(), arch, tmp_path)
    g = torch.Generator().manual_seed(23)
    a, za = _operands(g, torch.uint8, (3,), 10, 300)
    b, zb = _operands(g, torch.int8, (3,), 300, 37)
    want = qgemm.batched(a, b, int(za), int(zb), requant=(4, torch.uint8), mult=0.0007)
    monkeypatch.setattr(qgemm, "_batched_kernel", lambda: fn)
    assert torch.equal(qgemm.batched(a, b, int(za), int(zb), requant=(4, torch.uint8), mult=0.0007), want)
