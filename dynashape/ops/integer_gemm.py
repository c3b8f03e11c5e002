"""``qmatmul``: (A - za) @ (B - zb), exact, for MatMulInteger and the quantized ops; and its parts.

Exact integer products through float GEMMs. An 8-bit product of centered operands is at most
255 * 255 in magnitude, and a float32 GEMM adds integers exactly as long as every partial sum
stays below 2**24: in any order, a partial sum of one output is bounded by
max|A - za| * sum_k |B - zb|[k, n]. B is a constant weight in practice, so its column sums are
known once; K is split into the fewest chunks whose bound holds (one chunk for most weights:
sum_k |b| is far below K * 127 for real weights), each chunk a float32 GEMM whose result is
exact, the chunks summed in float64 (exact too). This beats an int32 GEMM (no BLAS kernel in
torch) by 3-50x on CPU, and float64 by 2x. On CUDA the same holds (TF32 and bfloat16 keep
integers up to 256 exactly, and accumulate in float32).

Where torch has a real int8 GEMM, torch._int_mm (int8 x int8 -> int32, exact) serves instead:
on CUDA for M > 16 and K, N multiples of 8; on CPUs where it runs on oneDNN's VNNI / AMX kernels
(a one-time probe times it against float32: on AVX2 it is a slow reference loop) for M >= 8,
3-7x faster than float32 there. uint8 operands are shifted to int8 (x ^ 0x80 = x - 128) and
the zero points corrected in int32: (a - za)(b - zb) summed over K =
a'b' - za' colsum(b') - zb' rowsum(a') + K za' zb', with a' = a - 128, za' = za - 128 (likewise b).

The preparation of B (centered float32 copy, per-block column sums, chunk plans) is cached per
B tensor object (weakly, checked against its version counter): constant initializers are the
same tensors every call; a fed or computed B is prepared again each call.

With the u8s8 saturation switch on (u8s8.py), onnxruntime's saturated pair sums instead
(``saturation_correction``).
"""

from __future__ import annotations

import weakref

import torch

from . import qgemm
from .u8s8 import u8s8_saturation

_F32_EXACT = float(1 << 24)
_BLOCK = 64  # rows of K per block of the column-sum table (64 * 255 * 255 < 2**24: a block always fits)


_INT_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-32768, 32767),
              torch.uint16: (0, 65535), torch.int32: (-(1 << 31), (1 << 31) - 1)}


