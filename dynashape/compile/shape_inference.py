"""Shape inference with partial shapes: dims are ints where static, Dimensions where dynamic."""

from __future__ import annotations

import logging

from ..errors import InvalidModelError, ShapeError
from ..ir import Node, Value
from ..shape import Dimension, PartialShape

log = logging.getLogger(__name__)


def as_dims(v: Value | None):
    if v is None:
        return None
    if v.shape is None:
        raise _Unknown
    return tuple(d.min if d.is_static else d for d in v.shape)


class _Unknown(Exception):
    pass


def infer_node(node: Node) -> None:
    """Set the output shapes of ``node`` from its inputs; keep ONNX's hint where we know less."""
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
                    raise _Unknown
        outs = od.infer(shapes, values, **node.attrs)
    except _Unknown:
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
