"""MatMulNBits with 4-bit weights and float32 A on the CPU at an accuracy level other than 4 (and at
level 4 where onnxruntime's int8 kernel's form, nbits_int8.py, does not serve: A's int8 blocks are
made first): A times the weight read packed (csrc/nbits_f32.c).

onnxruntime computes these levels in float32 over the dequantized weights. The op's torch path
kept a dequantized float32 copy of each weight (8x its packed bytes: a 1B model's 4.4 GB) for one
float matmul: a 32,000 x 256 LM head took 5.9 ms a row where onnxruntime takes 0.37. The C kernel
reads the packed bytes, 16 outputs side by side in a vector, 4 rows of A at a time on one unpack of
the weights, each block's sum scaled once: within float32 rounding of onnxruntime (its summation
order is its own), and a row's values do not depend on the rows beside it. It serves every row
count: measured against the float matmul over the dequantized copy (2-core AMD EPYC), 18-23x faster
at one row, 1.1-2.2x at 64 to 256, 0.77-1.17x at 1,024 (a prompt's product is bound by arithmetic
either way), and no copy is ever made.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import native
from .nbits_int8 import _by_chunk, _threads


@functools.cache
def available() -> bool:
    """Whether the C kernel runs here (a C compiler and AVX-512): once a process."""
    has = native.function("nbits_f32", "nbits_f32_available", "", ctypes.c_int)
    return has is not None and bool(has())


class PackedF32:
    """A 4-bit weight as the kernel reads it, made once: the bytes of 16 outputs side by side
    (chunks, blocks, bytes a block, 16), scales and zero points by chunk (float32). ``call`` is None
    where the C kernel cannot run (no compiler, no AVX-512): the caller's torch path serves."""

    def __init__(self, raw: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                 block_size: int) -> None:
        n, nb, half = raw.shape  # raw: (N, blocks, block_size / 2) packed bytes, the low nibble first
        self.n, self.nb, self.block_size = n, nb, block_size
        self.call = None
        self.nbytes = 0
        fn = native.function("nbits_f32", "nbits_f32_gemm", "iiiipppiipppi", ctypes.c_int, fallbacks="nbits_f32")
        if fn is None or not available():
            return
        n_pad = -(-n // 16) * 16
        padded = torch.zeros(n_pad, nb, half, dtype=torch.uint8)
        padded[:n] = raw
        self.wcol = padded.view(n_pad // 16, 16, nb, half).permute(0, 2, 3, 1).contiguous()
        self.scale_c = _by_chunk(scales.to(torch.float32).reshape(n, nb), n_pad)
        self.zp_c = None if zero_points is None else _by_chunk(zero_points.to(torch.float32).reshape(n, nb), n_pad)
        self.nbytes = sum(t.numel() * t.element_size() for t in (self.wcol, self.scale_c, self.zp_c) if t is not None)
        # the weight's arguments bound once
        self.call = functools.partial(fn, n, n_pad, nb, block_size, self.wcol.data_ptr(), self.scale_c.data_ptr(),
                                      0 if self.zp_c is None else self.zp_c.data_ptr())


def serves(a: torch.Tensor, w: PackedF32) -> bool:
    """Whether the C kernel computes A times ``w``: float32 A on the CPU, some rows."""
    return (w.call is not None and type(a) is torch.Tensor and a.device.type == "cpu" and a.dtype is torch.float32
            and a.numel() > 0)


def matmul(a: torch.Tensor, w: PackedF32, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """(..., K) float32 A (``serves``) times the packed weight: (..., N) float32, into ``out`` where it
    is a contiguous float32 tensor of that shape."""
    k = a.shape[-1]
    x = a if a.is_contiguous() else a.contiguous()
    rows = x.numel() // k
    b = None if bias is None else bias.to(torch.float32).contiguous()
    y = native.buffer(out, (*a.shape[:-1], w.n), torch.float32)
    if w.call(k, rows, x.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(), _threads(rows, w.n, k)) != 0:
        raise MemoryError("MatMulNBits: no memory for A's padded copy")
    native.count("nbits_f32_native_calls")
    return y
