"""A 3x3 stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3): a form ``tuned_conv.py``
times in a CUDA static impl's build.

Each 2x2 block of outputs is computed from its 4x4 input tile with 16 multiplies per (input,
output) channel pair instead of 36: ``Y = A^T [ (G g G^T) * (B^T d B) ] A``. Over all tiles the
16 elementwise products are 16 matrix products, ``M[k] = U[k] @ V[k]`` with ``U [16, out, in]``
the transformed weights (computed once per weight) and ``V [16, in, tiles]`` the transformed
input tiles. cuDNN's fp32 kernels on Hopper offer no Winograd algorithm to torch's benchmark
mode (all of its algorithms timed changed nothing), and the fp32 FFMA rate bounds ResNet-50's
3x3 convolutions at batches 8 and 16; 2.25x fewer multiplies then pays for the transforms'
memory passes. F(2x2, 3x3)'s transforms have entries 0, +-1 and +-1/2, so its float32 error stays
within a few units in the last place of the sums (measured against float64 in the tests).

The transforms are Triton kernels (one pass each: tiles in, 16 values out; 16 values in, the
2x2 outputs with the bias, the residual and the ReLU out); ``*_torch`` are the same arithmetic
in torch ops, for the tests on machines without a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .weight_cache import WeightCache

try:  # CI has no GPU and no triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

# F(2x2, 3x3): Y = A^T [(G g G^T) * (B^T d B)] A
_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))
BLOCK_P = 128
MAX_WORKSPACE = 128 << 20  # bytes of V (or M): ResNet-50's largest at batch 16 is 51 MiB

_U = WeightCache()  # per weight: U
# the output kernel's variants (HAS_B, HAS_Z, RELU) launched in this process: a build that times
# nothing takes Winograd only where its kernels are compiled (tuned_conv.guess), since a Triton
# compile on a fresh machine (~1 s a variant) held a ResNet-50's first graphs past 100 calls
_READY: set[tuple[bool, bool, bool]] = set()


def serves(x: torch.Tensor, w: torch.Tensor, stride, padding) -> bool:
    """A float32 CUDA convolution of a 3x3 kernel, stride 1, padding at most 2, Triton present,
    whose transformed tiles fit ``MAX_WORKSPACE`` (16 values per tile and channel, in and out)."""
    if not (triton is not None and x.is_cuda and x.dtype == torch.float32 and x.dim() == 4
            and tuple(w.shape[2:]) == (3, 3) and tuple(stride) == (1, 1) and all(0 <= p <= 2 for p in padding)):
        return False
    _, _, th, tw = tiles(x, padding)
    return th > 0 and tw > 0 and 16 * max(x.shape[1], w.shape[0]) * x.shape[0] * th * tw * 4 <= MAX_WORKSPACE


def transformed_weight(w: torch.Tensor) -> torch.Tensor:
    """``U [16, out, in]`` = G g G^T per channel pair, computed in float64 and kept per weight
    tensor (a constant of the model: computed at the form's first run, outside any capture)."""
    def make():
        # _G's rows made on the device: a copy from the host would wait for it (a sync per weight)
        e = torch.eye(3, dtype=torch.float64, device=w.device)
        g = torch.stack([e[0], (e[0] + e[1] + e[2]) / 2, (e[0] - e[1] + e[2]) / 2, e[2]])
        u = torch.einsum("ar,oirs,bs->aboi", g, w.double(), g).reshape(16, w.shape[0], w.shape[1])
        return u.to(w.dtype).contiguous()
    return _U.get(w, make)


def tiles(x: torch.Tensor, padding) -> tuple[int, int, int, int]:
    """Output height and width, and the 2x2 tiles along each."""
    ho, wo = x.shape[2] + 2 * padding[0] - 2, x.shape[3] + 2 * padding[1] - 2
    return ho, wo, (ho + 1) // 2, (wo + 1) // 2


def conv3x3(x, w, b, padding, relu: bool = False, z=None) -> torch.Tensor:
    """``relu?(conv2d(x, w, b, 1, padding) (+ z))`` for an NCHW float32 CUDA ``x``."""
    x = x.contiguous()
    n, c = x.shape[:2]
    ho, wo, th, tw = tiles(x, padding)
    p = n * th * tw
    v = torch.empty(16, c, p, dtype=x.dtype, device=x.device)
    m = torch.empty(16, w.shape[0], p, dtype=x.dtype, device=x.device)
    y = torch.empty(n, w.shape[0], ho, wo, dtype=x.dtype, device=x.device)
    zc = None if z is None else z.contiguous()
    with torch.cuda.device(x.device):
        _input_kernel[(triton.cdiv(p, BLOCK_P), c)](x, v, c, x.shape[2], x.shape[3], th, tw, p,
                                                    padding[0], padding[1], BLOCK=BLOCK_P)
        torch.bmm(transformed_weight(w), v, out=m)
        _output_kernel[(triton.cdiv(p, BLOCK_P), w.shape[0])](
            m, y if b is None else b, y if zc is None else zc, y, w.shape[0], ho, wo, th, tw, p,
            HAS_B=b is not None, HAS_Z=zc is not None, RELU=bool(relu), BLOCK=BLOCK_P)
    _READY.add((b is not None, zc is not None, bool(relu)))
    return y


def ready(has_b: bool, has_z: bool, relu: bool) -> bool:
    """Whether this epilogue's kernels were compiled in this process (launched once)."""
    return (has_b, has_z, bool(relu)) in _READY


def warm(device: torch.device, wanted: set[tuple[bool, bool, bool]]) -> None:
    """Compile the kernels of these epilogues now (a session's load) on a one-tile convolution."""
    if triton is None or device.type != "cuda":
        return
    x = torch.ones(1, 1, 4, 4, device=device)
    w = torch.ones(1, 1, 3, 3, device=device)
    for has_b, has_z, relu in sorted(wanted - _READY):
        conv3x3(x, w, torch.ones(1, device=device) if has_b else None, (1, 1), relu,
                torch.ones(1, 1, 4, 4, device=device) if has_z else None)


# ---- the same arithmetic in torch ops (the reference the tests hold the kernels to) ---------------
def input_transform_torch(x, padding) -> torch.Tensor:
    """``V [16, c, tiles]``: B^T d B of every 4x4 input tile (tiles in (image, row, col) order)."""
    n, c = x.shape[:2]
    ho, wo, th, tw = tiles(x, padding)
    # pad to the tiles' extent: zeros beyond the input, as the kernel masks
    xp = F.pad(x, (padding[1], 2 * tw + 2 - x.shape[3] - padding[1], padding[0], 2 * th + 2 - x.shape[2] - padding[0]))
    d = xp.unfold(2, 4, 2).unfold(3, 4, 2)  # [n, c, th, tw, 4, 4]
    bt = torch.tensor(_BT, dtype=x.dtype, device=x.device)
    v = torch.einsum("ar,nchwrs,bs->abcnhw", bt, d, bt)
    return v.reshape(16, c, n * th * tw)


def output_transform_torch(m, n, ho, wo, b=None, z=None, relu=False) -> torch.Tensor:
    """``y [n, out, ho, wo]`` from ``M [16, out, tiles]``: A^T m A per tile, then the epilogue."""
    co = m.shape[1]
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    at = torch.tensor(_AT, dtype=m.dtype, device=m.device)
    t = torch.einsum("ra,abonhw,sb->onhrws", at, m.reshape(4, 4, co, n, th, tw), at)
    y = t.reshape(co, n, 2 * th, 2 * tw)[:, :, :ho, :wo].permute(1, 0, 2, 3).contiguous()
    if b is not None:
        y = y + b.view(1, -1, 1, 1)
    if z is not None:
        y = y + z
    return y.relu() if relu else y


if triton is not None:
    @triton.jit
    def _tap(base, rr, cc, H, W, mt):
        return tl.load(base + rr * W + cc, mask=mt & (rr >= 0) & (rr < H) & (cc >= 0) & (cc < W), other=0.0)

    @triton.jit
    def _taps(base, rr, c0, H, W, mt):
        """The four taps of a tile's row ``rr`` from column ``c0`` (zeros outside the input)."""
        return (_tap(base, rr, c0, H, W, mt), _tap(base, rr, c0 + 1, H, W, mt), _tap(base, rr, c0 + 2, H, W, mt),
                _tap(base, rr, c0 + 3, H, W, mt))

    @triton.jit
    def _bt(d0, d1, d2, d3):
        """B^T applied to four values: (d0 - d2, d1 + d2, d2 - d1, d1 - d3)."""
        return d0 - d2, d1 + d2, d2 - d1, d1 - d3

    @triton.jit
    def _store_bt(dst, sk, e0, e1, e2, e3, mt):
        """B^T applied to a row of e (that is, e B), its four values stored ``sk`` apart."""
        v0, v1, v2, v3 = _bt(e0, e1, e2, e3)
        tl.store(dst, v0, mask=mt)
        tl.store(dst + sk, v1, mask=mt)
        tl.store(dst + 2 * sk, v2, mask=mt)
        tl.store(dst + 3 * sk, v3, mask=mt)

    @triton.jit(do_not_specialize=["C", "H", "W", "TH", "TW", "P", "ph", "pw"])
    def _input_kernel(X, V, C, H, W, TH, TW, P, ph, pw, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ch = tl.program_id(1).to(tl.int64)
        mt = t < P
        img = t // (TH * TW)
        rest = t % (TH * TW)
        r0 = (rest // TW) * 2 - ph
        c0 = (rest % TW) * 2 - pw
        base = X + (img * C + ch) * H * W
        d00, d01, d02, d03 = _taps(base, r0, c0, H, W, mt)
        d10, d11, d12, d13 = _taps(base, r0 + 1, c0, H, W, mt)
        d20, d21, d22, d23 = _taps(base, r0 + 2, c0, H, W, mt)
        d30, d31, d32, d33 = _taps(base, r0 + 3, c0, H, W, mt)
        # e = B^T d, column by column
        e00, e10, e20, e30 = _bt(d00, d10, d20, d30)
        e01, e11, e21, e31 = _bt(d01, d11, d21, d31)
        e02, e12, e22, e32 = _bt(d02, d12, d22, d32)
        e03, e13, e23, e33 = _bt(d03, d13, d23, d33)
        out = V + ch * P + t
        sk = C * P
        # V = e B, row by row; k = 4 a + b
        _store_bt(out, sk, e00, e01, e02, e03, mt)
        _store_bt(out + 4 * sk, sk, e10, e11, e12, e13, mt)
        _store_bt(out + 8 * sk, sk, e20, e21, e22, e23, mt)
        _store_bt(out + 12 * sk, sk, e30, e31, e32, e33, mt)

    @triton.jit
    def _at(m0, m1, m2, m3):
        """A^T applied to four values: (m0 + m1 + m2, m1 - m2 - m3)."""
        return m0 + m1 + m2, m1 - m2 - m3

    @triton.jit
    def _row_at(src, a, sk, mt):
        """A^T applied to row ``a`` of the 4x4 products (at ``src + (4 a + b) sk``)."""
        row = src + 4 * a * sk
        return _at(tl.load(row, mask=mt, other=0.0), tl.load(row + sk, mask=mt, other=0.0),
                   tl.load(row + 2 * sk, mask=mt, other=0.0), tl.load(row + 3 * sk, mask=mt, other=0.0))

    @triton.jit
    def _put(Y, Z, dst, ok, v, bias, HAS_B: tl.constexpr, HAS_Z: tl.constexpr, RELU: tl.constexpr):
        if HAS_B:
            v = v + bias
        if HAS_Z:
            v = v + tl.load(Z + dst, mask=ok, other=0.0)
        if RELU:
            v = tl.where(v < 0.0, 0.0, v)  # NaN stays NaN, as torch's relu keeps it
        tl.store(Y + dst, v, mask=ok)

    @triton.jit(do_not_specialize=["CO", "HO", "WO", "TH", "TW", "P"])
    def _output_kernel(M, B, Z, Y, CO, HO, WO, TH, TW, P, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
                       RELU: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        co = tl.program_id(1).to(tl.int64)
        mt = t < P
        src = M + co * P + t
        sk = CO * P
        q00, q01 = _row_at(src, 0, sk, mt)
        q10, q11 = _row_at(src, 1, sk, mt)
        q20, q21 = _row_at(src, 2, sk, mt)
        q30, q31 = _row_at(src, 3, sk, mt)
        img = t // (TH * TW)
        rest = t % (TH * TW)
        rr = (rest // TW) * 2
        cc = (rest % TW) * 2
        if HAS_B:
            bias = tl.load(B + co)
        else:
            bias = 0.0
        at = ((img * CO + co) * HO + rr) * WO + cc
        y00, y10 = _at(q00, q10, q20, q30)
        y01, y11 = _at(q01, q11, q21, q31)
        _put(Y, Z, at + 0 * WO + 0, mt & (rr + 0 < HO) & (cc + 0 < WO), y00, bias, HAS_B, HAS_Z, RELU)
        _put(Y, Z, at + 0 * WO + 1, mt & (rr + 0 < HO) & (cc + 1 < WO), y01, bias, HAS_B, HAS_Z, RELU)
        _put(Y, Z, at + 1 * WO + 0, mt & (rr + 1 < HO) & (cc + 0 < WO), y10, bias, HAS_B, HAS_Z, RELU)
        _put(Y, Z, at + 1 * WO + 1, mt & (rr + 1 < HO) & (cc + 1 < WO), y11, bias, HAS_B, HAS_Z, RELU)
