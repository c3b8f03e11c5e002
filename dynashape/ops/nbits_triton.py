"""MatMulNBits with 4-bit weights on CUDA, read packed (issue 38: "a Triton GEMV/GEMM that reads
the packed weights, no dequantized copy of the weights in memory").

A weight of N x K 4-bit values is N * K / 2 bytes; its dequantized copy in float16 is four times
that, in float32 eight times, and a decode step reads every weight once: the copy costs memory and
bandwidth. Here one Triton kernel reads the bytes as the model stores them (two values a byte, the
low nibble first), the block scales and the zero points (4-bit packed, or in the scales' type, or
8 when none is given), makes each block's weights in float32 in registers,
``(q - zero point) * scale``, rounds them to A's type (as a dequantized copy in that type would
hold them) and accumulates ``A @ W^T`` in float32 (float32 A: IEEE products, no TF32). A program
computes a block of 16 outputs for up to 64 rows of A; longer A takes more programs along the
rows (each reads the weight again: a prompt's product, bound by its arithmetic). accuracy_level 4
quantizes A to int8 blocks first (block_quant.py), as the other paths do.

Not the default yet (``DYNASHAPE_NBITS_PACKED=1`` turns it on, float16 and bfloat16 A only):
measured on an H200 (benchmarks/nbits_cuda.py, eight weights in turn) it is as fast as cuBLAS over
the dequantized copy on the 110M model's layers (3.6 against 3.3 us at 768x2048) but 1.5-2.1x
slower on a 1B model's (16.3 against 10.6 us at 2048x8192, 28.5 against 13.6 at 8192x2048): a
program's 16 outputs and the products padded to 16 rows leave the memory system idle; and 6-16x
slower for float32 A (IEEE products emulated). It trades that for a quarter of the memory.
"""

from __future__ import annotations

import os

import torch

from .triton_launch import on

try:  # CI has no GPU and no triton: the dequantized path serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

BLOCK_N = 16
BLOCK_K = 256  # values of K a step of a program's loop (a multiple of every block size served)
ENABLED = os.environ.get("DYNASHAPE_NBITS_PACKED", "0") == "1"
# a decode step's few rows (``rows``): products as sums, no dot (whose tile is 16 rows at least, and
# which float32 A emulates in IEEE), any A type, the level-4 int8 blocks of A made in the kernel (or,
# for a large weight, first by a kernel of their own: ``prequant``)
ROWS = 8
ROWS_ENABLED = os.environ.get("DYNASHAPE_NBITS_ROWS", "1") != "0"


def serves(a: torch.Tensor, bits: int, block_size: int, g_idx, k: int) -> bool:
    """Whether the packed kernel computes this product: turned on, 4 bits, a block size that divides
    BLOCK_K, no g_idx, float16 or bfloat16 A on CUDA with triton."""
    return (ENABLED and triton is not None and a.is_cuda and bits == 4 and g_idx is None
            and 16 <= block_size <= BLOCK_K and BLOCK_K % block_size == 0
            and a.dtype in (torch.float16, torch.bfloat16) and k > 0)


def serves_rows(a: torch.Tensor, bits: int, block_size: int, g_idx, zero_points) -> bool:
    """Whether ``rows`` computes this product: a few rows of A on CUDA, 4 bits, no g_idx, zero points
    packed or absent (the level-4 form's condition too)."""
    return (ROWS_ENABLED and triton is not None and a.is_cuda and bits == 4
            and g_idx is None and 16 <= block_size <= 128 and a.numel() <= ROWS * a.shape[-1] and a.numel() > 0
            and (zero_points is None or zero_points.dtype == torch.uint8)
            and a.dtype in (torch.float32, torch.float16, torch.bfloat16))


ROWS_CONFIG: tuple[int, int, int] | None = None  # the sweep's override of rows_config
PREQUANT: bool | None = None  # the sweep's override of ``prequant``
EVEN: bool | None = None  # False: the sweep's masked loads everywhere (the form before whole tiles went unmasked)