class PreparedB:
    """What the product needs of one B and its zero point, made once per constant B."""

    def __init__(self, b: torch.Tensor, b_zero_point: torch.Tensor | None):
        # (..., K, N); an alias without B's Python object: prepared_b's cache keeps this and drops it
        # when B dies, which a reference to B (or to a view of it) would keep alive for good
        bb = b.detach()
        bf = bb.to(torch.float32)
        if b_zero_point is not None:
            bf = bf - _b_zp(b_zero_point, bb).to(torch.float32)
        self.raw = bb
        self.bf = bf.contiguous()  # centered, (..., K, N)
        self.k, self.n = bb.shape[-2], bb.shape[-1]
        self._block_sums = None  # made when a plan needs them (for small K, B's type bound settles it: plan)
        self.plans: dict[int, list[tuple[int, int]] | None] = {}
        self.sat = None  # candidates for the u8s8 saturation, made when first asked for
        self.zb = None if b_zero_point is None else _b_zp(b_zero_point, bb)
        self._int8 = None  # torch._int_mm operands, made when first asked for
        self.forms: dict = {}  # B laid out for other kernels (qgemm.py), made when first asked for

    def int8(self):
        """(B' int8 (K, N) contiguous, colsum(B') int32 (N,), zb' int32 or None) of a 2-D 8-bit B,
        B' = B shifted to int8, zb' its zero point shifted alike; None when B is not such."""
        if self._int8 is None:
            b = self.raw
            if b.dim() != 2 or b.dtype not in (torch.uint8, torch.int8):
                self._int8 = False
            else:
                shift = b.dtype == torch.uint8
                b8 = (b.view(torch.int8) ^ -128) if shift else b
                zb = None
                if self.zb is not None and (shift or bool(self.zb.any())):  # a zero zb costs nothing
                    zb = self.zb.to(torch.int32) - (128 if shift else 0)
                elif shift:
                    zb = torch.full((), -128, dtype=torch.int32, device=b.device)
                if zb is not None and zb.dim() > 1:
                    zb = zb.reshape(-1)
                self._int8 = (b8.contiguous(), b8.sum(0, dtype=torch.int32), zb)
        return self._int8 or None

    @property
    def block_sums(self) -> torch.Tensor:
        """The table of column sums of |B - zb| per block of _BLOCK rows of K (max over batch dims)."""
        if self._block_sums is None:
            a = self.bf.abs().to(torch.float64)
            nb = -(-self.k // _BLOCK)
            pad = nb * _BLOCK - self.k
            if pad:
                a = torch.nn.functional.pad(a, (0, 0, 0, pad))
            sums = a.reshape(*a.shape[:-2], nb, _BLOCK, self.n).sum(-2)
            if sums.dim() > 2:
                sums = sums.reshape(-1, nb, self.n).amax(0)
            self._block_sums = sums.cpu()  # (nb, N)
        return self._block_sums

    def plan(self, amax: int) -> list[tuple[int, int]] | None:
        """K split into chunks whose float32 partial sums are exact for |A - za| <= amax; None when
        even one block cannot be (wider than 8-bit operands): then float64."""
        p = self.plans.get(amax, False)
        if p is not False:
            return p
        rng = _INT_RANGE.get(self.raw.dtype)
        if amax == 0 or self.k == 0 or (rng is not None and self.k * amax * (rng[1] - rng[0]) <= _F32_EXACT):
            # (B's type bounds |B - zb|: a dynamic B, new every call, skips the table of sums)
            p = [(0, self.k)]
        else:
            limit = _F32_EXACT / amax
            p, start, run = [], 0, None
            for i in range(self.block_sums.shape[0]):
                blk = self.block_sums[i]
                if float(blk.max()) > limit:
                    p = None
                    break
                if run is not None and float((run + blk).max()) > limit:
                    p.append((start, i * _BLOCK))
                    start, run = i * _BLOCK, blk.clone()
                else:
                    run = blk.clone() if run is None else run.add_(blk)
            if p is not None:
                p.append((start, self.k))
        self.plans[amax] = p
        return p


def _b_zp(zp: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """B's zero point shaped to broadcast over B (..., K, N): one value, one per column, or N-D."""
    if zp.numel() == 1:
        return zp.reshape(())
    if zp.dim() == 1:
        return zp  # per column
    return zp  # (..., 1, N): broadcasts as it is


def _a_zp(zp: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A's zero point shaped to broadcast over A (..., M, K): one value, one per row, or N-D."""
    if zp.numel() == 1:
        return zp.reshape(())
    if zp.dim() == 1 and a.dim() >= 2:
        return zp.reshape(-1, 1)  # per row
    return zp


_PREPARED: dict[int, tuple] = {}


def prepared_b(b: torch.Tensor, b_zero_point: torch.Tensor | None) -> PreparedB:
    """The PreparedB of ``b`` (cached per tensor object while it lives and is not written to)."""
    key = id(b)
    hit = _PREPARED.get(key)
    if hit is not None:
        ref, version, ptr, zk, zsource, prep, zobj, zversion = hit
        if ref() is b and version == b._version and ptr == b.data_ptr():
            # the zero point: generated code hands on the same constant tensor every call (the entry
            # holds it: no other tensor can have its identity), kernels a fresh view (reshape(()))
            # of it; the same living source, unwritten, needs no comparison of values
            if b_zero_point is None:
                if zk is None:
                    return prep
            elif b_zero_point is zobj and zobj._version == zversion:
                return prep
            elif zsource is not None and zsource == _ZpSource(b_zero_point):
                return prep
            elif _same_zp(zk, b_zero_point.detach().reshape(-1)):
                return prep
    prep = PreparedB(b, b_zero_point)
    try:
        ref = weakref.ref(b, lambda _r, k=key, cache=_PREPARED: cache.pop(k, None))  # cache: alive at exit
    except TypeError:
        return prep
    zk = None if b_zero_point is None else b_zero_point.detach().reshape(-1).clone()
    _PREPARED[key] = (ref, b._version, b.data_ptr(), zk, None if b_zero_point is None else _ZpSource(b_zero_point),
                      prep, b_zero_point, None if b_zero_point is None else b_zero_point._version)
    return prep


class _ZpSource:
    """Where a zero point's values live: its base tensor (weakly: a dead one matches nothing), the
    base's version, and the view's offset and shape."""

    __slots__ = ("ref", "version", "offset", "shape")

    def __init__(self, zp: torch.Tensor):
        base = zp._base if zp._base is not None else zp
        try:
            self.ref = weakref.ref(base)
        except TypeError:
            self.ref = None
        self.version, self.offset, self.shape = base._version, zp.storage_offset(), tuple(zp.shape)

    def __eq__(self, other) -> bool:
        return (isinstance(other, _ZpSource) and self.ref is not None and other.ref is not None
                and self.ref() is not None and self.ref() is other.ref() and self.version == other.version
                and self.offset == other.offset and self.shape == other.shape)

    __hash__ = None


def _same_zp(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))


def _amax(a: torch.Tensor, a_zero_point) -> int | None:
    """A bound of |A - za| from the types (and a CPU scalar zero point's value, or an int one)."""
    rng = _INT_RANGE.get(a.dtype)
    if rng is None:
        return None
    lo, hi = rng
    if a_zero_point is None:
        return max(-lo, hi)
    if isinstance(a_zero_point, int):
        return max(a_zero_point - lo, hi - a_zero_point, 0)
    if a_zero_point.numel() == 1 and a_zero_point.device.type == "cpu":
        z = int(a_zero_point.item())
        return max(z - lo, hi - z, 0)
    return hi - lo


def centered_a(a: torch.Tensor, a_zero_point) -> torch.Tensor:
    """A - za as float32 (exact); ``a_zero_point`` a tensor, an int or None."""
    af = a.to(torch.float32)
    if isinstance(a_zero_point, int):
        return af.sub_(a_zero_point) if a_zero_point else af
    if a_zero_point is not None:
        af = af.sub_(_a_zp(a_zero_point, a).to(torch.float32))
    return af


def int_product(af: torch.Tensor, prep: PreparedB, amax: int | None) -> torch.Tensor:
    """The exact product of centered A (float32, (..., M, K)) and prepared B: float32 when one
    chunk served (every value exact, below 2**24), else float64 (exact too)."""
    plan = prep.plan(amax) if amax is not None else None
    bf = prep.bf
    if plan is None:  # operands wider than 8 bits: float64 is exact below 2**53
        return torch.matmul(af.double(), bf.double())
    if len(plan) == 1:
        return torch.matmul(af, bf)
    if bf.dim() == 2 and af.dim() > 2:
        lead = af.shape[:-1]
        af2 = af.reshape(-1, af.shape[-1])
        return _chunked(af2, bf, plan).reshape(*lead, bf.shape[-1])
    return _chunked(af, bf, plan)


def _chunked(af, bf, plan):
    if len(plan) == 1:
        return torch.matmul(af, bf)
    acc = None
    for k0, k1 in plan:
        r = torch.matmul(af[..., k0:k1], bf[..., k0:k1, :])
        acc = r.double() if acc is None else acc.add_(r)
    return acc


def _saturation_candidates(prep: PreparedB):
    """(pair index j, column n, b[2j, n], b[2j+1, n]) of the pairs of a 2-D int8 B that can leave
    int16 with a uint8 A (|b_even| + |b_odd| >= 129, since 255 * 128 < 32767)."""
    if prep.sat is None:
        b = prep.raw.to(torch.int32)
        k = b.shape[-2] - (b.shape[-2] % 2)
        be, bo = b[..., 0:k:2, :], b[..., 1:k:2, :]
        big = (be.abs() + bo.abs()) >= 129
        idx = big.nonzero()
        if b.dim() == 2:
            j, n = idx[:, 0], idx[:, 1]
            prep.sat = (j, n, be[j, n], bo[j, n])
        else:
            prep.sat = ("batched", idx, be[big], bo[big])
    return prep.sat


def saturation_correction(a: torch.Tensor, prep: PreparedB) -> torch.Tensor | None:
    """What onnxruntime's int16 saturation of the uint8 x int8 pair sums adds to the exact product
    (int32, A's leading dims x N), or None when nothing saturates. ``a`` is the raw uint8 A."""
    cand = _saturation_candidates(prep)
    if cand[0] == "batched":
        return _saturation_correction_batched(a, prep, cand)
    j, n, be, bo = cand
    if j.numel() == 0:
        return None
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])
    m = a2.shape[0]
    corr = None
    step = max(1, (1 << 22) // max(m, 1))
    for q0 in range(0, j.numel(), step):
        jj, nn = j[q0:q0 + step], n[q0:q0 + step]
        ae = a2.index_select(1, 2 * jj).to(torch.int32)
        ao = a2.index_select(1, 2 * jj + 1).to(torch.int32)
        s = ae * be[q0:q0 + step] + ao * bo[q0:q0 + step]
        c = s.clamp(-32768, 32767).sub_(s)
        if not bool(c.any()):
            continue
        if corr is None:
            corr = torch.zeros(m, prep.n, dtype=torch.int32, device=a.device)
        corr.index_add_(1, nn, c)
    return None if corr is None else corr.reshape(*lead, prep.n)


def _saturation_correction_batched(a, prep, cand):
    # rare (both operands dynamic): the pair sums in full, per batch
    b = prep.raw.to(torch.int64)
    a64 = a.to(torch.int64)
    k = a64.shape[-1]
    if k % 2:
        a64 = torch.nn.functional.pad(a64, (0, 1))
        b = torch.nn.functional.pad(b, (0, 0, 0, 1))
    s = a64[..., 0::2].unsqueeze(-1) * b[..., 0::2, :].unsqueeze(-3) + \
        a64[..., 1::2].unsqueeze(-1) * b[..., 1::2, :].unsqueeze(-3)  # (..., M, K/2, N)
    c = (s.clamp(-32768, 32767) - s).sum(-2)
    return c.to(torch.int32) if bool(c.any()) else None


_CPU_INT_MM: bool | None = None  # whether torch._int_mm is fast on this CPU (probed once); None: not probed


def _cpu_has_int8_dot() -> bool | None:
    """Whether the CPU has int8 dot-product instructions (VNNI, AMX), which torch._int_mm's
    oneDNN kernels need to be fast; None when torch cannot say."""
    try:
        caps = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):
        return None
    return any(caps.get(k) for k in ("avx512_vnni", "avx_vnni", "amx_int8", "avx_vnni_int8"))


