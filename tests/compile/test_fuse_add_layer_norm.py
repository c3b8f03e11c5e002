"""``fuse_add_layer_norm`` (compile/fuse_add_layer_norm.py, ops/add_layer_norm.py): a residual add
and the LayerNormalization after it as one op, and its Triton kernel. Models run over sequences of
changing shapes with fresh random inputs in the fused compiled session, the interpreter and
onnxruntime; near misses must not fuse. The pass runs on CUDA sessions only; here it is switched
on for CPU sessions too, where the op's torch form serves; the kernel itself runs in Triton's
interpreter on the CPU, compiled on a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.compile import pipeline
from dynashape.ops import add_layer_norm as aln
from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops, randn
from tests.helpers import run_interpreted

H = 24
SHAPES = [(1, 1), (2, 5), (3, 1), (1, 7), (2, 5)]


@pytest.fixture(autouse=True)
def _on_cpu_too(monkeypatch):
    monkeypatch.setattr(pipeline, "RESIDUAL_FUSION_DEVICES", ("cuda", "cpu"))


def post_norm_model(r_shape=("b", "s", H), beta=True, sum_also_output=False, mean_used=False):
    """x @ W + bias, plus a residual, then LayerNormalization: a post-norm layer's end."""
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", ["b", "s", H])
    r = b.input("r", list(r_shape))
    p = b.op("Add", b.op("MatMul", x, b.const(rng.standard_normal((H, H)) / 4)), b.const(rng.standard_normal(H)))
    s = b.op("Add", p, r)
    ins = [s, b.const(rng.standard_normal(H) + 1)] + ([b.const(rng.standard_normal(H))] if beta else [])
    if mean_used:
        out = f"t{len(b.nodes)}_ln"
        from onnx import helper
        b.nodes.append(helper.make_node("LayerNormalization", ins, [out, "mean"], epsilon=1e-5, name="ln"))
        return b.model([out, "mean"])
    y = b.op("LayerNormalization", *ins, epsilon=1e-5)
    return b.model([y] + ([s] if sum_also_output else []))


def _feeds(rng, r=lambda b, s: (b, s, H)):
    return [{"x": randn(rng, b, s, H), "r": randn(rng, *r(b, s))} for b, s in SHAPES]


def test_the_pass_is_cuda_only_by_default(monkeypatch):
    monkeypatch.setattr(pipeline, "RESIDUAL_FUSION_DEVICES", ("cuda",))
    assert "fuse_add_layer_norm" not in [n for n, _ in pipeline.device_passes("cpu")]
    assert "fuse_add_layer_norm" in [n for n, _ in pipeline.device_passes("cuda:0")]


@pytest.mark.parametrize("beta", [True, False])
def test_a_residual_add_and_its_norm_become_one_op(beta):
    sess = check_sequence(post_norm_model(beta=beta), _feeds(np.random.default_rng(1)))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.AddLayerNorm"] == 1 and ops["LayerNormalization"] == 0, dict(ops)


@pytest.mark.parametrize("case", ["broadcast residual", "sum also an output", "mean read"])
def test_near_misses_keep_their_nodes(case):
    rng = np.random.default_rng(2)
    if case == "broadcast residual":
        model, feeds = post_norm_model(r_shape=(1, 1, H)), _feeds(rng, lambda b, s: (1, 1, H))
    else:
        model, feeds = post_norm_model(**{"sum also an output": {"sum_also_output": True},
                                          "mean read": {"mean_used": True}}[case]), _feeds(rng)
    ops = fused_ops(check_sequence(model, feeds))
    assert ops[f"{FUSED}.AddLayerNorm"] == 0 and ops["LayerNormalization"] == 1, dict(ops)


def test_a_sessions_load_knows_the_kernel_forms_its_norms_take():
    """(warm compiles them at a CUDA session's load: a first call paid ~0.1 s for them.)"""
    from dynashape.compile.pipeline import compile_graph
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model, prepare_proto

    def forms(model):
        return aln.forms(compile_graph(parse_model(prepare_proto(model), ParseOptions()), device="cuda").fused)
    assert forms(post_norm_model()) == {(True, True, H, torch.float32)}
    assert forms(post_norm_model(beta=False, sum_also_output=True)) == {(False, False, H, torch.float32)}


def test_the_torch_form_writes_where_it_is_told():
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(2, 3, H, generator=g), torch.randn(2, 3, H, generator=g)
    gamma, beta = torch.randn(H, generator=g), torch.randn(H, generator=g)
    want = torch.nn.functional.layer_norm(x + r, (H,), gamma, beta, 1e-5)
    out = torch.full((2, 3, H), float("nan"))
    assert aln.add_layer_norm(x, r, gamma, beta, 1e-5, out) is out
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(aln.add_layer_norm(x, None, gamma, None, 1e-5),
                               torch.nn.functional.layer_norm(x, (H,), gamma, None, 1e-5))


KERNEL_CASES = """
cases = [(5, 768, True, True), (3, 7, False, True), (4, 1000, True, False), (1, 1, True, True)]
for rows, n, with_r, with_beta in cases:
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(rows * n)
        x = (torch.randn(rows, n, generator=g) * 3 + 1).to(dtype)
        r = torch.randn(rows, n, generator=g).to(dtype) if with_r else None
        gamma = torch.randn(n, generator=g).to(dtype)
        beta = torch.randn(n, generator=g).to(dtype) if with_beta else None
        s = x.float() if r is None else (x + r).float()  # a half sum rounded, as the Add rounds it
        want = torch.nn.functional.layer_norm(s, (n,), gamma.float(), None if beta is None else beta.float(), 1e-5)
        for out in (None, torch.full((rows, n), float("nan"), dtype=dtype, device=x.device)):
            got = aln.add_layer_norm(x, r, gamma, beta, 1e-5, out)
            assert out is None or got is out
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
"""

INTERPRETED = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from dynashape.ops import add_layer_norm as aln
calls = aln.KERNEL_CALLS[0]
""" + KERNEL_CASES + """
assert aln.KERNEL_CALLS[0] > calls  # the kernel served, not torch's form
print("ok")
"""


def test_the_kernel_interpreted_on_the_cpu_matches_torch():
    run_interpreted(INTERPRETED)


cuda = pytest.mark.skipif(not torch.cuda.is_available() or aln.triton is None, reason="needs CUDA and Triton")


@cuda
def test_the_kernel_compiled_matches_torch():
    namespace = {"torch": torch, "aln": aln}
    calls = aln.KERNEL_CALLS[0]
    # the same cases as the interpreter's, their tensors made on the GPU
    exec(KERNEL_CASES.replace("generator=g)", "generator=g).cuda()"), namespace)  # noqa: S102
    assert aln.KERNEL_CALLS[0] > calls
    # a pointer not 16-byte aligned
    x = torch.randn(3 * 768 + 1, device="cuda")[1:].view(3, 768)
    gamma = torch.randn(768, device="cuda")
    torch.testing.assert_close(aln.add_layer_norm(x, None, gamma, None, 1e-5),
                               torch.nn.functional.layer_norm(x, (768,), gamma, None, 1e-5), atol=1e-5, rtol=1e-5)


@cuda
def test_a_layer_norm_into_its_buffer_takes_the_kernel_on_cuda():
    import dynashape
    rng = np.random.default_rng(4)
    model = post_norm_model()
    sess = dynashape.InferenceSession(model, device="cuda", static_impls="off")
    import onnxruntime as ort
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    calls = aln.KERNEL_CALLS[0]
    for feeds in _feeds(rng):
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert aln.KERNEL_CALLS[0] >= calls + len(SHAPES)