def rows_config(n: int, k: int) -> tuple[int, int, int]:
    """(outputs a program, K values a loop step, warps) of the rows kernel. Measured on an H200 over
    the layers of an 8-layer hidden-512 model, a 1B Llama and TinyLlama's 1.1B, float32 A at level 4
    and float16 A (benchmarks/nbits_rows_sweep.py, results/nbits_rows_sweep_wide_h200_2026-11-30.json):
    4 outputs a program (the most programs) over up to 1,024 values of K a step (the most bytes in
    flight a program), 4 warps: 7% over each shape's best tile in sum, 1.1-2.7x faster than 8 outputs
    over 256 values (results/nbits_rows_sweep_h200_2026-11-30.json: which was 1.5-2.2x 16-32 over 128).
    Neither K split over programs (a second kernel adding the splits' sums) nor a byte's two weights
    kept apart (no interleave into K's order) was faster at any of those shapes
    (results/nbits_rows_split_h200_2026-11-30.json, results/nbits_rows_pairs_h200_2026-11-30.json)."""
    return 4, min(1024, triton.next_power_of_2(k)), 4


def prequant(n: int, k: int) -> bool:
    """Whether A's level-4 blocks are made first by a kernel of their own rather than by each program
    (every program of the rows kernel quantizes the whole of A's K for its 4 outputs). Measured on an
    H200 (results/nbits_rows_split_h200_2026-11-30.json, the kernel's launch included): first from
    8M weights (1.1B gate 12.0 -> 10.8 us, down 12.7 -> 11.9, a 32,000 x 2,048 LM head 55.7 -> 43.5),
    in the kernel below (1.1B qkv 5.8 against 6.3 us, the 2,048 x 2,048 output projection 5.2
    against 5.7, every layer of the hidden-512 model)."""
    return PREQUANT if PREQUANT is not None else n * k >= 8 << 20


def rows(a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
         bias: torch.Tensor | None, k: int, n: int, block_size: int, level4: bool, out=None) -> torch.Tensor:
    """A decode step's (..., K) A (at most ROWS rows) times the packed weight: (..., N) in A's type,
    each weight read once from its packed bytes, the sums in float32. The weight is rounded to A's
    type (as the dequantized copy in that type holds it) and, ``level4``, A to int8 blocks as
    block_quant._int8_blocks makes them (then to A's type): the op's other paths' values. ``out``
    (the plan's buffer, contiguous): written in place, no copy after."""
    lead, x, m, nb, w, s, z = _operands(a, b, scales, zero_points, k, n, block_size)
    shape = (*lead, n)
    into = isinstance(out, torch.Tensor) and tuple(out.shape) == shape and out.dtype == a.dtype and out.is_contiguous()
    y = out.view(m, n) if into else torch.empty((m, n), dtype=a.dtype, device=a.device)
    block_n, block_k, warps = ROWS_CONFIG or rows_config(n, k)
    block_k = max(block_k, block_size)
    # whole tiles of N and K: loads without masks. Not by narrowing K's tile to one that divides K: measured
    # slower where it narrowed (an H200, results/nbits_rows_even_h200_2026-11-30.json: K 1,408 at 128 values
    # a step 7.4 us against 3.6 masked at 512, K 5,632 at 512 13.2 against 11.9 at 1,024); where the tile
    # divides K as it is, 0-8% faster (a 32,000 x 2,048 LM head 45.9 -> 42.2 us, the 1.1B gate 10.8 -> 10.4)
    even = EVEN is not False and n % block_n == 0 and nb * block_size == k and k % block_k == 0
    with on(a.device):
        if level4 and prequant(n, k):
            x = _level4_rows(x, k, block_size)
            level4 = False
        _nbits4_rows[(triton.cdiv(n, block_n),)](
            x, w, s, z if z is not None else s, bias.reshape(-1) if bias is not None else s, y, m, n, k, nb,
            x.stride(0), w.stride(0), s.stride(0), z.stride(0) if z is not None else 0, y.stride(0),
            HAS_Z=z is not None, HAS_BIAS=bias is not None, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=block_n,
            BLOCK_K=block_k, BS=block_size, LEVEL4=level4, EVEN=even, num_warps=warps)
    return out if into else y.reshape(shape)


