"""Float32 products at float32's accuracy on TF32 tensor cores: each operand split into a TF32 part
and a remainder, three TF32 products summed (the ``fp32_products`` option, options.py).

Why: with TF32 off, cuBLAS runs float32 products on the SIMT units (~45 TFLOPS on an H100/H200),
while its TF32 kernels run 4-6x faster but keep 10 mantissa bits (~3e-4 relative error). Write
``x = x_hi + x_lo`` with ``x_hi`` = x rounded to nearest TF32 (exact in TF32) and ``x_lo = x - x_hi``
(exact in float32, at most 2^-11 of x); then ``x @ w ~= x_hi @ w_hi + x_hi @ w_lo + x_lo @ w_hi``:
the dropped ``x_lo @ w_lo`` is ~2^-22 of the product and TF32's rounding of the remainders about as
small, so the sum is as close to the exact product as cuBLAS's float32 kernel is (float32's own
rounding is 2^-24 per operation, summed over K). Measured on an H200 against float64
(``benchmarks/tf32x3_forms.py``, ``benchmarks/split_tf32_error.py``): the tensor cores' float32
accumulation is not float32's rounding: a TF32 product of exact TF32 parts is off by 6e-7 at K = 256
and 8.4e-6 at K = 4096 (cuBLAS's float32 kernel: 3-7e-7), growing with K. So the large product
``x_hi @ w_hi`` runs in pieces of at most ``CHUNK`` along K, each added onto the result in float32
(cuBLAS's beta = 1): 1.2e-6 at any K with pieces of 512; ``CHUNK`` (1024) trades a little of
that for speed. The two small products go in one call over the parts
concatenated along K (``[x_lo | x_hi] @ [w_hi; w_lo]``): their accumulation error is 2^-11 smaller.
Time (H200): BERT-base's products at 12,288 rows take 0.49-0.65x cuBLAS's float32 time, at 6,144
rows 0.59-0.95x; at 1,024 rows and fewer 1.5-3.3x: there the split's launches and passes lose,
so the dynamic path splits only products of many rows
(``worth``) and a static impl's build times the split against the other forms (tuned_gemm.py).

Products of K up to ``ONE_CALL_K`` (1024) are one TF32 call over the parts concatenated along K
(``[x_lo | x_hi | x_hi] @ [w_hi; w_lo; w_hi]``): each launch costs the host tens of microseconds,
and a transformer's call at thousands of tokens was bound by the split's launches (two here, three
or more in pieces). Its accumulation runs over 3K terms: measured end to end on BERT-base the
same error as the pieces (5.9e-6); over every K (3K = 9,216 for the MLP's second product) it was
1.05e-5, so larger K keep the pieces.

Parts in bfloat16 (the default; DYNASHAPE_SPLIT_PARTS=tf32 for the TF32 parts above): ``x_hi`` = x
rounded to bfloat16, ``x_lo`` the remainder rounded to bfloat16 (the pair holds x to 2^-17 of it),
the same three products on bfloat16 tensor cores with float32 accumulation and output. Error: the
dropped ``x_lo @ w_lo`` and the remainders' rounding, each ~2^-17 of a term: a product 3.1-3.3e-6
against float64 at K 256-4096 (TF32 parts 0.4-1.7e-6, cuBLAS float32 0.2-0.8e-6), BERT-base end to
end 8.4e-6 of eager (TF32 parts 5.9e-6). Time (H200, results/split_parts_error_h200_2026-11-29.json):
bfloat16's tensor cores run twice TF32's rate and the parts are half the bytes: BERT-base's products
at 12,288 rows 0.17-0.52 ms against TF32 parts' 0.29-0.79 and float32's 0.46-1.58. And they need no
switch: cuBLAS's TF32 switch is process-wide (below), so with TF32 parts a background build could
not split (its graphs kept float32 products) and a run split only while no build was inside; BERT-base
cycling 7 shapes, whose graphs are built in the background, 0.82 -> 0.52 s (eager 0.90-0.96).
Not done: a bfloat16 product makes a cuBLAS plan per new row count (~100-220 us of the H200's host
against ~10 for float32's: benchmarks/new_shape_blas.py). Running a new row count at a bucket of
rows (8 an octave) whose plan earlier calls made measured no gain on BERT-base at random shapes, in
two leases and in an A/B alternating the modes call by call in one process (calls of 4,096-8,192
tokens 1.48x eager at their own rows, 1.38x at the buckets': results/pad_rows_ab_h200_2026-11-29.json;
the code and its script: git show 02b4e61), so products run at their own rows.

Memory: a weight's parts are made once and kept (two copies beside the weight, three for the one-call
form: float32 with TF32 parts, bfloat16 with bfloat16 ones; counted in ``held_bytes``); an
activation's parts are temporaries of the call. With TF32 parts, TF32 is switched on for cuBLAS
around its calls only (process-wide, as a run's ``allow_tf32`` switch is: run_settings.py), and
restored: convolutions and other products keep the run's setting.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
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
# inside a token region's build (``flag_free_builds``): its split products in Triton (``_flag_free``)
FLAG_FREE: contextvars.ContextVar[bool] = contextvars.ContextVar("flag_free", default=False)
AUTO_ROWS = 4096  # the dynamic path's rule (``worth``)
# the parts in bfloat16 (the default; DYNASHAPE_SPLIT_PARTS=tf32: TF32 parts): three bfloat16
# products with float32 output (``_bf16_mm``), which need no process-wide switch (module docstring)
BF16 = os.environ.get("DYNASHAPE_SPLIT_PARTS", "bf16") != "tf32"
_MASK = -8192  # 0xFFFFE000: sign, exponent and TF32's 10 mantissa bits
_MASK16 = -65536  # 0xFFFF0000: sign, exponent and bfloat16's 7 mantissa bits


def eligible(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the split may serve ``x @ w``: a run that asks for it, float32 CUDA operands, TF32
    not already allowed (then cuBLAS's own TF32 product is what the caller asked for), and on the
    compile worker (``building``) only inside ``flag_free_builds``, with Triton's product, which needs
    no switch (``_flag_free``)."""
    return (MODE.get() != "ieee" and x.is_cuda and x.dtype == torch.float32 and w.dtype == torch.float32
            and not torch.backends.cuda.matmul.allow_tf32
            and (BF16 or not getattr(_WORKER, "on", False) or (triton is not None and FLAG_FREE.get())))


