"""Products that end a residual branch, and the gated activation of a SwiGLU MLP
(``compile/fuse_residual.py``).

``MatMulAdd(x, w, r) = x @ w + r`` with ``w`` a constant matrix ([in, out], or [out, in] read
transposed with ``transposed=1``) and ``r`` a tensor of the product's shape: the residual add of a
transformer layer (attention output projection, MLP down projection). BLAS adds ``r`` in the
product's epilogue (``addmm`` with beta = 1): one kernel instead of two, and in float32 the same
value (the product is rounded once either way before ``r`` is added).

``SiluMul(a, b) = silu(a) * b``: the gate of a SwiGLU MLP, one kernel on CUDA (Triton) instead of
two; elsewhere the torch form, which is what the replaced nodes computed.

``GatedMatMulAdd(a, w, r, b) = silu(a) * b @ w + r``: the gate, the down projection and the residual
of a SwiGLU MLP. At one row on CUDA it is one Triton kernel, as ``MatMulAdd`` is there
(``_gemv_add``); otherwise the two ops above in turn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from . import small_work, split_tf32, tuned_gemm
from .fused import DOMAIN, CannotServe
from .registry import op
from .triton_launch import INTERPRET, on

try:  # CI has no GPU and no triton: the torch form serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # its Triton kernels' (the one-row ones too)


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


def _matmul_add_infer(shapes, values, *, transposed=0):
    x, w, r = tuple(shapes[0]), tuple(shapes[1]), tuple(shapes[2])
    k, n = (w[1], w[0]) if transposed else (w[0], w[1])
    if len(x) < 2 or x[-1] != k:
        raise ShapeError(f"MatMulAdd: input {x} does not match weight {w}")
    out = x[:-1] + (n,)
    if not _same_shape(out, r):  # a residual that broadcasts: the replaced MatMul and Add serve it
        raise CannotServe("a residual of another shape than the product")
    return [out]


@op("MatMulAdd", 1, DOMAIN, infer=_matmul_add_infer,
    notes="x @ w + r in one BLAS call, r added in its epilogue (fuse_residual)")
@small_work.when_small(lambda x, w, r, *a, **k: x.numel() * r.shape[-1])
def _matmul_add(x, w, r, *, transposed=0, out=None):
    if _one_row(x, w, r, transposed, out):
        return _gemv_add(x, None, w, r, out)
    wt = w.t() if transposed else w
    k, n = wt.shape
    x2, r2 = x.reshape(-1, k), r.reshape(-1, n)
    if tuned_gemm.serves(x, w):  # a static impl's build: the kernel timed fastest for this shape
        return tuned_gemm.rows_into(out, x.shape[:-1], n,
                                    lambda o2: tuned_gemm.product(x2, w, bool(transposed), None, r2, o2))
    if split_tf32.eligible(x, w) and split_tf32.worth(x2.shape[0], n, k):
        return tuned_gemm.rows_into(out, x.shape[:-1], n,
                                    lambda o2: split_tf32.product(x2, w, bool(transposed), r2, o2))
    if out is not None and out.is_contiguous():
        torch.addmm(r2, x2, wt, out=out.view(-1, n))
        return out
    res = torch.addmm(r2, x2, wt).view(*x.shape[:-1], n)
    if out is None:
        return res
    return out.copy_(res)


def _gated_infer(shapes, values, *, transposed=0):
    if not _same_shape(tuple(shapes[0]), tuple(shapes[3])):
        raise CannotServe("a gate and an input of other shapes")
    return _matmul_add_infer(shapes[:3], values, transposed=transposed)


@op("GatedMatMulAdd", 1, DOMAIN, infer=_gated_infer,
    notes="silu(a) * b @ w + r: a SwiGLU MLP's gate, down projection and residual (fuse_gated_matmul_add)")
def _gated_matmul_add(a, w, r, b, *, transposed=0, out=None):
    if _one_row(a, w, r, transposed, out) and b.dtype == a.dtype and b.numel() == a.numel():
        return _gemv_add(a, b, w, r, out)
    return _matmul_add(_silu_mul(a, b), w, r, transposed=transposed, out=out)


def _silu_mul_infer(shapes, values):
    a, b = tuple(shapes[0]), tuple(shapes[1])
    if not _same_shape(a, b):
        raise CannotServe("a gate and an input of other shapes")
    return [a]


@op("SiluMul", 1, DOMAIN, infer=_silu_mul_infer, notes="silu(a) * b, the SwiGLU gate (fuse_residual)")
def _silu_mul(a, b, *, out=None):
    if (triton is not None and a.is_cuda and a.dtype in TRITON_DTYPES and b.dtype == a.dtype and a.dim() >= 1
            and a.shape[-1] > 0 and a.stride(-1) == 1 and b.stride(-1) == 1):
        return _triton(a, b, out)
    return silu_mul_torch(a, b, out)


def silu_mul_torch(a, b, out=None):
    """What the exported nodes compute: silu rounded to the dtype, then the product."""
    s = F.silu(a)
    return torch.mul(s, b) if out is None else torch.mul(s, b, out=out)


def _rows(t):
    """``t`` as rows of its last dim: (rows, row stride) when every leading dim steps by whole rows
    of one stride (a contiguous tensor, a slice of the last dim), else None."""
    d = t.shape[-1]
    lead = t.shape[:-1]
    rows = 1
    for s in lead:
        rows *= s
    if t.dim() == 1:
        return 1, d
    stride = t.stride(-2)
    expect = stride
    for size, st in zip(reversed(lead), reversed(t.stride()[:-1])):
        if size != 1 and st != expect:
            return None
        expect *= size
    return rows, stride


def _triton(a, b, out):
    ra, rb = _rows(a), _rows(b)
    if ra is None or rb is None:
        return silu_mul_torch(a, b, out)
    if out is None or not out.is_contiguous():
        res = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    else:
        res = out
    d = a.shape[-1]
    rows = ra[0]
    if rows == 0:
        return res if out is None else out
    block = min(triton.next_power_of_2(d), 1024)
    with torch.cuda.device(a.device):  # Triton launches on the current device: make it a's (cuda:1)
        _silu_mul_kernel[(rows, triton.cdiv(d, block))](a, b, res, ra[1], rb[1], d, BLOCK=block,
                                                         num_warps=4 if block >= 512 else 1)
    if out is not None and res is not out:
        out.copy_(res)
        return out
    return res


if triton is not None:
    # the row count and strides change with batch and length: not specialised on (no new variant
    # for a new shape, nor for a CUDA graph capture of one)
    @triton.jit(do_not_specialize=["sa", "sb", "D"])
    def _silu_mul_kernel(A, B, OUT, sa, sb, D, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = j < D
        x = tl.load(A + row * sa + j, mask=m, other=0.0).to(tl.float32)
        y = tl.load(B + row * sb + j, mask=m, other=0.0)
        s = (x * tl.sigmoid(x)).to(OUT.dtype.element_ty)  # rounded to the dtype as torch's silu is
        tl.store(OUT + row * D + j, (s.to(tl.float32) * y.to(tl.float32)).to(OUT.dtype.element_ty), mask=m)


# ---- one row: the product, the residual (and the gate) in one Triton kernel -----------------------
# A decode step at batch 1: addmm copies the residual into its output before cuBLAS's matrix-vector
# kernel adds onto it (two kernels; in a whole-step graph 24 copies a step of a 12-layer decoder), and
# the SwiGLU gate is a kernel of its own before the down projection. Here each is one kernel that
# reads the weight [out, in] row by row (as _norm_gemv does), the gate computed as its input is read.


def _one_row(x, w, r, transposed, out) -> bool:
    """One row (float32, bfloat16 or float16) by a [out, in] weight of its dtype with a residual of the
    output's size, on CUDA."""
    return (triton is not None and (x.is_cuda or INTERPRET) and bool(transposed) and x.dtype in TRITON_DTYPES
            and w.dtype == x.dtype and r.dtype == x.dtype and w.dim() == 2 and w.stride(-1) == 1
            and x.numel() == w.shape[1] and r.numel() == w.shape[0] and (out is None or out.is_contiguous()))