def cpu_int_mm_fast() -> bool:
    """torch._int_mm beats a float32 GEMM here (oneDNN's VNNI / AMX kernels) and is exact: decided
    once per process, from the CPU's features and a timing of both on a 64 x 512 x 1024 product
    (where the fast kernels win 3-4x and torch's fallback loop loses 30x, so noise cannot flip it)."""
    global _CPU_INT_MM
    if _CPU_INT_MM is None:
        _CPU_INT_MM = False
        if _cpu_has_int8_dot() is False:
            return False
        import time
        try:
            g = torch.Generator().manual_seed(0)
            a = torch.randint(-128, 128, (64, 512), dtype=torch.int8, generator=g)
            b = torch.randint(-128, 128, (512, 1024), dtype=torch.int8, generator=g)
            ext = torch.full((64, 512), -128, dtype=torch.int8)
            if not (torch.equal(torch._int_mm(a, b).double(), a.double() @ b.double())
                    and torch.equal(torch._int_mm(ext, b).double(), ext.double() @ b.double())):
                return False
            af, bf = a.float(), b.float()

            def timed(f):
                t0 = time.perf_counter()
                f()
                return time.perf_counter() - t0
            t_f32 = min(timed(lambda: torch.mm(af, bf)) for _ in range(5))
            t_int = timed(lambda: torch._int_mm(a, b))
            if t_int < 4 * t_f32:  # not the fallback loop: time it properly
                t_int = min(timed(lambda: torch._int_mm(a, b)) for _ in range(5))
            _CPU_INT_MM = t_int * 1.25 < t_f32
        except (RuntimeError, AttributeError):
            _CPU_INT_MM = False
    return _CPU_INT_MM


