"""Float32 attention on bfloat16 tensor cores, at float32's accuracy: one Triton kernel (flash
attention's online softmax) whose two products are each three bfloat16 products of split parts.

Why: with TF32 off, torch's float32 attention (scaled_dot_product_attention's memory-efficient
kernel) runs its products on the SIMT units. BERT-base at 32 x 384 tokens spent ~6.6 of its ~31 ms
of kernels there (H200, benchmarks/profile_kernels.py), as much as eager does, while every other
product of the call runs split on the tensor cores (split_tf32.py). Here each operand tile ``x`` is
read in float32 and split in registers into ``hi`` = x rounded to bfloat16 and ``lo`` = the
remainder rounded to bfloat16 (together x to ~2^-17 of it); ``q @ k^T`` is ``q_lo k_hi + q_hi k_lo +
q_hi k_hi`` with float32 accumulation (the dropped ``q_lo k_lo`` is ~2^-17 of a term), and the
weights ``p`` of the online softmax meet ``v`` the same way. The softmax itself is float32. The
error is the split product's (split_tf32.py: ~3e-6 of a product against float64); measured against
float64 by ``benchmarks/split_attention.py``.

Where: CUDA, float32 q, k, v of rank 4 ``(B, H, S, D)`` with D one of ``HEAD_DIMS``, keys and values
of ``H / group`` heads (grouped-query attention reads head ``h // group``), an additive float32 mask
broadcastable to ``(B, H, S, L)`` or none; in a run whose ``fp32_products`` splits (``split``, or
``auto`` from ``MIN_WORK`` multiply-adds: below it torch's kernel, the launch is what a small call
pays). ``attention`` answers None elsewhere and the caller runs torch's kernel.

A query row whose every key is masked with ``-inf`` gives NaN (ONNX's Softmax of all ``-inf``);
with a finite fill such as ``finfo(float32).min`` (what exporters of BERT write) the row averages
its values as the softmax of equal scores does. ``heads_last``: the result is written as ``(B, S,
H, D)`` and returned as its ``(B, H, S, D)`` view, so that the Transpose(0, 2, 1, 3) an exporter puts
after it is contiguous and the heads' merge a view (compile/fuse_attention.py).
"""

from __future__ import annotations

import os

import torch
from onnx import TensorProto

from . import split_tf32
from .triton_launch import INTERPRET, on

try:  # CI has no GPU and no triton: torch's kernel serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

DOMAIN = "com.dynashape"  # (fused.py's Attention, which imports this module)
FLOAT = TensorProto.FLOAT
HEAD_DIMS = (16, 32, 64, 128)
# multiply-adds (B * H * S * L * D) from which the ``auto`` rule takes the kernel (measured in
# benchmarks/split_attention.py against torch's float32 kernel)
MIN_WORK = 1 << 24
# DYNASHAPE_SPLIT_ATTENTION=0: torch's kernel always (for measuring the two against each other)
ENABLED = os.environ.get("DYNASHAPE_SPLIT_ATTENTION", "1") != "0"
BLOCK_M, BLOCK_N, WARPS, STAGES = 128, 64, 8, 2  # the tiles (benchmarks/split_attention.py --sweep)
KERNEL_CALLS = [0]  # attentions run by the kernel in this process (stats' split_attention_kernels)


def serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the kernel takes these operands in this run (the module docstring)."""
    if not ENABLED or triton is None or not (q.is_cuda or INTERPRET) or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    if not (q.dtype == k.dtype == v.dtype == torch.float32) or (mask is not None and mask.dtype != torch.float32):
        return False
    b, h, s, d = q.shape
    if d not in HEAD_DIMS or tuple(k.shape) != (b, k.shape[1], k.shape[2], d) or tuple(v.shape) != tuple(k.shape):
        return False
    if k.shape[1] == 0 or h % k.shape[1] or s == 0 or k.shape[2] == 0:
        return False
    mode = split_tf32.MODE.get()
    if mode == "ieee" or torch.backends.cuda.matmul.allow_tf32:
        return False  # (TF32 allowed: torch's kernel is what the run asked for)
    return mode == "split" or b * h * s * k.shape[2] * d >= MIN_WORK


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
              heads_last: bool = False) -> torch.Tensor | None:
    """softmax(q k^T * scale + mask) v for q ``(B, H, S, D)``, k and v ``(B, H / group, L, D)``, or
    None where the kernel does not serve (``serves``)."""
    if not serves(q, k, v, mask):
        return None
    b, h, s, d = q.shape
    hk, n_k = k.shape[1], k.shape[2]
    if mask is not None:
        try:
            mask = mask.expand(b, h, s, n_k)  # broadcast dims read with stride 0
        except RuntimeError:
            return None
    q = q if q.stride(-1) == 1 else q.contiguous()
    if heads_last:
        out = torch.empty((b, s, h, d), dtype=torch.float32, device=q.device)
        o = out.transpose(1, 2)
    else:
        o = out = torch.empty((b, h, s, d), dtype=torch.float32, device=q.device)
    m = mask if mask is not None else q  # (not read without a mask)
    # the keys' and values' parts once, [k_hi, k_lo, v_hi, v_lo] each (B * KVH, L, D): the product's
    # loop then reads them as bfloat16 tiles (pipelined into shared memory), where splitting each tile
    # in registers took every program's loop twice torch's float32 time (H200, 32 x 384)
    parts = torch.empty((4, b * hk, n_k, d), dtype=torch.float32 if INTERPRET else torch.bfloat16,
                        device=q.device)
    block_m = BLOCK_M if s > 64 else 64
    qs, os_ = q.stride()[:3], o.stride()[:3]
    KERNEL_CALLS[0] += 1
    with on(q.device):
        _split_kv_kernel[(triton.cdiv(n_k, 64), b * hk)](
            k, v, parts, *k.stride()[:3], *v.stride()[:3], k.stride(-1), v.stride(-1), hk, n_k, parts[0].numel(),
            EXACT=INTERPRET, D=d, BLOCK=64, num_warps=4)
        _attention_kernel[(triton.cdiv(s, block_m), b * h)](
            q, parts, m, o, *qs, *m.stride(), *os_, h, h // hk, s, n_k, parts[0].numel(), float(scale),
            HAS_MASK=mask is not None, ALIGNED=all(x % 16 == 0 for x in (*qs, *os_)), EXACT=INTERPRET, D=d,
            BM=block_m, BN=BLOCK_N, num_warps=WARPS if block_m == 128 else 4, num_stages=STAGES)
    return o


if triton is not None:
    @triton.jit
    def _parts(x, EXACT: tl.constexpr):
        """``x`` (float32) as bfloat16 ``(hi, lo)``: hi = x rounded to nearest, lo = the remainder
        rounded to nearest (a non-finite x: lo 0). ``EXACT`` (the interpreter, whose cast truncates
        and whose dot multiplies bfloat16's bits as integers): by bit operations, the parts' values
        kept in float32, whose products are the same exact products."""
        if EXACT:
            bits = x.to(tl.int32, bitcast=True)
            hi = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            lo = tl.where(tl.abs(hi) < float("inf"), x - hi, 0.0)
            lb = lo.to(tl.int32, bitcast=True)
            lo = ((lb + 0x7FFF + ((lb >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            return hi, lo
        hi = x.to(tl.bfloat16)  # (the GPU's conversion rounds to nearest even)
        lo = tl.where(tl.abs(x) < float("inf"), x - hi.to(tl.float32), 0.0)
        return hi, lo.to(tl.bfloat16)

    @triton.jit(do_not_specialize=["skb", "skh", "sks", "svb", "svh", "svs", "skd", "svd", "heads_k", "n_k",
                                   "part"])
    def _split_kv_kernel(k_ptr, v_ptr, out_ptr, skb, skh, sks, svb, svh, svs, skd, svd, heads_k, n_k, part,
                         EXACT: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        bh = tl.program_id(1)
        b = bh // heads_k
        h = bh - b * heads_k
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        dd = tl.arange(0, D)
        keep = (rows < n_k)[:, None]
        at = (bh.to(tl.int64) * n_k + rows[:, None]) * D + dd[None, :]
        x = tl.load(k_ptr + b.to(tl.int64) * skb + h * skh + rows[:, None] * sks + dd[None, :] * skd, mask=keep)
        hi, lo = _parts(x, EXACT)
        tl.store(out_ptr + at, hi, mask=keep)
        tl.store(out_ptr + part + at, lo, mask=keep)
        x = tl.load(v_ptr + b.to(tl.int64) * svb + h * svh + rows[:, None] * svs + dd[None, :] * svd, mask=keep)
        hi, lo = _parts(x, EXACT)
        tl.store(out_ptr + 2 * part + at, hi, mask=keep)
        tl.store(out_ptr + 3 * part + at, lo, mask=keep)

    # every stride and size may change from call to call: none is specialised (a new divisibility
    # would compile the kernel again in a caller's way); ALIGNED says q's and o's are multiples of 16
    @triton.jit(do_not_specialize=["sqb", "sqh", "sqs", "smb", "smh", "smq", "smk", "sob", "soh", "sos", "heads",
                                   "group", "n_q", "n_k", "part"])
    def _attention_kernel(q_ptr, kv_ptr, m_ptr, o_ptr, sqb, sqh, sqs, smb, smh, smq, smk, sob, soh, sos, heads,
                          group, n_q, n_k, part, scale, HAS_MASK: tl.constexpr, ALIGNED: tl.constexpr,
                          EXACT: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        if ALIGNED:  # whole rows of 16 floats apart: vector loads and stores
            sqb, sqh, sqs = tl.multiple_of(sqb, 16), tl.multiple_of(sqh, 16), tl.multiple_of(sqs, 16)
            sob, soh, sos = tl.multiple_of(sob, 16), tl.multiple_of(soh, 16), tl.multiple_of(sos, 16)
        bh = tl.program_id(1)
        b = bh // heads
        h = bh - b * heads
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.arange(0, BN)
        dd = tl.arange(0, D)
        row_in = rows < n_q
        q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqs + dd[None, :],
                    mask=row_in[:, None], other=0.0)
        q_hi, q_lo = _parts(q, EXACT)
        kv = kv_ptr + (b.to(tl.int64) * (heads // group) + h // group) * n_k * D
        m_base = m_ptr + b.to(tl.int64) * smb + h.to(tl.int64) * smh + rows[:, None].to(tl.int64) * smq
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for start in range(0, n_k, BN):
            c = start + cols
            col_in = c < n_k
            kt_at = kv + c[None, :] * D + dd[:, None]  # [D, BN]
            kt_hi = tl.load(kt_at, mask=col_in[None, :], other=0.0)
            kt_lo = tl.load(kt_at + part, mask=col_in[None, :], other=0.0)
            s = tl.dot(q_lo, kt_hi)  # the small terms first, the large one onto them
            s = tl.dot(q_hi, kt_lo, s)
            s = tl.dot(q_hi, kt_hi, s)
            s = s * scale
            if HAS_MASK:
                s += tl.load(m_base + c[None, :] * smk, mask=row_in[:, None] & col_in[None, :], other=0.0)
            s = tl.where(col_in[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row all -inf so far: weights 0
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v_at = kv + 2 * part + c[:, None] * D + dd[None, :]  # [BN, D]
            v_hi = tl.load(v_at, mask=col_in[:, None], other=0.0)
            v_lo = tl.load(v_at + part, mask=col_in[:, None], other=0.0)
            p_hi, p_lo = _parts(p, EXACT)
            acc = tl.dot(p_lo, v_hi, acc)
            acc = tl.dot(p_hi, v_lo, acc)
            acc = tl.dot(p_hi, v_hi, acc)
            m_i = m_new
        o = acc / l_i[:, None]
        tl.store(o_ptr + b.to(tl.int64) * sob + h * soh + rows[:, None] * sos + dd[None, :], o,
                 mask=row_in[:, None])


def forms(graph) -> set[tuple]:
    """(head dim, with a mask) of ``graph``'s fused float32 attentions the kernel may take."""
    out = set()
    for n in graph.nodes:
        if n.op_type != "Attention" or n.domain != DOMAIN or not n.inputs:
            continue
        q = n.inputs[0]
        if q is None or q.elem_type != FLOAT or q.shape is None or len(q.shape) != 4 or not q.shape[-1].is_static:
            continue
        if int(q.shape[-1]) in HEAD_DIMS:
            out.add((int(q.shape[-1]), len(n.inputs) > 3 and n.inputs[3] is not None))
    return out


def warm(device: torch.device, graph) -> None:
    """Compile now (a session's load) the kernel's forms ``graph``'s attentions take, not in the
    first call that takes them (each form ~1 s of Triton's compile on an empty cache)."""
    if triton is None or device.type != "cuda":
        return
    tok = split_tf32.MODE.set("split")
    try:
        for d, with_mask in forms(graph):
            for s in (8, 128):  # both row blocks
                q = torch.ones(1, 1, s, d, device=device)
                attention(q, q, q, torch.zeros(1, 1, 1, s, device=device) if with_mask else None, 0.125)
    finally:
        split_tf32.MODE.reset(tok)
