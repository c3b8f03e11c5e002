"""Float32 products at float32's accuracy on TF32 tensor cores: each operand split into a TF32 part
and a remainder, three TF32 products summed (the ``fp32_products`` option, options.py).

Why: with TF32 off, cuBLAS runs float32 products on the SIMT units (~45 TFLOPS on an H100/H200),
while its TF32 kernels run 4-6x faster but keep 10 mantissa bits (~3e-4 relative error). Write
``x = x_hi + x_lo`` with ``x_hi`` = x rounded to nearest TF32 (exact in TF32) and ``x_lo = x - x_hi``
(exact in float32, at most 2^-11 of x); then ``x @ w ~= x_hi @ w_hi + x_hi @ w_lo + x_lo @ w_hi``:
the dropped ``x_lo @ w_lo`` is ~2^-22 of the product and TF32's rounding of the remainders about as
small, so the sum is as close to the exact product as cuBLAS's float32 kernel is (float32's own
rounding is 2^-24 per operation, summed over K). Measured on an H200 against float64
(``benchmarks/tf32x3_forms.py``): the three products in separate calls, each accumulated onto the
last in float32 (cuBLAS's beta = 1), keep that accuracy; one call over the parts concatenated along
K does not (~1e-5: small and large terms share a tensor-core accumulator), so three calls it is.
Time: BERT-base's products at 3,072-12,288 tokens 0.55-0.75x cuBLAS's float32 time; at a few hundred
rows three launches lose, so the dynamic path splits only products of at least ``AUTO_MACS``
multiply-adds and a static impl's build times the split against the other forms (tuned_gemm.py).

Memory: a weight's two parts are made once and kept (two float32 copies beside the weight, counted
in ``held_bytes``); an activation's parts are temporaries of the call. TF32 is switched on for
cuBLAS around the three calls only (process-wide, as a run's ``allow_tf32`` switch is:
run_settings.py), and restored: convolutions and other products keep the run's setting.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref

import torch

try:  # CI has no GPU and no triton: the torch form of the split serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

MODES = ("auto", "split", "ieee")
# the session's fp32_products for the run in progress (set by run_settings.Precision): "ieee"
# outside a CUDA session's run
MODE: contextvars.ContextVar[str] = contextvars.ContextVar("fp32_products", default="ieee")
# the session's allow_tf32 for the run in progress (None outside a CUDA session's run): a build on
# the compile worker applies it (``run_flags``), since the switches are process-wide and the worker
# is not inside the run that queued it
ALLOW_TF32: contextvars.ContextVar[bool | None] = contextvars.ContextVar("allow_tf32", default=None)
AUTO_MACS = 1 << 31  # H200: split products of 2.4-5.4e9 multiply-adds ran 1.07-1.35x faster, 1.8e9 ones 0.95x
_MASK = -8192  # 0xFFFFE000: sign, exponent and TF32's 10 mantissa bits


def eligible(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the split may serve ``x @ w``: a run that asks for it, float32 CUDA operands, and
    TF32 not already allowed (then cuBLAS's own TF32 product is what the caller asked for)."""
    return (MODE.get() != "ieee" and x.is_cuda and x.dtype == torch.float32 and w.dtype == torch.float32
            and not torch.backends.cuda.matmul.allow_tf32)


def worth(m: int, n: int, k: int) -> bool:
    """On the dynamic path (no timing): split where three TF32 products beat one float32 product."""
    return MODE.get() == "split" or m * n * k >= AUTO_MACS


