"""Attention over a paged KV pool, read in place through each row's block table (the paged engine).

``PagedAttention(q, k_new, v_new, pool_k, pool_v, tables, starts, lens, slots)`` (domain
com.dynashape; compile/paged_kv.py puts it where a decoder's attention read ``Concat(past, new)``):

- ``q`` [B, H, S, D]: S new query positions a row, row b's j-th at position ``starts[b] + j``;
- ``k_new`` / ``v_new`` [B, KVH, S, D]: their keys and values, written first into the pool at
  ``slots`` [B, S] (the pool's positions flattened over blocks; a padding position's slot is the
  pool's scratch slot, which no table names);
- ``pool_k`` / ``pool_v`` [blocks, block_size, KVH, D]: one layer's blocks;
- ``tables`` [B, W]: row b's position p lives in block ``tables[b, p // block_size]``;
- ``lens`` [B]: the positions row b holds after this run. A query sees the positions up to its own
  and below ``lens`` (a chunk's padding queries see the row's positions, never an unwritten one).
- ``qstarts`` [R] (optional): where each row's queries start among the run's tokens flattened.
  With R rows over a batch of one (``q`` [1, H, T, D]) the rows' queries are packed along T: row r's
  ``lens[r] - starts[r]`` queries are tokens ``qstarts[r]...``, so decode rows and prompt chunks
  share one run (tables, starts and lens are then [R, ...]); a token of no row gets zeros. With R
  equal to the batch, row b's queries are ``q[b]`` (qstarts b * S, not read).

So no past is gathered into a dense copy per step, and no row's work follows the longest row's
length. The lengths are read on the device: a CUDA graph of a decode step replays at any length.

Kernels: on CUDA with Triton, one-query rows (decode steps) take a split-K kernel that walks the
table (``_partial`` / ``_combine``: a program per (row, KV head, 64 positions; 128 where a KV head
has at most 8 query heads, whose products are then sums over d rather than a 16-row dot), those
beyond the row's length return at once; float32 products in IEEE precision). Otherwise (prompt chunks, the
CPU) the rows' positions are gathered through the tables into one [B, W * block_size] batch and
scaled_dot_product_attention runs with the causal mask of each row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from . import cpu_attention
from .contrib_attention import _heads, _merge_heads, _rotate, _scale
from .fused import DOMAIN, SDPA_GQA
from .registry import op
from .triton_launch import INTERPRET, few_rows_scores, few_rows_weighted, on

try:  # CI has no GPU and no triton: the torch form serves there
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

BLOCK_N = 64  # positions a program of the split kernel reads (a multiple of the pool's block size or not)
# Query heads per KV head up to which the decode kernel takes each head's products as sums over d
# instead of a dot (whose tile is 16 rows at least: 3 heads of a GQA model used 3 of its 16), and the
# positions a program reads then. An H200, the 12-layer decoder's shapes (benchmarks/paged_decode_sweep.py,
# results/paged_decode_sweep_h200_2026-11-29.json): 48 rows 63.3 -> 30.3 us, 64 rows 80.7 -> 37.7, 1 row
# 12.6 -> 9.3.
SMALL_GROUP = 8
SMALL_BLOCK_N = 128
CHUNK_ROWS = 64  # query rows (positions x the query heads of a KV head) a program of the chunks' kernel holds
COUNTS = {"paged_attention_triton": 0, "paged_attention_torch": 0}  # calls each form served (traced or run)


def _infer(shapes, values, *, scale=1.0):
    q, k, v, pk, pv, tables = shapes[:6]
    if tables[0] != q[0] and q[0] != 1:
        raise ShapeError(f"PagedAttention: {tables[0]} rows' tables over a batch of {q[0]}: expected the batch's "
                         "rows, or a batch of one with the rows' queries packed")
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or len(pk) != 4 or len(pv) != 4 or len(tables) != 2:
        raise ShapeError(f"PagedAttention: expected q, k, v of rank 4, pools of rank 4 and tables of rank 2, got "
                         f"{[len(s) for s in shapes[:6]]}")
    if q[1] % k[1] or pk[2] != k[1] or pk[3] != q[3] or pv[3] != v[3]:
        raise ShapeError(f"PagedAttention: query {tuple(q)}, new keys {tuple(k)}, pools {tuple(pk)} / {tuple(pv)}: "
                         "expected query heads a multiple of the pools' KV heads and equal head sizes")
    return [(q[0], q[1], q[2], v[3])]


@op("PagedAttention", 1, DOMAIN, infer=_infer, writes_out=False,
    notes="new keys and values written into a paged KV pool, attention over each row's blocks (compile/paged_kv)")
def _paged_attention(q, k_new, v_new, pool_k, pool_v, tables, starts, lens, slots, qstarts=None, *, scale=1.0,
                     out=None):
    write(pool_k, pool_v, slots, k_new, v_new)
    return attend(q, pool_k, pool_v, tables, starts, lens, scale, qstarts)


def _last_infer(shapes, values):
    x = shapes[0]
    if len(x) < 2 or len(shapes[1]) != 1:
        raise ShapeError(f"PagedLast: expected x of rank >= 2 and last of rank 1, got {tuple(x)} and "
                         f"{tuple(shapes[1])}")
    return [(shapes[1][0], 1) + tuple(x[2:])]


@op("PagedLast", 1, DOMAIN, infer=_last_infer, writes_out=False,
    notes="x [B, S, ...] at each row's last token (last[r]: its index among the B * S tokens): the only logits "
          "a paged step samples, [R, 1, ...] (compile/paged_kv)")
def _paged_last(x, last, *, out=None):
    return x.reshape(-1, *x.shape[2:]).index_select(0, last).unsqueeze(1)


def _gqa_infer(shapes, values, *, num_heads, kv_num_heads, **_attrs):
    q, key = shapes[0], shapes[1]
    if len(q) != 3:
        raise ShapeError(f"PagedGroupQueryAttention: query must be 3-D, got {tuple(q)}")
    h = q[2] // num_heads if key is not None else q[2] // (num_heads + 2 * kv_num_heads)
    new = (q[0], kv_num_heads, q[1], h)
    return [(q[0], q[1], num_heads * h), new, new]


@op("PagedGroupQueryAttention", 1, DOMAIN, infer=_gqa_infer, writes_out=False,
    notes="onnxruntime's GroupQueryAttention (rotary at each row's positions) over a paged KV pool; the presents "
          "are the run's new keys and values (compile/paged_kv)")
def _paged_gqa(query, key, value, cos_cache, sin_cache, pool_k, pool_v, tables, starts, lens, slots, *, num_heads,
               kv_num_heads, scale=0.0, do_rotary=0, rotary_interleaved=0, out=None):
    """GroupQueryAttention's causal attention (no window, softcap, sink or bias: the pass leaves those
    nodes as they are) with the past in the pool: a row's new positions start at ``starts`` (the
    op's own seqlens_k and total_sequence_length are not read), rotated there when ``do_rotary``."""
    what = "PagedGroupQueryAttention"
    b, s, d = query.shape
    if key is None:  # packed QKV
        h = d // (num_heads + 2 * kv_num_heads)
        q, k, v = query.split((num_heads * h, kv_num_heads * h, kv_num_heads * h), -1)
    else:
        h = d // num_heads
        q, k, v = query, key, value
    if do_rotary:
        pos = starts.reshape(b, 1).to(torch.int64) + torch.arange(s, device=query.device)
        rd = 2 * cos_cache.shape[1]
        q = _rotate(q, pos, cos_cache, sin_cache, num_heads, rd, rotary_interleaved)
        k = _rotate(k, pos, cos_cache, sin_cache, kv_num_heads, rd, rotary_interleaved)
    qh, kh, vh = _heads(q, num_heads, what), _heads(k, kv_num_heads, what), _heads(v, kv_num_heads, what)
    write(pool_k, pool_v, slots, kh, vh)
    y = attend(qh, pool_k, pool_v, tables, starts, lens, _scale(scale, h))
    return _merge_heads(y.to(query.dtype)), kh, vh


