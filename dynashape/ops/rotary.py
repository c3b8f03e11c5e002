"""The fused "rotate-half" rotary position embedding (``compile/fuse_rotary.py``).

``RotaryHalf(x, cos, sin) = x * cos + cat([-x[..., h:], x[..., :h]], -1) * sin``, h half of x's
last dim d; cos and sin broadcast to x's shape. Exported, it is five kernels per tensor on a GPU
(mul, neg, cat, mul, add), twice in every decoder layer, each a launch of a few hundred elements
at a decode step. On CUDA with Triton it is one kernel; elsewhere (CI: no GPU, no triton) the
torch form, which is what the replaced nodes computed.
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from .fused import DOMAIN, CannotServe
from .registry import op
from .shapes import broadcast

try:  # CI has no GPU and no triton: the torch form serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

MAX_D = 1024  # one program holds a whole row: beyond this the torch form serves
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rotary_infer(shapes, values):
    x = tuple(shapes[0])
    try:
        out = broadcast([x, tuple(shapes[1]), tuple(shapes[2])])[0]
    except ShapeError as e:
        raise CannotServe(f"cos / sin that do not broadcast to x: {e}") from e
    # the kernel writes x's shape: cos / sin that enlarge it are the replaced nodes' business
    if len(out) != len(x) or any(a != b for a, b in zip(out, x)):
        raise CannotServe("cos / sin that enlarge x")
    return [x]


@op("RotaryHalf", 1, DOMAIN, infer=_rotary_infer, writes_out=False,
    notes="x * cos + rotate_half(x) * sin (fuse_rotary)")
def _rotary_half(x, cos, sin, *, out=None):
    d = x.shape[-1]
    if triton is not None and x.is_cuda and x.dim() <= 4 and d <= MAX_D and x.dtype in _TRITON_DTYPES:
        return _triton(x, cos, sin)
    return rotary_half_torch(x, cos, sin)


def rotary_half_torch(x, cos, sin):
    """What the exported nodes compute, in their order (each product rounded to x's dtype)."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def _as_4d(t):
    """``t`` with leading dims of size 1 up to rank 4: a view, strides kept."""
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def _triton(x, cos, sin):
    # nothing here reads the device or allocates beyond the output: safe in a CUDA graph capture
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x4 = _as_4d(x)
    c4 = _as_4d(cos.expand(x.shape))  # stride 0 on the broadcast dims: each row reads its own
    s4 = _as_4d(sin.expand(x.shape))
    a, b, c, d = x4.shape
    block = triton.next_power_of_2(d)
    with torch.cuda.device(x.device):  # Triton launches on the current device: make it x's (cuda:1)
        _rotary_kernel[(a * b * c,)](x4, c4, s4, out, b, c, *x4.stride(), *c4.stride(), *s4.stride(),
                                     D=d, H=d // 2, BLOCK=block, num_warps=1 if block <= 256 else 4)
    return out


if triton is not None:
    @triton.jit
    def rotated_row(X, C, S, i0, i1, i2, sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3,
                    D: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr):
        """Row (i0, i1, i2) of X rotated (rotate_half), as float32: x * cos + rotate_half(x) * sin;
        also what ops/rope_append.py's kernel rotates q and k with."""
        j = tl.arange(0, BLOCK)
        m = j < D
        first = j < H
        partner = tl.where(first, j + H, j - H)  # the element rotate_half puts at j
        xr = X + i0 * sx0 + i1 * sx1 + i2 * sx2
        xj = tl.load(xr + j * sx3, mask=m, other=0.0).to(tl.float32)
        xp = tl.load(xr + partner * sx3, mask=m, other=0.0).to(tl.float32)
        cj = tl.load(C + i0 * sc0 + i1 * sc1 + i2 * sc2 + j * sc3, mask=m, other=0.0).to(tl.float32)
        sj = tl.load(S + i0 * ss0 + i1 * ss1 + i2 * ss2 + j * ss3, mask=m, other=0.0).to(tl.float32)
        return xj * cj + tl.where(first, -xp, xp) * sj

    # the leading sizes and strides change with batch and sequence length: not specialised on, so a
    # new shape (or a CUDA graph capture of one) compiles no new variant
    @triton.jit(do_not_specialize=["B", "C", "sx0", "sx1", "sx2", "sc0", "sc1", "sc2", "ss0", "ss1", "ss2"])
    def _rotary_kernel(X, COS, SIN, OUT, B, C, sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3,
                       D: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        i0 = row // (B * C)
        i1 = (row // C) % B
        i2 = row % C
        y = rotated_row(X, COS, SIN, i0, i1, i2, sx0, sx1, sx2, sx3, sc0, sc1, sc2, sc3, ss0, ss1, ss2, ss3,
                        D, H, BLOCK)
        j = tl.arange(0, BLOCK)
        m = j < D
        tl.store(OUT + row * D + j, y.to(OUT.dtype.element_ty), mask=m)
