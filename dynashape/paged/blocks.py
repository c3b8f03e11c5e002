"""The paged KV pool: fixed-size blocks of keys and values in one allocation, and a block table per
conversation.

Why blocks: a conversation's KV storage sized for its longest possible answer, as the decode
graphs' capacity buckets size it, holds memory the conversation may never use; with many
conversations of different lengths that spare room decides how many fit. Blocks of ``block_size``
token positions are taken as a conversation grows and given back when it ends or is preempted, so
at most one partly filled block per conversation is spare (vLLM's PagedAttention makes the same
trade).

Layout: ``k`` and ``v`` are ``[layers, num_blocks, block_size, kv_heads, head_dim]``. A token
position ``p`` of a conversation lives in block ``table.blocks[p // block_size]`` at offset
``p % block_size``; its *slot* (``block * block_size + offset``) indexes the pool's positions
flattened over blocks, which is how ``attention.write_kv`` stores a step's new keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import KVCapacityError, OptionsError


def blocks_for_memory(free_bytes: int, headroom: float, block_size: int, layers: int, kv_heads: int,
                      head_dim: int, dtype: torch.dtype) -> int:
    """How many blocks fit in ``free_bytes`` keeping ``headroom`` (a fraction, e.g. 0.1) of it for
    activations and everything else."""
    if not 0.0 <= headroom < 1.0:
        raise OptionsError(f"headroom={headroom!r}: expected a fraction in [0, 1)")
    per_block = 2 * layers * block_size * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return int(free_bytes * (1.0 - headroom)) // per_block


@dataclass
class BlockTable:
    """A conversation's blocks, in the order of its positions, and the positions it holds."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` positions for ``layers`` layers, and the free list."""

    def __init__(self, num_blocks: int, block_size: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        if num_blocks < 1 or block_size < 1:
            raise OptionsError(f"a pool of {num_blocks} blocks of {block_size} positions: expected at least one of one")
        self.num_blocks, self.block_size = num_blocks, block_size
        # one block more, never handed out: rows that pad a batch write their keys and values there
        # (a captured step writes every row of its bucket)
        shape = (layers, num_blocks + 1, block_size, kv_heads, head_dim)
        self.scratch_slot = num_blocks * block_size
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # lowest ids first: a fresh pool hands out 0, 1, 2, ... (reproducible tables in tests)
        self._free = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[object, BlockTable] = {}
        self.peak_used = 0

    # ---- accounting ---------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def stats(self) -> dict:
        """What memory_stats reports of the pool."""
        per_block = 2 * self.k[:, 0].numel() * self.k.element_size()
        return {"kv_blocks": self.num_blocks, "kv_blocks_used": self.used_blocks, "kv_blocks_peak": self.peak_used,
                "kv_block_size": self.block_size, "kv_pool_bytes": per_block * self.num_blocks,
                "kv_used_bytes": per_block * self.used_blocks, "kv_conversations": len(self.tables)}

    # ---- tables -------------------------------------------------------------------------------
    def check_fits(self, key, positions: int) -> None:
        """Refuse (KVCapacityError) a conversation that could never fit, even alone in the pool."""
        need = self.blocks_needed(positions)
        if need > self.num_blocks:
            raise KVCapacityError(f"conversation {key!r} needs {need} KV blocks of {self.block_size} positions "
                                  f"({positions} positions), the pool holds {self.num_blocks}")

    def can_grow(self, key, extra: int) -> bool:
        """Whether ``extra`` more positions for ``key`` (a new conversation too) fit in the free blocks."""
        t = self.tables.get(key)
        length = t.length if t is not None else 0
        have = len(t.blocks) if t is not None else 0
        return self.blocks_needed(length + extra) - have <= len(self._free)

    def grow(self, key, extra: int) -> np.ndarray:
        """Take the blocks for ``extra`` more positions of ``key`` (its table made on first use) and
        return the new positions' slots (an int64 array, on the host). Raises KVCapacityError
        without taking anything when they do not fit (``can_grow`` asks first)."""
        t = self.tables.get(key)
        if t is None:
            t = self.tables[key] = BlockTable()
        need = self.blocks_needed(t.length + extra) - len(t.blocks)
        if need > len(self._free):
            if not t.blocks and not t.length:
                del self.tables[key]
            raise KVCapacityError(f"conversation {key!r} needs {need} more KV blocks, {len(self._free)} are free")
        for _ in range(need):
            t.blocks.append(self._free.pop())
        self.peak_used = max(self.peak_used, self.used_blocks)
        bs, start = self.block_size, t.length
        t.length += extra
        # on the host: a step joins its rows' slots and moves them to the device once
        if extra == 1:  # a decode row
            return np.array([t.blocks[start // bs] * bs + start % bs], dtype=np.int64)
        pos = np.arange(start, start + extra)
        return np.asarray(t.blocks, dtype=np.int64)[pos // bs] * bs + pos % bs

    def truncate(self, key, length: int) -> None:
        """Keep the first ``length`` positions of ``key`` (a conversation's next turn that shares
        them) and give back the blocks past them; ``length`` 0 gives back its table."""
        t = self.tables.get(key)
        if t is None:
            return
        if length <= 0:
            self.release(key)
            return
        keep = self.blocks_needed(min(length, t.length))
        self._free.extend(reversed(t.blocks[keep:]))
        del t.blocks[keep:]
        t.length = min(length, t.length)

    def release(self, key) -> int:
        """Give back every block of ``key`` (ended, aborted or preempted); the blocks freed."""
        t = self.tables.pop(key, None)
        if t is None:
            return 0
        self._free.extend(reversed(t.blocks))
        return len(t.blocks)

    def table_tensor(self, keys: list, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables of ``keys`` as one ``[rows, width]`` int32 tensor (rows padded with -1) and
        their lengths ``[rows]``: what an attention kernel reads from the device."""
        tables = [self.tables[k] for k in keys]
        width = width or max((len(t.blocks) for t in tables), default=0) or 1
        out = torch.full((len(keys), width), -1, dtype=torch.int32)
        for i, t in enumerate(tables):
            out[i, :len(t.blocks)] = torch.tensor(t.blocks, dtype=torch.int32)
        lengths = torch.tensor([t.length for t in tables], dtype=torch.int32)
        return out.to(self.k.device), lengths.to(self.k.device)