def write(pool_k, pool_v, slots, k_new, v_new) -> None:
    """The new positions' keys and values [B, KVH, S, D] into the pool at ``slots`` [B, S]."""
    kvh, d, dv = pool_k.shape[2], pool_k.shape[3], pool_v.shape[3]
    idx = slots.reshape(-1)
    pool_k.view(-1, kvh, d).index_copy_(0, idx, k_new.transpose(1, 2).reshape(-1, kvh, d).to(pool_k.dtype))
    pool_v.view(-1, kvh, dv).index_copy_(0, idx, v_new.transpose(1, 2).reshape(-1, kvh, dv).to(pool_v.dtype))


def attend(q, pool_k, pool_v, tables, starts, lens, scale: float, qstarts=None):
    """Each query row over its row's positions in the pool (see the module's docstring): [B, H, S, Dv]."""
    b, h, s, d = q.shape
    kvh = pool_k.shape[2]
    if h % kvh:
        raise ShapeError(f"PagedAttention: {h} query heads over {kvh} KV heads (expected a multiple)")
    if tables.shape[0] != b:  # the rows' queries packed along the tokens of a batch of one
        if b != 1 or qstarts is None:
            raise ShapeError(f"PagedAttention: {tables.shape[0]} rows over a batch of {b}: packed rows need a "
                             "batch of one and their qstarts")
        return _packed(q, pool_k, pool_v, tables, starts, lens, scale, qstarts)
    if triton is not None and (q.is_cuda or INTERPRET) and pool_k.is_contiguous() and pool_v.is_contiguous() \
            and tables.stride(1) == 1 and d <= 256 and pool_v.shape[3] <= 256 and h // kvh <= 64:
        COUNTS["paged_attention_triton"] += 1
        if s == 1:
            return _triton(q, pool_k, pool_v, tables, lens, scale)
        return _triton_chunks(q, pool_k, pool_v, tables, starts, lens, scale)
    COUNTS["paged_attention_torch"] += 1
    return _torch(q, pool_k, pool_v, tables, starts, lens, scale)


