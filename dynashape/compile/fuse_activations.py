"""Pass: GELU, SiLU and the hard activations written out as arithmetic become one fused op.

SiLU: ``x * Sigmoid(x)``. GELU, erf form: ``0.5 * x * (1 + Erf(x / sqrt(2)))``; tanh form (GPT-2's
"new GELU"): ``0.5 * x * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))``. The product may be
associated and ordered any way: the factors of the Mul tree are compared as a multiset.

HardSwish (PaddleOCR's exports, MobileNetV3): ``x * Clip(x + 3, 0, 6) / 6``, the division last (or
a product by 1/6), which is torch's hardswish operation for operation; HardSigmoid:
``Clip(x + 3, 0, 6) / 6``. Four (three) passes over the activation become one.
"""

from __future__ import annotations

import math

from ..ir import Graph, Node, Value
from .patterns import fuse, only_feeds, producer, scalar

_TOL = 1e-4


def _near(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= _TOL * max(1.0, abs(b))


def fuse_silu(graph: Graph) -> Graph:
    for sig in [n for n in graph.nodes if n.op_type == "Sigmoid" and n.domain in ("", "ai.onnx")]:
        x, s = sig.inputs[0], sig.outputs[0]
        muls = [u for u in s.users if u.op_type == "Mul" and {id(u.inputs[0]), id(u.inputs[1])} == {id(x), id(s)}]
        if len(muls) != 1 or x is s or not only_feeds(s, muls, graph):
            continue
        fuse(graph, [sig, muls[0]], "Silu", [x], {})
    return graph


def _mul_factors(v: Value, nodes: list[Node], graph: Graph, top: bool = True) -> list[Value]:
    """The leaves of the Mul tree producing ``v`` (inner Muls read only inside the tree)."""
    n = producer(v, "Mul")
    if n is None or (not top and len(v.users) != 1):
        return [v]
    nodes.append(n)
    return _mul_factors(n.inputs[0], nodes, graph, False) + _mul_factors(n.inputs[1], nodes, graph, False)


def _one_plus(v: Value, op: str) -> tuple[Node, Node] | None:
    """``1 + op(...)``: the Add and the op node."""
    add = producer(v, "Add")
    if add is None:
        return None
    for a, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        inner = producer(b, op)
        if _near(scalar(a), 1.0) and inner is not None:
            return add, inner
    return None


def _erf_argument_is(x: Value, erf: Node) -> Node | None:
    """``Erf(x / sqrt 2)`` or ``Erf(x * (1 / sqrt 2))``: the Div / Mul node."""
    n = producer(erf.inputs[0], ("Div", "Mul"))
    if n is None:
        return None
    a, b = n.inputs
    if n.op_type == "Div" and a is x and _near(scalar(b), math.sqrt(2)):
        return n
    if n.op_type == "Mul" and ((a is x and _near(scalar(b), 1 / math.sqrt(2)))
                               or (b is x and _near(scalar(a), 1 / math.sqrt(2)))):
        return n
    return None


def _tanh_argument_is(x: Value, tanh: Node) -> list[Node] | None:
    """``Tanh(c * (x + 0.044715 * x^3))``, c = sqrt(2 / pi): the nodes between x and Tanh."""
    nodes: list[Node] = []
    leaves = _mul_factors(tanh.inputs[0], nodes, None)
    consts = [scalar(v) for v in leaves if v.is_const]
    rest = [v for v in leaves if not v.is_const]
    if len(rest) != 1 or len(consts) != 1 or not _near(consts[0], math.sqrt(2 / math.pi)):
        return None
    add = producer(rest[0], "Add")
    if add is None:
        return None
    for a, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if a is not x:
            continue
        cube_nodes: list[Node] = []
        leaves = _mul_factors(b, cube_nodes, None)
        consts = [scalar(v) for v in leaves if v.is_const]
        rest = [v for v in leaves if not v.is_const]
        if len(consts) != 1 or not _near(consts[0], 0.044715):
            continue
        if len(rest) == 1 and (p := producer(rest[0], "Pow")) is not None and p.inputs[0] is x \
                and _near(scalar(p.inputs[1]), 3.0):
            return [p, *cube_nodes, add, *nodes]
        if len(rest) == 3 and all(r is x for r in rest):
            return [*cube_nodes, add, *nodes]
    return None


def fuse_gelu(graph: Graph) -> Graph:
    for op, approximate in (("Erf", "none"), ("Tanh", "tanh")):
        for inner in [n for n in graph.nodes if n.op_type == op and n.domain in ("", "ai.onnx")]:
            if inner not in graph.nodes:
                continue
            found = _gelu_at(graph, inner, op)
            if found is not None:
                x, nodes = found
                fuse(graph, nodes, "Gelu", [x], {"approximate": approximate})
    return graph


def _gelu_at(graph: Graph, inner: Node, op: str):
    out = inner.outputs[0]
    if len(out.users) != 1:
        return None
    add = out.users[0]
    if add.op_type != "Add" or _one_plus(add.outputs[0], op) is None or len(add.outputs[0].users) != 1:
        return None
    # climb the Mul tree from (1 + ...) only until it holds x, 0.5 and (1 + ...): a Mul above that
    # (GeGLU's gelu(x) * up) is not the GELU's
    final = add.outputs[0].users[0]
    while True:
        if final.op_type != "Mul":
            return None
        tree: list[Node] = []
        leaves = _mul_factors(final.outputs[0], tree, graph)
        consts = [scalar(v) for v in leaves if v.is_const]
        rest = [v for v in leaves if not v.is_const and v is not add.outputs[0]]
        if len(consts) == 1 and _near(consts[0], 0.5) and len(rest) == 1 and \
                sum(v is add.outputs[0] for v in leaves) == 1:
            break
        if len(consts) > 1 or len(rest) > 1 or len(final.outputs[0].users) != 1:
            return None
        final = final.outputs[0].users[0]
    x = rest[0]
    head = _erf_argument_is(x, inner) if op == "Erf" else None
    head_nodes = ([head] if head is not None else None) if op == "Erf" else _tanh_argument_is(x, inner)
    if head_nodes is None:
        return None
    nodes = [*head_nodes, inner, add, *reversed(tree)]
    nodes = list({id(n): n for n in nodes}.values())
    if nodes[-1] is not final:
        nodes = [n for n in nodes if n is not final] + [final]
    if not all(only_feeds(o, nodes, graph) for n in nodes[:-1] for o in n.outputs if o is not None):
        return None
    return x, nodes


def _clip_bounds(clip: Node) -> tuple[float | None, float | None]:
    if len(clip.inputs) > 1 or "min" not in clip.attrs:  # opset 11+: bounds as inputs
        lo = scalar(clip.inputs[1]) if len(clip.inputs) > 1 and clip.inputs[1] is not None else None
        hi = scalar(clip.inputs[2]) if len(clip.inputs) > 2 and clip.inputs[2] is not None else None
        return lo, hi
    return clip.attrs.get("min"), clip.attrs.get("max")


def _x_plus_3(v: Value) -> tuple[Node, Value] | None:
    add = producer(v, "Add")
    if add is None:
        return None
    for a, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        if _near(scalar(b), 3.0) and not a.is_const:
            return add, a
    return None


def _by_six(v: Value) -> Node | None:
    """The only user of ``v`` when it is ``v / 6`` or ``v * (1/6)``."""
    if len(v.users) != 1:
        return None
    n = v.users[0]
    if n.domain not in ("", "ai.onnx"):
        return None
    if n.op_type == "Div" and n.inputs[0] is v and _near(scalar(n.inputs[1]), 6.0):
        return n
    if n.op_type == "Mul" and any(o is not v and _near(scalar(o), 1 / 6) for o in n.inputs):
        return n
    return None


def fuse_hard_activations(graph: Graph) -> Graph:
    for clip in [n for n in graph.nodes if n.op_type == "Clip" and n.domain in ("", "ai.onnx")]:
        lo, hi = _clip_bounds(clip)
        found = _x_plus_3(clip.inputs[0])
        if found is None or not (_near(lo, 0.0) and _near(hi, 6.0)):
            continue
        add, x = found
        c = clip.outputs[0]
        if not only_feeds(add.outputs[0], [clip], graph) or len(c.users) != 1 or not only_feeds(c, c.users, graph):
            continue
        user = c.users[0]
        div = _by_six(c)
        if div is not None:  # HardSigmoid
            fuse(graph, [add, clip, div], "HardSigmoid", [x], {})
            continue
        if user.op_type != "Mul" or user.domain not in ("", "ai.onnx") or \
                {id(user.inputs[0]), id(user.inputs[1])} != {id(x), id(c)}:
            continue
        div = _by_six(user.outputs[0])
        if div is not None and only_feeds(user.outputs[0], [div], graph):
            fuse(graph, [add, clip, user, div], "HardSwish", [x], {})
    return graph
