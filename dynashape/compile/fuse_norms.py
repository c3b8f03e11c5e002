"""Pass: RMSNorm and LayerNorm written out as reductions and arithmetic become one fused op.

RMSNorm as exporters write it (HF Llama, Mistral, Qwen, T5; the torch.onnx dynamo export):
``x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2), -1) + eps)) * weight`` (or ``x / Sqrt(...)``, the
reciprocal as ``Div(1, ...)``, ``Mul(x, x)`` for the square, operands in either order).
LayerNorm written out (older exports): ``d = x - ReduceMean(x); d / Sqrt(ReduceMean(d^2) + eps)
* weight + bias``; or as Keras' LayerNormalization reaches ONNX through tf2onnx (its batch-norm
form): ``s = Reciprocal(Sqrt(ReduceMean(d^2) + eps)) * gamma; x * s + (beta - mean * s)``, twelve
nodes. Both over the last axis, with the mean kept as a dim of 1.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from .patterns import const_ints, fuse, only_feeds, producer, rank, scalar


def _other(node: Node, v: Value) -> Value | None:
    """The input of a two-input node that is not ``v``."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is v else a if b is v else None


_MEANS = ("ReduceMean", "GlobalAveragePool")


def _mean_last_axis(n: Node | None) -> Value | None:
    """The input of a ReduceMean over the last axis that keeps it as 1 (or a GlobalAveragePool of a
    3-D input, which tf2onnx writes for it), else None."""
    if n is not None and n.op_type == "GlobalAveragePool" and n.domain in ("", "ai.onnx"):
        return n.inputs[0] if rank(n.inputs[0]) == 3 else None
    if n is None or n.op_type != "ReduceMean" or not n.attrs.get("keepdims", 1):
        return None
    axes = n.attrs.get("axes")
    if axes is None and len(n.inputs) > 1:
        axes = const_ints(n.inputs[1])
    r = rank(n.inputs[0])
    if not axes or r is None or len(axes) != 1 or axes[0] not in (-1, r - 1):
        return None
    return n.inputs[0]


def _square_of(v: Value | None) -> tuple[Value, Node] | None:
    n = producer(v, ("Pow", "Mul"))
    if n is None:
        return None
    if n.op_type == "Pow" and scalar(n.inputs[1]) == 2.0:
        return n.inputs[0], n
    if n.op_type == "Mul" and n.inputs[0] is n.inputs[1]:
        return n.inputs[0], n
    return None


def _users(v: Value, op: str) -> list[Node]:
    return [u for u in v.users if u.op_type == op and u.domain in ("", "ai.onnx")]


def _rsqrt_chain(mean: Node, graph: Graph):
    """From ``ReduceMean(...)``: ``+ eps``, ``Sqrt``; returns (eps, sqrt node, nodes) or None."""
    out = mean.outputs[0]
    adds = _users(out, "Add")
    if len(adds) != 1 or len(out.users) != 1:
        return None
    add = adds[0]
    eps = scalar(_other(add, out))
    sqrts = _users(add.outputs[0], "Sqrt")
    if eps is None or len(sqrts) != 1 or len(add.outputs[0].users) != 1:
        return None
    return eps, sqrts[0], [mean, add, sqrts[0]]


def _normalised(x: Value, sqrt: Node) -> tuple[Node, list[Node]] | None:
    """``x / sqrt`` as Div(x, s), Mul(x, Reciprocal(s)) or Mul(x, Div(1, s)); the last node and
    the nodes between."""
    s = sqrt.outputs[0]
    for u in s.users:
        if u.op_type == "Div" and u.inputs[0] is x and u.inputs[1] is s:
            return u, [u]
        if u.op_type == "Reciprocal" or (u.op_type == "Div" and u.inputs[1] is s and scalar(u.inputs[0]) == 1.0):
            r = u.outputs[0]
            for m in r.users:
                if m.op_type == "Mul" and _other(m, r) is x:
                    return m, [u, m]
    return None


def _scaled(n: Node, graph: Graph, x_last: int) -> tuple[Node, Value | None, list[Node]]:
    """An optional ``* weight`` (a constant of the normalised length) after ``n``."""
    out = n.outputs[0]
    if len(out.users) == 1 and out.users[0].op_type == "Mul":
        m = out.users[0]
        w = _other(m, out)
        rank = len(out.shape) if out.shape is not None else 0
        if w is not None and w.is_const and w.const.numel() == x_last and w.const.dim() <= rank and (
                w.const.dim() == 1 or all(d == 1 for d in w.const.shape[:-1])):
            return m, w, [m]  # (a weight of more dims than x would add axes to the result)
    return n, None, []


def _flat_const(graph: Graph, v: Value, name: str) -> Value:
    """``v`` as a 1-D constant (F.rms_norm / F.layer_norm want the normalised shape exactly)."""
    if v.const.dim() == 1:
        return v
    flat = Value(f"{v.name}_{name}", v.elem_type, None, v.kind, v.const.reshape(-1).contiguous())
    graph.values[flat.name] = flat
    return flat


def fuse_rms_norm(graph: Graph) -> Graph:
    for mean in [n for n in graph.nodes if n.op_type == "ReduceMean" and n.domain in ("", "ai.onnx")]:
        if mean not in graph.nodes:
            continue
        sq = _square_of(_mean_last_axis(mean))
        if sq is None:
            continue
        x, sq_node = sq
        if x.shape is None or not x.shape[-1].is_static:
            continue
        tail = _tail(mean, x, graph, x.shape[-1].min)
        if tail is None:
            continue
        eps, last, w, tail_nodes = tail
        nodes = [sq_node, *tail_nodes]
        if not all(only_feeds(o, nodes, graph) for n in nodes[:-1] for o in n.outputs if o is not None):
            continue
        ins = [x] + ([_flat_const(graph, w, "flat")] if w is not None else [])
        fuse(graph, nodes, "RMSNorm", ins, {"epsilon": eps})
    return graph