def _packed(q, pool_k, pool_v, tables, starts, lens, scale: float, qstarts):
    """Packed rows: the Triton chunk kernel reading each row's queries where they start; elsewhere the
    rows unpacked to [R, H, T, D] (row r's j-th query at token qstarts[r] + j), attended as a batch,
    packed again (a token of no row: zeros)."""
    h, t, d = q.shape[1], q.shape[2], q.shape[3]
    kvh = pool_k.shape[2]
    if triton is not None and (q.is_cuda or INTERPRET) and pool_k.is_contiguous() and pool_v.is_contiguous() \
            and tables.stride(1) == 1 and d <= 256 and pool_v.shape[3] <= 256 and h // kvh <= 64:
        COUNTS["paged_attention_triton"] += 1
        return _triton_chunks(q, pool_k, pool_v, tables, starts, lens, scale, qstarts=qstarts)
    COUNTS["paged_attention_torch"] += 1
    j = torch.arange(t, device=q.device)
    tok = qstarts.reshape(-1, 1).long() + j                       # [R, T]
    mine = j < (lens - starts).reshape(-1, 1)                     # the row's own queries
    rows = q[0].index_select(1, tok.clamp(max=t - 1).reshape(-1)).view(h, -1, t, d).transpose(0, 1)
    y = _torch(rows, pool_k, pool_v, tables, starts, lens, scale)  # [R, H, T, Dv]
    out = q.new_zeros((1, h, t, y.shape[3]))
    flat = y.transpose(0, 1)[:, mine]                              # [H, tokens of rows, Dv]
    out[0, :, tok[mine]] = flat.to(out.dtype)
    return out


def _torch(q, pool_k, pool_v, tables, starts, lens, scale: float):
    b, h, s, d = q.shape
    kvh, dv = pool_k.shape[2], pool_v.shape[3]
    slots, bias = _positions(tables, starts, lens, s, pool_k.shape[1])
    k = pool_k.reshape(-1, kvh, d)[slots].to(q.dtype).transpose(1, 2)  # [B, KVH, P, D]
    v = pool_v.reshape(-1, kvh, dv)[slots].to(q.dtype).transpose(1, 2)
    if q.is_cpu and q.dtype == torch.float32:  # the CPU attention kernel (the fused Attention's on the CPU)
        r = cpu_attention.attention(q, k, v, bias, scale)
        if r is not None:
            return r
    if h != kvh and not SDPA_GQA:
        k, v = k.repeat_interleave(h // kvh, dim=1), v.repeat_interleave(h // kvh, dim=1)
    kw = {"enable_gqa": True} if h != kvh and SDPA_GQA else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=scale, **kw)


_SHARED: dict = {}  # the last run's positions: the same tables, starts and lengths serve every layer of a run


