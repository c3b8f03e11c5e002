"""Attention of a decode step over KV storages of fixed capacity (the whole-step graphs).

``kv_attention(q, k, v, length, n_new, neg, scale, mask=None, kind="add")``: ``q`` [b, heads, s, d]
attends to the first ``length[0] + n_new`` positions of ``k`` / ``v`` [b, kv_heads, capacity, d]
(``length`` a device tensor: nothing here reads it on the host, so a CUDA graph replays it at any
length). Without ``mask`` every query sees every key written so far (a decode step's causal mask
masks nothing for its queries); with one (an ``attention_mask`` input made a mask, padded to the
capacity: what it holds beyond the length does not matter), ``mask`` broadcast to
[b, heads, s, capacity] is added to the scores (``kind`` 'add'), or says which keys are seen
('keep') or not ('drop'). The query heads that share a KV head are that head's rows.

On CUDA with Triton: split-K ("flash decoding"): one program per (batch, KV head, block of 32 or
64 keys: ``blocks_for``) computes its keys' softmax numerator and running max, a
second kernel combines the splits; blocks beyond the length return at once, so the work follows
the length, not the capacity. torch's fused attention kernels parallelise over heads and query
blocks, which a decode step has few of (measured on an H200, 12 heads / 4 KV heads, 256 keys: 30
us for the memory-efficient kernel, ~15 us for two batched products and a softmax). Elsewhere:
the batched products, masked by ``neg`` (0 for the keys written, -inf beyond).
"""

from __future__ import annotations

import torch

from .triton_launch import INTERPRET, few_rows_scores, few_rows_weighted, on

try:  # CI has no GPU and no triton: the torch form serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

# query rows of a KV head (heads x new positions) up to which their products are sums over d rather
# than a dot of 16 rows at least. 3 rows (12 heads over 4): sums measured faster (as in the paged decode
# kernel, ops/paged_attention.py); 8 rows (TinyLlama-1.1B's 32 over 4): the dot, a step 2.18 -> 1.80 ms on
# an H200 (results/generate_builder_norms*_h200_2026-11-30.json)
SMALL_ROWS = 4


