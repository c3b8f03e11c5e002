"""Run-time in-place concat: the Concat's inputs already sit in its buffer, so it copies nothing.

Two ways an input gets there:
- *the past is already in place*: the first input is a view at the start of a storage this
  Concat allocated earlier (a KV cache: the caller feeds last step's ``present`` back as
  ``past``), the storage has room for the rest along the axis, and nothing was written past the
  input's end since (a watermark per storage). Then the Concat's output is the same storage,
  one step longer, and the past is not copied.
- *a producer writes into its slot*: the last input's producer, when it is an element-wise
  kernel whose only user is this Concat, gets a view of its slot in the storage as its output
  buffer (OpenVINO's "producers write at their offset").
Whatever is not in place is copied into its slot (counted in ``concat_bytes_copied``).

A new storage has spare room along the axis (``growth``): a KV cache then appends for many steps
before it needs a larger one. Storages handed to the caller (a graph output in torch mode) stay
the caller's: the Concat remembers them only weakly, to recognise them when they come back.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

import torch

from ..ops.shapes import norm_axis

if TYPE_CHECKING:
    from .primitive_inst import PrimitiveInst

# Element-wise kernels that write correctly into a strided ``out`` (a slot of the storage is not
# contiguous when the axis is not the outermost non-trivial one).
STRIDED_OUT_OK = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Relu", "Sigmoid", "Tanh", "Where", "Cast"})


def growth_openvino(total: int, index: int) -> int:
    """OpenVINO's KV-cache rule: 128 spare positions, staggered by the concat's index."""
    return 128 + index % 64


def growth_geometric(total: int, index: int) -> int:
    """Ours: a quarter of the current length, at least 128 positions, staggered by index so that
    the layers of a model do not all grow at the same step. Long sequences grow O(log n) times
    instead of n/128 times, for at most ~25% spare room."""
    return max(128, math.ceil(total / 4)) + (index % 16) * 8


GROWTH = {"openvino": growth_openvino, "geometric": growth_geometric}


class InplaceConcat:
    """Attached to a Concat PrimitiveInst; ``index`` staggers the growth of the model's caches."""

    def __init__(self, inst: PrimitiveInst, index: int, growth: str = "geometric") -> None:
        self.inst, self.index, self.growth = inst, index, GROWTH[growth]
        self.axis = inst.node.attrs.get("axis", 0)
        self.owned: torch.Tensor | None = None  # a storage this Concat keeps between runs
        self.retire: torch.Tensor | None = None  # the previous one, freed once the copy is done
        # storages written lately: (weak root tensor, capacity shape, watermark along the axis)
        self.known: list[tuple[weakref.ref, tuple, int]] = []
        self.planned: tuple | None = None  # (storage, prefix) chosen for the feeder this run

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

    def storage_for(self, first: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """The storage the output of ``shape`` goes into: the past's, our own, or a new one."""
        a = norm_axis(self.axis, len(shape))
        total = shape[a]
        s = self._past_storage(first, a, total, shape)
        if s is not None:
            self.inst.net.stats["concat_past_in_place"] += 1
            return s
        own = self.owned
        if own is not None and own.shape[a] >= total and all(
                own.shape[d] == shape[d] for d in range(len(shape)) if d != a) and own.dtype == dtype:
            return own
        return self._new_storage(shape, a, dtype)

    def _new_storage(self, shape: tuple, a: int, dtype: torch.dtype) -> torch.Tensor:
        inst = self.inst
        cap = list(shape)
        cap[a] = shape[a] + self.growth(shape[a], self.index)
        n = math.prod(cap)
        engine = inst.net.engine
        if not engine.can_preallocate(n * dtype.itemsize):
            cap[a] = shape[a]  # no room for spare capacity: exact
            n = math.prod(cap)
        # the old storage may hold the past we are about to copy: it goes back after the copy
        self.retire, self.owned = self.owned, None
        flat = engine.allocate(n, dtype)
        storage = flat.view(cap)
        self.owned = storage
        inst.net.stats["concat_storages"] += 1
        return storage

    # ---- the feeder: the last input's producer writes into its slot --------------------------
    def slot_for_feeder(self, ins_before: list, own_shape: tuple, dtype: torch.dtype) -> torch.Tensor | None:
        first = ins_before[0] if ins_before else None
        if first is None or any(not isinstance(x, torch.Tensor) for x in ins_before):
            self.planned = None
            return None
        a = norm_axis(self.axis, len(own_shape))
        prefix = sum(x.shape[a] for x in ins_before)
        shape = list(own_shape)
        shape[a] = prefix + own_shape[a]
        storage = self.storage_for(first, tuple(shape), dtype)
        self.planned = (storage, prefix)
        return storage.narrow(a, prefix, own_shape[a])

    # ---- the Concat itself --------------------------------------------------------------------
    def run(self, xs: list) -> torch.Tensor:
        xs = [x for x in xs if x is not None]
        a = norm_axis(self.axis, xs[0].dim())
        shape = list(xs[0].shape)
        shape[a] = sum(x.shape[a] for x in xs)
        planned, self.planned = self.planned, None
        storage = planned[0] if planned is not None and planned[0].shape[a] >= shape[a] else None
        if storage is None:
            storage = self.storage_for(xs[0], tuple(shape), xs[0].dtype)
        stats = self.inst.net.stats
        offset = 0
        for x in xs:
            slot = storage.narrow(a, offset, x.shape[a])
            if x.numel() and not (x.data_ptr() == slot.data_ptr() and x.stride() == slot.stride()):
                slot.copy_(x)
                stats["concat_bytes_copied"] += x.numel() * x.element_size()
            offset += x.shape[a]
        self._mark(storage, shape[a])
        if self.retire is not None and self.retire is not storage:
            self.inst.net.engine.release(self.retire)
        self.retire = None
        return storage.narrow(a, 0, shape[a])

    def _mark(self, storage: torch.Tensor, filled: int) -> None:
        root = storage._base if storage._base is not None else storage
        self.known = [k for k in self.known if k[0]() is not None and k[0]() is not root][-3:]
        self.known.append((weakref.ref(root), tuple(storage.shape), filled))

    def hand_out(self) -> None:
        """The output goes to the caller: the storage is theirs now (remembered weakly)."""
        if self.owned is not None:
            self.inst.net.engine.release(self.owned, handed_out=True)
            self.owned = None
