"""Products of 8-bit operands with a constant 8-bit weight on the CPU, in one C call (csrc/qgemm.c).

The ops of quantized models (DynQuantMatMul, QMatMulCentered, MatMulInteger, QAttention's
projection, DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, QLinearMatMul) ask ``product`` first;
it answers None where the C kernel does not serve (not the CPU, a B that is not a 2-D uint8 / int8
matrix, a non-finite range of A), and the caller's torch path runs. Where it would serve but cannot
be built, the fallback is counted (``qgemm_torch_fallbacks`` in native.counters()). Callers keep
their torch path for what it alone does: per-row zero points of A, and the u8s8 saturation switch
(u8s8.u8s8_saturation: onnxruntime's AVX2 sums, emulated there).

B is laid out once per weight (kept on its PreparedB, which integer_gemm.prepared_b caches per tensor):
blocks of 64 columns with k in groups (qblock.h); int8 weights without zero point in groups of 4
for AVX-512 VNNI's uint8 x int8 instruction, every other weight as int16 pairs of B - B_zp.
"""

from __future__ import annotations

import array
import ctypes
import functools

import torch

from . import native
from .weight_cache import ConstantsCache

A_DYNAMIC, A_CENTERED, A_U8, A_S8 = range(4)  # what A holds (qgemm.c's kinds)
_OUT_I32, _OUT_F32, _OUT_F32_FMA, _OUT_U8, _OUT_S8 = 0, 1, 2, 3, 4
_THREAD_MIN_WORK = 1 << 18  # multiply-adds below which a second thread costs more than it saves
# Multiply-adds up to which qgemm.c serves on any CPU: there torch's calls around the product cost
# more than the product (64 x 64 x 64: 54 us in torch, 12 here). Above, only VNNI builds on CPUs
# without AMX (measured 1.2-1.7x torch._int_mm's whole path up to 512 x 768 x 3072 on a Zen 4);
# AMX's tile kernels (oneDNN's, behind torch._int_mm) are another class.
_SMALL_WORK = 1 << 24


def byte_kind(a: torch.Tensor) -> int:
    """A_U8 or A_S8 for an 8-bit A as it comes."""
    return A_U8 if a.dtype == torch.uint8 else A_S8


def _kernel():
    """qgemm.c's ``qgemm_bound``: B's side as an array made once (_constant_half), the rest a call."""
    return native.function("qgemm", "qgemm_bound", "piiipdip", ctypes.c_int, fallbacks="qgemm")


def _batched_kernel():
    return native.function("qgemm", "qbmm", "iiiiipiipiiidip", ctypes.c_int, fallbacks="qgemm")


def _int8_weights() -> bool:
    lib = native.library("qgemm")
    return bool(lib is not None and lib.qgemm_int8_weights())


def centered(x: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, float, int] | None:
    """DynamicQuantizeLinear of a float32 CPU x as (q - zp as float32, scale, zero point), in one
    call (csrc/qgemm.c dq_centered), into ``out`` when it is contiguous and x's shape; None where
    it does not serve (not the CPU or not float32, no build (counted), a non-finite range)."""
    return _dynamic_quantize(x, out, "dq_centered", torch.float32)


def quantized(x: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, float, int] | None:
    """DynamicQuantizeLinear of a float32 CPU x as it is written (uint8 q, scale, zero point), in
    one call (csrc/qgemm.c dq_u8); None where it does not serve (as ``centered``)."""
    return _dynamic_quantize(x, out, "dq_u8", torch.uint8)


def _dynamic_quantize(x, out, symbol: str, dtype: torch.dtype):
    if x.device.type != "cpu" or x.dtype != torch.float32 or not x.numel():
        return None
    fn = native.function("qgemm", symbol, "pipp", ctypes.c_int, fallbacks="qgemm")
    if fn is None:
        return None
    x, out = native.dense_pair(x, out, dtype)
    sz = (ctypes.c_float * 2)()
    if fn(x.data_ptr(), x.numel(), out.data_ptr(), sz):
        return None
    native.count("qgemm_native_calls")
    return out, float(sz[0]), int(sz[1])


@functools.cache
def _serves_large() -> bool:
    try:
        amx = bool(torch.cpu.get_capabilities().get("amx_int8"))
    except (AttributeError, RuntimeError):
        amx = False
    return _int8_weights() and not amx