def kv_attention(q, k, v, length, n_new: int, neg, scale: float, mask=None, kind: str = "add"):
    b, h, s, d = q.shape
    kvh, cap, dv = k.shape[1], k.shape[2], v.shape[-1]
    rows = (h // kvh) * s
    q3 = q.reshape(b * kvh, rows, d)
    bias = None if mask is None else _additive(mask, kind).expand(b, h, s, cap)
    if triton is not None and (q.is_cuda or INTERPRET) and d <= 256 and dv <= 256 and rows <= 64 \
            and k.stride(-1) == 1 and v.stride(-1) == 1:
        return _triton(q3, k, v, length, n_new, scale, bias, s).view(b, h, s, dv)
    full = neg.view(1, 1, cap)
    if bias is not None:  # the query heads of a KV head are its rows: [b * kv_heads, rows, capacity]
        full = (bias.to(neg.dtype) + neg.view(1, 1, 1, cap)).reshape(b * kvh, rows, cap)
    scores = torch.baddbmm(full, q3, k.reshape(b * kvh, cap, d).transpose(1, 2), alpha=scale)
    p = torch.softmax(scores, dim=-1)
    return torch.bmm(p, v.reshape(b * kvh, cap, dv)).view(b, h, s, dv)


def _additive(mask, kind: str):
    """The mask as fp32 numbers to add to the scores: 0 where a key is seen."""
    if kind == "add":
        return mask.float()
    seen = mask if kind == "keep" else mask.logical_not()
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(seen.logical_not(),
                                                                                         float("-inf"))


def blocks_for(bh: int) -> tuple[int, int, int]:
    """(keys a block, blocks a program, warps a program), measured on an H200 in CUDA graphs at 12
    query / 4 KV heads, d 64, float32 (benchmarks/kv_attention_tune.py,
    results/kv_attention_{tune,warps}_h200_2026-11-29.json). Many KV heads' rows (batch 8 and more
    at 4 KV heads): blocks of 32 keys and one warp a program (batch 16: 9.4 us against 12.6 with
    64 and 4 warps at a capacity of 256, 19.3 against 31.2 at 1,024): a warp's few-row sums reduce
    within the warp, and more programs fit an SM. Fewer: 64 keys over 4 warps (batch 1: one warp no
    faster; 32 keys 8.7 us against 10.1 at 256 but 15.3 against 13.5 at 1,024).

    Never by the capacity: a decode graph's next bucket is captured ahead on a thread that only
    records kernels the steps have run (runtime/decode_graph.py), so a kernel variant chosen by the
    capacity would be compiled there, mid-generation. The batch may choose: a new batch's first step
    runs on the dynamic path before its capture. Hence one block a program (two, a running softmax
    over them, were 12% faster at batch 16 and 1,024 keys with 4 warps, and not with one) and a
    combine kernel even where one split spans the capacity (``DIRECT``, the tuner's only: one program
    per KV head over the whole capacity took 1.5-3x longer at batch 1)."""
    block, warps = (32, 1) if bh >= 32 else (64, 4)
    return BLOCK_N or block, ITERS or 1, NUM_WARPS or warps


# the tuner's overrides of blocks_for's rule (None: the rule's); COMBINE_WARPS: the combine's (None:
# the partial kernel's)
BLOCK_N: int | None = None
ITERS: int | None = None
NUM_WARPS: int | None = None
COMBINE_WARPS: int | None = None


def _triton(q3, k, v, length, n_new: int, scale: float, bias=None, s: int = 1, small: bool | None = None):
    bh, rows, d = q3.shape
    b, kvh, cap, dv = v.shape
    block_n, iters, warps = blocks_for(bh)
    splits = triton.cdiv(cap, block_n * iters)
    small = rows <= SMALL_ROWS if small is None else small
    if not small and NUM_WARPS is None:
        warps = 4  # the 16-row dot form: measured over 4 warps only
    block_r = triton.next_power_of_2(rows) if small else max(16, triton.next_power_of_2(rows))
    block_dv = max(16, triton.next_power_of_2(dv))
    if q3.stride(-1) != 1:
        q3 = q3.contiguous()
    out = torch.empty((bh, rows, dv), dtype=q3.dtype, device=q3.device)
    direct = splits == 1 and iters > 1  # one program per KV head, several blocks: it writes the output
    if direct:
        part = mx = den = out
    else:
        part = torch.empty((bh, splits, block_r, block_dv), dtype=torch.float32, device=q3.device)
        mx = torch.empty((bh, splits, block_r), dtype=torch.float32, device=q3.device)
        den = torch.empty_like(mx)
    ieee = q3.dtype == torch.float32
    has_mask = bias is not None
    sb = bias.stride() if has_mask else (0, 0, 0, 0)
    with on(q3.device):
        _partial[(bh, splits)](q3, k, v, length, part, mx, den, bias if has_mask else part, out, n_new, scale, kvh,
                               rows, d, dv, q3.stride(0), q3.stride(1), k.stride(0), k.stride(1), k.stride(2),
                               v.stride(0), v.stride(1), v.stride(2), splits, s, *sb, out.stride(0), out.stride(1),
                               HAS_MASK=has_mask, BLOCK_R=block_r, BLOCK_N=block_n,
                               BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=block_dv, IEEE=ieee,
                               SMALL=small, ITERS=iters, DIRECT=direct, num_warps=warps)
        if not direct:
            _combine[(bh,)](part, mx, den, out, rows, dv, splits, out.stride(0), out.stride(1),
                            BLOCK_R=block_r, BLOCK_DV=block_dv, num_warps=COMBINE_WARPS or warps)
    return out


if triton is not None:
    # ints that change with the capacity are not specialised on: a new bucket's capture must not
    # compile a kernel variant
    @triton.jit(do_not_specialize=["n_new", "sk0", "sk1", "sv0", "sv1", "SPLITS", "sb0", "sb1", "sb2"])
    def _partial(Q, K, V, LEN, PART, MX, DEN, B, OUT, n_new, scale, KVH, R, D, DV,
                 sq0, sq1, sk0, sk1, sk2, sv0, sv1, sv2, SPLITS, S, sb0, sb1, sb2, sb3, so0, so1,
                 HAS_MASK: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr, IEEE: tl.constexpr, SMALL: tl.constexpr, ITERS: tl.constexpr,
                 DIRECT: tl.constexpr):
        """Keys [split * ITERS * BLOCK_N, + ITERS * BLOCK_N) of KV head bh, up to the length: a running
        softmax over its blocks; DIRECT (one split) writes the output, else the split's max, sum and
        numerator for _combine."""
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // KVH
        h = bh % KVH
        length = tl.load(LEN) + n_new
        first = split * (ITERS * BLOCK_N)
        stop = tl.minimum(first + ITERS * BLOCK_N, length)
        rows = tl.arange(0, BLOCK_R)
        dv = tl.arange(0, BLOCK_DV)
        d = tl.arange(0, BLOCK_D)
        q = tl.load(Q + bh * sq0 + rows[:, None] * sq1 + d[None, :], mask=(rows[:, None] < R) & (d[None, :] < D),
                    other=0.0)
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        for start in range(first, stop, BLOCK_N):  # none for a split beyond the length: it adds 0
            n = start + tl.arange(0, BLOCK_N)
            valid = n < length
            # both blocks' loads issued before either is used: one memory latency a block, not two
            vv = tl.load(V + b * sv0 + h * sv1 + n[:, None] * sv2 + dv[None, :],
                         mask=valid[:, None] & (dv[None, :] < DV), other=0.0)
            if SMALL:  # a few query rows: each one's products as a sum over d (a dot's tile is 16 rows at least)
                kn = tl.load(K + b * sk0 + h * sk1 + n[:, None] * sk2 + d[None, :],
                             mask=valid[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
                s = few_rows_scores(q, kn, BLOCK_R, BLOCK_N)
            else:
                kt = tl.load(K + b * sk0 + h * sk1 + n[None, :] * sk2 + d[:, None],
                             mask=valid[None, :] & (d[:, None] < D), other=0.0)
                if IEEE:
                    s = tl.dot(q, kt, input_precision="ieee")
                else:
                    s = tl.dot(q, kt)
            s = tl.where(valid[None, :], s * scale, float("-inf"))
            if HAS_MASK:  # row r is query r % S of query head h * (R // S) + r // S
                hq = h * (R // S) + rows // S
                bias = tl.load(B + b * sb0 + hq[:, None] * sb1 + (rows % S)[:, None] * sb2 + n[None, :] * sb3,
                               mask=(rows[:, None] < R) & valid[None, :], other=0.0)
                s = s + bias
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row masked so far: adds 0, no NaN
            alpha = tl.exp(m_i - m_use)
            p = tl.exp(s - m_use[:, None])
            if SMALL:
                pv = few_rows_weighted(p, vv, BLOCK_R, BLOCK_DV)
            elif IEEE:
                pv = tl.dot(p, vv, input_precision="ieee")
            else:
                pv = tl.dot(p.to(vv.dtype), vv)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        if DIRECT:
            tl.store(OUT + bh * so0 + rows[:, None] * so1 + dv[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty),
                     mask=(rows[:, None] < R) & (dv[None, :] < DV))
        else:
            base = (bh * SPLITS + split) * BLOCK_R
            tl.store(MX + base + rows, m_i)
            tl.store(DEN + base + rows, l_i)
            tl.store(PART + (base + rows[:, None]) * BLOCK_DV + dv[None, :], acc)

    @triton.jit(do_not_specialize=["SPLITS"])
    def _combine(PART, MX, DEN, OUT, R, DV, SPLITS, so0, so1, BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr):
        bh = tl.program_id(0)
        rows = tl.arange(0, BLOCK_R)
        dv = tl.arange(0, BLOCK_DV)
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        for i in range(0, SPLITS):
            m = tl.maximum(m, tl.load(MX + (bh * SPLITS + i) * BLOCK_R + rows))
        den = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        for i in range(0, SPLITS):
            base = (bh * SPLITS + i) * BLOCK_R
            w = tl.exp(tl.load(MX + base + rows) - m)  # 0 for a block beyond the length
            den += tl.load(DEN + base + rows) * w
            acc += tl.load(PART + (base + rows[:, None]) * BLOCK_DV + dv[None, :]) * w[:, None]
        out = acc / den[:, None]
        tl.store(OUT + bh * so0 + rows[:, None] * so1 + dv[None, :], out.to(OUT.dtype.element_ty),
                 mask=(rows[:, None] < R) & (dv[None, :] < DV))