def _level4_rows(x: torch.Tensor, k: int, block_size: int) -> torch.Tensor:
    """Rows of A as int8 blocks in A's type (block_quant._int8_blocks's values), one kernel."""
    xq = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_k = max(block_size, min(1024, triton.next_power_of_2(k)))
    _level4_kernel[(x.shape[0], triton.cdiv(k, block_k))](x, xq, k, x.stride(0), xq.stride(0), BLOCK_K=block_k,
                                                          BS=block_size, num_warps=4)
    return xq


def _operands(a, b, scales, zero_points, k: int, n: int, block_size: int):
    """Both kernels' views: (A's leading shape, A as contiguous rows of K, its row count, blocks a
    row of the weight, the packed weight [N, K / 2], scales [N, blocks], zero points [N, bytes] or
    None)."""
    x = a.reshape(-1, k)
    if x.stride(-1) != 1:
        x = x.contiguous()
    nb = -(-k // block_size)
    w = b.reshape(n, -1)
    if not w.is_contiguous():
        w = w.contiguous()
    z = None if zero_points is None else zero_points.reshape(n, -1)
    return a.shape[:-1], x, x.shape[0], nb, w, scales.reshape(n, nb), z


def matmul(a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
           bias: torch.Tensor | None, k: int, n: int, block_size: int) -> torch.Tensor:
    """(..., K) A times the packed (N, blocks, block_size / 2) weight: (..., N) in A's type."""
    lead, x, m, nb, w, s, z = _operands(a, b, scales, zero_points, k, n, block_size)
    y = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0:
        return y.reshape(*lead, n)
    block_m = 16 if m <= 16 else 64
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(m, block_m))
    with on(a.device):
        _nbits4[grid](x, w, s, z if z is not None else s, bias.reshape(-1) if bias is not None else s, y, m, n, k, nb,
                      x.stride(0), w.stride(0), s.stride(0), z.stride(0) if z is not None else 0, y.stride(0),
                      HAS_Z=z is not None, Z_PACKED=z is not None and z.dtype == torch.uint8,
                      HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                      BS=block_size, IEEE=a.dtype == torch.float32, num_warps=4)
    return y.reshape(*lead, n)


