"""A paged engine run's host side: the rows' padded sizes and the arrays the model's inputs are made
of, and those arrays on the device (``Batch.tensors``). Two forms: ``make_batch`` for a model that
takes its pasts dense (gathered from the blocks, ``gather``), ``make_paged_batch`` for one whose
attention reads the pool through the block tables (the session's ``paged_kv``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .scheduler import bucket
from .staging import Staged


def to_device(a: np.ndarray, dev: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``a`` on ``dev`` without the host waiting: a copy from pageable memory waits for the stream's
    earlier work (a step's chunk inputs would wait for its decode run), one from pinned memory does
    not (torch's pinned-memory cache keeps the staging buffer until the copy has run)."""
    if dev.type != "cuda":
        t = torch.from_numpy(a)
        return t.to(dev, dtype if dtype is not None else t.dtype)
    return stage(a, dtype).to(dev, non_blocking=True)


def stage(a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``a`` copied into pinned host memory (of ``dtype``), for a copy to the device that does not wait."""
    t = torch.from_numpy(a)
    staged = torch.empty(t.shape, dtype=dtype or t.dtype, pin_memory=True)
    return staged.copy_(t)


PAGED_ARRAYS = ("tables", "starts", "lens", "slots", "last", "qstarts")  # the session's paged.* inputs


@dataclass
class Batch:
    """A run's rows on the host: ``n`` real rows padded to ``b``, ``s`` new positions a row after a
    ``p``-long past; the inputs' arrays, the past's slots (``gather``), where each new position sits in
    the presents (row ``new_b``, place ``new_t``) and the pool slots it goes to."""

    n: int
    b: int
    s: int
    p: int
    decode: bool
    ids: np.ndarray
    mask: np.ndarray
    pos: np.ndarray
    gather: np.ndarray | None
    new_b: np.ndarray | None
    new_t: np.ndarray | None
    slots: np.ndarray
    tables: np.ndarray | None = None  # the paged form: each row's blocks, first new position, length after
    starts: np.ndarray | None = None
    lens: np.ndarray | None = None
    last: np.ndarray | None = None  # each row's last new token (its logits sampled), among the b * s flattened
    qstarts: np.ndarray | None = None  # each row's first new token among them
    packed: bool = False  # the rows' tokens packed along ``s`` of a batch of one (``b`` rows, ``s`` tokens)

    @property
    def paged(self) -> bool:
        return self.tables is not None

    @property
    def positions(self) -> int:
        """The new positions the run computes, padding included."""
        return self.s if self.packed else self.b * self.s

    def paged_arrays(self, ints: dict, io) -> dict:
        """The paged form's arrays and their device dtypes (``staging.Staged``'s input)."""
        out = {"ids": (self.ids, ints[io.input_ids]), "mask": (self.mask, ints[io.attention_mask]),
               **{k: (getattr(self, k), torch.int64) for k in PAGED_ARRAYS}}
        if io.position_ids is not None:
            out["pos"] = (self.pos, ints[io.position_ids])
        return out

    def tensors(self, dev, ints: dict, io, scratch: int | None) -> dict:
        """The arrays on the device. ``scratch``: every row of the bucket written (a captured step's
        fixed work), the padding rows' keys and values into the pool's scratch slot."""
        if self.paged:  # padding rows and positions write the scratch slot already
            return Staged(self.paged_arrays(ints, io), dev).tensors
        if scratch is None:
            nb, nt, slots = self.new_b, self.new_t, self.slots
        else:
            nb, nt = np.arange(self.b), np.full(self.b, self.p)
            slots = np.concatenate([self.slots, np.full(self.b - self.n, scratch, dtype=np.int64)])
        t = {"ids": torch.from_numpy(self.ids).to(dev, ints[io.input_ids]),
             "mask": torch.from_numpy(self.mask).to(dev, ints[io.attention_mask]),
             "idx": torch.from_numpy(self.gather.reshape(-1)).to(dev),
             "nb": torch.from_numpy(nb).to(dev), "nt": torch.from_numpy(nt).to(dev),
             "slots": torch.from_numpy(slots).to(dev), "branch": torch.tensor([self.p > 0], device=dev)}
        if io.position_ids is not None:
            t["pos"] = torch.from_numpy(self.pos).to(dev, ints[io.position_ids])
        return t


def make_batch(rows, pool, convention: str, pad_rows: bool, past_multiple: int, chunk_multiple: int) -> Batch:
    """``rows`` (the scheduler's, one kind: decode rows or prompt chunks) as one run: rows padded to a
    bucket (``pad_rows``), a chunk's length to ``chunk_multiple`` (the concat convention), the
    longest past to ``past_multiple``."""
    bs, n = pool.block_size, len(rows)
    decode = all(r.end - r.start == 1 for r in rows)
    b = bucket(n) if pad_rows else n
    ks = np.zeros(b, dtype=np.int64)  # new positions a row (0 for a padding row)
    starts = np.zeros(b, dtype=np.int64)
    ks[:n] = [r.end - r.start for r in rows]
    starts[:n] = [r.start for r in rows]
    s = int(ks.max())
    if not decode and convention == "concat":  # (GroupQueryAttention places a row's new tokens
        s = -(-s // chunk_multiple) * chunk_multiple  # by the step's length: never padded)
    p = -(-int(starts.max()) // past_multiple) * past_multiple  # the longest past, rounded up
    ids = np.zeros((b, s), dtype=np.int64)
    # each row's blocks, then every past position's slot at once (0 where a row has none: masked)
    tables = np.zeros((b, p // bs + 1), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, :ks[i]] = r.tokens
        table = pool.tables.get(r.seq.key)  # None: aborted since the plan (its row is dropped)
        if r.start and table is not None:
            blocks = table.blocks[:tables.shape[1]]  # those of the past (a chunk's new blocks are after)
            tables[i, :len(blocks)] = blocks
    grid, new = np.arange(p), np.arange(s)
    past_ok = grid[None, :] < starts[:, None]
    gather = np.where(past_ok, tables[:, grid // bs] * bs + grid % bs, 0)
    pos = np.where(new[None, :] < ks[:, None], starts[:, None] + new[None, :], 0)
    if convention == "gqa":  # right padding: the ones count the row's positions
        mask = (np.arange(p + s)[None, :] < (starts + ks)[:, None]).astype(np.int64)
        mask[n:, 0] = 1  # rows that pad a bucket: one token of their own, dropped after
        base = starts[:n]
    else:
        mask = np.concatenate([past_ok, new[None, :] < ks[:, None]], axis=1).astype(np.int64)
        mask[n:, p] = 1
        base = np.full(n, p, dtype=np.int64)
    new_b = np.repeat(np.arange(n), ks[:n])
    within = np.arange(len(new_b)) - np.repeat(np.cumsum(ks[:n]) - ks[:n], ks[:n])
    new_t = np.repeat(base, ks[:n]) + within
    slots = np.concatenate([r.slots for r in rows])
    return Batch(n, b, s, p, decode, ids, mask, pos, gather, new_b, new_t, slots)


def _paged_rows(rows, pool, pad_rows: bool, width: int | None):
    """What both paged forms share: ``n`` rows padded to ``b`` (a bucket with ``pad_rows``), each row's
    new positions (a padding row: one) and first position, its length after the run, and its block
    table (``width`` blocks wide, or the widest row's; a padding row's and a table's unused entries
    name the scratch block)."""
    bs, n = pool.block_size, len(rows)
    b = bucket(n) if pad_rows else n
    ks = np.ones(b, dtype=np.int64)
    starts = np.zeros(b, dtype=np.int64)
    ks[:n] = [r.end - r.start for r in rows]
    starts[:n] = [r.start for r in rows]
    lens = starts + ks
    tables = np.full((b, width or int(-(-lens.max() // bs))), pool.scratch_slot // bs, dtype=np.int64)
    for i, r in enumerate(rows):
        table = pool.tables.get(r.seq.key)  # None: aborted since the plan (its row is dropped)
        if table is not None:  # (blocks past the width hold no position below the row's length)
            blocks = table.blocks[:tables.shape[1]]
            tables[i, :len(blocks)] = blocks
    return n, b, ks, starts, lens, tables


def make_paged_batch(rows, pool, pad_rows: bool, chunk_multiple: int, width: int | None) -> Batch:
    """``rows`` as one run of a model whose attention reads the pool (the session's ``paged_kv``):
    no past is fed, each row's block table (``width`` blocks wide, or the widest row's), first new
    position and length after the run are. Padding rows (a bucket) and padding positions (a chunk
    padded to ``chunk_multiple``) write the pool's scratch slot; a padding row's table names the
    scratch block, so it attends to its own position only."""
    n, b, ks, starts, lens, tables = _paged_rows(rows, pool, pad_rows, width)
    decode = all(r.end - r.start == 1 for r in rows)
    s = int(ks.max())
    if not decode:
        s = -(-s // chunk_multiple) * chunk_multiple
    ids = np.zeros((b, s), dtype=np.int64)
    slots = np.full((b, s), pool.scratch_slot, dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, :ks[i]] = r.tokens
        slots[i, :ks[i]] = r.slots
    pos = starts[:, None] + np.arange(s)[None, :]
    mask = np.ones((b, s), dtype=np.int64)  # (the attention masks by the lengths; the graph's mask goes unused)
    qstarts = np.arange(b, dtype=np.int64) * s
    return Batch(n, b, s, 0, decode, ids, mask, pos, None, None, None, slots, tables, starts, lens, qstarts + ks - 1,
                 qstarts)


def make_packed_batch(rows, pool, pad_rows: bool, multiple: int, width: int | None) -> Batch:
    """``rows`` (decode rows and prompt chunks together) as one run of a batch of one whose tokens are
    the rows' new positions one after another, ``multiple`` apart at most in padding (a padding row
    one token of its own; the padding tokens write the scratch slot and belong to no row): the
    products pass over the weights once for the whole step."""
    n, b, ks, starts, lens, tables = _paged_rows(rows, pool, pad_rows, width)
    qstarts = np.concatenate([[0], np.cumsum(ks)[:-1]]).astype(np.int64)
    s = -(-int(ks.sum()) // multiple) * multiple
    ids = np.zeros((1, s), dtype=np.int64)
    pos = np.zeros((1, s), dtype=np.int64)
    slots = np.full((1, s), pool.scratch_slot, dtype=np.int64)
    for i, r in enumerate(rows):
        at = slice(qstarts[i], qstarts[i] + ks[i])
        ids[0, at] = r.tokens
        pos[0, at] = np.arange(r.start, r.end)
        slots[0, at] = r.slots
    return Batch(n, b, s, 0, False, ids, np.ones((1, s), dtype=np.int64), pos, None, None, None, slots, tables,
                 starts, lens, qstarts + ks - 1, qstarts, packed=True)


def padding_batch(pool, b: int, s: int, width: int, packed: bool = False) -> Batch:
    """A paged run of ``b`` padding rows of ``s`` new positions each (``packed``: ``b`` rows of one token
    among ``s`` of a batch of one), all written to the pool's scratch slot (each row's table names the
    scratch block): a key's shapes, to capture before a step needs it."""
    tables = np.full((b, width), pool.scratch_slot // pool.block_size, dtype=np.int64)
    one = 1 if packed else b
    ids = np.zeros((one, s), dtype=np.int64)
    pos = np.zeros((one, s), dtype=np.int64) if packed else np.tile(np.arange(s, dtype=np.int64), (b, 1))
    slots = np.full((one, s), pool.scratch_slot, dtype=np.int64)
    zeros = np.zeros(b, dtype=np.int64)
    qstarts = np.arange(b, dtype=np.int64) * (1 if packed else s)
    return Batch(0, b, s, 0, s == 1 and not packed, ids, np.ones((one, s), dtype=np.int64), pos, None, None, None,
                 slots, tables, zeros, zeros + 1, qstarts.copy(), qstarts, packed=packed)
