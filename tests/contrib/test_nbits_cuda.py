"""MatMulNBits with 4-bit weights on CUDA read packed (ops/nbits_triton.py): the kernel of any rows
(DYNASHAPE_NBITS_PACKED=1; called directly for float32 A too) and the rows kernel of a decode step's few
rows (on by default, the level-4 int8 blocks of A made in it), each equal to the product by the
dequantized weight (block_quant._nbits_weight) within the accumulation's rounding, for float32,
float16 (and bfloat16) A, block sizes 16-128, K not a multiple of the block, zero points packed, in
the scales' type or absent, a bias, 1 to 70 rows; and no dequantized copy of the weight is kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import dynashape
from dynashape.ops import block_quant, native, nbits_triton

MS = "com.microsoft"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or nbits_triton.triton is None,
                                reason="the packed kernel needs CUDA and triton")


def _weights(rng, k, n, bs, zp_kind):
    nb = -(-k // bs)
    b = torch.from_numpy(rng.integers(0, 256, (n, nb, bs // 2), dtype=np.uint8))
    scales = torch.from_numpy((rng.uniform(0.005, 0.05, (n, nb))).astype(np.float32))
    if zp_kind == "packed":
        zp = torch.from_numpy(rng.integers(0, 256, (n, (nb + 1) // 2), dtype=np.uint8))
    elif zp_kind == "float":
        zp = torch.from_numpy(rng.uniform(6, 10, (n, nb)).astype(np.float32))
    else:
        zp = None
    return b, scales, zp


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("k, n, bs", [(64, 7, 32), (96, 48, 32), (200, 300, 64), (768, 130, 128), (80, 16, 16)])
@pytest.mark.parametrize("zp_kind", ["none", "packed", "float"])
def test_the_packed_kernel_equals_the_product_by_the_dequantized_weight(k, n, bs, zp_kind, dtype):
    rng = np.random.default_rng(k + n + bs)
    b, scales, zp = _weights(rng, k, n, bs, zp_kind)
    dev = torch.device("cuda")
    b, scales = b.to(dev), scales.to(dev, dtype)
    zp = None if zp is None else zp.to(dev, dtype if zp.dtype != torch.uint8 else torch.uint8)
    bias = torch.randn(n, device=dev, dtype=dtype)
    w = block_quant._nbits_weight(b, scales, zp, None, k, n, 4, bs, torch.float32).to(dtype)
    for m in (1, 5, 70):
        a = torch.randn(m, k, device=dev, dtype=dtype)
        got = nbits_triton.matmul(a, b, scales, zp, bias, k, n, bs)
        want = (a.double() @ w.double().t() + bias.double()).to(dtype)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got, want, **tol)


def test_a_model_runs_the_packed_kernel_and_keeps_no_dequantized_weight(monkeypatch):
    monkeypatch.setattr(nbits_triton, "ENABLED", True)
    rng = np.random.default_rng(3)
    k, n, bs = 256, 96, 32
    b, scales, zp = _weights(rng, k, n, bs, "packed")
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain=MS, K=k, N=n, bits=4, block_size=bs)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT16, ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["m", n])],
                          [numpy_helper.from_array(b.numpy(), "b"),
                           numpy_helper.from_array(scales.numpy().astype(np.float16), "s"),
                           numpy_helper.from_array(zp.numpy(), "z")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    feeds = [rng.standard_normal((m, k)).astype(np.float16) for m in (1, 3, 17)]
    cpu = dynashape.InferenceSession(model.SerializeToString())  # (its dequantized weight is the CPU's)
    want = [cpu.run(None, {"a": a})[0] for a in feeds]
    sess = dynashape.InferenceSession(model.SerializeToString(), device="cuda")
    before_calls = native.counters().get("nbits_packed_cuda_calls", 0)
    before_bytes = block_quant._DEQUANT_BYTES[0]
    for a, w in zip(feeds, want):
        got = sess.run(None, {"a": torch.from_numpy(a).cuda()})[0].cpu().numpy()
        np.testing.assert_allclose(got.astype(np.float32), w.astype(np.float32), atol=2e-2, rtol=2e-2)
    assert native.counters()["nbits_packed_cuda_calls"] >= before_calls + 3
    assert block_quant._DEQUANT_BYTES[0] == before_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("k, n, bs", [(64, 7, 32), (200, 300, 64), (768, 130, 128), (80, 16, 16), (512, 5000, 32)])
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
@pytest.mark.parametrize("level4", [False, True])
def test_the_rows_kernel_equals_the_op_s_dequantized_path(k, n, bs, zp_kind, dtype, level4):
    # a decode step's few rows (nbits_triton.rows): the weight rounded to A's type and, at accuracy
    # level 4, A made int8 blocks as block_quant._int8_blocks makes them; sums in float32
    rng = np.random.default_rng(k + n + bs + level4)
    b, scales, zp = _weights(rng, k, n, bs, zp_kind)
    dev = torch.device("cuda")
    b, scales, zp = b.to(dev), scales.to(dev, dtype), None if zp is None else zp.to(dev)
    bias = torch.randn(n, device=dev, dtype=dtype)
    w = block_quant._nbits_weight(b, scales, zp, None, k, n, 4, bs, torch.float32).to(dtype)
    for m in (1, 3, 8):
        a = torch.randn(2, m, k, device=dev, dtype=dtype)[1]  # (a view: rows at an offset)
        assert nbits_triton.serves_rows(a, 4, bs, None, zp)
        got = nbits_triton.rows(a, b, scales, zp, bias, k, n, bs, level4)
        x = block_quant._int8_blocks(a, bs).to(dtype) if level4 else a
        want = (x.double() @ w.double().t() + bias.double()).to(dtype)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(got, want, **tol)
    assert not nbits_triton.serves_rows(torch.randn(9, k, device=dev, dtype=dtype), 4, bs, None, zp)


def test_a_decode_step_s_products_read_the_packed_weight():
    # accuracy level 4, float32 A, as the builder's CPU models: a session's one-row calls take the rows
    # kernel (counted) and equal the CPU's onnxruntime-exact kernel within the products' rounding
    rng = np.random.default_rng(5)
    k, n, bs = 256, 96, 32
    b, scales, zp = _weights(rng, k, n, bs, "packed")
    node = helper.make_node("MatMulNBits", ["a", "b", "s", "z"], ["y"], domain=MS, K=k, N=n, bits=4, block_size=bs,
                            accuracy_level=4)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                          [numpy_helper.from_array(b.numpy(), "b"), numpy_helper.from_array(scales.numpy(), "s"),
                           numpy_helper.from_array(zp.numpy(), "z")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    feeds = [rng.standard_normal((m, k)).astype(np.float32) for m in (1, 2, 1)]
    cpu = dynashape.InferenceSession(model.SerializeToString())
    sess = dynashape.InferenceSession(model.SerializeToString(), device="cuda")
    before = native.counters().get("nbits_rows_cuda_calls", 0)
    for a in feeds:
        got = sess.run(None, {"a": torch.from_numpy(a).cuda()})[0].cpu().numpy()
        np.testing.assert_allclose(got, cpu.run(None, {"a": a})[0], atol=1e-4, rtol=1e-4)
    assert native.counters()["nbits_rows_cuda_calls"] >= before + 3


@pytest.mark.parametrize("cfg, prequant", [((4, 256, 4), False), ((8, 512, 4), True), ((4, 1024, 4), True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_rows_kernel_with_a_s_blocks_made_first_keeps_its_values(cfg, prequant, dtype, monkeypatch):
    # A's level-4 blocks made by a kernel of their own: the values of the blocks made in the rows kernel,
    # bias and out included
    monkeypatch.setattr(nbits_triton, "ROWS_CONFIG", cfg)
    monkeypatch.setattr(nbits_triton, "PREQUANT", prequant)
    rng = np.random.default_rng(11)
    k, n, bs = 2000, 300, 32
    b, scales, zp = _weights(rng, k, n, bs, "packed")
    dev = torch.device("cuda")
    b, scales, zp = b.to(dev), scales.to(dev, dtype), zp.to(dev)
    bias = torch.randn(n, device=dev, dtype=dtype)
    w = block_quant._nbits_weight(b, scales, zp, None, k, n, 4, bs, torch.float32).to(dtype)
    for m, level4 in ((1, True), (3, True), (2, False)):
        a = torch.randn(m, k, device=dev, dtype=dtype)
        out = torch.empty(m, n, device=dev, dtype=dtype)
        assert nbits_triton.rows(a, b, scales, zp, bias, k, n, bs, level4, out) is out
        x = block_quant._int8_blocks(a, bs).to(dtype) if level4 else a
        want = (x.double() @ w.double().t() + bias.double()).to(dtype)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(out, want, **tol)
