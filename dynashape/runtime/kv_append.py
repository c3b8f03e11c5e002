"""KV-cache append: a Concat whose output the caller feeds back as the next ``past``.

``present = Concat(past, new)`` copies the whole past on every decode step unless the past
already sits at the start of a storage with room behind it. This class gives every new storage
spare room along the axis (the growth rules of ``memory/growth.py``) and remembers the
storages it wrote (weakly, with a watermark: how far along the axis it has written), so that a
``past`` that is a view of one of them is extended in place: only ``new`` is written, by its
producer straight into its slot (``prepare``) or copied. Feeding the same past twice (beam
search) finds the watermark beyond the past's end and copies instead of overwriting what the
first call appended.

In torch mode the storage goes to the caller with the output (``hand_out``); in numpy mode the
outputs are copied out, and the storage stays here for the next call.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter

import torch

from ..memory.growth import GROWTH

# storages a caller lends with its pasts (``lend_room``): (id of the root, data_ptr of the past) ->
# (weak root, the storage's size, stride and offset in it, the past's shape); only the root is
# referenced, weakly, so an entry whose pasts were never appended to dies with its memory
_LENT: dict = {}


def lend_room(past: torch.Tensor, storage: torch.Tensor) -> None:
    """Let a Concat append to ``past`` in place: ``past`` is the start of ``storage`` (same
    address and strides) and the caller gives the room behind it along the axis to this call's
    output (the paged engine's gathered pasts, dynashape/paged/engine.py): only the new part is
    written, the past is not copied into a storage of our own."""
    root = storage._base if storage._base is not None else storage
    if len(_LENT) > 4096:
        for k in [k for k, v in _LENT.items() if v[0]() is None]:
            del _LENT[k]
    # keyed by where the past starts in its root: an empty past (a chunk with no past yet, the paged
    # attention's pasts of length 0) has no data pointer (0), and every layer's would collide
    _LENT[(id(root), past.storage_offset())] = (weakref.ref(root), tuple(storage.shape), storage.stride(),
                                                storage.storage_offset(), past.shape)


class KVAppend:
    def __init__(self, axis: int, index: int, growth: str | None, engine, stats: Counter, predictor=None,
                 key: str = "") -> None:
        """``growth``: a rule of GROWTH for spare room (in-place concat on), or None: then the
        ShapePredictor sizes a new storage, as it sizes any buffer that must grow (a numpy-mode
        caller's present, copied out, leaves the storage here for the next step)."""
        self.axis, self.index = axis, index
        self.growth = GROWTH[growth] if growth is not None else None
        self.engine, self.stats = engine, stats
        self.predictor, self.key = predictor, key
        self.owned: torch.Tensor | None = None  # our storage, when the caller does not hold it
        self.known: list[tuple[weakref.ref, tuple, int]] = []  # (root, capacity shape, watermark)
        # the storage of the last call, checked first: a decode loop feeds it back every step
        self.last: tuple | None = None  # (root, storage view, filled, data_ptr, stride)
        self.pending: tuple | None = None  # (storage, slot data_ptr, slot stride) from prepare()
        self._layout: tuple | None = None  # what _into_own checks of ``owned`` (_own_layout)

    def prepare(self, past: torch.Tensor, new_shape: tuple) -> torch.Tensor:
        """The slot the producer of the new part writes into (``past`` in place or copied first)."""
        a = self.axis if self.axis >= 0 else self.axis + past.dim()
        self.pending = storage, offset, stride, _ = self._grown(past, a, new_shape[a])
        return storage.as_strided(new_shape, stride, offset)

    def _grown(self, past: torch.Tensor, a: int, extra: int) -> tuple:
        """(storage, offset of the new part, its stride, result shape) for ``past`` grown by ``extra``."""
        n = past.shape[a]
        total = n + extra
        storage = self._fast(past, total)
        if storage is None:
            shape = list(past.shape)
            shape[a] = total
            storage = self._storage(past, a, shape)
        stride = storage.stride()
        return storage, storage.storage_offset() + n * stride[a], stride, past.shape[:a] + (total,) + past.shape[a + 1:]

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        past = xs[0]
        a = self.axis if self.axis >= 0 else self.axis + past.dim()
        pending, self.pending = self.pending, None
        if len(xs) == 2:  # the common case: past and this step's part
            new = xs[1]
            if pending is None and past._base is None:  # a past we did not write (a numpy caller's)
                out = self._into_own(past, new, a)
                if out is not None:
                    return out
            # its producer wrote into the slot prepare() gave, or not
            storage, offset, stride, shape = pending if pending is not None else self._grown(past, a, new.shape[a])
            total = shape[a]
            if new.numel() and (new.storage_offset() != offset or new.stride() != stride or
                                new.untyped_storage().data_ptr() != storage.untyped_storage().data_ptr()):
                storage.as_strided(new.shape, stride, offset).copy_(new)
                self.stats["concat_bytes_copied"] += new.numel() * new.element_size()
        else:
            xs = tuple(x for x in xs if x is not None)
            total = sum(x.shape[a] for x in xs)
            storage = self._fast(past, total) if pending is None else pending[0]
            if storage is None:
                grown = list(past.shape)
                grown[a] = total
                storage = self._storage(past, a, grown)
            offset = past.shape[a]
            for x in xs[1:]:
                n = x.shape[a]
                if x.numel():
                    storage.narrow(a, offset, n).copy_(x)
                    self.stats["concat_bytes_copied"] += x.numel() * x.element_size()
                offset += n
            shape = past.shape[:a] + (total,) + past.shape[a + 1:]
        out = storage.as_strided(shape, storage.stride(), storage.storage_offset())
        self._mark(storage, total, out)
        return out

    def _into_own(self, past: torch.Tensor, new: torch.Tensor, a: int) -> torch.Tensor | None:
        """Past and new part in one ``cat`` into the storage kept here, where it has room: the
        numpy caller's loop, whose past is a copy of the last present (~5 us a call, where
        finding the storage and copying the two parts took ~15). What the storage's checks need
        of it is worked out once per storage (``_own_layout``)."""
        own = self.owned
        if own is None:
            return None
        lay = self._layout
        if lay is None or lay[0] is not own:
            lay = self._layout = self._own_layout(own, a)
        _, dtype, lead, tail, cap, stride, offset, ptr = lay
        ps, ns = past.shape, new.shape
        total = ps[a] + ns[a]
        if total > cap or past.dtype is not dtype or new.dtype is not dtype or ps[:a] != lead or ps[a + 1:] != tail \
                or ns[:a] != lead or ns[a + 1:] != tail:
            return None
        if past.numel() and past.untyped_storage().data_ptr() == ptr:
            return None  # (a view of the storage itself, whatever its base says)
        out = own.as_strided(lead + (total,) + tail, stride, offset)
        torch.cat((past, new), a, out=out)
        self.stats["concat_bytes_copied"] += out.numel() * out.element_size()
        # a numpy caller gets copies: no past of a later call is this storage's, so what _fast and
        # _past_storage know of it (written up to where) is dropped rather than kept up to date
        self.last = None
        return out

    @staticmethod
    def _own_layout(own: torch.Tensor, a: int) -> tuple:
        cap = own.shape
        return (own, own.dtype, tuple(cap[:a]), tuple(cap[a + 1:]), cap[a], own.stride(), own.storage_offset(),
                own.untyped_storage().data_ptr())

    def _fast(self, past: torch.Tensor, total: int) -> torch.Tensor | None:
        """The last storage, when ``past`` is exactly what the last call returned (a decode loop
        feeding its present back): checked without looking anything up. In-place concat off
        (no growth rule): never; the past is copied, as asked."""
        last = self.last
        if last is None or self.growth is None or past._base is not last[0]() or past.data_ptr() != last[3] \
                or past.shape != last[5] or past.stride() != last[4] or total > last[6]:
            return None
        self.stats["concat_past_in_place"] += 1
        return last[1]

    # ---- where the output goes ----------------------------------------------------------------
    def _storage(self, past: torch.Tensor, a: int, shape: list) -> torch.Tensor:
        """The storage the output goes into, with ``past`` at its start: the past's own when it
        is in place, else ours or a new one with the past copied in."""
        storage = self._past_storage(past, a, shape)
        if storage is not None:
            self.stats["concat_past_in_place"] += 1
            return storage
        storage = self._storage_for(past, a, shape)
        if past.numel():
            storage.narrow(a, 0, past.shape[a]).copy_(past)
            self.stats["concat_bytes_copied"] += past.numel() * past.element_size()
        return storage

    def _past_storage(self, first: torch.Tensor, a: int, shape: list) -> torch.Tensor | None:
        """A storage we wrote whose start is ``first``, with room for ``shape[a]`` along the axis
        and nothing written past ``first``'s end since."""
        root = first._base
        if root is None or self.growth is None:
            return None
        lent = self._lent(first, root, a, shape)  # first: a lent root may hold several storages
        if lent is not None:
            return lent
        last = self.last
        if last is not None and last[0]() is root:
            storage = last[1]
            filled, ptr, stride = last[2], storage.data_ptr(), storage.stride()
        else:
            hit = next((k for k in self.known if k[0]() is root), None)
            if hit is None or root.numel() != math.prod(hit[1]):  # (a root that is more than the storage)
                return None
            storage = root.view(hit[1])
            filled, ptr, stride = hit[2], storage.data_ptr(), storage.stride()
        cap = storage.shape
        if (filled != first.shape[a] or cap[a] < shape[a] or first.data_ptr() != ptr or first.stride() != stride
                or any(cap[d] != shape[d] for d in range(len(shape)) if d != a)):
            return None
        return storage

    @staticmethod
    def _lent(first: torch.Tensor, root: torch.Tensor, a: int, shape: list) -> torch.Tensor | None:
        """A storage lent with ``first`` (``lend_room``), taken once, when it has the room."""
        hit = _LENT.get((id(root), first.storage_offset()))
        if hit is None or hit[0]() is not root or hit[4] != first.shape:
            return None
        storage = root.as_strided(hit[1], hit[2], hit[3])
        cap = storage.shape
        if first.stride() != storage.stride() or cap[a] < shape[a] or any(
                cap[d] != shape[d] for d in range(len(shape)) if d != a):
            return None
        del _LENT[(id(root), first.storage_offset())]
        return storage

    def _storage_for(self, past: torch.Tensor, a: int, shape: list) -> torch.Tensor:
        own, dtype = self.owned, past.dtype
        if own is not None and own.dtype == dtype and own.shape[a] >= shape[a] and all(
                own.shape[d] == shape[d] for d in range(len(shape)) if d != a) and not (
                past.numel() and past.untyped_storage().data_ptr() == own.untyped_storage().data_ptr()):
            return own
        cap = list(shape)
        if self.growth is not None:
            cap[a] = shape[a] + self.growth(shape[a], self.index)
        elif self.predictor is not None:
            ok, pred = self.predictor.predict(self.key, tuple(shape), dtype.itemsize * 8, False)
            other = math.prod(d for i, d in enumerate(shape) if i != a) or 1
            if ok and math.prod(pred) > math.prod(shape):  # as many positions along the axis as it holds
                cap[a] = max(shape[a], math.prod(pred) // other)
                self.stats["predictions_used"] += 1
        n = math.prod(cap)
        if n > math.prod(shape) and not self.engine.can_preallocate(n * dtype.itemsize):
            cap[a], n = shape[a], math.prod(shape)  # no room for spare capacity: exact
        if own is not None:
            self.engine.release(own)
        self.owned = self.engine.allocate(n, dtype).view(cap)
        self.stats["concat_storages"] += 1
        return self.owned

    def _mark(self, storage: torch.Tensor, filled: int, out: torch.Tensor) -> None:
        """Remember ``storage`` as written up to ``filled`` along the axis (``out`` is the result)."""
        root = storage._base if storage._base is not None else storage
        last = self.last
        a = self.axis if self.axis >= 0 else self.axis + storage.dim()
        if last is not None and last[1] is storage:
            ref = last[0]
            for i, k in enumerate(self.known):
                if k[0]() is root:
                    self.known[i] = (k[0], k[1], filled)
        else:
            ref = weakref.ref(root)
            self.known = [k for k in self.known if k[0]() is not None and k[0]() is not root][-3:]
            self.known.append((ref, tuple(storage.shape), filled))
        # (root, storage, filled, data_ptr, stride, shape of the result, capacity along the axis)
        self.last = (ref, storage, filled, out.data_ptr(), out.stride(), out.shape, storage.shape[a])

    def hand_out(self) -> None:
        """The output went to the caller: the storage is theirs now (remembered weakly)."""
        if self.owned is not None:
            self.engine.release(self.owned, handed_out=True)
            self.owned = None

    def close(self) -> None:
        if self.owned is not None:
            self.engine.release(self.owned)
            self.owned = None