if triton is not None:
    @triton.jit
    def _weight_tile(W, S, Z, n, nmask, k0, NB, swn, ssn, szn, HAS_Z: tl.constexpr, Z_PACKED: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr, EVEN: tl.constexpr = False):
        """Outputs ``n``'s weights at values k0 .. k0 + BLOCK_K of K, float32: (q - zero point) * scale.
        EVEN: every output and value of the tile exists (N and K whole tiles): loads without masks,
        which the compiler can widen to vectors (a mask on a runtime bound keeps them a byte each)."""
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        bi = k0 // BS + tl.arange(0, BLOCK_K // BS)
        zi = bi // 2 if Z_PACKED else bi  # two 4-bit zero points a byte, the low nibble first; or one a block
        if EVEN:
            packed = tl.load(W + n[:, None] * swn + kb[None, :])
            s = tl.load(S + n[:, None] * ssn + bi[None, :]).to(tl.float32)
            if HAS_Z:
                zb = tl.load(Z + n[:, None] * szn + zi[None, :])
        else:
            packed = tl.load(W + n[:, None] * swn + kb[None, :],
                             mask=nmask[:, None] & (kb[None, :] < NB * BS // 2), other=0)
            bmask = nmask[:, None] & (bi[None, :] < NB)
            s = tl.load(S + n[:, None] * ssn + bi[None, :], mask=bmask, other=0.0).to(tl.float32)
            if HAS_Z:
                zb = tl.load(Z + n[:, None] * szn + zi[None, :], mask=bmask, other=0)
        q = tl.join(packed & 15, packed >> 4).reshape(BLOCK_N, BLOCK_K).to(tl.float32)  # value k0 + j
        if HAS_Z:
            if Z_PACKED:
                z = ((zb >> ((bi[None, :] % 2) * 4)) & 15).to(tl.float32)
            else:
                z = zb.to(tl.float32)
        else:
            z = tl.full([BLOCK_N, BLOCK_K // BS], 8.0, tl.float32)
        return ((q.reshape(BLOCK_N, BLOCK_K // BS, BS) - z[:, :, None]) * s[:, :, None]).reshape(BLOCK_N, BLOCK_K)

    @triton.jit
    def _nbits4(X, W, S, Z, BIAS, Y, M, N, K, NB, sxm, swn, ssn, szn, sym,
                HAS_Z: tl.constexpr, Z_PACKED: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr, IEEE: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        nmask, mmask = n < N, m < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        kk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            w = _weight_tile(W, S, Z, n, nmask, k0, NB, swn, ssn, szn, HAS_Z, Z_PACKED, BLOCK_N, BLOCK_K, BS)
            x = tl.load(X + m[:, None] * sxm + (k0 + kk)[None, :], mask=mmask[:, None] & ((k0 + kk)[None, :] < K),
                        other=0.0)
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
        if HAS_BIAS:
            acc += tl.load(BIAS + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + m[:, None] * sym + n[None, :], acc.to(Y.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])

    @triton.jit
    def _level4_blocks(x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BS: tl.constexpr):
        """x [BLOCK_M, BLOCK_K] (float32) as int8 blocks of BS per row: q = round(x * 127 / amax) half to
        even, then q * (amax / 127), IEEE divisions (block_quant._int8_blocks's values)."""
        xb = x.reshape(BLOCK_M, BLOCK_K // BS, BS)
        amax = tl.max(tl.abs(xb), axis=2)
        inv = tl.where(amax != 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
        scale = tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))
        # round half to even as 1.5 * 2^23 added and taken away (exact for |y| <= 127 in IEEE float32
        # sums, which Triton does not reassociate): torch.round's value, with no libdevice call (which
        # Triton's interpreter lacks)
        y = xb * inv[:, :, None]
        q = (y + 12582912.0) - 12582912.0
        return (q * scale[:, :, None]).reshape(BLOCK_M, BLOCK_K)

    @triton.jit
    def _level4_kernel(X, XQ, K, sxm, sqm, BLOCK_K: tl.constexpr, BS: tl.constexpr):
        row = tl.program_id(0)
        kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(X + row * sxm + kk, mask=kk < K, other=0.0).to(tl.float32)
        xq = _level4_blocks(x.reshape(1, BLOCK_K), 1, BLOCK_K, BS).reshape(BLOCK_K)
        tl.store(XQ + row * sqm + kk, xq.to(XQ.dtype.element_ty), mask=kk < K)

    @triton.jit
    def _nbits4_rows(X, W, S, Z, BIAS, Y, M, N, K, NB, sxm, swn, ssn, szn, sym,
                     HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, BS: tl.constexpr, LEVEL4: tl.constexpr, EVEN: tl.constexpr):
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        m = tl.arange(0, BLOCK_M)
        nmask, mmask = n < N, m < M
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        kk = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            w = _weight_tile(W, S, Z, n, nmask, k0, NB, swn, ssn, szn, HAS_Z, True, BLOCK_N, BLOCK_K, BS, EVEN)
            w = w.to(X.dtype.element_ty).to(tl.float32)
            if EVEN:  # the rows' mask only: constant along K
                x = tl.load(X + m[:, None] * sxm + (k0 + kk)[None, :], mask=mmask[:, None], other=0.0)
            else:
                x = tl.load(X + m[:, None] * sxm + (k0 + kk)[None, :],
                            mask=mmask[:, None] & ((k0 + kk)[None, :] < K), other=0.0)
            x = x.to(tl.float32)
            if LEVEL4:
                x = _level4_blocks(x, BLOCK_M, BLOCK_K, BS).to(X.dtype.element_ty).to(tl.float32)
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        if HAS_BIAS:
            acc += tl.load(BIAS + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + m[:, None] * sym + n[None, :], acc.to(Y.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])