def _layout(prep, int8: bool):
    """B (K, N) of a integer_gemm.PreparedB for qgemm.c: (k's per group, groups, the blocks (N / 64,
    K / group, 64, group), their column sums int32 or None); None for a B it cannot take."""
    b, zb = prep.raw, prep.zb
    if b.dim() != 2 or b.dtype not in (torch.int8, torch.uint8) or b.device.type != "cpu":
        return None
    k, n = b.shape
    if zb is not None and not (zb.numel() == 1 or tuple(zb.shape) in ((n,), (1, n))):
        return None
    grp = 4 if int8 and b.dtype == torch.int8 and (zb is None or not bool(zb.any())) else 2
    w = b if grp == 4 else b.to(torch.int16)
    if grp == 2 and zb is not None:
        w = w - zb.to(torch.int16).reshape(-1 if zb.numel() > 1 else ())
    w = torch.nn.functional.pad(w, (0, -n % 64, 0, -k % grp))
    kg, nb = w.shape[0] // grp, w.shape[1] // 64
    blk = w.reshape(kg, grp, nb, 64).permute(2, 0, 3, 1).contiguous()
    colsum = blk.sum((1, 3), dtype=torch.int32).reshape(-1).contiguous() if grp == 4 else None
    return grp, kg, blk, colsum