# ---- the split ---------------------------------------------------------------------------------
def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)``: ``hi`` = x rounded to the nearest TF32 value (ties to even), ``lo = x - hi``;
    a non-finite x keeps its value in ``hi`` and 0 in ``lo`` (inf - inf would be NaN)."""
    if triton is not None and x.is_cuda and x.is_contiguous() and x.numel() > 0:
        return _split_triton(x)
    bits = x.view(torch.int32)
    hi = ((bits + 0xFFF + ((bits >> 13) & 1)) & _MASK).view(torch.float32)
    lo = torch.where(torch.isfinite(x), x - hi, 0.0)
    return hi, lo


if triton is not None:
    @triton.jit
    def _split_kernel(x_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        x = tl.load(x_ptr + offs, mask=keep, other=0.0)
        bits = x.to(tl.int32, bitcast=True)
        hi = ((bits + 0xFFF + ((bits >> 13) & 1)) & -8192).to(tl.float32, bitcast=True)
        finite = tl.abs(x) < float("inf")
        lo = tl.where(finite, x - hi, 0.0)
        tl.store(hi_ptr + offs, hi, mask=keep)
        tl.store(lo_ptr + offs, lo, mask=keep)


def _split_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    n = x.numel()
    block = 2048
    _split_kernel[(triton.cdiv(n, block),)](x, hi, lo, n, BLOCK=block, num_warps=8)
    return hi, lo


# ---- a weight's parts, made once ---------------------------------------------------------------
PRODUCTS = [0]  # split products run in this process (stats' split_tf32_products)
_PARTS: dict[int, tuple] = {}  # id(weight) -> (weakref, version, hi, lo)
_LOCK = threading.Lock()


def parts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's ``(hi, lo)`` (contiguous, of w's shape), made on its first use and again if it is
    written in place (``update_weights``); dropped with the weight. ``w`` is the tensor the session
    holds (a view made per call would be a new object each time)."""
    key = id(w)
    with _LOCK:
        got = _PARTS.get(key)
        if got is not None and got[0]() is w and got[1] == w._version:
            return got[2], got[3]
    hi, lo = split(w.contiguous())
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return hi, lo  # made by the graph on each replay: memory of its pool is nothing to keep
    made = getattr(_RECORD, "made", None)
    if made is not None:
        made.add(key)

    def forget(_ref, key=key):
        with _LOCK:
            _PARTS.pop(key, None)

    with _LOCK:
        _PARTS[key] = (weakref.ref(w, forget), w._version, hi, lo)
    return hi, lo


_RECORD = threading.local()


@contextlib.contextmanager
def recording():
    """The ids of the tensors whose parts were made in this thread meanwhile: a background build
    warms its region on scratch copies of the weights (impls/static.py ``detached``), then makes the
    real weights' parts before the capture, which would otherwise split them on every replay."""
    prev, _RECORD.made = getattr(_RECORD, "made", None), set()
    try:
        yield _RECORD.made
    finally:
        _RECORD.made = prev


def held_bytes() -> int:
    """Bytes of the weights' parts held now (memory_stats' ``split_tf32_weight_bytes``)."""
    with _LOCK:
        return sum(2 * v[2].numel() * v[2].element_size() for v in _PARTS.values())


@contextlib.contextmanager
def run_flags():
    """The queuing run's TF32 switches (cuDNN's and cuBLAS's) around a build on the compile worker,
    restored afterwards; nothing where no run queued it. Without this a background capture took
    whatever the process had: torch's default lets cuDNN use TF32, so a captured convolution
    could differ from the dynamic path's by ~1e-3."""
    allow = ALLOW_TF32.get()
    if allow is None:
        yield
        return
    b = torch.backends
    prev = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
    b.cudnn.allow_tf32 = b.cuda.matmul.allow_tf32 = allow
    try:
        yield
    finally:
        b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = prev


@contextlib.contextmanager
def _tf32():
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


# ---- the product --------------------------------------------------------------------------------
def product(x2: torch.Tensor, w: torch.Tensor, w_out_in: bool, addend: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K] @ W (+ addend)`` as three TF32 products accumulated in float32. ``w`` is the
    weight as the session holds it (its parts are kept): ``[N, K]`` when ``w_out_in`` (Linear's
    layout), else ``[K, N]``; ``addend`` a bias [N] or a residual [M, N]; ``out`` an [M, N] tensor
    to write (else a new one)."""
    PRODUCTS[0] += 1
    w_hi, w_lo = parts(w)
    if w_out_in:
        w_hi, w_lo = w_hi.t(), w_lo.t()
    x_hi, x_lo = split(x2.contiguous())
    with _tf32():
        # the small terms first, the large last: each call adds onto the last in float32
        if addend is not None:
            y = torch.addmm(addend, x_lo, w_hi, out=out) if out is not None else torch.addmm(addend, x_lo, w_hi)
        else:
            y = torch.mm(x_lo, w_hi, out=out) if out is not None else torch.mm(x_lo, w_hi)
        y.addmm_(x_hi, w_lo)
        y.addmm_(x_hi, w_hi)
    return y
