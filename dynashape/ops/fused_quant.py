"""Fused dynamic-quantization products (domain ``com.dynashape``), what ``fuse_dynamic_quant``
rewrites onnxruntime.quantization.quantize_dynamic's pattern into:

    DynamicQuantizeLinear(x) -> (xq, xs, xz)
    MatMulInteger(xq, W, xz, Wz) -> Cast(float) -> Mul(., Mul(xs, Ws)) [-> Add(., bias)]

* ``DynQuantMatMul(x, W, Ws, Wz?, bias?)``: the whole chain, for a DynamicQuantizeLinear that feeds
  one product;
* ``DynQuantize(x) -> (xc, xs, xz)`` and ``QMatMulCentered(xc, xs, xz, W, Ws, Wz?, bias?)``: for one
  that feeds several (a transformer's query, key and value projections): the quantization once,
  its values handed on centered (``xq - xz`` as float32, what the product reads), then one call per
  product.

On the CPU each is one call of csrc/qgemm.c (quantization, exact product, scales and bias) where it
serves (qgemm.py), else the torch path below. The results are those of the unfused nodes, bit for
bit: the quantization is onnxruntime's
(quant.dynamic_qparams / quantize_u8), the integer product exact (integer_gemm.qmatmul's engine), then
float32(acc) * float32(xs * Ws) [+ bias] in float32 as Cast, Mul and Add compute it. With
linalg.set_u8s8_saturation(True) the product saturates as onnxruntime's AVX2 kernels do, as the
unfused MatMulInteger then does.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from . import native, qgemm
from .indexing import _gather
from .integer_gemm import int8_product, int_product, prepared_b, saturation_correction
from .linalg import _matmul_shape
from .quant import _dequantize, _dql_tensor_path, host_qparams, quantize_u8
from .registry import COMPUTED, binder, op
from .u8s8 import u8s8_saturation

DOMAIN = "com.dynashape"


def _quantize(x: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, float | torch.Tensor, int]:
    """(xq - xz as float32, xs, xz) of DynamicQuantizeLinear(x); xs a float on the CPU, else a 0-d
    tensor (and xz then 0: the values come back as xq, uncentered, with the zero point in a tensor)."""
    xf = x if x.dtype == torch.float32 else x.to(torch.float32)
    qp = host_qparams(xf)
    if qp is None:
        y, scale, zp = _dql_tensor_path(xf)
        return y.sub_(zp), scale, zp
    scale, zp = qp
    if out is not None:
        q = torch.div(xf, scale, out=out).round_().clamp_(-zp, 255 - zp)
    else:
        q = quantize_u8(xf, scale, zp)
    return q, scale, zp


def _product(xc: torch.Tensor, zp, b, b_zero_point, out: torch.Tensor | None) -> torch.Tensor:
    """float32(exact (xq - xz) @ (W - Wz)), into ``out`` when given and one float32 chunk served."""
    prep = prepared_b(b, b_zero_point)
    amax = max(zp, 255 - zp) if isinstance(zp, int) else 255
    if u8s8_saturation() and b.dtype == torch.int8:
        zq = zp if isinstance(zp, int) else zp.to(torch.float32)
        r = int_product(xc, prep, amax).double()
        c = saturation_correction((xc + zq).to(torch.uint8), prep)
        if c is not None:
            r = r.add_(c)
        return r.to(torch.float32)
    r = int8_product(xc, zp, prep, centered=True)  # int32 through torch._int_mm where that is fast
    if r is not None:
        return r.to(torch.float32) if out is None else out.copy_(r)
    plan = prep.plan(amax)
    if out is not None and plan is not None and len(plan) == 1 and prep.bf.dim() == 2 and out.is_contiguous():
        if xc.dim() <= 2:
            return torch.matmul(xc, prep.bf, out=out)
        torch.mm(xc.reshape(-1, xc.shape[-1]), prep.bf, out=out.view(-1, out.shape[-1]))
        return out
    r = int_product(xc, prep, amax)
    return r if r.dtype == torch.float32 else r.to(torch.float32)


def _multiplier(xs, b_scale: torch.Tensor) -> float | torch.Tensor:
    """Mul(xs, Ws) in float32: a float when both are single values on the host."""
    if isinstance(xs, float) and b_scale.numel() == 1 and b_scale.device.type == "cpu":
        return float(np.float32(xs) * np.float32(b_scale.item()))
    xs_t = xs if isinstance(xs, torch.Tensor) else torch.tensor(xs, dtype=torch.float32, device=b_scale.device)
    return xs_t.to(torch.float32) * b_scale.to(torch.float32)


def _finish(r: torch.Tensor, mult, bias) -> torch.Tensor:
    r = r.mul_(mult)
    return r if bias is None else r.add_(bias)


def _dqmm_infer(shapes, values):
    return [_matmul_shape(shapes[0], shapes[1], "DynQuantMatMul")]


@op("DynQuantMatMul", 1, DOMAIN, infer=_dqmm_infer,
    notes="DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scales) [-> Add bias] (fuse_dynamic_quant)")
def _dyn_quant_matmul(x, b, b_scale, b_zero_point=None, bias=None, *, out=None):
    if x.device.type == "cpu" and not (u8s8_saturation() and b.dtype == torch.int8):
        r = qgemm.product(x, qgemm.A_DYNAMIC, prepared_b(b, b_zero_point), b_scale=b_scale, bias=bias, out=out)
        if r is not None:
            return r if out is None or r is out else out.copy_(r)
    xc, xs, zp = _quantize(x)
    r = _finish(_product(xc, zp, b, b_zero_point, out), _multiplier(xs, b_scale), bias)
    return r if out is None or r is out else out.copy_(r)


def _bound_b(consts, b_at: int):
    """(qgemm.bind's function, whether B is int8) for a fused 8-bit product whose B side is
    constants (inputs b_at .. b_at + 3: B, its scale, zero point and bias, the last two optional),
    or None."""
    c = list(consts) + [None] * (b_at + 4 - len(consts))
    b, b_scale, b_zp, bias = c[b_at:b_at + 4]
    if any(t is COMPUTED for t in (b, b_scale, b_zp, bias)) or b is None or b_scale is None \
            or b.device.type != "cpu" or b.dim() != 2:
        return None
    run = qgemm.bind(prepared_b(b, b_zp), b_scale=b_scale, bias=bias)
    return None if run is None else (run, b.dtype == torch.int8)


@binder("DynQuantMatMul", DOMAIN)
def _bind_dyn_quant_matmul(consts, attrs):
    """DynQuantMatMul of constant B, scales and bias: qgemm.c's B and epilogue read once
    (qgemm.bind); the op itself where that does not serve."""
    got = _bound_b(consts, 1)
    if got is None:
        return None
    run, int8 = got

    def kernel(x, b, b_scale, b_zero_point=None, bias=None, *, out=None):
        if not (int8 and u8s8_saturation()):
            r = run(x, qgemm.A_DYNAMIC, out=out)
            if r is not None:
                return r if out is None or r is out else out.copy_(r)
        return _dyn_quant_matmul(x, b, b_scale, b_zero_point, bias, out=out)

    return kernel


def _dq_infer(shapes, values):
    return [shapes[0], (), ()]


@op("DynQuantize", 1, DOMAIN, infer=_dq_infer,
    notes="DynamicQuantizeLinear whose values are handed on centered, as float32 (fuse_dynamic_quant)")
def _dyn_quantize(x, *, out=None):
    r = qgemm.centered(x, None if out is None else out[0])
    xc, xs, zp = r if r is not None else _quantize(x, None if out is None else out[0])
    if out is None:
        dev = x.device
        return (xc, xs if isinstance(xs, torch.Tensor) else torch.tensor(xs, dtype=torch.float32, device=dev),
                zp.to(torch.uint8) if isinstance(zp, torch.Tensor) else torch.tensor(zp, dtype=torch.uint8, device=dev))
    if xc is not out[0]:
        out[0].copy_(xc)
    if isinstance(xs, torch.Tensor):
        out[1].copy_(xs)
        out[2].copy_(zp)
    else:
        out[1].fill_(xs)
        out[2].fill_(zp)
    return out


def _qmc_infer(shapes, values):
    return [_matmul_shape(shapes[0], shapes[3], "QMatMulCentered")]


@op("QMatMulCentered", 1, DOMAIN, infer=_qmc_infer,
    notes="MatMulInteger -> Cast -> Mul(scales) [-> Add bias] of a DynQuantize's output (fuse_dynamic_quant)")
def _qmatmul_centered(xc, x_scale, x_zero_point, b, b_scale, b_zero_point=None, bias=None, *, out=None):
    if x_zero_point.device.type == "cpu" and x_scale.device.type == "cpu":
        zp, xs = int(x_zero_point.item()), float(x_scale.item())
        if not (u8s8_saturation() and b.dtype == torch.int8):
            r = qgemm.product(xc, qgemm.A_CENTERED, prepared_b(b, b_zero_point), a_scale=xs, a_zp=zp,
                              b_scale=b_scale, bias=bias, out=out)
            if r is not None:
                return r if out is None or r is out else out.copy_(r)
    else:
        zp, xs = x_zero_point, x_scale
    r = _product(xc, zp, b, b_zero_point, out)
    r = _finish(r, _multiplier(xs, b_scale), bias)
    return r if out is None or r is out else out.copy_(r)


@binder("QMatMulCentered", DOMAIN)
def _bind_qmatmul_centered(consts, attrs):
    """QMatMulCentered of constant B, scales and bias: as DynQuantMatMul's bound form, A's scale
    and zero point read from their tensors each call."""
    got = _bound_b(consts, 3)
    if got is None:
        return None
    run, int8 = got

    def kernel(xc, x_scale, x_zero_point, b, b_scale, b_zero_point=None, bias=None, *, out=None):
        if x_zero_point.device.type == "cpu" and x_scale.device.type == "cpu" and not (int8 and u8s8_saturation()):
            r = run(xc, qgemm.A_CENTERED, float(x_scale.item()), int(x_zero_point.item()), out)
            if r is not None:
                return r if out is None or r is out else out.copy_(r)
        return _qmatmul_centered(xc, x_scale, x_zero_point, b, b_scale, b_zero_point, bias, out=out)

    return kernel


# A QuantizeLinear whose every reader is a DequantizeLinear of the same scale and zero point (the
# QDQ format's activations): fuse_qdq.py makes the pair one op.
def _fake_quant_infer(shapes, values, *, lo=0, hi=255):
    return [shapes[0]]


@op("FakeQuant", 1, DOMAIN, infer=_fake_quant_infer,
    notes="QuantizeLinear then DequantizeLinear of one per-tensor scale and zero point, in float32")
def _fake_quant(x, scale, zero_point, *, lo=0, hi=255, out=None):
    """(clamp(round(x / s) + z, lo, hi) - z) * s, what the two nodes compute, bit for bit: every
    value between the division and the multiplication is a small integer, exact in float32, so
    adding z, clamping to [lo, hi] and taking z away is clamping to [lo - z, hi - z]. The scale
    stays a tensor, as the unfused kernels read it (a device divides by a host float as a
    multiplication by its reciprocal). A NaN stays NaN, where the unfused cast to an integer
    type gives whatever the platform's conversion gives."""
    z = int(zero_point.item()) if zero_point is not None else 0
    y = _fake_quant_native(x, scale, lo - z, hi - z, out)
    if y is not None:
        return y
    s = scale.reshape(()).to(torch.float32)
    q = torch.div(x, s, out=out) if out is not None else torch.div(x, s)
    return q.round_().clamp_(lo - z, hi - z).mul_(s)


_FAKE_QUANT_THREAD_MIN = 1 << 16  # elements below which a second thread costs more than it saves


@binder("FakeQuant", DOMAIN)
def _bind_fake_quant(consts, attrs):
    """FakeQuant with a constant float32 scale (and zero point): both read once, the C pass called
    straight into ``out`` when x and ``out`` are contiguous float32 (~2.4 against ~5.6 us a call
    at 4096 elements; bert-qdq runs 58 a call); anything else goes to the op itself."""
    scale = consts[1] if len(consts) > 1 else None
    zp = consts[2] if len(consts) > 2 else None
    if scale is None or scale is COMPUTED or zp is COMPUTED or scale.dtype != torch.float32 \
            or scale.device.type != "cpu" or scale.numel() != 1 or (zp is not None and zp.numel() != 1):
        return None
    fn = native.function("elementwise", "fake_quant_f32", "pidddpi", fallbacks="fake_quant")
    if fn is None:
        return None
    lo, hi = attrs.get("lo", 0), attrs.get("hi", 255)
    z = int(zp.item()) if zp is not None else 0
    s, lo_z, hi_z = scale.item(), float(lo - z), float(hi - z)

    def kernel(x, scale, zero_point, *, out=None):
        if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous() or (
                out is not None and (out.dtype != torch.float32 or out.shape != x.shape or not out.is_contiguous())):
            return _fake_quant(x, scale, zero_point, lo=lo, hi=hi, out=out)
        if out is None:
            out = torch.empty_like(x)
        n = x.numel()
        threads = torch.get_num_threads() if n >= _FAKE_QUANT_THREAD_MIN else 1
        fn(x.data_ptr(), n, s, lo_z, hi_z, out.data_ptr(), threads)
        native.count("fake_quant_native_calls")
        return out

    return kernel


def _fake_quant_native(x: torch.Tensor, scale: torch.Tensor, lo: int, hi: int, out) -> torch.Tensor | None:
    """FakeQuant of a float32 CPU x with a float32 scale in one C call (csrc/elementwise.c
    fake_quant_f32: the same four float32 operations), or None (the torch calls then)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or scale.dtype != torch.float32 \
            or scale.device.type != "cpu" or scale.numel() != 1:
        return None
    fn = native.function("elementwise", "fake_quant_f32", "pidddpi", fallbacks="fake_quant")
    if fn is None:
        return None
    x, out = native.dense_pair(x, out, torch.float32)
    n = x.numel()
    fn(x.data_ptr(), n, scale.item(), float(lo), float(hi), out.data_ptr(),
       torch.get_num_threads() if n >= _FAKE_QUANT_THREAD_MIN else 1)
    native.count("fake_quant_native_calls")
    return out


# A Gather of rows of a constant 8-bit table and the DequantizeLinear of one scale and zero point
# after it (quantize_dynamic's embeddings): fuse_gather_dequant.py makes the pair one op.
def _gather_dequant_infer(shapes, values):
    return [tuple(shapes[1]) + tuple(shapes[0][1:])]


@op("GatherDequant", 1, DOMAIN, infer=_gather_dequant_infer,
    notes="Gather (axis 0) of a constant 8-bit table, then DequantizeLinear of one scale and zero point")
def _gather_dequant(table, indices, scale, zero_point=None, *, out=None):
    """What the two nodes compute: the rows (ONNX's Gather, its checks and negative indices), then
    float32(q - z) * s."""
    q = _gather(table, indices, axis=0)
    return _dequantize(q, scale, zero_point, out=out)


@binder("GatherDequant", DOMAIN)
def _bind_gather_dequant(consts, attrs):
    """The table, scale and zero point read once; one C pass a call (an embedding lookup of a
    tiny quantized GPT-2: two calls, ~20 us in a decode step, where it was four)."""
    c = list(consts) + [None] * (4 - len(consts))
    table, scale, zp = c[0], c[2], c[3]
    if any(t is COMPUTED for t in (table, scale, zp)) or type(table) is not torch.Tensor \
            or table.dtype not in (torch.uint8, torch.int8) or table.dim() != 2 or not table.is_contiguous() \
            or not table.is_cpu or scale is None or scale.numel() != 1 or scale.dtype != torch.float32 \
            or (zp is not None and zp.numel() != 1):
        return None
    fn = native.function("lut", "gather_dequant_small", "piipiiiidp", ctypes.c_int, fallbacks="lut")
    if fn is None:
        return None
    rows, h = table.shape
    args = (table.data_ptr(), rows, h)
    kind, z, s = int(table.dtype == torch.int8), 0 if zp is None else int(zp.item()), scale.item()

    def kernel(tab, indices, sc, zero_point=None, *, out=None):
        if type(indices) is torch.Tensor and indices.is_cpu and indices.dtype in (torch.int64, torch.int32) \
                and indices.is_contiguous():
            shape = (*indices.shape, h)
            y = native.buffer(out, shape, torch.float32)
            if not fn(*args, indices.data_ptr(), indices.numel(), int(indices.dtype is torch.int64), kind, z, s,
                      y.data_ptr()):
                native.count("lut_native_calls")
                return y
        return _gather_dequant(tab, indices, sc, zero_point, out=out)

    kernel.table = table  # the tensor whose address it holds stays alive with it
    return kernel
