"""``fuse_matmul_add`` and ``fuse_silu_mul`` (compile/fuse_residual.py, ops/residual.py): the
residual add joins its product, the SwiGLU gate joins its SiLU. Each model runs over a sequence
of changing shapes with fresh random inputs in the fused compiled session, the interpreter (the
unfused graph) and onnxruntime; near misses must not fuse. The passes run on CUDA sessions only
(measured); here they are switched on for CPU sessions too, to test them where CI runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.compile import pipeline
from dynashape.ops import residual
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_nodes, fused_ops, randn
from tests.helpers import run_interpreted

K, N = 16, 24
CUDA_ONLY = pipeline.RESIDUAL_FUSION_DEVICES  # as shipped, before the fixture switches CPU on


@pytest.fixture(autouse=True)
def _on_cpu_too(monkeypatch):
    monkeypatch.setattr(pipeline, "RESIDUAL_FUSION_DEVICES", ("cuda", "cpu"))


def test_the_passes_are_cuda_only_by_default(monkeypatch):
    monkeypatch.setattr(pipeline, "RESIDUAL_FUSION_DEVICES", CUDA_ONLY)

    def names(device):
        return [n for n, _ in pipeline.device_passes(device) if n in ("fuse_silu_mul", "fuse_matmul_add")]
    assert names("cpu") == [] and names("cuda:1") == ["fuse_silu_mul", "fuse_matmul_add"]

SHAPES = [(1, 1), (2, 5), (3, 1), (1, 7), (2, 5)]


def _feeds(rng, shapes, **extra):
    return [{"x": randn(rng, b, s, K), **{k: randn(rng, *f(b, s)) for k, f in extra.items()}} for b, s in shapes]


def residual_model(swap=False, r_shape=("b", "s", N), also_output=False):
    b = Builder()
    x = b.input("x", ["b", "s", K])
    r = b.input("r", list(r_shape))
    p = b.op("MatMul", x, b.const(np.random.default_rng(0).standard_normal((K, N))))
    y = b.op("Add", *((r, p) if swap else (p, r)))
    return b.model([y] + ([p] if also_output else []))


@pytest.mark.parametrize("swap", [False, True])
def test_residual_add_rides_the_product(swap):
    rng = np.random.default_rng(1)
    sess = check_sequence(residual_model(swap), _feeds(rng, SHAPES, r=lambda b, s: (b, s, N)))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.MatMulAdd"] == 1 and ops["MatMul"] == 0 and ops["Add"] == 0, dict(ops)
    (node,) = fused_nodes(sess, "MatMulAdd")
    assert node.attrs["transposed"] == 0  # a float32 product on CPU keeps its [in, out] weight


@pytest.mark.parametrize("case", ["broadcast residual", "product also an output"])
def test_residual_add_near_misses_do_not_fuse(case):
    rng = np.random.default_rng(2)
    if case == "broadcast residual":
        model, r = residual_model(r_shape=(1, 1, N)), (lambda b, s: (1, 1, N))
    else:
        model, r = residual_model(also_output=True), (lambda b, s: (b, s, N))
    sess = check_sequence(model, _feeds(rng, SHAPES, r=r))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.MatMulAdd"] == 0 and ops["Add"] == 1, dict(ops)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matmul_add_kernel_reads_either_layout_and_writes_out(dtype):
    g = torch.Generator().manual_seed(3)
    x, w, r = (torch.randn(*s, generator=g, dtype=dtype) for s in ((2, 3, K), (K, N), (2, 3, N)))
    want = x @ w + r
    torch.testing.assert_close(residual._matmul_add(x, w, r), want)
    torch.testing.assert_close(residual._matmul_add(x, w.t().contiguous(), r, transposed=1), want)
    out = torch.full((2, 3, N), float("nan"), dtype=dtype)
    assert residual._matmul_add(x, w, r, out=out) is out
    torch.testing.assert_close(out, want)
    strided = torch.full((2, 3, 2 * N), float("nan"), dtype=dtype)[..., :N]  # not contiguous: copied into
    residual._matmul_add(x, w, r, out=strided)
    torch.testing.assert_close(strided, want)


def swiglu_model(gate_broadcast=False, sigmoid_first=False):
    b = Builder()
    a = b.input("a", ["b", "s", N])
    u = b.input("u", ["b", 1, N] if gate_broadcast else ["b", "s", N])
    sig = b.op("Sigmoid", a)
    silu = b.op("Mul", *((sig, a) if sigmoid_first else (a, sig)))
    return b.model([b.op("Mul", silu, u)])


@pytest.mark.parametrize("sigmoid_first", [False, True])
def test_swiglu_gate_joins_its_silu(sigmoid_first):
    rng = np.random.default_rng(4)
    feeds = [{"a": randn(rng, b, s, N), "u": randn(rng, b, s, N)} for b, s in SHAPES]
    sess = check_sequence(swiglu_model(sigmoid_first=sigmoid_first), feeds)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.SiluMul"] == 1 and ops[f"{FUSED}.Silu"] == 0 and ops["Mul"] == 0, dict(ops)


def test_swiglu_gate_that_broadcasts_keeps_its_mul():
    rng = np.random.default_rng(5)
    feeds = [{"a": randn(rng, b, s, N), "u": randn(rng, b, 1, N)} for b, s in SHAPES]
    sess = check_sequence(swiglu_model(gate_broadcast=True), feeds)
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.SiluMul"] == 0 and ops[f"{FUSED}.Silu"] == 1 and ops["Mul"] == 1, dict(ops)


@pytest.mark.skipif(not torch.cuda.is_available() or residual.triton is None, reason="needs CUDA and Triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_silu_mul_triton_matches_torch_on_strided_halves(dtype):
    """The gate and the input as the merged gate/up product hands them out: halves of one buffer."""
    g = torch.Generator(device="cuda").manual_seed(6)
    for rows, d in ((1, 2048), (3, 5), (7, 1500)):
        merged = torch.randn(rows, 1, 2 * d, generator=g, device="cuda", dtype=dtype)
        a, u = merged[..., :d], merged[..., d:]
        want = residual.silu_mul_torch(a, u)
        got = residual._silu_mul(a, u)
        tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        out = torch.empty(rows, 1, d, device="cuda", dtype=dtype)
        assert residual._silu_mul(a, u, out=out) is out
        torch.testing.assert_close(out, want, atol=tol, rtol=tol)


def test_rmsnorm_joins_the_linear_that_reads_it_on_cuda():
    """Compiled for CUDA (the passes run at compile time, no GPU needed): each decoder layer's two
    norms are read by one merged product each, the final norm by the LM head."""
    import onnx

    from dynashape.compile.pipeline import compile_graph
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model
    from tests.models import llama
    program = compile_graph(parse_model(onnx.load(str(llama.model_path())), ParseOptions()), device="cuda")
    ops = [n.op_type for n in program.fused.nodes]
    assert ops.count("RMSNormLinear") == 2 * llama.TINY["layers"] + 1 and ops.count("RMSNorm") == 0
    for n in program.fused.nodes:
        if n.op_type == "RMSNormLinear":
            assert n.inputs[2].const.dtype == torch.float32 and n.attrs["epsilon"] > 0


@pytest.mark.parametrize("rows", [1, 3])
def test_rmsnorm_linear_torch_form_is_the_two_ops(rows):
    g = torch.Generator().manual_seed(7)
    x, nw, w = torch.randn(rows, 1, K, generator=g), torch.randn(K, generator=g), torch.randn(N, K, generator=g)
    want = torch.nn.functional.linear(torch.nn.functional.rms_norm(x, (K,), nw, 1e-6), w)
    torch.testing.assert_close(residual._norm_linear(x, nw, w, epsilon=1e-6), want, atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available() or residual.triton is None, reason="needs CUDA and Triton")
@pytest.mark.parametrize("k,n", [(768, 1280), (768, 4096), (2048, 768), (100, 37)])
def test_rmsnorm_linear_triton_one_row(k, n):
    g = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randn(1, 1, k, generator=g, device="cuda")
    nw = torch.randn(k, generator=g, device="cuda")
    w = torch.randn(n, k, generator=g, device="cuda") / k ** 0.5
    got = residual._norm_linear(x, nw, w, epsilon=1e-5)
    want = torch.nn.functional.linear(torch.nn.functional.rms_norm(x.double(), (k,), nw.double(), 1e-5), w.double())
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


def mlp_model(gate_also_output=False):
    """A SwiGLU MLP's end: silu(a) * u, its down projection, the residual."""
    b = Builder()
    a = b.input("a", ["b", "s", K])
    u = b.input("u", ["b", "s", K])
    r = b.input("r", ["b", "s", N])
    gate = b.op("Mul", b.op("Mul", a, b.op("Sigmoid", a)), u)
    y = b.op("Add", b.op("MatMul", gate, b.const(np.random.default_rng(9).standard_normal((K, N)))), r)
    return b.model([y] + ([gate] if gate_also_output else []))


