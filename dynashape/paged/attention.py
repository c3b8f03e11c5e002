"""Keys and values written into the pool's blocks, and attention over them.

``paged_attention`` is the reference form in torch ops: each conversation's positions gathered
from its blocks, then scaled dot-product attention with a causal mask over its new rows. It serves
decode steps (one query row per conversation) and prompt chunks (several rows, each seeing the
positions before it) in one packed batch, as a continuous-batching step mixes them. A kernel that
reads the block table on the device (a Triton kernel for CUDA) must give what this gives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .blocks import BlockPool


def write_kv(pool: BlockPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Store new positions' keys and values ``[tokens, kv_heads, head_dim]`` at their ``slots``."""
    _, _, bs, h, d = pool.k.shape
    slots = torch.as_tensor(slots, device=pool.k.device)
    pool.k[layer].view(-1, h, d).index_copy_(0, slots, k.to(pool.k.dtype))
    pool.v[layer].view(-1, h, d).index_copy_(0, slots, v.to(pool.v.dtype))


def paged_attention(q: torch.Tensor, pool: BlockPool, layer: int, keys: list, q_lens: list[int],
                    scale: float | None = None) -> torch.Tensor:
    """Attention of packed query rows ``q [tokens, heads, head_dim]`` (the rows of ``keys[0]``, then
    of ``keys[1]``, ...; ``q_lens[i]`` of them each) over their conversations' positions in the pool,
    their own new positions written already: row j of conversation i sits at position
    ``length_i - q_lens[i] + j`` and sees the positions up to it. Heads may be a multiple of the
    pool's kv heads (grouped-query attention). Returns ``[tokens, heads, head_dim]``."""
    _, _, bs, kvh, d = pool.k.shape
    heads = q.shape[1]
    if heads % kvh:
        raise ShapeError(f"paged_attention: {heads} query heads over {kvh} KV heads (expected a multiple)")
    group = heads // kvh
    kf, vf = pool.k[layer].view(-1, kvh, d), pool.v[layer].view(-1, kvh, d)
    out = torch.empty_like(q)
    start = 0
    for key, n in zip(keys, q_lens):
        t = pool.tables[key]
        pos = torch.arange(t.length, device=q.device)
        ids = torch.tensor(t.blocks, dtype=torch.int64, device=q.device)
        slots = ids[pos // bs] * bs + pos % bs
        k = kf.index_select(0, slots).to(q.dtype).repeat_interleave(group, dim=1)  # [L, heads, d]
        v = vf.index_select(0, slots).to(q.dtype).repeat_interleave(group, dim=1)
        qi = q[start:start + n]
        rows = torch.arange(t.length - n, t.length, device=q.device)
        mask = pos[None, :] <= rows[:, None]  # [n, L]: causal over the conversation's positions
        o = F.scaled_dot_product_attention(qi.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                           attn_mask=mask, scale=scale)
        out[start:start + n] = o.transpose(0, 1)
        start += n
    return out
