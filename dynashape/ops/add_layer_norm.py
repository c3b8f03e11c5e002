"""LayerNormalization over the last axis as one Triton kernel on CUDA, a residual added first where
the graph adds one (``AddLayerNorm``, compile/fuse_add_layer_norm.py).

Why: a post-norm transformer layer (BERT) ends each branch with ``LayerNorm(Add(y, r))``, which the
dynamic path ran as three kernels: the add, torch's layer norm, and a copy of its result into the
buffer the memory plan gave the node (torch's layer_norm has no ``out=``). A call of a few thousand
tokens is bound by the host's launches (~275 a BERT-base call, benchmarks/new_shape_cost.py), and
the two extra passes over the activations cost the large calls. One kernel reads both inputs once
and writes the plan's buffer: two launches and four passes fewer per norm (H200, 768 columns:
0.025-0.054 ms of device time against torch's 0.036-0.095, 17 us of host against 28-30:
benchmarks/triton_launch.py). The row count is not specialised: one compile serves every shape.

Arithmetic: the sum in float32 (each input read in its dtype), rounded to a half dtype as the Add
it replaces rounds it; mean and variance of the row in float32 over the whole row in registers (two
passes: no running update), ``(s - mean) * rsqrt(var + eps) * gamma + beta``, stored in the output's
dtype; torch's layer norm differs by float32 rounding (~1e-7 relative).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .fused import DOMAIN, CannotServe
from .registry import op
from .triton_launch import INTERPRET, on

try:  # CI has no GPU and no triton: the torch form serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_N = 16384  # a row in one program's registers (BLOCK elements): wider rows take torch's kernels
KERNEL_CALLS = [0]  # norms run by the kernel (stats' add_layer_norm_kernels)


def _infer(shapes, values, *, epsilon=1e-5):
    x, r = tuple(shapes[0]), tuple(shapes[1]) if len(shapes) > 1 and shapes[1] is not None else None
    if r is not None and r != x:  # a residual that broadcasts: the replaced Add and norm serve it
        raise CannotServe("a residual of another shape than the input")
    h = x[-1] if x else None
    for i in (2, 3):
        if len(shapes) > i and shapes[i] is not None and tuple(shapes[i]) != (h,):
            raise CannotServe("a scale or bias that is not one value per column")
    return [x]


def serves(x: torch.Tensor) -> bool:
    """Whether the Triton kernel takes ``x`` (rows of its last axis)."""
    return (triton is not None and (x.is_cuda or INTERPRET) and x.dtype in DTYPES and x.dim() >= 1
            and 0 < x.shape[-1] <= MAX_N)


def add_layer_norm(x: torch.Tensor, r: torch.Tensor | None, gamma: torch.Tensor, beta: torch.Tensor | None,
                   epsilon: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``LayerNorm(x + r)`` over the last axis (``r`` None: of ``x``), written into ``out`` where
    given (contiguous, ``x``'s shape), else into a new tensor. The host's part is kept lean (a
    dynamic call of a few thousand tokens is bound by it): no call where a tensor is contiguous
    already."""
    if not serves(x) or (out is not None and not out.is_contiguous()):
        s = x if r is None else x + r
        y = F.layer_norm(s, (x.shape[-1],), gamma, beta, epsilon)
        return y if out is None else out.copy_(y)
    n = x.shape[-1]
    rows = x.numel() // n
    if not x.is_contiguous():
        x = x.contiguous()
    if r is not None and not r.is_contiguous():
        r = r.contiguous()
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not rows:
        return y
    _launch(x, r, gamma, beta, y, None, rows, epsilon, rms=False, round_sum=True)
    return y


def _launch(x, r, gamma, beta, y, total, rows: int, epsilon: float, rms: bool, round_sum: bool) -> None:
    """One program a row: the norm of ``x (+ r)`` into ``y`` and, ``total`` given, the sum into it."""
    KERNEL_CALLS[0] += 1
    n = x.shape[-1]
    block, warps = _tile(n)
    g = gamma if gamma.is_contiguous() else gamma.contiguous()
    b = beta if beta is None or beta.is_contiguous() else beta.contiguous()
    with on(x.device):
        _kernel[(rows,)](x, r, g, b, y, total if total is not None else y, n, float(epsilon), HAS_R=r is not None,
                         HAS_B=beta is not None, BLOCK=block, RMS=rms, HAS_SUM=total is not None,
                         ROUND_SUM=round_sum, num_warps=warps)


