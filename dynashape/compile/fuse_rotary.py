"""Pass: the "rotate-half" rotary position embedding written out by exporters becomes one fused op.

``q * cos + rotate_half(q) * sin`` with ``rotate_half(x) = cat([-x[..., h:], x[..., :h]], -1)``
(Llama, Mistral, Qwen... as torch.onnx writes them), h half the last dim d:

    a = Mul(x, cos)
    c = Concat([Neg(Slice(x, h, >= d)), Slice(x, 0, h)], last axis)
    y = Add(a, Mul(c, sin))

Multiplications and the Add in either operand order. It sits twice in every decoder layer
(queries and keys) and is five kernels each time on a GPU (mul, neg, cat, mul, add): the fused
``RotaryHalf`` (``ops/rotary.py``) is one. d must be a known even int: the slice bounds are
checked against it.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from .fuse_attention import _ordered
from .patterns import const_ints, fuse, only_feeds, producer, rank

INT64_MAX = 2**63 - 1


def _last_dim(x: Value) -> int | None:
    """x's last dim when it is a known int."""
    if x.shape is None or len(x.shape) == 0 or not x.shape[-1].is_static:
        return None
    return x.shape[-1].min


def _last_axis_slice(v: Value) -> tuple[Node, Value, int, int] | None:
    """``v = Slice(x, [start], [end], [last axis], [1])``: (the Slice, x, start, end)."""
    n = producer(v, "Slice")
    if n is None or len(n.inputs) < 3:
        return None
    x, r = n.inputs[0], rank(n.inputs[0])
    ins = n.inputs + [None] * (5 - len(n.inputs))
    starts, ends = const_ints(ins[1]), const_ints(ins[2])
    axes = const_ints(ins[3]) if ins[3] is not None else [0]  # absent: the first len(starts) axes
    steps = const_ints(ins[4]) if ins[4] is not None else [1]
    if r is None or starts is None or ends is None or axes is None or steps is None:
        return None
    if len(starts) != 1 or len(ends) != 1 or axes not in ([-1], [r - 1]) or steps != [1]:
        return None
    return n, x, starts[0], ends[0]


def _times(v: Value, x: Value | None = None) -> tuple[Node, Value, Value] | None:
    """``v = Mul(p, q)``, either order: (the Mul, the factor that is x, the other); any factor
    order when x is None."""
    n = producer(v, "Mul")
    if n is None:
        return None
    a, b = n.inputs
    if x is None or a is x:
        return n, a, b
    if b is x:
        return n, b, a
    return None


def fuse_rotary(graph: Graph) -> Graph:
    # each Neg is in one pattern at most: fusing one pattern never removes another's Neg
    for neg in [n for n in graph.nodes if n.op_type == "Neg" and n.domain in ("", "ai.onnx")]:
        found = _match(graph, neg)
        if found is not None:
            nodes, ins = found
            fuse(graph, nodes, "RotaryHalf", ins, {})
    return graph


def _rotated(neg: Node) -> tuple[Value, list[Node]] | None:
    """Neg at the head of ``rotate_half(x)``: (x, [the Slices, Neg, Concat]) when the slices are
    x's two halves, second half first."""
    high = _last_axis_slice(neg.inputs[0])
    if high is None or len(neg.outputs[0].users) != 1:
        return None
    cat = neg.outputs[0].users[0]
    if cat.op_type != "Concat" or cat.domain not in ("", "ai.onnx") or len(cat.inputs) != 2 \
            or cat.inputs[0] is not neg.outputs[0]:
        return None
    low = _last_axis_slice(cat.inputs[1])
    s_high, x, h, end = high
    if low is None or low[1] is not x:
        return None
    d = _last_dim(x)
    if d is None or d % 2 or h != d // 2 or end < d or low[2:] != (0, h):
        return None
    if cat.attrs.get("axis") not in (-1, rank(x) - 1):
        return None
    return x, [s_high, neg, low[0], cat]


def _match(graph: Graph, neg: Node):
    rot = _rotated(neg)
    if rot is None:
        return None
    x, rot_nodes = rot
    c = rot_nodes[-1].outputs[0]
    if len(c.users) != 1 or (b := _times(c.users[0].outputs[0], c)) is None:
        return None
    mul_sin, _, sin = b
    bv = mul_sin.outputs[0]
    if len(bv.users) != 1 or producer(bv.users[0].outputs[0], "Add") is None:
        return None
    add = bv.users[0]
    av = add.inputs[1] if add.inputs[0] is bv else add.inputs[0]
    a = _times(av, x)
    if a is None or a[0] is mul_sin:
        return None
    mul_cos, _, cos = a
    nodes = _ordered(graph, [*rot_nodes, mul_cos, mul_sin, add])
    inner = [o for n in nodes if n is not add for o in n.outputs]
    # cos or sin being a value the fusion removes (x * c + c * c, say) is not the pattern
    if any(v is o for v in (cos, sin) for o in inner):
        return None
    if not all(only_feeds(o, nodes, graph) for o in inner):
        return None
    return nodes, [x, cos, sin]