def _mlp_feeds(rng):
    return [{"a": randn(rng, b, s, K), "u": randn(rng, b, s, K), "r": randn(rng, b, s, N)} for b, s in SHAPES]


def test_the_gate_joins_the_down_projection_and_its_residual():
    sess = check_sequence(mlp_model(), _mlp_feeds(np.random.default_rng(10)))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.GatedMatMulAdd"] == 1 and ops[f"{FUSED}.SiluMul"] == 0, dict(ops)
    assert ops[f"{FUSED}.MatMulAdd"] == 0 and ops["MatMul"] == 0 and ops["Add"] == 0, dict(ops)


def test_a_gate_read_elsewhere_stays_apart():
    sess = check_sequence(mlp_model(gate_also_output=True), _mlp_feeds(np.random.default_rng(11)))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.GatedMatMulAdd"] == 0 and ops[f"{FUSED}.SiluMul"] == 1 and ops[f"{FUSED}.MatMulAdd"] == 1


def test_the_decoder_compiled_for_cuda_has_one_gated_product_a_layer():
    import onnx

    from dynashape.compile.pipeline import compile_graph
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model
    from tests.models import llama
    program = compile_graph(parse_model(onnx.load(str(llama.model_path())), ParseOptions()), device="cuda")
    ops = [n.op_type for n in program.fused.nodes]
    assert ops.count("GatedMatMulAdd") == llama.TINY["layers"] and ops.count("SiluMul") == 0
    assert ops.count("MatMulAdd") == llama.TINY["layers"]  # the attention's output projection