def worth(m: int, n: int, k: int) -> bool:
    """On the dynamic path (no timing): split where it beats one float32 product. Measured on an
    H200 at BERT-base's products (benchmarks/split_tf32_error.py): from 6,144 rows 1.05-2.0x, at
    3,072 rows 1.27-1.48x where N >= 2K (768 -> 2304, 3072) and 0.6-0.9x otherwise, at 1,024 rows
    and fewer 0.3-0.67x (the split's launches and passes over the operands)."""
    return MODE.get() == "split" or m >= AUTO_ROWS or (m >= AUTO_ROWS // 2 and n >= 2 * k)


# ---- the split ---------------------------------------------------------------------------------
def split(x: torch.Tensor, bf16: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)``: ``hi`` = x rounded to the nearest TF32 value (ties to even), ``lo = x - hi``;
    a non-finite x keeps its value in ``hi`` and 0 in ``lo`` (inf - inf would be NaN). With ``bf16``
    both parts are bfloat16: ``hi`` x rounded to bfloat16, ``lo`` the remainder rounded to it (the
    pair holds x to ~2^-17 of it, not exactly)."""
    n = x.numel()
    buf = _split(x.reshape(-1), 1, n, 2, False, bf16)
    return buf[:n].view(x.shape), buf[n:].view(x.shape)


def _split(x: torch.Tensor, rows: int, k: int, parts: int, lo_first: bool, bf16: bool = False) -> torch.Tensor:
    """``x`` read as ``rows`` rows of ``k`` values, split into one new buffer (bfloat16 where
    ``bf16``) of ``parts`` (2 or 3) blocks of ``k`` a row: ``[lo | hi]`` where ``lo_first`` (an
    activation's: its remainders meet the weight's high parts), else ``[hi | lo]``; a third block
    repeats ``hi`` (the one-call form's operands, ``_split_product``). Few arguments on purpose: the
    JIT binds each on every launch, host time a dynamic call is bound by."""
    if not x.is_contiguous():
        x = x.contiguous()
    buf = torch.empty(rows * parts * k, dtype=torch.bfloat16 if bf16 else x.dtype, device=x.device)
    n = rows * k
    if triton is not None and x.is_cuda and n > 0:
        _split_kernel[(-(-n // 2048),)](x, buf, n, k, PARTS=parts, LO_FIRST=lo_first, BF16=bf16, BLOCK=2048,
                                        num_warps=8)
        return buf
    bits = x.view(torch.int32)
    if bf16:  # 8 significant bits: round at bit 16
        hi = ((bits + 0x7FFF + ((bits >> 16) & 1)) & _MASK16).view(torch.float32)
        lo = torch.where(torch.isfinite(hi), x - hi, 0.0)
    else:
        hi = ((bits + 0xFFF + ((bits >> 13) & 1)) & _MASK).view(torch.float32)
        lo = torch.where(torch.isfinite(x), x - hi, 0.0)
    grid = buf.view(rows, parts, k)
    grid[:, 0 if lo_first else 1] = lo.view(rows, k)
    grid[:, 1 if lo_first else 0] = hi.view(rows, k)
    if parts == 3:
        grid[:, 2] = hi.view(rows, k)
    return buf


if triton is not None:
    # one compile for every size (a specialisation per divisibility of n or k would compile again
    # at new shapes: a call's stall)
    @triton.jit(do_not_specialize=["n", "k"])
    def _split_kernel(x_ptr, out_ptr, n, k, PARTS: tl.constexpr, LO_FIRST: tl.constexpr, BF16: tl.constexpr,
                      BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        x = tl.load(x_ptr + offs, mask=keep, other=0.0)
        bits = x.to(tl.int32, bitcast=True)
        if BF16:
            hi = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            lo = tl.where(tl.abs(hi) < float("inf"), x - hi, 0.0)
            # rounded to nearest here, so that the cast below is exact (the interpreter's truncates)
            lb = lo.to(tl.int32, bitcast=True)
            lo = ((lb + 0x7FFF + ((lb >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        else:
            hi = ((bits + 0xFFF + ((bits >> 13) & 1)) & -8192).to(tl.float32, bitcast=True)
            lo = tl.where(tl.abs(x) < float("inf"), x - hi, 0.0)
        hi = hi.to(out_ptr.dtype.element_ty)  # exact: each holds the part's bits only
        lo = lo.to(out_ptr.dtype.element_ty)
        row = offs // k
        at = row * (PARTS * k) + (offs - row * k)
        if LO_FIRST:
            tl.store(out_ptr + at, lo, mask=keep)
            tl.store(out_ptr + at + k, hi, mask=keep)
        else:
            tl.store(out_ptr + at, hi, mask=keep)
            tl.store(out_ptr + at + k, lo, mask=keep)
        if PARTS == 3:
            tl.store(out_ptr + at + 2 * k, hi, mask=keep)


def warm(device: torch.device) -> None:
    """Compile the split's kernel now (a session's load), not in the first call that splits: every
    variant a product takes (an activation's parts lo first, a weight's hi first; two or three). One
    left out, the weights' three parts, was compiled in BERT-base's first call of 4,096+ rows on an
    H200 (~140 ms of that call's 317: benchmarks/first_big_call.py)."""
    if triton is not None and device.type == "cuda":
        for n in (2, 3):
            for lo_first in (True, False):
                _split(torch.ones(4, device=device), 1, 4, n, lo_first, BF16)


# (K, N) shapes of a graph's products warmed at most (``warm_products``), and the largest weight warmed:
# its scratch copy and parts are the load's memory for a moment (a decoder's vocabulary projection is not)
WARM_SHAPES = 16
WARM_MAX_WEIGHT = 1 << 24


def warm_products(device: torch.device, graph) -> None:
    """Run each of ``graph``'s products by a constant float32 weight once as a split product of
    ``AUTO_ROWS`` rows, on scratch operands of its shape (with no addend, a bias and a residual): the
    cuBLAS kernels a bfloat16 product of that shape takes are loaded now (a session's load), not in
    the first call that splits. BERT-base's first call of 12,288 tokens spent 64 ms in its 84 products
    there, 3 ms when they ran again (H200, benchmarks/first_big_call.py). The scratch weight's parts
    go with it."""
    if device.type != "cuda" or not BF16:  # (TF32 parts: their switch is process-wide; not warmed)
        return
    shapes = []
    for (k, n) in _product_shapes(graph):
        if (k, n) not in shapes and len(shapes) < WARM_SHAPES and k * n <= WARM_MAX_WEIGHT:
            shapes.append((k, n))
    for k, n in shapes:
        x = torch.zeros(AUTO_ROWS, k, device=device)
        w = torch.zeros(n, k, device=device)  # Linear's [out, in]
        bias, res = torch.zeros(n, device=device), torch.zeros(AUTO_ROWS, n, device=device)
        for addend in (None, bias, res):
            _split_product(x, w, True, addend, None, _bf16_mm)
    PRODUCTS[0] -= 3 * len(shapes)  # (not the session's products)


def _product_shapes(graph):
    """(K, N) of each product by a constant 2-D float32 weight: Linear's [N, K], MatMul's [K, N],
    Gemm's and MatMulAdd's either way by their attributes."""
    for node in graph.nodes:
        w = node.inputs[1] if len(node.inputs) > 1 else None
        if w is None or not w.is_const or not isinstance(w.const, torch.Tensor) or w.const.dim() != 2 \
                or w.const.dtype != torch.float32:
            continue
        a, b = w.const.shape
        if node.op_type == "Linear" or (node.op_type == "Gemm" and node.attrs.get("transB", 0)) or (
                node.op_type == "MatMulAdd" and node.attrs.get("transposed", 0)):
            yield b, a
        elif node.op_type in ("MatMul", "Gemm", "MatMulAdd"):
            yield a, b


def split_rows(x2: torch.Tensor) -> torch.Tensor:
    """An activation ``[M, K]`` as ``[M, 2K]``: each row's remainders, then its high parts."""
    m, k = x2.shape
    return _split(x2, m, k, 2, True, BF16).view(m, 2 * k)


# ---- a weight's parts, made once ---------------------------------------------------------------
PRODUCTS = [0]  # split products run in this process (stats' split_tf32_products)
_PARTS: dict[tuple, tuple] = {}  # (id(weight), layout) -> (weakref, version, parts)
_LOCK = threading.Lock()


def parts(w: torch.Tensor, w_out_in: bool, three: bool = False) -> torch.Tensor:
    """The weight's parts as one ``[2K, N]`` matrix, its TF32 parts in rows ``:K`` and the
    remainders in rows ``K:`` (``w`` is ``[N, K]`` when ``w_out_in``, else ``[K, N]``); with
    ``three``, ``[3K, N]``: ``[hi; lo; hi]`` (the one-call form, ``_split_product``). Made on the
    weight's first use and again if it is written in place (``update_weights``); dropped with the
    weight. ``w`` is the tensor the session holds (a view made per call is a new object each time)."""
    key = (id(w), w_out_in, three, BF16)
    with _LOCK:
        got = _PARTS.get(key)
        if got is not None and got[0]() is w and got[1] == w._version:
            return got[2]
    a = w.shape[0]
    b = w.numel() // a if a else 0  # (a convolution's weight [N, C, kh, kw] is read as [N, K])
    n = 3 if three else 2
    if w_out_in:  # [N, K] rows as [hi | lo (| hi)]: its transpose is [hi; lo (; hi)] over K
        cat = _split(w, a, b, n, False, BF16).view(a, n * b).t()
    else:  # [K, N] as [hi; lo (; hi)]
        cat = _split(w, 1, a * b, n, False, BF16).view(n * a, b)
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return cat  # made by the graph on each replay: memory of its pool is nothing to keep
    made = getattr(_RECORD, "made", None)
    if made is not None:
        made.add(key[:3])  # what ``parts`` is called with again: (id, w_out_in, three)

    def forget(_ref, key=key):
        with _LOCK:
            _PARTS.pop(key, None)

    with _LOCK:
        _PARTS[key] = (weakref.ref(w, forget), w._version, cat)
    return cat


_RECORD = threading.local()


@contextlib.contextmanager
def recording():
    """The keys ``(id(weight), layout, three)`` of the parts made in this thread meanwhile: a background build
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
        return sum(v[2].numel() * v[2].element_size() for v in _PARTS.values())


# ---- cuBLAS's and cuDNN's TF32 switches are process-wide ----------------------------------------
# A run sets them (run_settings.Precision), a build on the compile worker sets its run's
# (``run_flags``), and a split product turns cuBLAS's on for its calls. Another thread's float32
# cuBLAS call inside that window would run as TF32, and a capture would keep it in its graph (seen:
# BERT-base's cycling shapes 5.4e-4 off eager while the worker captured, 1.4e-6 before). So a
# product splits only while its run is the one run or build inside (else it takes cuBLAS's float32
# product, counted as ``split_tf32_skipped``), the compile worker never splits, and a run or build
# that begins waits for the split products launching (a window of ~0.1 ms of host time) to end.
# Code outside dynashape's runs in other threads is not covered: such an application should set
# fp32_products="ieee".
_SWITCHES = threading.Condition()
_HOLDERS = [0, None]  # runs and builds inside now; the application's switches saved by the first
_OPEN = [0]  # split products launching now
_WORKER = threading.local()
SKIPPED = [0]


def _enter(allow: bool | None) -> None:
    b = torch.backends
    with _SWITCHES:
        _SWITCHES.wait_for(lambda: _OPEN[0] == 0)
        if _HOLDERS[0] == 0:
            _HOLDERS[1] = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
        _HOLDERS[0] += 1
        if allow is not None:
            b.cudnn.allow_tf32 = b.cuda.matmul.allow_tf32 = allow


def _exit() -> None:
    b = torch.backends
    with _SWITCHES:
        _HOLDERS[0] -= 1
        if _HOLDERS[0] == 0:
            b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = _HOLDERS[1]


@contextlib.contextmanager
def switches(allow: bool):
    """cuDNN's and cuBLAS's TF32 switches set to ``allow`` for a run (run_settings.Precision) or a
    build (``run_flags``); the application's values come back when the last run or build inside
    ends, not when the first does (a run that ends while its queued build captures would otherwise
    hand the capture the application's TF32)."""
    _enter(allow)
    try:
        yield
    finally:
        _exit()


@contextlib.contextmanager
def flag_free_builds():
    """Inside: a build on the compile worker splits its products in Triton (``_flag_free``) rather
    than run them as cuBLAS's float32 ones. Token regions' builds only (runtime/spec_state.py): an
    H200 run with every background build so measured BERT-base cycling 7 shapes at 0.62x eager
    (1.19x before), not understood yet; token graphs without it ran 2x slower float32 products."""
    token = FLAG_FREE.set(True)
    try:
        yield
    finally:
        FLAG_FREE.reset(token)


@contextlib.contextmanager
def building():
    """A build on a compile worker (impls/context.py): it never switches TF32 on (it splits only in
    Triton, inside ``flag_free_builds``), and no run splits meanwhile."""
    _WORKER.on = True
    _enter(None)
    try:
        yield
    finally:
        _exit()
        _WORKER.on = False


def _open() -> bool:
    with _SWITCHES:
        if _HOLDERS[0] > 1:
            SKIPPED[0] += 1
            return False
        _OPEN[0] += 1
        return True


def _close() -> None:
    with _SWITCHES:
        _OPEN[0] -= 1
        if not _OPEN[0]:
            _SWITCHES.notify_all()


@contextlib.contextmanager
def run_flags():
    """The queuing run's TF32 switches around a build on the compile worker; nothing where no run
    queued it. Without this a background capture took whatever the process had: torch's default
    lets cuDNN use TF32, so a captured convolution differed from the dynamic path's by ~1e-3."""
    allow = ALLOW_TF32.get()
    if allow is None:
        yield
        return
    with switches(allow):
        yield


@contextlib.contextmanager
def _tf32():
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


# ---- the product --------------------------------------------------------------------------------
def addmm(addend: torch.Tensor | None, x2: torch.Tensor, wt: torch.Tensor, out: torch.Tensor | None = None):
    """``x2 @ wt (+ addend)`` in one BLAS call, written into ``out`` where given (torch's mm and
    addmm take no ``out=None``)."""
    if addend is None:
        return torch.mm(x2, wt) if out is None else torch.mm(x2, wt, out=out)
    return torch.addmm(addend, x2, wt) if out is None else torch.addmm(addend, x2, wt, out=out)


# K per TF32 product of the large parts (see the module docstring). BERT-base at a random (batch, seq)
# on every call, H200 (benchmarks/split_tf32_variants.py): pieces of 512: 1.16x eager over the last
# 50 calls, error 3.2e-6; 1024: 1.40x, 5.9e-6; no pieces: 1.48x, 1.1e-5; cuBLAS float32: 1.05x, 1.2e-6
CHUNK = 1024
# K up to which the product is one call over three parts (``_split_product``): its accumulation runs
# over 3K terms where the pieces' runs over at most CHUNK; above it, the pieces. DYNASHAPE_SPLIT_ONE_CALL_K
# sets it (0: never), for measuring the forms against each other.
ONE_CALL_K = int(os.environ.get("DYNASHAPE_SPLIT_ONE_CALL_K", CHUNK))


def product(x2: torch.Tensor, w: torch.Tensor, w_out_in: bool, addend: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K] @ W (+ addend)`` from TF32 products of the parts, accumulated in float32. ``w`` is
    the weight as the session holds it (its parts are kept): ``[N, K]`` when ``w_out_in`` (Linear's
    layout), else ``[K, N]``; ``addend`` a bias [N] or a residual [M, N]; ``out`` an [M, N] tensor
    to write (else a new one)."""
    if BF16:  # no switch to take: every thread and build may
        return _split_product(x2, w, w_out_in, addend, out, _bf16_mm)
    flag_free = triton is not None and x2.is_cuda and FLAG_FREE.get()
    worker = getattr(_WORKER, "on", False)
    if worker or not _open():
        # a build on the compile worker, or another run or build inside: TF32 may not be switched on
        # for the process, so Triton's product, which needs no switch (a token region's build), or
        # else cuBLAS's float32 one
        if flag_free:
            return _split_product(x2, w, w_out_in, addend, out, _flag_free)
        SKIPPED[0] += worker  # (_open counted the other case)
        return addmm(addend, x2, w.t() if w_out_in else w, out)
    try:
        return _split_product(x2, w, w_out_in, addend, out, _switched)
    finally:
        _close()


def _bf16_mm(addend, a, b, out):
    """A product of bfloat16 parts with float32 accumulation and output: cuBLAS's on CUDA; on the CPU
    (tests) the float32 product of the parts, the same sum of exact products."""
    if not a.is_cuda:
        return addmm(addend, a.float(), b.float(), out)
    if addend is None:
        return torch.mm(a, b, out_dtype=torch.float32) if out is None else torch.mm(
            a, b, out_dtype=torch.float32, out=out)
    return torch.addmm(addend, a, b, out_dtype=torch.float32) if out is None else torch.addmm(
        addend, a, b, out_dtype=torch.float32, out=out)


def weight_left_product(w: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``W [N, K] @ cols`` in float32 from three bfloat16 products, float32 accumulation and output:
    a convolution as a product (ops/tuned_conv.py), ``w`` its weight as the session holds it
    (``[N, C, kh, kw]`` read as ``[N, K]``: its parts are kept), ``cols`` ``[K, L]`` or ``[B, K, L]``
    (each of B images by the same weight). One call over the parts concatenated along K:
    ``[w_hi | w_lo | w_hi] @ [x_lo; x_hi; x_hi]``. Bfloat16 parts only (TF32's would need the
    process-wide switch); the caller offers it where ``eligible`` and ``BF16``."""
    PRODUCTS[0] += 1
    n = w.shape[0]
    w3 = parts(w, True, True).t()  # [N, 3K], each row [hi | lo | hi]
    k, length = cols.shape[-2:]
    if cols.dim() == 2:
        x3 = _split(cols, 1, k * length, 3, True, True).view(3 * k, length)
        return _bf16_mm(None, w3, x3, None)
    b = cols.shape[0]
    x3 = _split(cols, b, k * length, 3, True, True).view(b, 3 * k, length)
    if not x3.is_cuda:  # (tests) the float32 product of the parts, the same sum of exact products
        return torch.matmul(w3.float(), x3.float())
    return torch.bmm(w3.expand(b, n, 3 * k), x3, out_dtype=torch.float32)


def _switched(addend, a, b, out):
    """cuBLAS's TF32 product, the switch on around the call only."""
    with _tf32():
        return addmm(addend, a, b, out)


def _split_product(x2, w, w_out_in, addend, out, mm):
    """The split product; ``mm(addend, a, b, out)``: a TF32 product (``_switched``, ``_flag_free``)
    or a bfloat16 one (``_bf16_mm``)."""
    PRODUCTS[0] += 1
    m, k = x2.shape
    if k <= ONE_CALL_K:
        # one TF32 product over the parts concatenated along K: [x_lo | x_hi | x_hi] @ [w_hi; w_lo;
        # w_hi]. Two launches (the split, the product) where the form below takes three or more:
        # each costs the host ~75 us on the H200's host (benchmarks/split_host.py), and a BERT-base
        # call at 4,000+ tokens, 48 split products, was bound by that host time
        x3 = _split(x2, m, k, 3, True, BF16).view(m, 3 * k)
        return mm(addend, x3, parts(w, w_out_in, True), out)
    w_cat = parts(w, w_out_in)  # [w_hi; w_lo]
    x_cat = split_rows(x2)  # [x_lo | x_hi]
    x_hi, w_hi = x_cat[:, k:], w_cat[:k]
    # x_lo @ w_hi + x_hi @ w_lo in one call: terms ~2^-11 of the product, whose accumulation
    # error in the tensor cores stays far below float32's rounding of the whole
    y = mm(addend, x_cat, w_cat, out)
    # x_hi @ w_hi in pieces of at most CHUNK along K, each added onto y in float32
    pieces = -(-k // CHUNK) if CHUNK else 1
    step = -(-k // pieces)
    for c0 in range(0, k, step):
        y = mm(y, x_hi[:, c0:c0 + step], w_hi[c0:c0 + step], y)
    return y


def _flag_free(addend, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a [M, K] @ b [K, N] (+ addend)`` on TF32 tensor cores, float32 accumulation, in Triton: no
    process-wide switch, so a build on the compile worker may take it beside a run's float32
    products (cuBLAS's TF32 needs ``allow_tf32``, which every thread's products read), and a run
    may beside a build. ``addend``: a bias [N], or [M, N] (``out`` itself: accumulated in place)."""
    m, k = a.shape
    n = b.shape[1]
    c = out if out is not None else torch.empty(m, n, dtype=torch.float32, device=a.device)
    d, sdm, sdn = c, 0, 0
    if addend is not None:
        d = addend
        sdm, sdn = (0, addend.stride(0)) if addend.dim() == 1 else (
            0 if addend.shape[0] == 1 else addend.stride(0), addend.stride(1))
    bm, bn, bk, warps, stages = MM_CONFIG
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _tf32_mm_kernel[grid](a, b, c, d, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                          c.stride(1), sdm, sdn, HAS_D=addend is not None, BM=bm, BN=bn, BK=bk,
                          GROUP_M=8, num_warps=warps, num_stages=stages)
    return c


# (BM, BN, BK, warps, stages) of ``_flag_free`` (benchmarks/tf32_triton_sweep.py times others)
MM_CONFIG = (128, 256, 32, 8, 3)  # 1.15-1.4x cuBLAS TF32 at BERT-base's split products (H200); 128x128: 2x
if triton is not None:
    # M (the rows, a token count) changes every call: not specialised, so one compile serves them
    @triton.jit(do_not_specialize=["m"])
    def _tf32_mm_kernel(a_ptr, b_ptr, c_ptr, d_ptr, m, n, k, sam, sak, sbk, sbn, scm, scn, sdm, sdn,
                        HAS_D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        grid_m, grid_n = tl.cdiv(m, BM), tl.cdiv(n, BN)
        in_group = GROUP_M * grid_n  # programs of GROUP_M row blocks: they share B's columns in L2
        first_m = (pid // in_group) * GROUP_M
        size_m = tl.minimum(grid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % size_m
        pid_n = (pid % in_group) // size_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        rows = rm.to(tl.int64)[:, None]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, k, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rows * sam + kk[None, :] * sak, mask=(rm[:, None] < m) & (kk[None, :] < k), other=0.0)
            b = tl.load(b_ptr + kk[:, None].to(tl.int64) * sbk + rn[None, :] * sbn,
                        mask=(kk[:, None] < k) & (rn[None, :] < n), other=0.0)
            acc = tl.dot(a, b, acc=acc, input_precision="tf32")
        keep = (rm[:, None] < m) & (rn[None, :] < n)
        if HAS_D:
            acc += tl.load(d_ptr + rows * sdm + rn[None, :] * sdn, mask=keep, other=0.0)
        tl.store(c_ptr + rows * scm + rn[None, :] * scn, acc, mask=keep)