def set_cpu_int_mm(on: bool | None) -> bool | None:
    """Force the CPU int8 GEMM path on (True) or off (False), or probe again (None); for tests.
    Returns the previous setting."""
    global _CPU_INT_MM
    prev, _CPU_INT_MM = _CPU_INT_MM, on
    return prev


def _use_int_mm(device: torch.device, m: int, k: int, n: int) -> bool:
    if device.type == "cuda":
        return m > 16 and k % 8 == 0 and n % 8 == 0 and k >= 16
    # CPU: from 8 rows on, or for fewer rows when B is large enough that reading it as float32
    # costs more than the ~15 us the int8 operands take to make (a GEMV reads 1 byte per weight
    # instead of 4: T5's vocabulary projection in a decode step; an LSTM's recurrent product at
    # batch 4, 256 x 1024: 27 us against 71)
    return (device.type == "cpu" and k > 0 and n > 0 and (m >= 8 or max(m, 2) * k * n >= 1 << 20)
            and cpu_int_mm_fast())


def _rows_zp(zp, a: torch.Tensor, rows: int) -> torch.Tensor | int:
    """A's zero point as an int, or an int32 (rows, 1) tensor for A flattened to (rows, K)."""
    if isinstance(zp, int):
        return zp
    if zp.numel() == 1:
        if zp.device.type == "cpu":
            return int(zp.item())
        return zp.reshape(()).to(torch.int32)
    z = _a_zp(zp, a).to(torch.int32)
    return z.expand(*a.shape[:-1], 1).reshape(rows, 1)