def _float_vector(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    if t is None or (t.dtype == torch.float32 and t.dim() == 1 and t.is_contiguous()):
        return t
    return t.detach().reshape(n).to(torch.float32).contiguous()


def product(a: torch.Tensor, kind: int, prep, *, a_scale: float = 1.0, a_zp: int = 0,
            b_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
            out: torch.Tensor | None = None, fused: bool = False,
            requant: tuple[int, torch.dtype] | None = None) -> torch.Tensor | None:
    """(A - za) @ (B - zb) for A (..., K) of ``kind``: int32, or with ``b_scale`` float32
    float32(sum) * float32(a_scale * b_scale) [+ bias] (A's scale and zero point computed for
    A_DYNAMIC); ``fused``: the bias added in one rounding with the product, fma(sum, mult, bias),
    as torch.addcmul computes it; ``requant`` (zero point, uint8 or int8): with ``b_scale`` the
    whole multiplier (a_scale 1), round-half-even(float32(sum) * multiplier) + zero point saturated
    to that type, as QLinearMatMul. ``out``: where to write (contiguous, the result's shape and
    dtype), else a new tensor. None where qgemm.c does not serve (the module docstring)."""
    if a.device.type != "cpu" or not a.dim():
        return None
    half = _constant_half(prep, b_scale, bias, fused, requant)
    return None if half is None else _run(half, a, kind, a_scale, a_zp, out)


def bind(prep, *, b_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, fused: bool = False,
         requant: tuple[int, torch.dtype] | None = None):
    """``product`` for a node whose B, B's scales and bias are constants: what depends on them
    alone (B's blocks, the epilogue's vectors, the output kind) worked out once, and a function
    ``f(a, kind, a_scale=1.0, a_zp=0, out=None)`` that does the rest as product does (None where
    qgemm.c does not serve those arguments); None where it cannot serve this B at all."""
    half = _constant_half(prep, b_scale, bias, fused, requant)
    if half is None:
        return None

    def run(a, kind, a_scale=1.0, a_zp=0, out=None):
        if not a.is_cpu or not a.dim():
            return None
        return _run(half, a, kind, a_scale, a_zp, out)

    return run


def _constant_half(prep, b_scale, bias, fused, requant):
    """What product's call takes from B, its scales, the bias and the output kind alone (the
    tensors whose addresses it passes ride along), or None where qgemm.c cannot serve them."""
    fn = _kernel()
    if fn is None:
        return None
    ready = prep.forms.get("qgemm")
    if ready is None:
        ready = prep.forms["qgemm"] = _ready(prep)
    if not ready:
        return None
    k, n, grp, kg, blk, colsum, held = ready
    scale = bias_v = None
    bs_step = 0
    if b_scale is not None:
        b = None if requant is not None else bias
        got = _EPILOGUES.get((b_scale, b), lambda: _epilogue(b_scale, b, n), n)
        if requant is not None:
            bias_v = _ZERO_POINTS.get(requant[0])
            if bias_v is None:  # the zero point, as the kernel reads it (a float32 vector of one)
                bias_v = _ZERO_POINTS.setdefault(requant[0], torch.tensor([float(requant[0])]))
        if got is None:
            return None
        scale, bs_step, b = got
        if requant is None:
            bias_v = b
    dtype = torch.int32 if scale is None else requant[1] if requant is not None else torch.float32
    if scale is None:
        out_kind = _OUT_I32
    elif requant is not None:
        out_kind = _OUT_S8 if requant[1] == torch.int8 else _OUT_U8
    else:
        out_kind = _OUT_F32_FMA if fused and bias_v is not None else _OUT_F32
    consts = array.array("q", (k, n, grp, kg, blk or 0, colsum or 0, out_kind,
                               0 if scale is None else scale.data_ptr(), bs_step,
                               0 if bias_v is None else bias_v.data_ptr()))
    return fn, k, n, dtype, consts, consts.buffer_info()[0], (held, scale, bias_v)


def _run(half, a, kind, a_scale, a_zp, out):
    fn, k, n, dtype, _consts, consts_p, _held = half
    if a.shape[-1] != k:
        return None
    m = a.numel() // k
    if m == 0 or (m * k * n > _SMALL_WORK and not _serves_large()):
        return None
    shape = (*a.shape[:-1], n)
    if out is None or out.dtype != dtype or out.shape != shape or not out.is_contiguous():
        out = torch.empty(shape, dtype=dtype)
    if not a.is_contiguous():
        a = a.contiguous()
    if kind == A_DYNAMIC and a.dtype != torch.float32:
        a = a.to(torch.float32)
    threads = torch.get_num_threads() if m * k * n >= _THREAD_MIN_WORK else 1
    rc = fn(consts_p, m, threads, kind, a.data_ptr(), a_scale, a_zp, out.data_ptr())
    if rc:
        return None  # a non-finite range (or no memory): the torch path gives what the formula gives
    native.count("qgemm_native_calls")
    return out


def batched(a: torch.Tensor, b: torch.Tensor, za: int, zb: int, *, requant: tuple[int, torch.dtype] | None = None,
            mult: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """(A - za) @ (B - zb) for 8-bit A (..., M, K) and B (..., K, N) that both change every call
    (attention's scores and weighted sums; csrc/qgemm.c qbmm), batch dims broadcast: int32, or with
    ``requant`` (zero point, uint8 / int8) round-half-even(float32(sum) * mult) + zero point,
    saturated, as QLinearMatMul. None where it does not serve (not the CPU, not 8-bit operands)."""
    if a.device.type != "cpu" or b.device.type != "cpu" or a.dim() < 2 or b.dim() < 2 \
            or a.dtype not in (torch.uint8, torch.int8) or b.dtype not in (torch.uint8, torch.int8) \
            or a.shape[-1] != b.shape[-2]:
        return None
    fn = _batched_kernel()
    if fn is None:
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    lead = a.shape[:-2]
    if lead != b.shape[:-2]:  # torch.broadcast_shapes costs ~20 us: only where they differ
        lead = torch.broadcast_shapes(lead, b.shape[:-2])
        a, b = a.expand(*lead, m, k), b.expand(*lead, k, n)  # copied below where a batch dim broadcasts
    if not a.is_contiguous():
        a = a.contiguous()
    if not b.is_contiguous():
        b = b.contiguous()
    shape = (*lead, m, n)
    dtype = torch.int32 if requant is None else requant[1]
    if out is None or out.dtype != dtype or out.shape != shape or not out.is_contiguous():
        out = torch.empty(shape, dtype=dtype)
    if not out.numel():
        return out
    batch = out.numel() // (m * n)
    threads = torch.get_num_threads() if batch * m * k * n >= _THREAD_MIN_WORK else 1
    out_kind = _OUT_I32 if requant is None else _OUT_S8 if requant[1] == torch.int8 else _OUT_U8
    if fn(batch, m, k, n, threads, a.data_ptr(), int(a.dtype == torch.int8), za, b.data_ptr(),
          int(b.dtype == torch.int8), zb, out_kind, mult, 0 if requant is None else requant[0], out.data_ptr()):
        return None  # no memory: the torch path
    native.count("qgemm_native_calls")
    return out


_EPILOGUES = ConstantsCache()  # B's scales and bias as the kernel reads them, per constant tensors
_ZERO_POINTS: dict[int, torch.Tensor] = {}  # requantization's zero points (-128 .. 255) as the kernel reads them


def _epilogue(b_scale: torch.Tensor, bias: torch.Tensor | None, n: int):
    """(B's scales as a float32 vector, their step (0: one for all columns, 1: one per column), the
    bias as a float32 vector or None), or None for scales or a bias of another size."""
    if b_scale.numel() == 1:
        step = 0
    elif b_scale.numel() == n and b_scale.shape[-1] == n:
        step = 1
    else:
        return None
    if bias is not None and (bias.numel() != n or bias.shape[-1] != n):
        return None
    return _float_vector(b_scale.reshape(-1), b_scale.numel()), step, _float_vector(bias, n)


def _ready(prep):
    """(K, N, group, groups, blocks' address, column sums' address, the two tensors) of a B qgemm.c
    takes, or False; kept on the PreparedB (integer_gemm.PreparedB: ``raw`` B, its zero point ``zb``, ``k``,
    ``n``, and ``forms``, where B's layouts are kept)."""
    form = _layout(prep, _int8_weights())
    if form is None:
        return False
    grp, kg, blk, colsum = form
    # the tensors ride along with their addresses (two threads building one layout at the same
    # moment each keep their own)
    return (prep.k, prep.n, grp, kg, blk.data_ptr(), None if colsum is None else colsum.data_ptr(), (blk, colsum))