def _gemv_add(x, gate, w, r, out, tiles=None):
    """``tiles``: (BLOCK_N, BLOCK_K, warps) to use (benchmarks/gemv_add_sweep.py), else ``_tiles``'s."""
    n, k = w.shape
    res = out if out is not None else torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    xr, rr = x.reshape(k), r.reshape(n)
    gr = gate.reshape(k) if gate is not None else xr
    xr, rr, gr = (t if t.stride(0) == 1 else t.contiguous() for t in (xr, rr, gr))
    block_n, block_k, warps = tiles or _tiles(n, k, w.dtype, gate is not None)
    with on(x.device):
        _row_gemv_kernel[(triton.cdiv(n, block_n),)](xr, gr, xr, w, rr, res, n, k, 0.0, w.stride(0), NORM=False,
                                                     GATED=gate is not None, RESIDUAL=True, K_ALL=16,
                                                     BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return res


def _tiles(n: int, k: int, dtype=torch.float32, gated: bool = False) -> tuple[int, int, int]:
    # (BLOCK_N, BLOCK_K, warps), measured in CUDA graphs on an H200 with the weights read from memory
    # (benchmarks/gemv_add_sweep.py, results/gemv_add_sweep_ring_h200_2026-11-29.json): one or two rows
    # a program, a long stretch of K a load; 768 -> 768 2.77 us (cuBLAS with the residual's copy 4.57),
    # gated 2048 -> 768 4.62 us (cuBLAS and the gate's kernel 6.71). bfloat16 (the same sweep,
    # results/gemv_add_sweep_bf16_h200_2026-11-29.json): the same tiles but a gated K of 2048 on, which
    # takes 4 rows of 8 warps (3.77 us against 4.25; cuBLAS and the gate's kernel 10.3)
    if dtype != torch.float32 and gated and k >= 2048:
        return 4, 2048, 8
    if k >= 2048:
        return (1, 2048, 4) if n <= 2048 else (4, 2048, 8)
    return 2, 1024, 4


def norm_tiles(n: int, k: int, dtype=torch.float32) -> tuple[int, int, int]:
    """_norm_gemv's tiles (the same sweep): 768 -> 1280 3.68 us against 4.38 with 4 x 256; a wide
    output (768 -> 4096) keeps 4 x 256 (5.79 us against 7.51). bfloat16: 2 rows of 1,024 a load up
    to a K of 1,024 at every width measured (768 -> 4096 4.36 us, rms_norm and cuBLAS 6.98)."""
    if dtype != torch.float32 and k <= 2048:
        return (2, 1024, 4) if k <= 1024 else (1, 2048, 4)
    return (1, 2048, 4) if n <= 1536 and k <= 2048 else (4, 256, 4)


if triton is not None:
    @triton.jit(do_not_specialize=["eps"])
    def _row_gemv_kernel(X, G, NW, W, R, OUT, N, K, eps, swn, NORM: tl.constexpr, GATED: tl.constexpr,
                         RESIDUAL: tl.constexpr, K_ALL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One row: OUT[n] = sum over k of f(X)[k] * W[n, k] (+ R[n]), f the RMS norm (NORM: X scaled by
        1 / sqrt(mean(X^2) + eps), times NW) or the SwiGLU gate (GATED: silu(X) * G) or nothing. Sums in
        float32; in a half dtype f's result is rounded to it as the unfused ops' output was (the norm once,
        silu and the product each), and OUT once, the residual added before."""
        scale = 1.0
        if NORM:  # each program reads the whole row for its scale (a few KB, from L2 after the first)
            ka = tl.arange(0, K_ALL)
            xa = tl.load(X + ka, mask=ka < K, other=0.0).to(tl.float32)
            scale = 1.0 / tl.sqrt(tl.sum(xa * xa, axis=0) / K + eps)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < N
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            km = kk < K
            xk = tl.load(X + kk, mask=km, other=0.0).to(tl.float32)
            if NORM:
                xk = xk * scale * tl.load(NW + kk, mask=km, other=0.0).to(tl.float32)
                xk = xk.to(X.dtype.element_ty).to(tl.float32)
            if GATED:  # silu(a) * b, a the gate
                sx = (xk * tl.sigmoid(xk)).to(X.dtype.element_ty).to(tl.float32)
                xk = (sx * tl.load(G + kk, mask=km, other=0.0).to(tl.float32)).to(X.dtype.element_ty).to(tl.float32)
            wk = tl.load(W + n[:, None] * swn + kk[None, :], mask=nm[:, None] & km[None, :], other=0.0)
            acc += tl.sum(wk.to(tl.float32) * xk[None, :], axis=1)
        if RESIDUAL:
            acc += tl.load(R + n, mask=nm, other=0.0).to(tl.float32)
        tl.store(OUT + n, acc.to(OUT.dtype.element_ty), mask=nm)


# ---- RMSNorm into the product that reads it ------------------------------------------------------
def _norm_linear_infer(shapes, values, *, epsilon=1e-5):
    x, w = tuple(shapes[0]), tuple(shapes[2])
    if len(x) < 1 or x[-1] != w[1]:
        raise ShapeError(f"RMSNormLinear: input {x} does not match weight {w} (out, in)")
    return [x[:-1] + (w[0],)]


@op("RMSNormLinear", 1, DOMAIN, infer=_norm_linear_infer, writes_out=False,
    notes="rms_norm(x) * norm_weight @ weight.T, one kernel for a single row on CUDA (fuse_norm_linear)")
def _norm_linear(x, norm_weight, weight, *, epsilon=1e-5, out=None):
    k = x.shape[-1]
    if (triton is not None and (x.is_cuda or INTERPRET) and x.dtype in TRITON_DTYPES and weight.dtype == x.dtype
            and norm_weight is not None and norm_weight.dtype == x.dtype and x.numel() == k and k <= MAX_NORM_K
            and weight.stride(-1) == 1):
        return _norm_gemv(x, norm_weight, weight, epsilon)
    y = F.rms_norm(x, (k,), norm_weight, epsilon)  # several rows: the norm's kernel and cuBLAS, as unfused
    return F.linear(y, weight)


MAX_NORM_K = 8192  # the row is held whole by each program for its sum of squares


def _norm_gemv(x, norm_weight, weight, eps: float, tiles=None):
    """``tiles``: (BLOCK_N, BLOCK_K, warps) to use (benchmarks/gemv_add_sweep.py), else ``norm_tiles``'s."""
    n, k = weight.shape
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    xr = x.reshape(k)
    if xr.stride(0) != 1:
        xr = xr.contiguous()
    block_n, block_k, warps = tiles or norm_tiles(n, k, weight.dtype)
    with on(x.device):
        _row_gemv_kernel[(triton.cdiv(n, block_n),)](xr, xr, norm_weight, weight, out, out, n, k, eps,
                                                     weight.stride(0), NORM=True, GATED=False, RESIDUAL=False,
                                                     K_ALL=triton.next_power_of_2(k), BLOCK_N=block_n,
                                                     BLOCK_K=block_k, num_warps=warps)
    return out
