"""MatMulNBits at accuracy_level 4 (4-bit weights in blocks of 32, float32 A) as onnxruntime's
CPU kernel computes it on x86-64 with AVX-512 VNNI (MLAS's CompInt8 "BlkSum" kernels), to the bit.

Why not dequantize and run one float matmul: onnxruntime's sum is made of float roundings in its
own order, and a model feeds one product into the next one's int8 quantization: an output one ulp
away can quantize to the next integer there, which moves the K/V projections, which stay in the
cache (a genai-built Llama drifted from onnxruntime by 0.003-0.010 on logits after 55 decode steps
and chose other tokens from step 64). So this redoes its arithmetic, checked against onnxruntime
1.32 on such a CPU (tests/contrib/test_nbits_int8.py):

* A, per row and block of 32 (zeros past K): amax = max |a|; scale = amax / 127 and
  inv = 127 / amax (two float32 divisions, inv = 0 where amax is 0); q = round_half_even(a * inv)
  (a float32 product); blksum = scale * sum(q) (float32).
* B is read raw (0..15); its zero point (8 when none is given) comes in through the block sums:
  bsum[n, blk] = -(zp * scale_b).
* Per output, the integer products of a block are summed in lanes, each lane's integer sum
  converted to float and accumulated with a fused multiply-add by s = scale_a * scale_b (float32):
  blocks in groups of 4 feed 16 lanes of 8 products each (lane j = 4c + p takes block
  2 * (p // 2) + c // 2, products 4r..4r+3 for r in (4 (c % 2) + p % 2, that + 2)); those fold
  to 8 lanes (lane i + lane i + 8); the blocks left over (fewer than 4) feed the 8 lanes with 4
  products each (lane l: products 4l..4l+3).
* The 8 lanes are summed as ((x0 + x1) + x2) + x3 + (((x4 + x5) + x6) + x7) for the columns in
  groups of 4, as ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)) for the N % 4 columns
  left; then the bias is added.
* Last, MLAS's float GEMM adds sum_blk blksum * bsum: a fused multiply-add chain from 0 in block
  order, added to the output in one rounding.

The kernel is C (csrc/nbits_int8.c: fmaf, built with -ffp-contract=off, rows parallel over N),
about as fast as the float matmul it replaces; where it cannot be built, the torch path below
computes the same bits (counted as ``nbits_int8_torch_fallbacks``). In that path, the integer lane
sums are exact in float32 (at most 8 products of 127 x 15), so they run as float
matmuls. A fused multiply-add of float32 values is computed in float64 and rounded to odd before
the float32 rounding, which makes it a single correct rounding (a plain float64 sum rounded twice
could land one ulp off at a tie).

Other CPUs: onnxruntime's AVX2 and AVX-512 (no VNNI) kernels sum in other orders; nothing here
detects them (this is the order of the CPU these were measured on).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import native

BLOCK = 32
_F32 = torch.float32
GROUP = 4  # blocks per 16-lane step
_ROWS_ELEMS = 1 << 24  # partial sums held at once (float32): rows are done in chunks beyond it


def _group_order() -> torch.Tensor:
    """For the 16 lanes of a group of 4 blocks, the 8 positions (in the group's 128) each sums."""
    idx = []
    for j in range(16):
        c, p = divmod(j, 4)
        blk = 2 * (p // 2) + c // 2
        for r in (4 * (c % 2) + p % 2, 4 * (c % 2) + p % 2 + 2):
            idx += [blk * BLOCK + 4 * r + t for t in range(4)]
    return torch.tensor(idx)


_ORDER = _group_order()
_LANE_BLOCK = torch.tensor([2 * ((j % 4) // 2) + (j // 4) // 2 for j in range(16)])  # block of lane j


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a * b + c with one rounding: the product is exact in float64, the sum is rounded to
    odd there (its error, from TwoSum, pushes an even last bit outward), then to float32."""
    p = a.double() * b.double()
    c = c.double()
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    even = (s.view(torch.int64) & 1) == 0
    away = torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf")))
    s = torch.where((err != 0) & even, torch.nextafter(s, away), s)
    return s.float()


def quantize_a(a: torch.Tensor, k_blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(M, K) float32 -> q (M, blocks, 32) as float32 integers, scale (M, blocks), blksum (M, blocks)."""
    m, k = a.shape
    blocks = torch.nn.functional.pad(a, (0, k_blocks * BLOCK - k)).reshape(m, k_blocks, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    scale = amax / 127.0
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv.unsqueeze(-1))
    return q, scale, scale * q.sum(dim=-1)


class PackedB:
    """The weight as the kernel reads it, built once per weight: raw 4-bit values (with AVX-512
    VNNI: packed two a byte in the lanes' order, 16 outputs side by side: ``cols``), the scales, and the
    block sums' factor -(zero point * scale). The torch path's float operands are made when it
    first runs (four bytes a value: never where the C kernel serves)."""

    def __init__(self, raw: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None) -> None:
        n, nb, _ = raw.shape  # raw: (N, blocks, 32) values 0..15
        self.n, self.nb, self.groups = n, nb, nb // GROUP
        self._scale = scales.to(torch.float32).reshape(n, nb).contiguous()
        self.zp = None if zero_points is None else zero_points.to(torch.float32).reshape(n, nb)
        self.raw = raw.to(torch.uint8).reshape(n, nb * BLOCK).contiguous()  # the C kernel's operand
        self.cols = self.tcols = self.scale_c = self.bsum_c = self.call = None
        self._torch: tuple | None = None
        self._bsum: torch.Tensor | None = None
        pack = native.function("nbits_int8", "nbits_int8_pack_lanes", "iipp")
        has = native.function("nbits_int8", "nbits_int8_has_lanes", "", ctypes.c_int)
        call = native.function("nbits_int8", "nbits_int8_gemm_cols", "iiippppiipppi", ctypes.c_int)
        if pack is not None and has is not None and has() and call is not None:
            self._pack_cols(pack, zero_points is not None)
            # the weight's arguments bound once: a decode step makes ~60 of these calls
            self.call = functools.partial(call, n, self.n_pad, nb, self.cols.data_ptr(), self.tcols.data_ptr(),
                                          self.scale_c.data_ptr(), 0 if self.bsum_c is None else self.bsum_c.data_ptr())
        else:
            self._bsum = self.bsum
        self.nbytes = sum(t.numel() * t.element_size() for t in
                          (self._scale, self.zp, self._bsum, self.raw, self.cols, self.tcols, self.scale_c, self.bsum_c)
                          if t is not None)

    def _pack_cols(self, pack, zero_points: bool) -> None:
        """The C kernel's operands (nbits_int8_gemm_cols): the lanes of 16 outputs side by side, N
        padded to 16 with zero weights, the scales and the block sums' factors by chunk of 16 outputs
        (none for zero points of 8: the kernel makes them from the scales). The raw values are dropped: the
        columns hold every value (``values``)."""
        n, nb, g = self.n, self.nb, self.groups
        self.n_pad = -(-n // 16) * 16
        chunks, rest = self.n_pad // 16, nb - g * GROUP
        lanes = torch.zeros(self.n_pad, g, 64, dtype=torch.uint8)
        pack(n, nb, self.raw.data_ptr(), lanes.data_ptr())
        self.cols = lanes.view(chunks, 16, g, 16, 4).permute(0, 2, 3, 1, 4).contiguous()  # (c, g, lane, out, 4)
        tail = torch.zeros(self.n_pad, rest * BLOCK, dtype=torch.uint8)
        tail[:n] = self.raw[:, g * GROUP * BLOCK:]
        self.tcols = tail.view(chunks, 16, rest, 8, 4).permute(0, 2, 3, 1, 4).contiguous()  # (c, r, lane, out, 4)
        self.scale_c = _by_chunk(self._scale, self.n_pad)
        if zero_points:
            self.bsum_c = _by_chunk(self.bsum, self.n_pad)
        self.raw = self._scale = None  # the columns and scale_c hold them

    @property
    def scale(self) -> torch.Tensor:
        """(N, blocks) the block scales."""
        if self._scale is not None:
            return self._scale
        return self.scale_c.permute(0, 2, 1).reshape(self.n_pad, self.nb)[:self.n]

    @property
    def bsum(self) -> torch.Tensor:
        """(N, blocks) the block sums' factors -(zero point * scale) (zero point 8 where none is given);
        kept where the scalar kernel reads them."""
        if self._bsum is not None:
            return self._bsum
        zp = torch.full_like(self.scale, 8.0) if self.zp is None else self.zp
        return -(zp * self.scale)

    def values(self) -> torch.Tensor:
        """(N, blocks * 32) the raw values 0..15, one a byte."""
        if self.raw is not None:
            return self.raw
        n, g, npad = self.n, self.groups, self.n_pad
        lanes = self.cols.permute(0, 3, 1, 2, 4).reshape(npad, g, 64)[:n]
        tail = self.tcols.permute(0, 3, 1, 2, 4).reshape(npad, -1)[:n]
        vals = torch.empty(n, g, GROUP * BLOCK, dtype=torch.uint8)
        first, last = _ORDER.reshape(16, 2, 4)[:, 0].reshape(-1), _ORDER.reshape(16, 2, 4)[:, 1].reshape(-1)
        vals[:, :, first] = lanes & 15
        vals[:, :, last] = lanes >> 4
        return torch.cat([vals.reshape(n, -1), tail], 1)

    def torch_operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(groups, 16, 8, N) and (rest, 8, 4, N) float32: right operands of the lane matmuls."""
        if self._torch is None:
            n, nb, g = self.n, self.nb, self.groups
            q = self.values().reshape(n, nb, BLOCK).to(torch.float32)
            grouped = q[:, :g * GROUP].reshape(n, g, GROUP * BLOCK)[:, :, _ORDER].reshape(n, g, 16, 8) \
                .permute(1, 2, 3, 0).contiguous()
            rest = q[:, g * GROUP:].reshape(n, nb - g * GROUP, 8, 4).permute(1, 2, 3, 0).contiguous()
            self._torch = (grouped, rest)
        return self._torch


def _fold(x: torch.Tensor, n_full: int) -> torch.Tensor:
    """(8, M, N) lanes -> (M, N): columns below ``n_full`` as MLAS folds 4 columns at once, the
    rest as its one-column horizontal sum."""
    lo = ((x[0] + x[1]) + x[2]) + x[3]
    hi = ((x[4] + x[5]) + x[6]) + x[7]
    out = lo + hi
    if n_full < x.shape[-1]:
        t = x[..., n_full:]
        out[:, n_full:] = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]))
    return out


def _rows(a: torch.Tensor, w: PackedB, bias: torch.Tensor | None) -> torch.Tensor:
    q, sa, asum = quantize_a(a, w.nb)
    m, g = a.shape[0], w.groups
    grouped, rest = w.torch_operands()
    comb = sa.t().unsqueeze(-1) * w.scale.t().unsqueeze(1)  # (blocks, M, N) = scale_a * scale_b
    acc = torch.zeros(16, m, w.n)
    if g:
        qa = q[:, :g * GROUP].reshape(m, g, GROUP * BLOCK)[:, :, _ORDER].reshape(m, g, 16, 8).permute(1, 2, 0, 3)
        part = torch.matmul(qa, grouped)  # (groups, 16, M, N), exact integers
        for i in range(g):
            acc = fma32(part[i], comb[GROUP * i + _LANE_BLOCK], acc)
    acc = acc[:8] + acc[8:]
    if w.nb > g * GROUP:
        qa = q[:, g * GROUP:].reshape(m, w.nb - g * GROUP, 8, 4).permute(1, 2, 0, 3)
        part = torch.matmul(qa, rest)  # (rest, 8, M, N)
        for i in range(part.shape[0]):
            acc = fma32(part[i], comb[g * GROUP + i].unsqueeze(0), acc)
    out = _fold(acc, w.n - w.n % 4)
    if bias is not None:
        out = out + bias.to(torch.float32)
    extra = torch.zeros(m, w.n)
    for i in range(w.nb):
        extra = fma32(asum[:, i:i + 1].expand(m, w.n), w.bsum[:, i].expand(m, w.n), extra)
    return extra + out


def matmul(a: torch.Tensor, w: PackedB, bias: torch.Tensor | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """(..., K) float32 times the packed weight: (..., N) float32, onnxruntime's bits; written into
    ``out`` where it is a contiguous float32 tensor of the result's size (else a new tensor)."""
    k = a.shape[-1]
    if w.call is not None and type(out) is torch.Tensor and a.dtype is _F32 and out.dtype is _F32 and a.numel() \
            and out.numel() == a.numel() // k * w.n and a.is_contiguous() and out.is_contiguous() \
            and (bias is None or (bias.dtype is _F32 and bias.is_contiguous())):
        # a bound call's usual case: float32 rows in, the runtime's buffer out
        rows = a.numel() // k
        if w.call(k, rows, a.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                  _threads(rows, w.n, k)) == 0:
            native.count("nbits_int8_native_calls")
            return out
    lead = a.shape[:-1]
    flat = a.reshape(-1, a.shape[-1]).to(torch.float32)
    if flat.shape[0] == 0:
        return torch.zeros(*lead, w.n)
    if w.call is not None:  # the VNNI kernel, the weight's arguments bound (PackedB)
        fn = w.call
    elif w.raw is not None:
        scalar = native.function("nbits_int8", "nbits_int8_gemm", "iiiipppppp", ctypes.c_int, fallbacks="nbits_int8")
        fn = None if scalar is None else functools.partial(_scalar_call, scalar, w)
    else:
        fn = None
    if fn is not None:
        flat = flat.contiguous()
        b = None if bias is None else bias.to(torch.float32).contiguous()
        m = flat.shape[0]
        direct = out is not None and out.dtype == torch.float32 and out.is_contiguous() and out.numel() == m * w.n
        y = out if direct else torch.empty(m, w.n)
        if fn(flat.shape[1], m, flat.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(),
              _threads(m, w.n, flat.shape[1])) == 0:
            native.count("nbits_int8_native_calls")
            return out if direct else y.reshape(*lead, w.n)
        native.count("nbits_int8_torch_fallbacks")  # no memory for A's int8 copy
    return torch_matmul(flat, w, bias).reshape(*lead, w.n)


def _by_chunk(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """(N, blocks) as (chunks of 16 outputs, blocks, 16), N padded with zeros."""
    n, nb = t.shape
    padded = torch.zeros(n_pad, nb)
    padded[:n] = t
    return padded.view(n_pad // 16, 16, nb).permute(0, 2, 1).contiguous()


def _threads(rows: int, n: int, k: int) -> int:
    """The C kernel's OpenMP threads: torch's count from 256K products on (a decode step's small products
    are a few microseconds: a second thread's wake-up would cost more), else one."""
    return torch.get_num_threads() if rows * n * k >= 1 << 18 else 1


def _scalar_call(fn, w: PackedB, k: int, m: int, a: int, bias: int, y: int, threads: int) -> int:
    """The scalar C kernel called as PackedB.call is (K, rows, then pointers; its threads its own)."""
    return fn(m, w.n, k, w.nb, a, w.raw.data_ptr(), w.scale.data_ptr(), w.bsum.data_ptr(), bias, y)


def torch_matmul(flat: torch.Tensor, w: PackedB, bias: torch.Tensor | None = None) -> torch.Tensor:
    """(M, K) float32 -> (M, N): the same bits as the C kernel, in torch ops."""
    step = max(1, _ROWS_ELEMS // max(1, w.nb * 8 * w.n))
    outs = [_rows(flat[r:r + step], w, bias) for r in range(0, flat.shape[0], step)]
    return torch.cat(outs) if len(outs) != 1 else outs[0]
