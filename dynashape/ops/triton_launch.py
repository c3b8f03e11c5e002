"""What the ops' own Triton kernels share.

``INTERPRET``: Triton runs the kernels in its interpreter (TRITON_INTERPRET=1, read at import), on
CPU tensors: their tests where there is no GPU. ``on(device)``: Triton launches on the current CUDA
device, so a launch for a tensor on ``cuda:1`` makes that device current first (nothing to do in
the interpreter, nor where it is current already). ``few_rows_scores`` / ``few_rows_weighted``: the
two products of a decode attention whose KV head has a few query rows (kv_attention.py,
paged_attention.py), each row's as sums over d: a dot's tile is 16 rows at least, of which a GQA
model's 3 heads used 3.
"""

from __future__ import annotations

import contextlib
import os

import torch

try:  # CI has no GPU and no triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def on(device: torch.device):
    """The context to launch on ``device``: a switch of the current CUDA device only where it is another
    (entering ``torch.cuda.device`` costs the host microseconds on every launch, and a dynamic call
    launches hundreds)."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


few_rows_scores = few_rows_weighted = None  # (the kernels that call them exist only with triton)
if triton is not None:
    @triton.jit
    def few_rows_scores(q, k, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
        """q [BLOCK_R, D] by k [BLOCK_N, D]: the [BLOCK_R, BLOCK_N] products in float32."""
        rows = tl.arange(0, BLOCK_R)
        s = tl.zeros([BLOCK_R, BLOCK_N], tl.float32)
        for r in tl.static_range(BLOCK_R):
            qr = tl.sum(tl.where(rows[:, None] == r, q.to(tl.float32), 0.0), axis=0)  # [D]
            s = tl.where(rows[:, None] == r, tl.sum(k * qr[None, :], axis=1)[None, :], s)
        return s

    @triton.jit
    def few_rows_weighted(p, v, BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr):
        """p [BLOCK_R, N] (float32) by v [N, DV]: the [BLOCK_R, BLOCK_DV] sums in float32."""
        rows = tl.arange(0, BLOCK_R)
        v32 = v.to(tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        for r in tl.static_range(BLOCK_R):
            pr = tl.sum(tl.where(rows[:, None] == r, p, 0.0), axis=0)  # [N]
            acc = tl.where(rows[:, None] == r, tl.sum(v32 * pr[:, None], axis=0)[None, :], acc)
        return acc
