"""The strides the generated code follows through view ops, decided on expressions.

A group member that is a view (an arena view, a Reshape of one ...) is made once per symbol
values only when it stays a view for every value: these rules say so without asking a symbol's
value (no guard comes out of them), and a reshape they cannot prove a view is left to a copy.
"""

from __future__ import annotations

from ..ir import Node, Value
from ..ops.tensor import _perm
from ..shape.symint import NeedsConcrete, is_one, same_dim


def _strides(dims, layout: str | None) -> tuple:
    """Contiguous strides, or channels-last ones (N, C, H, W -> H*W*C, 1, W*C, C)."""
    if layout == "nhwc" and len(dims) == 4:
        n, c, h, w = dims
        return (h * w * c, 1, w * c, c)
    return _contiguous(dims)


def _contiguous(dims) -> tuple:
    acc, out = 1, []
    for d in reversed(dims):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


def _reshape_strides(old_shape, old_strides, new_shape) -> tuple | None:
    """The strides of ``view(new_shape)`` of a tensor of these sizes and strides, or None when the
    reshape copies. torch's rule (``computeStride``), with every decision taken on expressions and
    none asked of the symbols' values, so that no guard comes out of it: what is found is a view
    for every value of the symbols, and what is not is a copy, right for every value too. (Asking
    made guards such as ``batch == 1``: one specialization for batch 1 and another for the rest.)
    - the same shape: the same strides (a layout pass's no-op reshape);
    - strides that are the sizes' contiguous strides (dims of a literal 1 aside: their stride
      addresses nothing): any shape of that numel, with its contiguous strides;
    - otherwise chunk by chunk: a dim joins the next chunk when it is a literal 1 or its stride is
      that chunk's extent (as expressions), and the new dims must rebuild each chunk's numel as
      the same expression. A symbolic dim is never taken as 1 (``is_one``): a view that holds
      only when it is 1 is left to a copy."""
    if len(old_shape) == len(new_shape) and all(same_dim(o, n) for o, n in zip(old_shape, new_shape)):
        return tuple(old_strides)
    if all(same_dim(st, c) or is_one(d) for d, st, c in zip(old_shape, old_strides, _contiguous(old_shape))):
        return _contiguous(new_shape)
    if any(type(d) is int and d == 0 for d in old_shape):  # no elements: any strides address them
        return _contiguous(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel, view_numel = 1, 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel = tensor_numel * old_shape[d]
        if d == 0 or not (is_one(old_shape[d - 1]) or same_dim(old_strides[d - 1], tensor_numel * chunk_base)):
            while view_d >= 0 and (not same_dim(view_numel, tensor_numel) or is_one(new_shape[view_d])):
                new_strides[view_d] = view_numel * chunk_base
                view_numel = view_numel * new_shape[view_d]
                view_d -= 1
            if not same_dim(view_numel, tensor_numel):
                return None
            if d > 0:
                chunk_base = old_strides[d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return tuple(new_strides)


_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


class Strides:
    """The code builder's part (``builder._Builder``) that follows a view op's strides from its
    input's, a group member's (``self.strides``)."""

    def _view_strides(self, node: Node, src: Value, info) -> tuple | None:
        """The strides of a view op's output from its input's (a group member), or None when the
        op is not a view there (a reshape that has to copy) or its strides are not followed."""
        old = self.strides.get(id(src))
        if old is None or info.dims is None or node.domain not in ("", "ai.onnx"):
            return None
        op, dims = node.op_type, info.dims
        try:
            if op in _RESHAPES:
                return _reshape_strides(self.t.of(src).dims, old, dims)
            if op == "Transpose":
                perm = _perm(len(old), node.attrs.get("perm"))
                return tuple(old[p] for p in perm)
            if op == "Slice":
                return self._slice_strides(node, old)
            if op == "Expand":  # new leading axes and axes of 1 that grow read one element: stride 0
                pad = len(dims) - len(old)
                src_dims = (1,) * pad + tuple(self.t.of(src).dims)
                full = (0,) * pad + tuple(old)
                # a dim kept as it is keeps its stride, a literal 1 gets stride 0 whatever it grows
                # to: neither asks a symbol's value (no guard)
                return tuple(st if same_dim(sd, d) else 0 if is_one(sd) or (sd == 1 and d != 1) else st
                             for sd, d, st in zip(src_dims, dims, full))
        except NeedsConcrete:
            return None
        return None

    def _slice_strides(self, node: Node, old: tuple) -> tuple | None:
        if node.opset >= 10:
            vals = [None if x is None else self.t.of(x).sval for x in node.inputs[1:5]]
            if vals[0] is None or vals[1] is None or (len(node.inputs) > 3 and node.inputs[3] is not None
                                                      and vals[2] is None):
                return None
            axes = None if len(vals) < 3 or vals[2] is None else vals[2].flat()
            steps = None if len(vals) < 4 or vals[3] is None else vals[3].flat()
            if len(node.inputs) > 4 and node.inputs[4] is not None and steps is None:
                return None
        else:
            axes, steps = node.attrs.get("axes"), None
        n = len(old)
        if steps is None:
            return old
        axes = list(range(len(steps))) if axes is None else [a % n for a in axes]
        out = list(old)
        for a, sp in zip(axes, steps):
            if not isinstance(sp, int) or sp <= 0:
                return None  # a negative step flips: the kernel copies
            out[a] = out[a] * sp
        return tuple(out)