def _tail(mean: Node, normed: Value, graph: Graph, h: int):
    """What both norms share after the mean of squares: + eps, sqrt, normed / sqrt (or times the
    reciprocal), then an optional weight: (eps, last node, weight, nodes) or None."""
    chain = _rsqrt_chain(mean, graph)
    if chain is None:
        return None
    eps, sqrt, nodes = chain
    found = _normalised(normed, sqrt)
    if found is None:
        return None
    last, between = found
    last, w, scale_nodes = _scaled(last, graph, h)
    return eps, last, w, [*nodes, *between, *scale_nodes]


def _const_of_len(v: Value | None, h: int, r: int) -> bool:
    return v is not None and v.is_const and v.const.numel() == h and v.const.dim() <= r


def _keras_tail(mean: Node, var_mean: Node, x: Value, graph: Graph, h: int):
    """tf2onnx's LayerNormalization after ``var_mean`` (the mean of squares): + eps, Sqrt,
    Reciprocal (or Div(1, .)), * gamma = s; then x * s + (beta - mean * s) in either order of
    operands: (eps, gamma, beta, nodes) or None."""
    chain = _rsqrt_chain(var_mean, graph)
    if chain is None:
        return None
    eps, sqrt, nodes = chain
    r = len(x.shape)
    recips = [u for u in sqrt.outputs[0].users if u.op_type == "Reciprocal"
              or (u.op_type == "Div" and u.inputs[1] is sqrt.outputs[0] and scalar(u.inputs[0]) == 1.0)]
    if len(recips) != 1 or len(sqrt.outputs[0].users) != 1 or len(recips[0].outputs[0].users) != 1:
        return None
    inv = recips[0].outputs[0]
    scale = inv.users[0]
    gamma = _other(scale, inv) if scale.op_type == "Mul" else None
    if not _const_of_len(gamma, h, r):
        return None
    sv = scale.outputs[0]
    m_mean = [u for u in sv.users if u.op_type == "Mul" and _other(u, sv) is mean.outputs[0]]
    m_x = [u for u in sv.users if u.op_type == "Mul" and _other(u, sv) is x]
    if len(sv.users) != 2 or len(m_mean) != 1 or len(m_x) != 1:
        return None
    ms, xs = m_mean[0].outputs[0], m_x[0].outputs[0]
    if len(ms.users) != 1 or ms.users[0].op_type != "Sub" or ms.users[0].inputs[1] is not ms:
        return None
    sub_b = ms.users[0]
    beta = sub_b.inputs[0]
    if not _const_of_len(beta, h, r) or len(xs.users) != 1 or len(sub_b.outputs[0].users) != 1:
        return None
    add = xs.users[0]
    if add.op_type != "Add" or _other(add, xs) is not sub_b.outputs[0]:
        return None
    return eps, gamma, beta, [*nodes, recips[0], scale, m_mean[0], m_x[0], sub_b, add]


def fuse_layer_norm(graph: Graph) -> Graph:
    for sub in [n for n in graph.nodes if n.op_type == "Sub" and n.domain in ("", "ai.onnx")]:
        if sub not in graph.nodes:
            continue
        x, m = sub.inputs
        mean = producer(m, _MEANS)
        if mean is None or _mean_last_axis(mean) is not x or x.shape is None or not x.shape[-1].is_static:
            continue
        d = sub.outputs[0]
        squares = list({id(u): u for u in d.users  # (a Mul(d, d) lists d's users twice)
                        if (u.op_type == "Pow" and scalar(u.inputs[1]) == 2.0)
                        or (u.op_type == "Mul" and u.inputs[0] is d and u.inputs[1] is d)}.values())
        if len(squares) != 1:
            continue
        sq_node = squares[0]
        means = [u for op in _MEANS for u in _users(sq_node.outputs[0], op)]
        if len(means) != 1 or _mean_last_axis(means[0]) is not sq_node.outputs[0]:
            continue
        h = x.shape[-1].min
        tail = _tail(means[0], d, graph, h)
        if tail is None:
            keras = _keras_tail(mean, means[0], x, graph, h)
            if keras is None:
                continue
            eps, w, bias, tail_nodes = keras
            nodes = [mean, sub, sq_node, *tail_nodes]
            # the mean feeds the Sub and the mean * s: both inside
            if not all(only_feeds(o, nodes, graph) for n in nodes[:-1] for o in n.outputs if o is not None):
                continue
            fuse(graph, nodes, "LayerNorm", [x, _flat_const(graph, w, "flat"), _flat_const(graph, bias, "flat")],
                 {"epsilon": eps})
            continue
        eps, last, w, tail_nodes = tail
        bias, bias_nodes = None, []
        out = last.outputs[0]
        if w is not None and len(out.users) == 1 and out.users[0].op_type == "Add":
            a = out.users[0]
            b = _other(a, out)
            if b is not None and b.is_const and b.const.numel() == h and b.const.dim() <= len(x.shape):
                bias, bias_nodes = b, [a]
        nodes = [mean, sub, sq_node, *tail_nodes, *bias_nodes]
        if not all(only_feeds(o, nodes, graph) for n in nodes[:-1] for o in n.outputs if o is not None):
            continue
        ins = [x, None if w is None else _flat_const(graph, w, "flat"),
               None if bias is None else _flat_const(graph, bias, "flat")]
        while ins and ins[-1] is None:
            ins.pop()
        fuse(graph, nodes, "LayerNorm", ins, {"epsilon": eps})
    return graph
