"""Lookups of bytes in a quantized op's table in one C call (csrc/lut.c says why); None where the C
kernel does not serve (not the CPU, more than 8 dims) and the caller's torch indexing runs, counted
(``lut_torch_fallbacks``) where it would serve but cannot be built."""

from __future__ import annotations

import array

import torch

from . import native


def pairs(table: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """table[(a << 8) | b] over a and b (8-bit, broadcasting), as a's dtype; None where not served."""
    if a.device.type != "cpu" or table.device.type != "cpu" or not table.is_contiguous():
        return None
    a, b = torch.broadcast_tensors(a, b)  # views: strides 0 along the broadcast dims
    if a.dim() > 8:
        return None
    fn = native.function("lut", "lut2_u8", "ipppppp" "p", fallbacks="lut")
    if fn is None:
        return None
    y = torch.empty(a.shape, dtype=table.dtype)
    if y.numel():
        shape = array.array("q", a.shape)
        sa, sb = array.array("q", a.stride()), array.array("q", b.stride())
        fn(a.dim(), shape.buffer_info()[0], a.data_ptr(), sa.buffer_info()[0], b.data_ptr(), sb.buffer_info()[0],
           table.data_ptr(), y.data_ptr())
    native.count("lut_native_calls")
    return y


ADD, ADD_SWAPPED, MUL = 0, 1, 2  # lut.c qbinary_u8's kinds


def _contiguous_strides(shape) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def _dense(x: torch.Tensor) -> bool:
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


def arithmetic(kind: int, a: torch.Tensor, b: torch.Tensor, ra: float, rb: float, c0: float, za: int = 0,
               zb: int = 0) -> torch.Tensor | None:
    """QLinearAdd / QLinearMul of 8-bit a and b (same dtype, broadcasting) by the arithmetic their
    tables hold (csrc/lut.c qbinary_u8 says which), as a's dtype; None where not served."""
    if a.device.type != "cpu" or b.device.type != "cpu":
        return None
    fn = _arithmetic_kernel()
    if fn is None:
        return None
    walk = binary_walk(a, b)
    return None if walk is None else run_arithmetic(fn, walk, kind, a, b, ra, rb, c0, za, zb)


def _arithmetic_kernel():
    return native.function("lut", "qbinary_u8", "ipppppiidddiip", fallbacks="lut")


def binary_walk(a: torch.Tensor, b: torch.Tensor):
    """How qbinary_u8 walks a and b (CPU tensors of one dtype) and lays out the result, a function
    of their shapes and strides only (a bound QLinearAdd keeps it per layout): (dims, a's strides,
    b's strides as C arrays, the result's shape and strides); None beyond 8 dims."""
    if a.shape == b.shape and a.stride() == b.stride() and _dense(a):
        # one run of elements in memory order, either layout: no broadcasting to walk
        dims, sa = [a.numel()], [1]
        sb, y_shape, y_strides = sa, a.shape, a.stride()
    else:
        a, b = torch.broadcast_tensors(a, b)  # views: strides 0 along the broadcast dims
        if a.dim() > 8:
            return None
        if a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous():
            # a CNN's channels-last activation: walked in NHWC order, so that the result keeps its layout
            y = torch.empty_like(a)
            y_shape, y_strides = y.shape, y.stride()
            a, b = a.permute(0, 2, 3, 1), b.permute(0, 2, 3, 1)  # y's storage in this order
        else:
            y_shape, y_strides = a.shape, _contiguous_strides(a.shape)
        dims, sa, sb = a.shape, a.stride(), b.stride()
    return (array.array("q", dims), array.array("q", sa), array.array("q", sb), tuple(y_shape), tuple(y_strides))


def run_arithmetic(fn, walk, kind: int, a: torch.Tensor, b: torch.Tensor, ra: float, rb: float, c0: float,
                   za: int, zb: int) -> torch.Tensor:
    """qbinary_u8 over a and b as ``walk`` (binary_walk of their layouts) says, into a new tensor."""
    dims, sa, sb, y_shape, y_strides = walk
    y = torch.empty_strided(y_shape, y_strides, dtype=a.dtype)
    if y.numel():
        fn(len(dims), dims.buffer_info()[0], a.data_ptr(), sa.buffer_info()[0], b.data_ptr(), sb.buffer_info()[0],
           int(a.dtype == torch.int8), kind, ra, rb, c0, za, zb, y.data_ptr())
    native.count("lut_native_calls")
    return y


_SMALL_KINDS = {torch.uint8: 0, torch.int8: 1, torch.uint16: 2, torch.int16: 3}


def dequantize(x: torch.Tensor, zp: int, scale: float, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """float32(x - zp) * scale of 8- or 16-bit CPU x in one pass (csrc/lut.c dequant_small), into
    ``out`` when it is a contiguous float32 tensor of x's shape; None where not served."""
    kind = _SMALL_KINDS.get(x.dtype)
    if kind is None or x.device.type != "cpu":
        return None
    fn = native.function("lut", "dequant_small", "piiidp", fallbacks="lut")
    if fn is None:
        return None
    x, out = native.dense_pair(x, out, torch.float32)
    fn(x.data_ptr(), x.numel(), kind, zp, scale, out.data_ptr())
    native.count("lut_native_calls")
    return out


def quantize(x: torch.Tensor, scale: float, zp: int, dtype: torch.dtype,
             out: torch.Tensor | None = None) -> torch.Tensor | None:
    """QuantizeLinear of float32 CPU x with one scale and zero point to uint8 / int8 in one pass
    (csrc/lut.c quant_small), into ``out`` when it fits; None where not served."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or dtype not in (torch.uint8, torch.int8):
        return None
    fn = native.function("lut", "quant_small", "piidip", fallbacks="lut")
    if fn is None:
        return None
    x, out = native.dense_pair(x, out, dtype)
    fn(x.data_ptr(), x.numel(), int(dtype == torch.int8), scale, zp, out.data_ptr())
    native.count("lut_native_calls")
    return out


def single(table: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """table[x] for 8-bit x, as the table's dtype; None where not served."""
    if x.device.type != "cpu" or table.device.type != "cpu" or not table.is_contiguous():
        return None
    fn = native.function("lut", "lut1_u8", "pipp", fallbacks="lut")
    if fn is None:
        return None
    x, y = native.dense_pair(x, None, table.dtype)
    fn(x.data_ptr(), x.numel(), table.data_ptr(), y.data_ptr())
    native.count("lut_native_calls")
    return y


def softmax(x: torch.Tensor, exp_table: torch.Tensor, y_inv: float, y_zp: int) -> torch.Tensor | None:
    """QLinearSoftmax over the last axis of 8-bit x (csrc/lut.c qsoftmax_u8), x's dtype; None where
    not served."""
    if x.device.type != "cpu" or x.dim() == 0 or exp_table.dtype != torch.float32 or exp_table.numel() != 256:
        return None
    fn = native.function("lut", "qsoftmax_u8", "piiipdipp", fallbacks="lut")
    if fn is None:
        return None
    x = x.contiguous()
    d = x.shape[-1]
    y = torch.empty_like(x)
    scratch = torch.empty(max(d, 1))
    fn(x.data_ptr(), x.numel() // max(d, 1), d, int(x.dtype == torch.int8), exp_table.contiguous().data_ptr(),
       float(y_inv), int(y_zp), y.data_ptr(), scratch.data_ptr())
    native.count("lut_native_calls")
    return y
