"""Pass: the nodes of a Loop body that compute the same value every iteration run once, before it.

A body node whose inputs are all constants, values of the enclosing graph, or outputs of nodes
already hoisted (none of the iteration number, the condition, the carried values, or anything
computed from them) gives the same result on every iteration. Exporters leave such nodes in the
body: SLANet's attention decoder (paddle2onnx) projects the encoder's features by a weight inside
its 501-step Loop, a (64 x 96) @ (96 x 256) product per step, and rebuilds shapes and ranges of
values that never change. Moved to the enclosing graph just before the Loop, they become outer
values the body reads (``Graph.outer``), as the exporter's own outer values are.

Taken: deterministic ops of the standard domain without subgraphs (``PURE``), whose outputs are
not body outputs (an ONNX graph's outputs are its own values), and with at least one input that is
not a constant (constant folding has taken those). A carried value that the body hands back
unchanged (itself, or through reshapes that end in its shape and additions of zero: ``_unchanged``)
counts as the Loop's initial value (paddle2onnx carries a Loop's weights and features so). Bodies
are processed innermost first, so a value invariant over two nested Loops moves out of both. A Loop
that runs no iteration still runs the hoisted nodes once: they compute values of the enclosing
graph, which are there whatever the trip count, so they fail only where the body would have failed
on its first iteration.
"""

from __future__ import annotations

from ..ir import Graph, Node
from .patterns import same_shape, scalar

_STD = ("", "ai.onnx")
# deterministic, no subgraphs, outputs a function of the inputs' values alone
PURE = frozenset({
    "Abs", "Add", "And", "ArgMax", "ArgMin", "BatchNormalization", "Cast", "Ceil", "Clip", "Concat", "ConstantOfShape",
    "Conv", "Cos", "CumSum", "Div", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "Flatten", "Floor", "Gather",
    "GatherElements", "GatherND", "Gemm", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity",
    "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "MatMul",
    "Max", "Mean", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pad", "Pow", "Range", "Reciprocal", "ReduceL2",
    "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "Relu", "Reshape", "Resize", "Round", "Shape",
    "Sigmoid", "Sign", "Sin", "Size", "Slice", "Softmax", "Softplus", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh",
    "Tile", "Transpose", "Trilu", "Unsqueeze", "Where", "Xor",
})


def hoist_loop_invariants(graph: Graph) -> Graph:
    for node in list(graph.nodes):
        for sub in node.subgraphs.values():
            hoist_loop_invariants(sub)  # innermost first: what they hoist may move on out of this body
    for node in list(graph.nodes):
        body = node.subgraphs.get("body")
        if node.op_type == "Loop" and node.domain in _STD and body is not None:
            _hoist(graph, node, body)
    return graph


def _hoist(graph: Graph, loop: Node, body: Graph) -> None:
    # a carried value the body hands back unchanged (its output k is its input k + 1: paddle2onnx carries
    # a Loop's weights and inputs so) is the Loop's initial value on every iteration: read as that
    same = {id(body.inputs[k + 1]): loop.inputs[k + 1] for k in range(1, min(len(body.outputs), len(body.inputs) - 1,
                                                                           len(loop.inputs) - 1))
            if _unchanged(body.outputs[k], body.inputs[k + 1]) and loop.inputs[k + 1] is not None}
    # the iteration number, the condition, the carried values that change
    varying = {id(v) for v in body.inputs if id(v) not in same}
    outputs = {id(v) for v in body.outputs}
    moved: list[Node] = []
    for n in body.nodes:
        ins = [v for v in n.inputs if v is not None]
        outs = [v for v in n.outputs if v is not None]
        if (n.op_type not in PURE or n.domain not in _STD or n.subgraphs or not outs
                or any(id(v) in outputs or v.name in graph.values for v in outs)
                or any(id(v) in varying for v in ins) or all(v.is_const for v in ins)):
            varying.update(id(v) for v in outs)
            continue
        moved.append(n)
        n.inputs = [same.get(id(v), v) if v is not None else None for v in n.inputs]
    if not moved:
        return
    gone = {id(n) for n in moved}
    body.nodes = [n for n in body.nodes if id(n) not in gone]
    at = graph.nodes.index(loop)
    graph.nodes[at:at] = moved
    read = _read_by(body)
    for n in moved:
        for v in n.outputs:
            if v is None:
                continue
            body.values.pop(v.name, None)
            graph.values[v.name] = v
            if id(v) in read and v not in body.outer:
                body.outer.append(v)
    # what only the moved nodes read from outside the body is no longer the body's outer value
    body.outer = [v for v in body.outer if id(v) in read]
    graph.rebuild_users()
    body.rebuild_users()


# ops that hand on their first input's values: in a chain of them a value is unchanged where the
# shape it ends with is the one it began with (paddle2onnx hands a carried value back as
# Squeeze(Add(Unsqueeze(x, 0), 0.0), 0))
_RESHAPING = frozenset({"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})
_NEUTRAL = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}


def _unchanged(out, inp) -> bool:
    """Whether body output ``out`` holds the values of body input ``inp`` (the same value, or it through
    reshapes and additions of zero or products by one; -0.0 may come back as 0.0, which equals it)."""
    v = out
    for _ in range(16):
        if v is inp:
            return v is out or same_shape(out, inp)
        n = v.producer
        if n is None or n.domain not in _STD or not n.inputs or n.inputs[0] is None:
            return False
        if n.op_type in _NEUTRAL:
            if len(n.inputs) != 2 or scalar(n.inputs[1]) != _NEUTRAL[n.op_type]:
                return False
        elif n.op_type == "Cast":
            if n.inputs[0].elem_type != v.elem_type or not v.elem_type:
                return False
        elif n.op_type not in _RESHAPING:
            return False
        v = n.inputs[0]
    return False


def _read_by(g: Graph) -> set[int]:
    """Values that ``g``'s nodes (and the bodies inside them) read."""
    read = {id(v) for n in g.nodes for v in n.inputs if v is not None}
    read.update(id(v) for v in g.outputs)
    for n in g.nodes:
        for sub in n.subgraphs.values():
            read.update(id(v) for v in sub.outer)
    return read
