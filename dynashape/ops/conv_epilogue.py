"""The epilogue of a convolution computed as a matrix product (``tuned_conv.py``) in one pass.

A product form of a convolution leaves ``y[n, c, l]`` (NCHW, or channels first ``[c, n, l]``
when the images went side by side through one product); the convolution's epilogue is then
``relu?(y + bias[c] (+ z[n, c, l]))`` and, for the side-by-side form, the move back to NCHW.
As torch ops that is up to four passes over the output (move with bias, add, ReLU); on CUDA one
Triton kernel reads ``y`` (through its strides) and ``z`` once and writes the result once. At
ResNet-50's batch 16 the product forms' elementwise kernels took ~0.4 ms of a 4.9 ms call
(H200, fp32; ``benchmarks/profile_kernels.py``). Values are those of the torch ops: the same
float32 sums in the same order (``(y + b) + z``), then the ReLU.
"""

from __future__ import annotations

import torch

try:  # CI has no GPU and no triton: the torch form serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_BLOCK = 1024
BLOCKS_L = (64, 256, MAX_BLOCK)  # ResNet-50's 7x7, 14x14 and larger maps
_READY: set[tuple] = set()  # (dtype, HAS_B, HAS_Z, RELU, BLOCK_L) launched in this process


def bias_add_relu(y: torch.Tensor, b, z, relu: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """``relu?(y + b[c] (+ z))`` for ``y`` a view ``[n, c, l]`` whose last stride is 1, into
    ``out`` (a contiguous ``[n, c, l]``; may be ``y`` itself when ``y`` is contiguous) or a new
    tensor; ``b`` a ``[c]`` vector or None, ``z`` a contiguous ``[n, c, l]`` tensor or None."""
    if out is None:
        out = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if _triton_serves(y, b, z, out):
        return _triton(y, b, z, relu, out)
    return _torch(y, b, z, relu, out)


def _torch(y, b, z, relu, out):
    """The torch ops' form (and their values): bias, then the residual, then the ReLU."""
    if b is not None:
        torch.add(y, b.view(1, -1, 1), out=out)
    elif out is not y:
        out.copy_(y)
    if z is not None:
        out.add_(z)
    return out.relu_() if relu else out


def _triton_serves(y, b, z, out) -> bool:
    return (triton is not None and y.is_cuda and y.dim() == 3 and y.dtype in _DTYPES and y.stride(2) == 1
            and out.is_contiguous() and (b is None or (b.dtype == y.dtype and b.is_contiguous()))
            and (z is None or (z.dtype == y.dtype and z.is_contiguous() and z.shape == y.shape)))


def _triton(y, b, z, relu, out):
    n, c, length = y.shape
    rows = n * c
    if rows == 0 or length == 0:
        return out
    block_l = block_for(length)
    block_r = max(1, MAX_BLOCK // block_l)
    grid = (triton.cdiv(rows, block_r), triton.cdiv(length, block_l))
    with torch.cuda.device(y.device):  # Triton launches on the current device: make it y's
        _epilogue_kernel[grid](y, out if b is None else b, out if z is None else z, out, rows, c, length,
                               y.stride(0), y.stride(1), HAS_B=b is not None, HAS_Z=z is not None,
                               RELU=bool(relu), BLOCK_R=block_r, BLOCK_L=block_l,
                               num_warps=4)
    _READY.add((y.dtype, b is not None, z is not None, bool(relu), block_l))
    return out


def block_for(length: int) -> int:
    """The kernel's block along an image's positions: one of ``BLOCKS_L``, the least that holds
    ``length`` (three variants a dtype and epilogue, compiled at a session's load: ``warm``)."""
    return next((b for b in BLOCKS_L if length <= b), MAX_BLOCK)


def ready(dtype: torch.dtype, has_b: bool, has_z: bool, relu: bool, length: int) -> bool:
    """Whether the kernel for this epilogue over ``length`` positions was compiled in this process."""
    return triton is not None and (dtype, has_b, has_z, bool(relu), block_for(length)) in _READY


def warm(device: torch.device, epilogues: set[tuple[bool, bool, bool]]) -> None:
    """Compile the kernels of these epilogues (has a bias, a residual, a ReLU) for float32 at every
    block size now (a session's load), not in a build: a first graph that took a product form
    compiled ~1.2 s of these variants on an H200 with an empty Triton cache."""
    if triton is None or device.type != "cuda":
        return
    for has_b, has_z, relu in sorted(epilogues):
        for block in BLOCKS_L:
            if (torch.float32, has_b, has_z, relu, block) in _READY:
                continue
            y = torch.ones(1, 1, block, device=device)
            _triton(y, torch.ones(1, device=device) if has_b else None, y.clone() if has_z else None, relu,
                    torch.empty_like(y))


if triton is not None:
    # sizes and strides change with the batch: not specialised on (no new variant per shape)
    @triton.jit(do_not_specialize=["rows", "C", "L", "sn", "sc"])
    def _epilogue_kernel(Y, B, Z, OUT, rows, C, L, sn, sc, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
                         RELU: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr):
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        j = tl.program_id(1).to(tl.int64) * BLOCK_L + tl.arange(0, BLOCK_L)
        mr = r < rows
        m = mr[:, None] & (j < L)[None, :]
        img, ch = r // C, r % C
        v = tl.load(Y + (img * sn + ch * sc)[:, None] + j[None, :], mask=m, other=0.0)
        if HAS_B:
            v = v + tl.load(B + ch, mask=mr, other=0.0)[:, None]
        dst = (r * L)[:, None] + j[None, :]
        if HAS_Z:
            v = v + tl.load(Z + dst, mask=m, other=0.0)
        if RELU:
            v = tl.where(v < 0.0, 0.0, v)  # NaN stays NaN, as torch's relu keeps it
        tl.store(OUT + dst, v, mask=m)