def skip_norm(x: torch.Tensor, skip: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, epsilon: float,
              rms: bool, y: torch.Tensor | None, total: torch.Tensor | None, want_total: bool):
    """onnxruntime's SkipLayerNormalization / SkipSimplifiedLayerNormalization on CUDA as one kernel:
    (the norm of ``x + skip``, that sum or None) written into ``y`` and ``total`` where given (contiguous,
    ``x``'s shape), the sum kept in float32 for the norm (as onnxruntime computes it) and stored in
    ``x``'s dtype. Where the torch form took four kernels (the add, the norm, a copy of each into the
    plan's buffers: two decoder-layer norms took ~13 us of a 1B model's step on an H200,
    results/decode_kernels_builder_1b_h200_2026-11-30.json). None where the kernel does not serve."""
    if not serves(x) or skip.shape != x.shape or not x.is_contiguous() or not skip.is_contiguous() \
            or skip.dtype != x.dtype or gamma.numel() != x.shape[-1] \
            or (beta is not None and beta.numel() != gamma.numel()):
        return None
    bufs = []
    for b, wanted in ((y, True), (total, want_total)):
        if not wanted:
            bufs.append(None)
        elif b is not None and b.shape == x.shape and b.dtype == x.dtype and b.is_contiguous():
            bufs.append(b)
        else:
            bufs.append(torch.empty(x.shape, dtype=x.dtype, device=x.device))
    rows = x.numel() // x.shape[-1]
    if rows:
        _launch(x, skip, gamma, beta, bufs[0], bufs[1], rows, epsilon, rms=rms, round_sum=False)
    return bufs[0], bufs[1]


@functools.lru_cache(maxsize=64)
def _tile(n: int) -> tuple[int, int]:
    """(BLOCK, warps) of a row of ``n``: the row in one block, ~256 of it a warp."""
    block = 1 << max(n - 1, 0).bit_length()
    return block, max(1, min(16, block // 256))


_ELEM = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16}


def forms(graph) -> set[tuple]:
    """The kernel's forms ``graph``'s norms take: (residual, beta, columns, dtype) each."""
    out = set()
    for n in graph.nodes:
        x = n.inputs[0] if n.inputs else None
        if x is None or x.shape is None or not x.shape or not x.shape[-1].is_static or x.elem_type not in _ELEM:
            continue
        fused = n.op_type == "AddLayerNorm" and n.domain == DOMAIN
        if not fused and not (n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx")
                              and n.attrs.get("axis", -1) in (-1, len(x.shape) - 1)):
            continue
        at = 3 if fused else 2
        beta = len(n.inputs) > at and n.inputs[at] is not None
        if int(x.shape[-1]) <= MAX_N:
            out.add((fused, beta, int(x.shape[-1]), _ELEM[x.elem_type]))
    return out


def warm(device: torch.device, graph) -> None:
    """Compile now (a session's load) the kernel's forms ``graph``'s norms take: a first call paid
    ~0.1 s for them on the H200 (results/new_shapes_parts_final_h200_2026-11-29.json)."""
    if device.type != "cuda" or triton is None:
        return
    for with_r, with_beta, h, dtype in forms(graph):
        x = torch.ones(1, h, dtype=dtype, device=device)
        add_layer_norm(x, x if with_r else None, x[0], x[0] if with_beta else None, 1e-5, torch.empty_like(x))


@op("AddLayerNorm", 1, DOMAIN, infer=_infer,
    notes="LayerNormalization(x + r) over the last axis, one Triton kernel on CUDA (fuse_add_layer_norm)")
def _add_layer_norm(x, r, gamma, beta=None, *, epsilon=1e-5, out=None):
    return add_layer_norm(x, r, gamma, beta, epsilon, out)


if triton is not None:
    # the row count is the grid: nothing of the shape is in the kernel's specialisation but BLOCK
    @triton.jit(do_not_specialize=["n", "eps"])
    def _kernel(x_ptr, r_ptr, g_ptr, b_ptr, y_ptr, s_ptr, n, eps, HAS_R: tl.constexpr, HAS_B: tl.constexpr,
                BLOCK: tl.constexpr, RMS: tl.constexpr, HAS_SUM: tl.constexpr, ROUND_SUM: tl.constexpr):
        # RMS: no centring (SimplifiedLayerNormalization); HAS_SUM: the residual sum stored too (the Skip
        # norms' fourth output); ROUND_SUM: the norm of the sum rounded to the dtype, as an Add before it
        row = tl.program_id(0).to(tl.int64) * n
        cols = tl.arange(0, BLOCK)
        keep = cols < n
        s = tl.load(x_ptr + row + cols, mask=keep, other=0.0).to(tl.float32)
        if HAS_R:
            s += tl.load(r_ptr + row + cols, mask=keep, other=0.0).to(tl.float32)
            if ROUND_SUM and x_ptr.dtype.element_ty != tl.float32:
                s = s.to(x_ptr.dtype.element_ty).to(tl.float32)
        if HAS_SUM:
            tl.store(s_ptr + row + cols, s.to(s_ptr.dtype.element_ty), mask=keep)
        if RMS:
            d = tl.where(keep, s, 0.0)
        else:
            mean = tl.sum(s, axis=0) / n
            d = tl.where(keep, s - mean, 0.0)
        inv = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n + eps)
        y = d * inv * tl.load(g_ptr + cols, mask=keep, other=0.0).to(tl.float32)
        if HAS_B:
            y += tl.load(b_ptr + cols, mask=keep, other=0.0).to(tl.float32)
        tl.store(y_ptr + row + cols, y.to(y_ptr.dtype.element_ty), mask=keep)
