"""PrimitiveInst: one node's runtime state and the per-node flow of the design notes.

    update_shape -> (empty output? skip) -> update_impl -> update_weights -> realloc_if_needed
    -> execute

Each step returns early when nothing it depends on changed, so a node whose input shapes are
the same as last time costs one shape comparison plus its kernel.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Protocol

import numpy as np
import torch

from ..errors import at_node
from ..ir import Node
from ..ops.limits import check_output_sizes, shape_failure
from ..ops.shapes import prod

_STRING = 8  # onnx.TensorProto.STRING

class NetworkState(Protocol):
    """What a PrimitiveInst uses of the Network it belongs to (the Network is the one that
    imports this module, not the other way round)."""

    device: torch.device
    stats: Counter
    engine: object
    pool: object
    runs: int

    def dtype_of(self, v) -> torch.dtype | None: ...

    def predict(self, key: str, shape: tuple, dtype: torch.dtype, can_reuse: bool) -> tuple[bool, tuple]: ...


class PrimitiveInst:
    __slots__ = (
        "node", "name", "op_type", "net", "kernel", "infer", "in_slots", "out_slots", "shape_deps",
        "volatile_deps", "out_dtypes", "device", "view", "writes_out", "data_dependent", "shape_of", "host",
        "in_shapes", "dep_vals", "out_shapes", "buffers", "capacity", "out", "skipped", "impl_key",
        "xfer", "xfer_cache", "single_out", "out_slot0", "pool_keys", "pred_keys", "inplace", "feeds",
    )

    def __init__(self, node: Node, net: NetworkState, in_slots: list[int | None], out_slots: list[int | None],
                 kernel, xfer: tuple[bool, ...]) -> None:
        od = node.opdef
        self.node, self.name, self.op_type, self.net = node, node.name, node.op_type, net
        self.kernel = kernel
        self.infer = partial(od.infer, **node.attrs) if od.infer is not None else None
        self.in_slots, self.out_slots = tuple(in_slots), tuple(out_slots)
        self.shape_deps = tuple(i for i in od.shape_deps if i < len(in_slots) and in_slots[i] is not None)
        self.volatile_deps = False  # set by the network when a shape dep is computed from data
        self.out_dtypes = [net.dtype_of(v) for v in node.outputs]
        self.shape_of = bool(getattr(node, "shape_of", False))
        self.host = self.shape_of or od.host
        self.device = torch.device("cpu") if self.host else net.device
        self.view, self.data_dependent = od.view, od.data_dependent
        if any(v is not None and v.kind != "tensor" for v in (*node.inputs, *node.outputs)):
            # Sequences and optionals have no shape to infer: the kernel's result is the truth.
            self.infer, self.data_dependent, self.view = None, True, False
        # shape_of nodes hand out a new tensor object whenever they re-run, so consumers can tell
        # a changed value by identity; they never write into a reused buffer.
        self.writes_out = od.writes_out and self.infer is not None and not self.shape_of and all(
            d is not None for d, slot in zip(self.out_dtypes, out_slots) if slot is not None)
        self.in_shapes = None
        self.dep_vals: tuple = ()
        self.out_shapes: list | None = None
        self.buffers: list[torch.Tensor | None] = [None] * len(out_slots)
        self.capacity = [0] * len(out_slots)
        self.out = None
        self.skipped = False
        self.impl_key = None
        self.xfer = xfer if any(xfer) else None
        self.xfer_cache: dict[int, tuple] = {}
        self.single_out = len(out_slots) == 1
        self.out_slot0 = out_slots[0] if out_slots else None
        # memory: the pool's requester name per output (None: not pooled), the predictor's keys
        self.pool_keys: list[str | None] = [None] * len(out_slots)
        self.pred_keys = [self.name if k == 0 else f"{self.name}_out{k}" for k in range(len(out_slots))]
        self.inplace = None  # InplaceConcat, for a Concat whose inputs may sit in its buffer
        self.feeds = None  # the InplaceConcat whose storage we write our output into

    # ---- inputs ---------------------------------------------------------------------------
    def gather(self, vals: list) -> list:
        ins = [None if s is None else vals[s] for s in self.in_slots]
        if self.xfer is not None:
            for i, need in enumerate(self.xfer):
                t = ins[i]
                if need and isinstance(t, torch.Tensor) and t.device != self.device:
                    hit = self.xfer_cache.get(i)
                    if hit is not None and hit[0] is t:
                        ins[i] = hit[1]
                    else:
                        moved = t.to(self.device, non_blocking=True)
                        self.xfer_cache[i] = (t, moved)
                        ins[i] = moved
        return ins

    # ---- the flow -------------------------------------------------------------------------
    def update_shape(self, ins: list) -> bool:
        """Recompute output shapes if an input shape or a shape-defining value changed."""
        shapes = tuple(map(shape_key, ins))
        deps = tuple(ins[i] for i in self.shape_deps)
        if (shapes == self.in_shapes and not self.volatile_deps and not self.data_dependent
                and all(a is b for a, b in zip(deps, self.dep_vals))):
            return False
        self.in_shapes, self.dep_vals = shapes, deps
        self.net.stats["shape_updates"] += 1
        if self.infer is None:  # data-dependent: the kernel tells the shape
            self.out_shapes = None
            return True
        values = [None] * len(ins)
        for i in self.shape_deps:
            t = ins[i]
            values[i] = t if t.device.type == "cpu" else t.cpu()
        try:
            inferred = self.infer(list(shapes), values)
            # a shape function may describe optional outputs this node does not have: keep the node's
            self.out_shapes = [None if s is None else tuple(map(int, s)) for s in inferred[:len(self.out_slots)]]
            check_output_sizes(self.op_type, self.out_shapes, self.out_dtypes, self.net.engine)
        except Exception as e:
            self.in_shapes = None
            self.out_shapes = None
            shown = [tuple(x) if isinstance(x, torch.Size) else x for x in shapes]
            raise at_node(shape_failure(e, self.op_type), self.name, self.op_type,
                          f" with input shapes {shown}") from e
        return True

    def update_impl(self) -> None:
        """Pick the implementation for these shapes (one shape-agnostic torch kernel today)."""
        key = (self.op_type, self.in_shapes)
        if key == self.impl_key:
            return
        self.impl_key = key
        self.net.stats["impl_updates"] += 1

    def update_weights(self) -> None:
        """Reorder weights when the impl wants another layout; the torch kernels take them as
        stored, so there is nothing to do until an impl asks for a layout."""
        return

    def realloc_if_needed(self) -> None:
        """Give each output a buffer large enough: reuse the old one when its capacity (in
        elements) suffices, unless it is more than 10x what is needed (reclaim); otherwise the old
        buffer goes back first, and the new one is sized as the ShapePredictor expects the shape to
        grow (when it predicts, and the engine has room). A producer that writes into a Concat's
        storage gets its own buffer only when the storage has no slot for it (``plan_feed``)."""
        if not self.writes_out or self.out_shapes is None:
            self.out = None
            return
        outs = [None if s is None or self.out_slots[k] is None or (k == 0 and self.feeds is not None)
                else self._buffer_for(k, s) for k, s in enumerate(self.out_shapes)]
        self.out = outs[0] if self.single_out else tuple(outs)

    def _buffer_for(self, k: int, shape: tuple) -> torch.Tensor:
        n = prod(shape)
        dtype = self.out_dtypes[k]
        fits = self.buffers[k] is not None and n <= self.capacity[k]
        if fits and n * 10 >= self.capacity[k]:
            self.net.stats["buffer_reuses"] += 1
            self.net.predict(self.pred_keys[k], shape, dtype, True)  # the history records every shape
        else:
            if self.buffers[k] is not None:
                self.net.stats["buffer_reclaims" if fits else "buffer_grows"] += 1
                self._give_back(k)
            want = n
            ok, predicted = self.net.predict(self.pred_keys[k], shape, dtype, False)
            if ok and prod(predicted) > n:
                want = prod(predicted)
                self.net.stats["predictions_used"] += 1
            self.buffers[k] = self._take(k, want, dtype)
            self.capacity[k] = want
        # as_strided: one op for "the first n elements, seen with this shape"
        return self.buffers[k].as_strided(shape, _contiguous_strides(shape))

    def _take(self, k: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        key = self.pool_keys[k]
        if key is not None and self.net.pool is not None:
            return self.net.pool.get(key, numel, dtype, dynamic=True)
        return self.net.engine.allocate(numel, dtype)

    def _give_back(self, k: int) -> None:
        # A pooled buffer is left inside the pool's next get(), which frees its record when
        # nobody else uses it, or grows it for all its users when nothing else fits.
        if self.pool_keys[k] is None or self.net.pool is None:
            self.net.engine.release(self.buffers[k])
        self.buffers[k] = None
        self.capacity[k] = 0

    def rebind(self, k: int, record: torch.Tensor) -> None:
        """The pool moved the record output k shares (another user grew it): point the buffer,
        and the ``out`` views the kernel writes through, at the new memory."""
        if self.inplace is not None:
            self.inplace.rebind(record)
            return
        dtype = self.out_dtypes[k]
        self.buffers[k] = record[:self.capacity[k] * dtype.itemsize].view(dtype)
        if self.out_shapes is None or self.out is None:
            return
        # a producer that wrote into a Concat's slot this run may have a shape its own (older,
        # smaller) buffer cannot view: plan_feed picks its ``out`` before each run anyway
        outs = [None if b is None or s is None or prod(s) > cap else b.as_strided(s, _contiguous_strides(s))
                for b, s, cap in zip(self.buffers, self.out_shapes, self.capacity)]
        self.out = outs[0] if self.single_out else tuple(outs)

    def execute(self, ins: list, vals: list) -> None:
        try:
            res = self.kernel(*ins, out=self.out)
        except Exception as e:
            raise at_node(e, self.name, self.op_type, f" with input shapes {list(self.in_shapes or ())}") from e
        if not self.writes_out and not self.view:
            res = self._on_device(res)
        if self.single_out:
            vals[self.out_slot0] = res
            return
        for s, r in zip(self.out_slots, res):
            if s is not None:
                vals[s] = r

    def _on_device(self, res):
        """An adopted result must live where the node runs: a kernel that built it from host
        values (Range with no element type known, so no buffer) hands back a CPU tensor."""
        if isinstance(res, torch.Tensor):
            return res if res.device == self.device else res.to(self.device)
        if isinstance(res, tuple):
            return tuple(self._on_device(r) for r in res)
        return res

    def step(self, vals: list) -> None:
        """The full per-node flow, used whenever some shape in the network may have changed.
        Whatever fails in it (shape function, predictor, allocation, kernel) names this node."""
        try:
            self._step(vals)
        except Exception as e:
            named = at_node(e, self.name, self.op_type, f" with input shapes {list(self.in_shapes or ())}")
            if named is e:
                raise
            raise named from e

    def _step(self, vals: list) -> None:
        ins = self.gather(vals)
        if self.shape_of and self.op_type not in ("Shape", "Size"):
            # Inside a shape_of subgraph every input is a shape value: re-run only when one of
            # them is a new object, i.e. when a shape it depends on changed.
            if all(a is b for a, b in zip(ins, self.dep_vals)) and len(ins) == len(self.dep_vals):
                return
            self.dep_vals = tuple(ins)
            self.net.stats["shape_updates"] += 1
            self.execute(ins, vals)
            return
        if self.update_shape(ins):
            self.skipped = self.out_shapes is not None and all(
                s is None or prod(s) == 0 for s in self.out_shapes)
            if self.skipped:
                self._emit_empty(vals)
                return
            self.update_impl()
            self.update_weights()
            self.realloc_if_needed()
        elif self.shape_of:
            return  # same shapes in, so the same values out: keep them
        elif self.skipped:
            return
        if self.feeds is not None:
            self.plan_feed(vals)
        self.execute(ins, vals)

    def plan_feed(self, vals: list) -> None:
        """Write straight into our slot of the Concat's storage when it can take us."""
        slot = self.feeds.slot_for_feeder(self, vals, self.out_shapes[0], self.out_dtypes[0])
        if slot is None:
            self.out = self._buffer_for(0, self.out_shapes[0])
            return
        self.out = slot
        if self.buffers[0] is not None:  # our own buffer (from a run without a slot) is not needed now
            if self.pool_keys[0] is not None and self.net.pool is not None:
                # no get() follows to take it back: the record is released (freed if emptied) now
                self.net.pool.release(self.pool_keys[0], self.buffers[0], free_if_unused=True)
            self._give_back(0)

    def _emit_empty(self, vals: list) -> None:
        self.net.stats["empty_skips"] += 1
        for k, s in enumerate(self.out_slots):
            if s is None:
                continue
            if self.node.outputs[k].elem_type == _STRING:  # strings live in numpy object arrays
                vals[s] = np.empty(self.out_shapes[k], dtype=object)
            else:
                vals[s] = torch.empty(self.out_shapes[k], dtype=self.out_dtypes[k] or torch.float32,
                                      device=self.device)

    def release_output(self, k: int) -> None:
        """Hand output k's buffer to the caller: the next run must not overwrite it."""
        if self.buffers[k] is not None:
            self.net.engine.release(self.buffers[k], handed_out=True)
        self.buffers[k] = None
        self.capacity[k] = 0
        self.in_shapes = None  # forces realloc_if_needed on the next run

    def reset(self) -> None:
        """Forget cached shapes so the next run redoes the whole flow (after an error)."""
        self.in_shapes, self.dep_vals, self.impl_key = None, (), None
        if self.inplace is not None:
            self.inplace.reset()


def shape_key(t):
    """What update_shape compares: a tensor's shape (torch.Size compares as a tuple), a
    sequence's length, None for an absent input or an empty optional."""
    if t is None:
        return None
    if isinstance(t, list):
        return ("sequence", len(t))
    return t.shape


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))
