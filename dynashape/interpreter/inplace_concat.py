"""Run-time in-place concat: the Concat's inputs already sit in its buffer, so it copies nothing.

Two ways an input gets there:
- *the past is already in place*: the first input is a view at the start of a storage this
  Concat allocated earlier (a KV cache: the caller feeds last step's ``present`` back as
  ``past``), the storage has room for the rest along the axis, and nothing was written past the
  input's end since (a watermark per storage). Then the Concat's output is the same storage,
  one step longer, and the past is not copied.
- *producers write into their slots* (OpenVINO's "producers write at their offset"): an input
  whose producer writes into a given ``out`` and whose only reader is this Concat gets a view of
  its slot as that ``out``. The first such producer of a run lays the storage out: the shapes of
  inputs made before it are known, its own is just inferred, and those of inputs made after it
  are taken from the Concat's last run. Every later producer checks that the layout still holds
  for it (else it writes its own buffer). A slot that is not contiguous (the axis is not the
  outermost non-trivial one) is offered only to kernels that write strided outputs correctly.
Whatever is not in place when the Concat runs is copied into its slot (counted in
``concat_bytes_copied``); an input that lies in the storage at another place than its slot (the
layout changed during the run) is copied out first, so no copy overwrites another's data.

A new storage has spare room along the axis (``growth``): a KV cache then appends for many steps
before it needs a larger one. Storages handed to the caller (a graph output in torch mode) stay
the caller's: the Concat remembers them only weakly, to recognise them when they come back.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

import torch

from ..memory.growth import GROWTH
from ..ops.shapes import norm_axis

if TYPE_CHECKING:
    from .primitive_inst import PrimitiveInst

# Element-wise kernels that write correctly into a strided ``out`` (a slot of the storage is not
# contiguous when the axis is not the outermost non-trivial one).
STRIDED_OUT_OK = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Relu", "Sigmoid", "Tanh", "Where", "Cast"})


class InplaceConcat:
    """Attached to a Concat PrimitiveInst; ``index`` staggers the growth of the model's caches."""

    def __init__(self, inst: PrimitiveInst, index: int, growth: str | None = "geometric") -> None:
        """``growth``: a rule of GROWTH for spare room along the axis, or None (exact storages)."""
        self.inst, self.index = inst, index
        self.growth = GROWTH[growth] if growth is not None else None
        self.pool_key: str | None = None  # set when the storage comes from the network's pool
        self.axis = inst.node.attrs.get("axis", 0)
        self.owned: torch.Tensor | None = None  # a storage this Concat keeps between runs
        self.flat: torch.Tensor | None = None  # the pool's 1-D buffer under ``owned`` (pooled storages)
        self.retire: list[torch.Tensor] = []  # earlier ones, freed once the Concat has copied from them
        # storages written lately: (weak root tensor, capacity shape, watermark along the axis)
        self.known: list[tuple[weakref.ref, tuple, int]] = []
        # producers writing into their slots: id(producer) -> (its input index, the input indices
        # whose values exist when it runs); set up by memory_setup
        self.feeders_of: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.first_feeder: PrimitiveInst | None = None
        self.plan: _Layout | None = None  # laid out by the first producer, for one run
        # layouts on our own storage by input shapes, for the next runs (a batch that comes back
        # finds its views made); emptied whenever that storage changes
        self._kept: dict[tuple, _Layout] = {}

    # ---- choosing the storage ----------------------------------------------------------------
    def _past_storage(self, first: torch.Tensor, a: int, total: int, shape: tuple) -> torch.Tensor | None:
        """A known storage whose start is ``first`` and that has room for ``total`` along ``a``,
        with nothing written past ``first``'s end since (so no one else's data is there)."""
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

    def storage_for(self, first: torch.Tensor | None, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """The storage the output of ``shape`` goes into: the past's, our own, or a new one."""
        a = norm_axis(self.axis, len(shape))
        total = shape[a]
        s = None if first is None else self._past_storage(first, a, total, shape)
        if s is not None:
            self.inst.net.stats["concat_past_in_place"] += 1
            return s
        own = self.owned
        if own is not None and own.shape[a] >= total and all(
                own.shape[d] == shape[d] for d in range(len(shape)) if d != a) and own.dtype == dtype:
            return own
        flat, n = self.flat, math.prod(shape)
        if flat is not None and flat.dtype == dtype and n <= flat.numel() <= 10 * n:
            # a pooled storage is reused by capacity in elements, as realloc_if_needed does (a
            # batch that shrinks or comes back needs no new one): the same memory, another shape
            self.owned = flat[:n].view(shape)
            return self.owned
        return self._new_storage(shape, a, dtype)

    def _new_storage(self, shape: tuple, a: int, dtype: torch.dtype) -> torch.Tensor:
        inst = self.inst
        self._kept = {}  # layouts on the storage this one replaces
        cap = list(shape)
        if self.growth is not None:
            cap[a] = shape[a] + self.growth(shape[a], self.index)
        n = math.prod(cap)
        engine = inst.net.engine
        if n > math.prod(shape) and not engine.can_preallocate(n * dtype.itemsize):
            cap[a] = shape[a]  # no room for spare capacity: exact
            n = math.prod(cap)
        if self.pool_key is not None:
            # the pool takes the old record back itself (inputs were moved out of it before)
            self.owned = None
            flat = self.flat = inst.net.pool.get(self.pool_key, n, dtype, dynamic=True)
        else:
            # the old storage may hold the past we are about to copy: it goes back after the copy
            if self.owned is not None:
                self.retire.append(self.owned)
                self.owned = None
            flat = engine.allocate(n, dtype)
        storage = flat.view(cap)
        self.owned = storage
        inst.net.stats["concat_storages"] += 1
        return storage

    # ---- producers writing into their slots --------------------------------------------------
    def slot_for_feeder(self, feeder: PrimitiveInst, vals: list, own_shape: tuple,
                        dtype: torch.dtype) -> torch.Tensor | None:
        """The view of the storage ``feeder`` writes its output into, or None (its own buffer)."""
        i, ready = self.feeders_of[id(feeder)]
        run = self.inst.net.runs
        if feeder is self.first_feeder:
            self.plan = self._lay_out(i, ready, vals, own_shape, dtype)
            if self.plan is not None:
                self.plan.run = run
        lay = self.plan
        if lay is None or lay.run != run:  # none, or one of a run whose first producer did not come here
            return None
        slots, shapes = self.inst.in_slots, lay.shapes
        if shapes[i] != own_shape or any(vals[slots[j]].shape != shapes[j] for j in ready):
            return None  # the layout does not hold for us: write our own buffer, the Concat copies
        slot = lay.slots[i]
        if not slot.is_contiguous() and feeder.op_type not in STRIDED_OUT_OK:
            return None
        return slot

    def _lay_out(self, i: int, ready: tuple, vals: list, own_shape: tuple, dtype: torch.dtype) -> _Layout | None:
        """Input shapes, offsets and the storage for this run, as the first producer sees them.
        An input made after it is guessed: Concat forces its other dims to equal ours, and its
        length along the axis is taken from the Concat's last run or from the graph's static
        shape (right whenever that length is fixed, as the channels of a CNN's branches are).
        The same shapes on our own storage give the same layout: it is kept, views and all."""
        last = self.inst.in_shapes  # the Concat's input shapes of its last run
        a = norm_axis(self.axis, len(own_shape))
        slots, shapes = self.inst.in_slots, []
        for j in range(len(slots)):
            if j == i:
                shapes.append(tuple(own_shape))
            elif j in ready:
                shapes.append(_shape(vals[slots[j]]))
            else:
                length = self._length_of(j, a, len(own_shape), last)
                if length is None:
                    return None  # no guess for an input made after us
                guess = list(own_shape)
                guess[a] = length
                shapes.append(tuple(guess))
        key = tuple(shapes)
        kept = self._kept.get(key)
        if kept is not None:
            self.owned = kept.storage
            return kept
        if any(s is None or len(s) != len(own_shape) for s in shapes):
            return None
        if any(s[d] != own_shape[d] for s in shapes for d in range(len(own_shape)) if d != a):
            return None
        total = list(own_shape)
        total[a] = sum(s[a] for s in shapes)
        first = vals[slots[0]] if 0 in ready else None
        lay = _Layout(self.storage_for(first, tuple(total), dtype), shapes, a)
        # only a layout on a storage we keep can serve again (a past's storage changes every step)
        if lay.storage is self.owned and len(self._kept) < 16:
            self._kept[key] = lay
        return lay

    def _length_of(self, j: int, a: int, rank: int, last) -> int | None:
        """Input j's length along the axis: as in the last run, else as compile-time shape
        inference fixed it (the channels of a CNN branch are known before any run)."""
        if last is not None and last[j] is not None and len(last[j]) == rank:
            return last[j][a]
        shape = self.inst.node.inputs[j].shape
        if shape is None or len(shape) != rank or not shape[a].is_static:
            return None
        return shape[a].min

    # ---- the Concat itself --------------------------------------------------------------------
    def run(self, xs: list) -> torch.Tensor:
        xs = [x for x in xs if x is not None]
        a = norm_axis(self.axis, xs[0].dim())
        shape = list(xs[0].shape)
        shape[a] = sum(x.shape[a] for x in xs)
        lay, self.plan = self.plan, None
        stats = self.inst.net.stats
        if lay is not None and lay.run == self.inst.net.runs and all(
                x.shape == s for x, s in zip(xs, lay.shapes)) and len(xs) == len(lay.shapes):
            if all(x.data_ptr() == p and x.stride() == st for x, (p, st) in zip(xs, lay.where)):
                # every input is already in its slot: nothing to do (the common case)
                stats["concat_inputs_in_place"] += len(xs)
                return self._done(lay.storage, lay.result, a)
            storage = lay.storage
        else:
            if self.owned is not None:  # a new storage may take this one's place: what is in it moves out
                xs = self._moved_out(xs, self.owned.untyped_storage().data_ptr())
            storage = self.storage_for(xs[0], tuple(shape), xs[0].dtype)
        offset, slots = 0, []
        for x in xs:
            slots.append(storage.narrow(a, offset, x.shape[a]))
            offset += x.shape[a]
        placed = [x.numel() == 0 or (x.data_ptr() == s.data_ptr() and x.stride() == s.stride())
                  for x, s in zip(xs, slots)]
        # an input left in the storage at another place would be overwritten by the copies: move it out first
        xs = self._moved_out(xs, storage.untyped_storage().data_ptr(), placed)
        result = storage.narrow(a, 0, shape[a])
        if not any(x.numel() for x, ok in zip(xs, placed) if ok):
            torch.cat(xs, dim=a, out=result)  # nothing in place: one kernel, not one copy per input
            stats["concat_bytes_copied"] += sum(x.numel() * x.element_size() for x in xs)
        else:
            for x, slot, ok in zip(xs, slots, placed):
                if ok:
                    stats["concat_inputs_in_place"] += 1
                else:
                    slot.copy_(x)
                    stats["concat_bytes_copied"] += x.numel() * x.element_size()
        return self._done(storage, result, a)

    def _done(self, storage: torch.Tensor, result: torch.Tensor, a: int) -> torch.Tensor:
        if self.pool_key is None:  # only a storage the caller may feed back needs its watermark
            self._mark(storage, result.shape[a])
        for old in self.retire:
            self.inst.net.engine.release(old)
        self.retire = []
        return result

    def _moved_out(self, xs: list, mem: int, placed: list | None = None) -> list:
        """``xs`` with the inputs that lie in storage ``mem`` (and are not at their slot) cloned."""
        out = []
        for k, x in enumerate(xs):
            if x.numel() and x.untyped_storage().data_ptr() == mem and not (placed and placed[k]):
                x = x.clone()
                self.inst.net.stats["concat_bytes_copied"] += x.numel() * x.element_size()
            out.append(x)
        return out

    def rebind(self, record: torch.Tensor) -> None:
        """The pool moved the record our storage shares (another user grew it, at a time none of
        our producers or readers runs): the storage is there now."""
        self._kept = {}  # their views are of the old memory
        if self.flat is not None:
            flat = self.flat
            self.flat = record[:flat.numel() * flat.element_size()].view(flat.dtype)
        if self.owned is not None:
            own = self.owned
            self.owned = self.flat[:own.numel()].view(own.shape)

    def _mark(self, storage: torch.Tensor, filled: int) -> None:
        root = storage._base if storage._base is not None else storage
        self.known = [k for k in self.known if k[0]() is not None and k[0]() is not root][-3:]
        self.known.append((weakref.ref(root), tuple(storage.shape), filled))

    def hand_out(self) -> None:
        """The output goes to the caller: the storage is theirs now (remembered weakly)."""
        if self.owned is not None:
            self.inst.net.engine.release(self.owned, handed_out=True)
            self.owned, self._kept = None, {}

    def reset(self) -> None:
        """A run failed: a layout made for it must not be used by the next one."""
        self.plan, self._kept = None, {}


class _Layout:
    """Where each input of one Concat goes in a storage: shapes, slot views, the output view."""

    __slots__ = ("storage", "shapes", "slots", "where", "result", "run")

    def __init__(self, storage: torch.Tensor, shapes: list[tuple], a: int) -> None:
        self.storage, self.shapes, self.run = storage, shapes, 0
        self.slots, offset = [], 0
        for s in shapes:
            self.slots.append(storage.narrow(a, offset, s[a]))
            offset += s[a]
        self.where = [(t.data_ptr(), t.stride()) for t in self.slots]
        self.result = storage.narrow(a, 0, offset)


def _shape(t) -> tuple | None:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None
