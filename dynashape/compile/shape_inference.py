"""Shape inference with partial shapes: dims are ints where static, Dimensions where dynamic."""

from __future__ import annotations

import logging

import torch

from ..errors import InvalidModelError, ShapeError
from ..ir import Node, Value
from ..ops.tensor import reshape_target
from ..shape import Dimension, PartialShape
from . import partial_values

log = logging.getLogger(__name__)


def as_dims(v: Value | None):
    if v is None:
        return None
    if v.shape is None:
        raise _Unknown
    return tuple(d.min if d.is_static else d for d in v.shape)


class _Unknown(Exception):
    pass


def infer_node(node: Node, known: dict | None = None) -> None:
    """Set the output shapes of ``node`` from its inputs; keep ONNX's hint where we know less.
    ``known``: shape tensors known in part (compile/partial_values.py), by value id."""
    od = node.opdef
    if od.infer is None:
        return
    try:
        shapes = [as_dims(v) for v in node.inputs]
        values = [None] * len(node.inputs)
        for i in od.shape_deps:
            if i < len(node.inputs) and node.inputs[i] is not None:
                values[i] = node.inputs[i].const
                if values[i] is None:
                    values[i] = _from_partial(node, i, known)
                if values[i] is None:
                    raise _Unknown
        outs = od.infer(shapes, values, **node.attrs)
    except _Unknown:
        _partial_reshape(node, known)
        return
    except ShapeError as e:
        if all(v is None or (v.shape is not None and v.shape.is_static) for v in node.inputs):
            raise InvalidModelError(f"node {node.name!r} ({node.op_type}): {e}") from e
        return
    except Exception as e:  # noqa: BLE001  a shape function that cannot reason about ranges
        log.debug("compile-time shape inference skipped for %s: %s", node.name, e)
        return
    for v, s in zip(node.outputs, outs):
        if v is None or s is None:
            continue
        ours = PartialShape(s)
        v.shape = _merge_hint(ours, v.shape)


def _from_partial(node: Node, i: int, known: dict | None):
    """A shape input whose entries the walk knows to be numbers, as the tensor it will be."""
    entries = partial_values.of(node.inputs[i], known or {})
    if entries is None or not all(type(e) is int for e in entries):
        return None
    return torch.tensor(entries, dtype=torch.int64)


def _partial_reshape(node: Node, known: dict | None) -> None:
    """A Reshape whose target is known in part: its rank, and the dims the entries give."""
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or node.outputs[0] is None:
        return
    x = node.inputs[0]
    entries = partial_values.of(node.inputs[1], known or {})
    if x is None or x.shape is None or entries is None:
        return
    try:
        dims = reshape_target(as_dims(x), entries, node.attrs.get("allowzero", 0))
    except ShapeError:
        return  # the run names the node and says what the target asks
    node.outputs[0].shape = _merge_hint(PartialShape(dims), node.outputs[0].shape)


def infer_if(node: Node) -> None:
    """An If's outputs have the shapes both branches agree on: the rank where the ranks match, a
    dim where both give the same one, else the range covering both (its own inference has none,
    the branch taken being known only at run time). Conditions that test an output's rank fold then."""
    branches = [node.subgraphs.get("then_branch"), node.subgraphs.get("else_branch")]
    if any(b is None or len(b.outputs) != len(node.outputs) for b in branches):
        return
    for i, v in enumerate(node.outputs):
        a, b = (br.outputs[i].shape for br in branches)
        if v is None or a is None or b is None or len(a) != len(b):
            continue
        v.shape = _merge_hint(PartialShape(_join(x, y) for x, y in zip(a, b)), v.shape)


def _join(a: Dimension, b: Dimension) -> Dimension:
    if a == b:
        return a
    hi = None if a.max is None or b.max is None else max(a.max, b.max)
    return Dimension(min(a.min, b.min), hi)


def _merge_hint(ours: PartialShape, hint: PartialShape | None) -> PartialShape:
    if hint is None or len(hint) != len(ours):
        return ours
    dims = []
    for a, b in zip(ours, hint):
        try:
            m = a.merge(b)
        except ShapeError:
            m = a
        if m.symbol is None and b.symbol is not None:
            m = m.with_symbol(b.symbol)
        dims.append(m)
    return PartialShape(Dimension.of(d) for d in dims)