ONE_ROW = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from dynashape.ops import residual
g = torch.Generator().manual_seed(12)
for k, n in ((64, 24), (300, 37), (512, 256)):
    x, u = torch.randn(1, 1, k, generator=g), torch.randn(1, 1, k, generator=g)
    w, r = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(1, 1, n, generator=g)
    assert residual._one_row(x, w, r, 1, None)
    torch.testing.assert_close(residual._matmul_add(x, w, r, transposed=1), x @ w.t() + r, atol=2e-6, rtol=1e-5)
    want = (torch.nn.functional.silu(x) * u) @ w.t() + r
    out = torch.full((1, 1, n), float("nan"))
    assert residual._gated_matmul_add(x, w, r, u, transposed=1, out=out) is out
    torch.testing.assert_close(out, want, atol=2e-6, rtol=1e-5)
    # the gate and the input as halves of the merged gate/up product
    merged = torch.randn(1, 1, 2 * k, generator=g)
    a, b = merged[..., :k], merged[..., k:]
    want = (torch.nn.functional.silu(a) * b) @ w.t() + r
    torch.testing.assert_close(residual._gated_matmul_add(a, w, r, b, transposed=1), want, atol=2e-6, rtol=1e-5)
x = torch.randn(2, 1, 64, generator=g)  # two rows: the two ops as before
assert not residual._one_row(x, torch.randn(24, 64), torch.randn(2, 1, 24), 1, None)
for k, n in ((64, 24), (300, 1500)):  # RMSNormLinear's row: the same kernel, the norm as it reads the row
    x, nw, w = torch.randn(1, 1, k, generator=g), torch.randn(k, generator=g), torch.randn(n, k, generator=g)
    want = torch.nn.functional.linear(torch.nn.functional.rms_norm(x, (k,), nw, 1e-6), w)
    torch.testing.assert_close(residual._norm_linear(x, nw, w, epsilon=1e-6), want, atol=1e-5, rtol=1e-5)