def int8_product(a: torch.Tensor, za, prep: PreparedB, centered: bool = False) -> torch.Tensor | None:
    """The exact product through torch._int_mm, as int32 (A's leading dims x N), or None when the
    operands do not suit it. ``a``: raw uint8 / int8 with zero point ``za`` (tensor, int or None);
    or, ``centered``, float32 a - za holding integers with ``za`` the uint8 zero point it had."""
    k = a.shape[-1]
    rows = a.numel() // k if k else 0
    if not _use_int_mm(a.device, rows, k, prep.n):
        return None
    ops = prep.int8()
    if ops is None:
        return None
    b8, colsum, zb = ops
    lead = a.shape[:-1]
    if centered:  # float a - za, za a uint8 zero point: a' = (a - za) + za - 128
        zq = za if isinstance(za, int) else za.to(torch.float32)
        a8 = (a + (zq - 128)).to(torch.int8).reshape(rows, k)
        zs = (za - 128) if isinstance(za, int) else (za.to(torch.int32) - 128)
        za2 = zs if isinstance(zs, int) else _rows_zp(zs, a, rows)
    else:
        shift = a.dtype == torch.uint8
        a8 = (a.view(torch.int8) ^ -128) if shift else a
        a8 = a8.reshape(rows, k)
        za2 = 0 if za is None else _rows_zp(za, a, rows)
        if shift:
            za2 = za2 - 128
    try:
        p = torch._int_mm(a8.contiguous(), b8)
    except RuntimeError:
        return None
    if isinstance(za2, int):
        if za2:
            p.sub_(colsum, alpha=za2)
    else:
        p -= za2 * colsum
    if zb is not None:
        p -= a8.sum(1, keepdim=True, dtype=torch.int32) * zb
        if not (isinstance(za2, int) and za2 == 0):
            p += (k * za2) * zb
    return p.reshape(*lead, prep.n)


def _saturates(a: torch.Tensor, b: torch.Tensor) -> bool:
    return u8s8_saturation() and a.dtype == torch.uint8 and b.dtype == torch.int8


def qmatmul(a: torch.Tensor, b: torch.Tensor, a_zero_point=None, b_zero_point=None) -> torch.Tensor:
    """(A - za) @ (B - zb), exact: int32 (csrc/qgemm.c on the CPU for a 2-D B and one zero point of
    A; torch._int_mm), float32 (when the values are all below 2**24) or float64; with the u8s8
    saturation switch on, onnxruntime's saturated sums instead."""
    if b.dim() < 2:  # a vector B (rare): float64 holds every such dot product exactly
        bz = b.to(torch.float64) - (0 if b_zero_point is None else b_zero_point.to(torch.float64))
        az = a.to(torch.float64) - (0 if a_zero_point is None else _a_zp(a_zero_point, a).to(torch.float64))
        return torch.matmul(az, bz)
    prep = prepared_b(b, b_zero_point)
    za = a_zero_point
    if za is not None and za.numel() == 1 and za.device.type == "cpu":
        za = int(za.item())  # a host int: no zero-point tensor ops below
    r = None
    if a.dtype in (torch.uint8, torch.int8) and (za is None or isinstance(za, int)) and not _saturates(a, b):
        r = qgemm.product(a, qgemm.byte_kind(a), prep, a_zp=za or 0)
    if r is None and a.dtype in (torch.uint8, torch.int8):
        r = int8_product(a, za, prep)
    if r is None:
        r = int_product(centered_a(a, za), prep, _amax(a, za))
    if _saturates(a, b):
        c = saturation_correction(a, prep)
        if c is not None:
            r = r.double().add_(c)
    return r
