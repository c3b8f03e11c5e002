"""KV-cache append: a Concat whose output the caller feeds back as the next ``past``.

``present = Concat(past, new)`` copies the whole past on every decode step unless the past
already sits at the start of a storage with room behind it. This class gives every new storage
spare room along the axis (the growth rules of ``inplace_concat.GROWTH``) and remembers the
storages it wrote (weakly, with a watermark: how far along the axis it has written), so that a
``past`` that is a view of one of them is extended in place: only ``new`` is copied. Feeding the
same past twice (beam search) finds the watermark beyond the past's end and copies instead of
overwriting what the first call appended.

In torch mode the storage goes to the caller with the output (``hand_out``); in numpy mode the
outputs are copied out, and the storage stays here for the next call.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter

import torch

from ..ops.shapes import norm_axis
from .inplace_concat import GROWTH


class KVAppend:
    def __init__(self, axis: int, index: int, growth: str | None, engine, stats: Counter) -> None:
        self.axis, self.index = axis, index
        self.growth = GROWTH[growth] if growth is not None else None
        self.engine, self.stats = engine, stats
        self.owned: torch.Tensor | None = None  # our storage, when the caller does not hold it
        self.known: list[tuple[weakref.ref, tuple, int]] = []  # (root, capacity shape, watermark)
        self.pending: torch.Tensor | None = None  # the storage prepare() chose for this run's Concat

    def prepare(self, past: torch.Tensor, new_shape: tuple) -> torch.Tensor:
        """The slot the producer of the new part writes into (``past`` in place or copied first)."""
        a = norm_axis(self.axis, past.dim())
        shape = list(past.shape)
        shape[a] += new_shape[a]
        storage = self._storage(past, a, shape)
        self.pending = storage
        return storage.narrow(a, past.shape[a], new_shape[a])

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        xs = tuple(x for x in xs if x is not None)
        a = norm_axis(self.axis, xs[0].dim())
        shape = list(xs[0].shape)
        shape[a] = sum(x.shape[a] for x in xs)
        storage, self.pending = self.pending, None
        if storage is None:
            storage = self._storage(xs[0], a, shape)
        offset = xs[0].shape[a]
        for x in xs[1:]:
            n = x.shape[a]
            slot = storage.narrow(a, offset, n)
            if x.numel() and (x.data_ptr() != slot.data_ptr() or x.stride() != slot.stride()):
                slot.copy_(x)
                self.stats["concat_bytes_copied"] += x.numel() * x.element_size()
            offset += n
        self._mark(storage, shape[a])
        return storage.narrow(a, 0, shape[a])

    def _storage(self, past: torch.Tensor, a: int, shape: list) -> torch.Tensor:
        """The storage the output goes into, with ``past`` at its start: the past's own when it
        is in place, else ours or a new one with the past copied in."""
        storage = self._past_storage(past, a, shape[a], shape)
        if storage is not None:
            self.stats["concat_past_in_place"] += 1
            return storage
        storage = self._storage_for((past,), a, shape)
        if past.numel():
            storage.narrow(a, 0, past.shape[a]).copy_(past)
            self.stats["concat_bytes_copied"] += past.numel() * past.element_size()
        return storage

    def _past_storage(self, first: torch.Tensor, a: int, total: int, shape: list) -> torch.Tensor | None:
        """A storage we wrote whose start is ``first``, with room for ``total`` along the axis
        and nothing written past ``first``'s end since."""
        root = first._base
        if root is None:
            return None
        for ref, cap, filled in self.known:
            if ref() is not root:
                continue
            storage = root.view(cap)
            if (filled != first.shape[a] or cap[a] < total or first.data_ptr() != storage.data_ptr()
                    or first.stride() != storage.stride()
                    or any(cap[d] != shape[d] for d in range(len(shape)) if d != a)):
                return None
            return storage
        return None

    def _storage_for(self, xs: tuple, a: int, shape: list) -> torch.Tensor:
        own, dtype = self.owned, xs[0].dtype
        if own is not None and own.dtype == dtype and own.shape[a] >= shape[a] and all(
                own.shape[d] == shape[d] for d in range(len(shape)) if d != a) and not any(
                x.numel() and x.untyped_storage().data_ptr() == own.untyped_storage().data_ptr() for x in xs):
            return own
        cap = list(shape)
        if self.growth is not None:
            cap[a] = shape[a] + self.growth(shape[a], self.index)
        n = math.prod(cap)
        if n > math.prod(shape) and not self.engine.can_preallocate(n * dtype.itemsize):
            cap[a], n = shape[a], math.prod(shape)  # no room for spare capacity: exact
        if own is not None:
            self.engine.release(own)
        self.owned = self.engine.allocate(n, dtype).view(cap)
        self.stats["concat_storages"] += 1
        return self.owned

    def _mark(self, storage: torch.Tensor, filled: int) -> None:
        root = storage._base if storage._base is not None else storage
        self.known = [k for k in self.known if k[0]() is not None and k[0]() is not root][-3:]
        self.known.append((weakref.ref(root), tuple(storage.shape), filled))

    def hand_out(self) -> None:
        """The output went to the caller: the storage is theirs now (remembered weakly)."""
        if self.owned is not None:
            self.engine.release(self.owned, handed_out=True)
            self.owned = None

    def close(self) -> None:
        if self.owned is not None:
            self.engine.release(self.owned)
            self.owned = None