def _positions(tables, starts, lens, s: int, bs: int):
    """Every table position's slot [B, P] and the additive causal mask [B, 1, S, P] (0 where a query
    sees the position, -inf elsewhere), worked out once for the layers of a run (the same tensors)."""
    key = (tables._version, starts._version, lens._version, s, bs)
    hit = _SHARED.get("run")  # (one entry, read once: sessions in other threads replace it whole)
    if hit is not None and hit[0] == key and hit[1] is tables and hit[2] is starts and hit[3] is lens:
        return hit[4]
    t = torch.arange(tables.shape[1] * bs, device=tables.device)
    slots = tables[:, t // bs].long() * bs + t % bs
    last = torch.minimum(starts[:, None] + torch.arange(s, device=tables.device), lens[:, None] - 1)  # [B, S]
    bias = torch.zeros(last.shape + t.shape, dtype=torch.float32, device=tables.device)
    bias.masked_fill_(t[None, None, :] > last[:, :, None], float("-inf"))
    value = (slots, bias.unsqueeze(1))
    _SHARED["run"] = (key, tables, starts, lens, value)
    return value


def _triton(q, pool_k, pool_v, tables, lens, scale: float, block_n: int | None = None, small: bool | None = None,
            warps: int = 4):
    """``block_n`` (positions a program), ``small`` (the query heads' products as sums, not a dot of
    16 rows at least) and ``warps``: the probe's (benchmarks/paged_decode_sweep.py), else the defaults."""
    b, h, _, d = q.shape
    bs, kvh, dv = pool_k.shape[1], pool_k.shape[2], pool_v.shape[3]
    g = h // kvh
    small = g <= SMALL_GROUP if small is None else small
    block_n = block_n or (SMALL_BLOCK_N if small else BLOCK_N)
    splits = triton.cdiv(tables.shape[1] * bs, block_n)
    block_r = triton.next_power_of_2(g) if small else max(16, triton.next_power_of_2(g))
    block_dv = max(16, triton.next_power_of_2(dv))
    q3 = q.reshape(b * kvh, g, d)
    if q3.stride(-1) != 1:
        q3 = q3.contiguous()
    part = torch.empty((b * kvh, splits, block_r, block_dv), dtype=torch.float32, device=q.device)
    mx = torch.empty((b * kvh, splits, block_r), dtype=torch.float32, device=q.device)
    den = torch.empty_like(mx)
    out = torch.empty((b * kvh, g, dv), dtype=q.dtype, device=q.device)
    with on(q.device):
        _partial[(b * kvh, splits)](q3, pool_k, pool_v, tables, lens, part, mx, den, scale, kvh, g, d, dv, bs,
                                    q3.stride(0), q3.stride(1), tables.stride(0), splits,
                                    BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
                                    BLOCK_DV=block_dv, IEEE=q.dtype == torch.float32, SMALL=small, num_warps=warps)
        _combine[(b * kvh,)](part, mx, den, out, lens, kvh, g, dv, splits, out.stride(0), out.stride(1),
                             BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_DV=block_dv, num_warps=4)
    return out.view(b, h, 1, dv)


def _triton_chunks(q, pool_k, pool_v, tables, starts, lens, scale: float, rows: int | None = None,
                   block_n: int = BLOCK_N, warps: int | None = None, ieee: bool = True, qstarts=None):
    """Prompt chunks: a program per (row, KV head, block of positions) walks the row's table up to
    its block's last visible position with a running softmax (flash attention's loop), the query
    heads of the KV head and the block's positions as the rows of its products. The output is laid
    out [B, S, H, Dv] (returned as its [B, H, S, Dv] view: the heads merge after it without a copy)."""
    _, h, s, d = q.shape
    b = tables.shape[0]  # the rows (packed over a batch of one: qstarts says where each row's queries start)
    bs, kvh, dv = pool_k.shape[1], pool_k.shape[2], pool_v.shape[3]
    g = h // kvh
    if rows is None:  # (an H200, 12-layer decoder's shapes, benchmarks/paged_chunks_tune.py: 1.5-4x the
        # one tile of 64 rows and 4 warps) a grid of fewer than ~128 programs takes tiles of 16 rows, more
        # programs each; a wider one tiles of 64 rows over 8 warps. Packed rows take tiles of 16: a decode
        # row's one query would leave most of a wider tile idle
        per = max(1, triton.next_power_of_2(CHUNK_ROWS // g + 1) // 2)  # positions a wide tile holds
        wide = qstarts is None and b * kvh * triton.cdiv(s, per) >= 128
        rows, warps = (CHUNK_ROWS, warps or 8) if wide else (16, warps or 4)
    warps = warps or 4
    block_m = max(1, triton.next_power_of_2(rows // g + 1) // 2)  # positions a program: the largest
    block_r = max(16, triton.next_power_of_2(block_m * g))        # power of 2 with g of them <= rows
    packed = qstarts is not None
    out = (torch.zeros if packed else torch.empty)((q.shape[0], s, h, dv), dtype=q.dtype, device=q.device)
    with on(q.device):
        _chunks[(b * kvh, triton.cdiv(s, block_m))](
            q, pool_k, pool_v, tables, starts, lens, qstarts if packed else starts, out, scale, kvh, g, s, d, dv, bs,
            q.stride(0), q.stride(1), q.stride(2), tables.stride(0), out.stride(0), out.stride(1), out.stride(2),
            BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
            BLOCK_DV=max(16, triton.next_power_of_2(dv)), IEEE=ieee and q.dtype == torch.float32, PACKED=packed,
            num_warps=warps)
    return out.transpose(1, 2)


if triton is not None:
    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        """a @ b, float32 products in IEEE precision where asked (not TF32)."""
        if IEEE:
            return tl.dot(a, b, input_precision="ieee")
        return tl.dot(a, b)

    # the table's width and the row count change with the batch: not specialised on, so that a new
    # bucket's capture compiles nothing
    @triton.jit(do_not_specialize=["st0", "SPLITS"])
    def _partial(Q, PK, PV, TABLES, LENS, PART, MX, DEN, scale, KVH, R, D, DV, BS, sq0, sq1, st0, SPLITS,
                 BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                 IEEE: tl.constexpr, SMALL: tl.constexpr):
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // KVH
        h = bh % KVH
        length = tl.load(LENS + b)
        start = split * BLOCK_N
        if start < length:  # beyond the row's positions: nothing (the combine reads no split past its length)
            rows = tl.arange(0, BLOCK_R)
            d = tl.arange(0, BLOCK_D)
            dv = tl.arange(0, BLOCK_DV)
            n = start + tl.arange(0, BLOCK_N)
            valid = n < length
            block = tl.load(TABLES + b * st0 + n // BS, mask=valid, other=0).to(tl.int64)
            slot = block * BS + n % BS  # [BLOCK_N]: the pool positions of this program's keys
            q = tl.load(Q + bh * sq0 + rows[:, None] * sq1 + d[None, :], mask=(rows[:, None] < R) & (d[None, :] < D),
                        other=0.0)
            vv = tl.load(PV + (slot[:, None] * KVH + h) * DV + dv[None, :], mask=valid[:, None] & (dv[None, :] < DV),
                         other=0.0)
            if SMALL:  # a few query heads: each one's products as a sum over d (no 16-row dot tile)
                k = tl.load(PK + (slot[:, None] * KVH + h) * D + d[None, :], mask=valid[:, None] & (d[None, :] < D),
                            other=0.0).to(tl.float32)
                s = few_rows_scores(q, k, BLOCK_R, BLOCK_N)
            else:
                kt = tl.load(PK + (slot[None, :] * KVH + h) * D + d[:, None],
                             mask=valid[None, :] & (d[:, None] < D), other=0.0)
                s = _dot(q, kt.to(q.dtype), IEEE)
            s = tl.where(valid[None, :], s * scale, float("-inf"))
            m = tl.max(s, axis=1)
            p = tl.exp(s - m[:, None])
            if SMALL:
                acc = few_rows_weighted(p, vv, BLOCK_R, BLOCK_DV)
            else:
                acc = _dot(p.to(q.dtype), vv.to(q.dtype), IEEE)  # (IEEE: q is float32, p is already)
            base = (bh * SPLITS + split) * BLOCK_R
            tl.store(MX + base + rows, m)
            tl.store(DEN + base + rows, tl.sum(p, axis=1))
            tl.store(PART + (base + rows[:, None]) * BLOCK_DV + dv[None, :], acc)

    @triton.jit(do_not_specialize=["SPLITS"])
    def _combine(PART, MX, DEN, OUT, LENS, KVH, R, DV, SPLITS, so0, so1, BLOCK_R: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr):
        bh = tl.program_id(0)
        used = tl.cdiv(tl.load(LENS + bh // KVH), BLOCK_N)  # the splits that ran for this row
        rows = tl.arange(0, BLOCK_R)
        dv = tl.arange(0, BLOCK_DV)
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        for i in range(0, used):
            m = tl.maximum(m, tl.load(MX + (bh * SPLITS + i) * BLOCK_R + rows))
        den = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        for i in range(0, used):
            base = (bh * SPLITS + i) * BLOCK_R
            w = tl.exp(tl.load(MX + base + rows) - m)
            den += tl.load(DEN + base + rows) * w
            acc += tl.load(PART + (base + rows[:, None]) * BLOCK_DV + dv[None, :]) * w[:, None]
        out = acc / den[:, None]
        tl.store(OUT + bh * so0 + rows[:, None] * so1 + dv[None, :], out.to(OUT.dtype.element_ty),
                 mask=(rows[:, None] < R) & (dv[None, :] < DV))

    @triton.jit(do_not_specialize=["S", "st0", "so0", "so1", "sq0", "sq2"])
    def _chunks(Q, PK, PV, TABLES, STARTS, LENS, QSTARTS, OUT, scale, KVH, G, S, D, DV, BS, sq0, sq1, sq2, st0, so0,
                so1, so2, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, IEEE: tl.constexpr, PACKED: tl.constexpr):
        bh = tl.program_id(0)
        b = bh // KVH
        h = bh % KVH
        r = tl.arange(0, BLOCK_R)
        j = tl.program_id(1) * BLOCK_M + r // G  # the row's position in the chunk
        head = h * G + r % G
        start = tl.load(STARTS + b)
        length = tl.load(LENS + b)
        if PACKED:  # the row's queries from its first token on (batch of one), its own only
            live = (r < BLOCK_M * G) & (j < length - start)
            qrow = 0
            tok = tl.load(QSTARTS + b) + j
        else:
            live = (r < BLOCK_M * G) & (j < S)
            qrow = b
            tok = j
        last = tl.minimum(start + j, length - 1)  # the last position the row sees
        d = tl.arange(0, BLOCK_D)
        dv = tl.arange(0, BLOCK_DV)
        q = tl.load(Q + qrow * sq0 + head[:, None] * sq1 + tok[:, None] * sq2 + d[None, :],
                    mask=live[:, None] & (d[None, :] < D), other=0.0)
        m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        top = tl.minimum(start + tl.program_id(1) * BLOCK_M + BLOCK_M - 1, length - 1)  # the block's last seen
        steps = tl.cdiv(top + 1, BLOCK_N)
        if PACKED:  # a block past the row's queries (a decode row's, mostly) reads nothing
            steps = tl.where(tl.program_id(1) * BLOCK_M < length - start, steps, 0)
        for kb in range(0, steps):
            n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = n <= top
            block = tl.load(TABLES + b * st0 + n // BS, mask=valid, other=0).to(tl.int64)
            slot = block * BS + n % BS
            kt = tl.load(PK + (slot[None, :] * KVH + h) * D + d[:, None], mask=valid[None, :] & (d[:, None] < D),
                         other=0.0)
            sc = _dot(q, kt.to(q.dtype), IEEE)
            sc = tl.where(n[None, :] <= last[:, None], sc * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=1))  # finite from the first block on (position 0 is seen)
            alpha = tl.exp(m - m_new)
            p = tl.exp(sc - m_new[:, None])
            vv = tl.load(PV + (slot[:, None] * KVH + h) * DV + dv[None, :], mask=valid[:, None] & (dv[None, :] < DV),
                         other=0.0)
            pv = _dot(p.to(q.dtype), vv.to(q.dtype), IEEE)
            acc = acc * alpha[:, None] + pv
            den = den * alpha + tl.sum(p, axis=1)
            m = m_new
        o = acc / tl.where(den > 0, den, 1.0)[:, None]  # (a block of no live query: nothing summed)
        tl.store(OUT + qrow * so0 + tok[:, None] * so1 + head[:, None] * so2 + dv[None, :],
                 o.to(OUT.dtype.element_ty), mask=live[:, None] & (dv[None, :] < DV))
