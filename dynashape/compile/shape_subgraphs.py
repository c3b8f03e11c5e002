"""Pass: mark shape_of subgraphs, the nodes that compute only from shapes and constants.

They run on the host (no device sync to read a shape) and are skipped at run time unless a
shape they depend on changed, as in the design notes' update_shape.
"""

from __future__ import annotations

import onnx

from ..ir import Graph

_SMALL_INT = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}


def mark_shape_subgraphs(graph: Graph) -> Graph:
    shape_valued: set[int] = set()
    for node in graph.nodes:
        node.shape_of = False
        if node.op_type in ("Shape", "Size"):
            node.shape_of = True
        elif node.opdef.shape_op and not node.subgraphs and all(
            v is None or v.is_const or id(v) in shape_valued for v in node.inputs
        ) and any(v is not None and id(v) in shape_valued for v in node.inputs):
            node.shape_of = all(v is None or v.elem_type in _SMALL_INT for v in node.outputs)
        if node.shape_of:
            shape_valued.update(id(v) for v in node.outputs if v is not None)
    return graph
