"""Pass: onnxruntime.quantization.quantize_dynamic's product chains become fused products.

quantize_dynamic writes each MatMul by a constant weight as

    DynamicQuantizeLinear(x) -> (xq, xs, xz)            (one per activation, shared by its products)
    MatMulInteger(xq, Wq, xz, Wz) -> Cast(to=FLOAT) -> Mul(., Mul(xs, Ws)) [-> Add(., bias)]

that is 4-5 nodes and three intermediates per product, each a full pass over the activation or
the result. When every user of a DynamicQuantizeLinear is such a chain (its outputs read by
nothing else, no graph outputs among them), the nodes become:

* one ``DynQuantMatMul(x, Wq, Ws, Wz, bias)`` for a quantization that feeds one product;
* ``DynQuantize(x) -> (xc, xs, xz)`` plus one ``QMatMulCentered(xc, xs, xz, Wq, Ws, Wz, bias)``
  per product for one that feeds several (query, key, value).

The fused kernels (ops/fused_quant.py) compute what the nodes compute, bit for bit. Their shape
functions never refuse a signature, so no unfusion is needed (``unfused`` stays empty).
"""

from __future__ import annotations

import itertools

import torch

from ..ir import Graph, Node, Value
from ..ops.registry import lookup
from .patterns import FUSED_DOMAIN

_ONNX = ("", "ai.onnx")
_ids = itertools.count()


def _is(n: Node | None, op_type: str) -> bool:
    return n is not None and n.op_type == op_type and n.domain in _ONNX


def _only_users(v: Value, nodes: list[Node], graph: Graph) -> bool:
    if any(v is o for o in graph.outputs):
        return False
    ids = {id(n) for n in nodes}
    return bool(v.users) and all(id(u) in ids for u in v.users)


def _const(v: Value | None, floating: bool) -> torch.Tensor | None:
    if v is None or not isinstance(v.const, torch.Tensor):
        return None
    return v.const if v.const.is_floating_point() == floating else None


def _chain(mmi: Node, dql: Node, graph: Graph) -> tuple[list[Node], list[Value | None], Node] | None:
    """The nodes of one product chain from ``mmi``, the fused node's weight inputs
    [Wq, Ws, Wz, bias], and the chain's scale Mul (which reads the DynamicQuantizeLinear's scale)."""
    xq, xs, xz = dql.outputs
    ins = list(mmi.inputs) + [None] * (4 - len(mmi.inputs))
    if ins[0] is not xq or ins[2] is not xz:
        return None
    w, wz = ins[1], ins[3]
    wt = _const(w, False)
    if wt is None or wt.dim() != 2 or wt.dtype not in (torch.uint8, torch.int8):
        return None
    if wz is not None and (_const(wz, False) is None or wz.const.numel() not in (1, wt.shape[1])):
        return None
    out = mmi.outputs[0]
    if len(out.users) != 1 or not _is(out.users[0], "Cast") or out.users[0].attrs.get("to") != 1:
        return None
    cast = out.users[0]
    cf = cast.outputs[0]
    if len(cf.users) != 1 or not _is(cf.users[0], "Mul"):
        return None
    mul = cf.users[0]
    s = mul.inputs[1] if mul.inputs[0] is cf else mul.inputs[0]
    smul = s.producer if s is not None else None
    if not _is(smul, "Mul") or len(s.users) != 1:
        return None
    ws = smul.inputs[1] if smul.inputs[0] is xs else smul.inputs[0] if smul.inputs[1] is xs else None
    wst = _const(ws, True)
    if wst is None or wst.dtype != torch.float32 or wst.numel() not in (1, wt.shape[1]) or (
            wst.numel() != 1 and wst.dim() != 1):
        return None
    nodes = [mmi, cast, smul, mul]
    if not (_only_users(out, [cast], graph) and _only_users(cf, [mul], graph) and _only_users(s, [mul], graph)):
        return None
    bias = None
    y = mul.outputs[0]
    if len(y.users) == 1 and _is(y.users[0], "Add") and not any(y is o for o in graph.outputs):
        add = y.users[0]
        b = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
        bt = _const(b, True)
        if bt is not None and bt.dtype == torch.float32 and bt.dim() == 1 and bt.numel() == wt.shape[1]:
            bias = b
            nodes.append(add)
    return nodes, [w, ws, wz, bias], smul


def _node(graph: Graph, op_type: str, name: str, inputs: list, outputs: list) -> Node:
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    n = Node(op_type, FUSED_DOMAIN, f"{op_type}_{next(_ids)}_{name}", list(inputs), list(outputs), {}, 1)
    n.opdef = lookup(op_type, FUSED_DOMAIN, 1)
    n.unfused = []
    n.shape_of = False
    return n


def _replace(graph: Graph, nodes: list[Node], new: Node) -> None:
    """``new`` takes the place of the last of ``nodes`` (in graph order); the others go."""
    gone = {id(n) for n in nodes}
    at = max(i for i, n in enumerate(graph.nodes) if id(n) in gone)
    graph.nodes = [new if i == at else n for i, n in enumerate(graph.nodes) if id(n) not in gone or i == at]


def fuse_dynamic_quant(graph: Graph) -> Graph:
    changed = False
    for dql in [n for n in graph.nodes if _is(n, "DynamicQuantizeLinear")]:
        if len(dql.outputs) != 3 or any(v is None for v in dql.outputs) or dql.inputs[0] is None:
            continue
        x = dql.inputs[0]
        if x.elem_type not in (0, 1):  # float32 input only
            continue
        xq, xs, xz = dql.outputs
        chains = []
        for u in xq.users:
            c = _chain(u, dql, graph) if _is(u, "MatMulInteger") else None
            if c is None:
                chains = None
                break
            chains.append(c)
        if not chains:
            continue
        if not (_only_users(xq, [c[0][0] for c in chains], graph) and _only_users(xz, [c[0][0] for c in chains], graph)
                and _only_users(xs, [c[2] for c in chains], graph)):
            continue
        if len(chains) == 1:
            nodes, (w, ws, wz, bias), _ = chains[0]
            _replace(graph, [dql, *nodes], _node(graph, "DynQuantMatMul", nodes[-1].name, [x, w, ws, wz, bias],
                                                 nodes[-1].outputs))
        else:
            xc = Value(f"{xq.name}_centered", 1, xq.shape, "tensor")
            graph.values[xc.name] = xc
            _replace(graph, [dql], _node(graph, "DynQuantize", dql.name, [x], [xc, xs, xz]))
            for nodes, (w, ws, wz, bias), _ in chains:
                _replace(graph, nodes, _node(graph, "QMatMulCentered", nodes[-1].name,
                                             [xc, xs, xz, w, ws, wz, bias], nodes[-1].outputs))
        changed = True
    if changed:
        graph.rebuild_users()
    return graph
