"""The rotary embedding of a decode step's queries and keys and the write of its keys and values
into the KV storages, as one kernel (``codegen/step_fusions.py`` rewrites the whole step's lines
to it).

``rope_append(q, k, v, cos, sin, ks, vs, axis, idx)`` = (RotaryHalf(q), ks after
``ks.index_copy_(axis, idx, RotaryHalf(k))``, vs after ``vs.index_copy_(axis, idx, v)``): four
kernels of a few hundred elements per decoder layer become one launch on CUDA with Triton (the
rotation computed as ``ops/rotary.py``'s kernel computes it, so the values are the same); the
torch form elsewhere.
"""

from __future__ import annotations

import torch

from .rotary import MAX_D, rotary_half_torch
from .rotary import triton as _triton_mod

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rope_append(q, k, v, cos, sin, ks, vs, axis: int, idx):
    if _fits(q, k, v, ks, vs, axis):
        return _triton(q, k, v, cos, sin, ks, vs, idx)
    ks.index_copy_(axis, idx, rotary_half_torch(k, cos, sin))
    vs.index_copy_(axis, idx, v)
    return rotary_half_torch(q, cos, sin), ks, vs


def _fits(q, k, v, ks, vs, axis: int) -> bool:
    if triton is None or _triton_mod is None or not q.is_cuda or axis != 2:
        return False
    ts = (q, k, v, ks, vs)
    if any(t.dim() != 4 or t.dtype != q.dtype for t in ts) or q.dtype not in _DTYPES:
        return False
    d = q.shape[-1]
    return (d <= MAX_D and d % 2 == 0 and k.shape[-1] == d and v.shape[-1] == d and ks.stride(-1) == 1
            and vs.stride(-1) == 1 and k.shape[2] == q.shape[2] == v.shape[2])


def _triton(q, k, v, cos, sin, ks, vs, idx):
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    b, hq, n, d = q.shape
    hk = k.shape[1]
    cq, sq = cos.expand(q.shape), sin.expand(q.shape)  # stride 0 on the broadcast dims
    ck, sk = cos.expand(k.shape), sin.expand(k.shape)
    rq, rk = b * hq * n, b * hk * n
    block = triton.next_power_of_2(d)
    with torch.cuda.device(q.device):
        _rope_append_kernel[(rq + 2 * rk,)](
            q, k, v, cq, sq, ck, sk, qo, ks, vs, idx, rq, rk, hq, hk, n,
            *q.stride(), *k.stride(), *v.stride(), *cq.stride(), *sq.stride(), *ck.stride(), *sk.stride(),
            *ks.stride()[:3], *vs.stride()[:3],
            D=d, H=d // 2, BLOCK=block, num_warps=1 if block <= 256 else 4)
    return qo, ks, vs


if triton is not None:
    from .rotary import rotated_row as _rotated

    @triton.jit(do_not_specialize=["RQ", "RK", "HQ", "HK", "NQ", "sq0", "sq1", "sq2", "sk0", "sk1", "sk2",
                                   "sv0", "sv1", "sv2", "scq0", "scq1", "scq2", "ssq0", "ssq1", "ssq2",
                                   "sck0", "sck1", "sck2", "ssk0", "ssk1", "ssk2", "sks0", "sks1", "sks2",
                                   "svs0", "svs1", "svs2"])
    def _rope_append_kernel(Q, K, V, CQ, SQ, CK, SK, QO, KS, VS, IDX, RQ, RK, HQ, HK, NQ,
                            sq0, sq1, sq2, sq3, sk0, sk1, sk2, sk3, sv0, sv1, sv2, sv3,
                            scq0, scq1, scq2, scq3, ssq0, ssq1, ssq2, ssq3,
                            sck0, sck1, sck2, sck3, ssk0, ssk1, ssk2, ssk3,
                            sks0, sks1, sks2, svs0, svs1, svs2,
                            D: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, BLOCK)
        m = j < D
        if row < RQ:  # a query row: rotated into the new tensor
            i0, i1, i2 = row // (HQ * NQ), (row // NQ) % HQ, row % NQ
            y = _rotated(Q, CQ, SQ, i0, i1, i2, sq0, sq1, sq2, sq3, scq0, scq1, scq2, scq3,
                         ssq0, ssq1, ssq2, ssq3, D, H, BLOCK)
            tl.store(QO + row * D + j, y.to(QO.dtype.element_ty), mask=m)
        elif row < RQ + RK:  # a key row: rotated into the storage at its position
            r = row - RQ
            i0, i1, i2 = r // (HK * NQ), (r // NQ) % HK, r % NQ
            pos = tl.load(IDX + i2)
            y = _rotated(K, CK, SK, i0, i1, i2, sk0, sk1, sk2, sk3, sck0, sck1, sck2, sck3,
                         ssk0, ssk1, ssk2, ssk3, D, H, BLOCK)
            tl.store(KS + i0 * sks0 + i1 * sks1 + pos * sks2 + j, y.to(KS.dtype.element_ty), mask=m)
        else:  # a value row: copied into the storage at its position
            r = row - RQ - RK
            i0, i1, i2 = r // (HK * NQ), (r // NQ) % HK, r % NQ
            pos = tl.load(IDX + i2)
            x = tl.load(V + i0 * sv0 + i1 * sv1 + i2 * sv2 + j * sv3, mask=m, other=0.0)
            tl.store(VS + i0 * svs0 + i1 * svs1 + pos * svs2 + j, x, mask=m)
