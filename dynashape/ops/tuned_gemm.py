"""The forms of a matrix product a static impl times (``specialise.py``): ``Linear``, ``MatMulAdd``, ``Gemm``.

Why the forms differ: a product with a bias vector goes to cuBLASLt's bias epilogue, whose fp32
kernels are far slower than the plain product's on Hopper. Measured on an H200, BERT-base's
products in CUDA graphs, operands cold, TF32 off (``benchmarks/linear_forms.py``): 3072 -> 768
at 16 rows 82.7 us with the bias epilogue, 21.9 as the product and then the bias added; 768 ->
2304 at 64 rows 27.8 against 17.4; 3072 -> 768 at 1024 rows 174 against 116; at other shapes
the epilogue wins (768 -> 3072 at 1024 rows: 128 against 137). The forms compute the same
values: the product is rounded to the dtype once, then the bias (or residual) is added.

Forms, with ``y = x @ W (+ bias) (+ residual)``, W ``[out, in]`` as Linear keeps it or ``[in, out]``:
- ``epilogue``: one cuBLAS call, the bias (or the residual, as addmm's C) added in its epilogue;
- ``then_add``: the product, then the bias and the residual added in place;
- ``c_bias``: the bias written into the output first, then one product accumulated onto it
  (addmm's beta = 1 over a matrix C: cuBLAS's plain kernels, no bias epilogue);
- ``split``: three TF32 products of the operands' parts (split_tf32.py), where the session's
  ``fp32_products`` allows it: timed against the others ("auto"), or the only form ("split").
"""

from __future__ import annotations

import torch

from . import split_tf32
from .specialise import active, choose

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FORMS = ("epilogue", "then_add", "c_bias")
# rows from which an untimed build takes the split product (where fp32_products allows it): in a graph
# its extra launches cost no host time, and from ~500 rows its bfloat16 products beat float32's
# (H200, BERT-base's products: benchmarks/split_tf32_error.py, 0.17-0.52 ms against 0.46-1.58 at 12,288)
SPLIT_PRIOR_ROWS = 512


def serves(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether a product takes a tuned form: inside a static impl's build, on CUDA, a dtype of
    cuBLAS's and a 2-D weight."""
    return active() and x.is_cuda and x.dtype in DTYPES and w.dtype == x.dtype and x.dim() >= 1 and w.dim() == 2


def forms(bias, residual) -> tuple[str, ...]:
    """The forms worth timing for this epilogue: none without one (a plain product has one)."""
    if bias is None and residual is None:
        return ("epilogue",)
    if bias is None:  # a residual is addmm's C already: no bias epilogue to avoid
        return ("epilogue", "then_add")
    return FORMS


def product(x2: torch.Tensor, w: torch.Tensor, w_out_in: bool, bias=None, residual=None, out=None):
    """``x2 [M, K] @ W (+ bias) (+ residual)`` in the form tuned for its key. ``w`` is ``[N, K]``
    when ``w_out_in`` (Linear's layout), else ``[K, N]``; ``residual`` is ``[M, N]``; ``out``
    (optional) a ``[M, N]`` tensor to write."""
    cands = forms(bias, residual)
    if split_tf32.eligible(x2, w):
        cands = ("split",) if split_tf32.MODE.get() == "split" else cands + ("split",)
    m, k = x2.shape
    n = w.shape[0] if w_out_in else w.shape[1]
    key = ("gemm", m, n, k, x2.dtype, bias is not None, residual is not None, w_out_in, x2.stride(), w.stride(),
           torch.backends.cuda.matmul.allow_tf32, split_tf32.MODE.get(), x2.device.index)
    # a graph built untimed (a bucket's first graph) takes the split where a tuned build took it: the
    # IEEE product there made padded BERT-base buckets of 2,048-4,096 rows 2.2-2.4x slower than timed
    prior = "split" if "split" in cands and m >= SPLIT_PRIOR_ROWS else None
    form = choose(key, cands, lambda f: _run(f, x2, w, w_out_in, bias, residual, None), prior)
    return _run(form, x2, w, w_out_in, bias, residual, out)


def _addend(bias, residual):
    """What is added to the product: the residual (plus the bias), the bias, or None."""
    if residual is None:
        return bias
    return residual if bias is None else residual + bias


def _run(form: str, x2, w, w_out_in, bias, residual, out):
    if form == "split":
        return split_tf32.product(x2, w, w_out_in, _addend(bias, residual), out)
    wt = w.t() if w_out_in else w
    if form == "then_add":
        y = split_tf32.addmm(None, x2, wt, out)
        if bias is not None:
            y.add_(bias)
        if residual is not None:
            y.add_(residual)
        return y
    c = _addend(bias, residual)
    if form == "c_bias":  # C written first (a bias broadcast over the rows), then accumulated onto
        y = out if out is not None else torch.empty(x2.shape[0], wt.shape[1], dtype=x2.dtype, device=x2.device)
        y.copy_(c)
        return torch.addmm(y, x2, wt, out=y)
    return split_tf32.addmm(c, x2, wt, out)  # epilogue


def rows_into(out: torch.Tensor | None, lead: tuple, n: int, product) -> torch.Tensor:
    """A product of rows ``[M, n]`` for a result of shape ``lead + (n,)``: ``product(o2)`` writes
    into ``o2``, the ``[M, n]`` view of ``out`` where ``out`` is contiguous (else it returns a new
    result, copied into ``out`` where there is one)."""
    o2 = out.view(-1, n) if out is not None and out.is_contiguous() else None
    res = product(o2)
    if out is None:
        return res.view(*lead, n)
    return out if o2 is not None else out.copy_(res.view(*lead, n))