for dt in (torch.float16, torch.bfloat16):  # a half row: float32 sums, f's result rounded as the ops round it
    tol = dict(atol=2e-2, rtol=2e-2)
    for k, n in ((64, 24), (300, 37)):
        merged = torch.randn(1, 1, 2 * k, generator=g).to(dt)
        a, b = merged[..., :k], merged[..., k:]
        w, r = (torch.randn(n, k, generator=g) / k ** 0.5).to(dt), torch.randn(1, 1, n, generator=g).to(dt)
        assert residual._one_row(a, w, r, 1, None)
        want = (residual.silu_mul_torch(a, b).float() @ w.float().t() + r.float()).to(dt)
        torch.testing.assert_close(residual._gated_matmul_add(a, w, r, b, transposed=1), want, **tol)
        torch.testing.assert_close(residual._matmul_add(a, w, r, transposed=1),
                                   (a.float() @ w.float().t() + r.float()).to(dt), **tol)
        nw = torch.randn(k, generator=g).to(dt)
        normed = torch.nn.functional.rms_norm(a.float(), (k,), nw.float(), 1e-6).to(dt)
        torch.testing.assert_close(residual._norm_linear(a, nw, w, epsilon=1e-6),
                                   (normed.float() @ w.float().t()).to(dt), **tol)
print("ok")
"""


def test_one_row_kernel_interpreted_on_the_cpu_matches_the_ops():
    run_interpreted(ONE_ROW)


@pytest.mark.skipif(not torch.cuda.is_available() or residual.triton is None, reason="needs CUDA and Triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k,n", [(768, 768), (2048, 768), (100, 37)])
def test_one_row_kernel_on_cuda_matches_the_ops(k, n, dtype):
    g = torch.Generator(device="cuda").manual_seed(13)
    merged = torch.randn(1, 1, 2 * k, generator=g, device="cuda").to(dtype)
    a, b = merged[..., :k], merged[..., k:]
    w = (torch.randn(n, k, generator=g, device="cuda") / k ** 0.5).to(dtype)
    r = torch.randn(1, 1, n, generator=g, device="cuda").to(dtype)
    assert residual._one_row(a, w, r, 1, None)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    want = (residual.silu_mul_torch(a, b).double() @ w.t().double() + r.double()).to(dtype)
    torch.testing.assert_close(residual._gated_matmul_add(a, w, r, b, transposed=1), want, **tol)
    plain = (a.double() @ w.t().double() + r.double()).to(dtype)
    torch.testing.assert_close(residual._matmul_add(a, w, r, transposed=1), plain, **tol)
    nw = torch.randn(k, generator=g, device="cuda").to(dtype)
    normed = torch.nn.functional.rms_norm(a.double(), (k,), nw.double(), 1e-5).to(dtype)
    torch.testing.assert_close(residual._norm_linear(a, nw, w, epsilon=1e-5), (normed.double() @ w.t().double())
                               .to(dtype), **tol)
