"""Pass: the element types of contrib ops' outputs that ONNX's own inference leaves unknown.

ONNX's shape inference knows no com.microsoft schema, so a model written by onnxruntime's
transformers optimizer carries no type for a SkipLayerNormalization's or a FastGelu's output
unless the optimizer wrote value_info. Without a type the memory plan gives the value no buffer:
the kernel allocates its result every call (and a SkipLayerNormalization's sum a second one),
~3 us each in a decode step. The types these ops give are fixed by their schemas: the input's
type, or float for the statistics.
"""

from __future__ import annotations

import onnx

from ..ir import Graph

_MS = "com.microsoft"
_FLOAT = onnx.TensorProto.FLOAT
# op -> per output: "x" (input 0's type) or an element type
_RULES: dict[str, tuple] = {
    "SkipLayerNormalization": ("x", _FLOAT, _FLOAT, "x"),
    "SkipSimplifiedLayerNormalization": ("x", _FLOAT, _FLOAT, "x"),
    "FastGelu": ("x",),
    "BiasGelu": ("x",),
    "Gelu": ("x",),
    "QuickGelu": ("x",),
    "BiasAdd": ("x",),
}


def contrib_types(graph: Graph) -> Graph:
    for node in graph.nodes:
        rule = _RULES.get(node.op_type) if node.domain == _MS else None
        if rule is not None and node.inputs and node.inputs[0] is not None and node.inputs[0].elem_type:
            for v, r in zip(node.outputs, rule):
                if v is not None and not v.elem_type and v.kind == "tensor":
                    v.elem_type = node.inputs[0].elem_type if r == "x" else r
        for sub in node.subgraphs.values():
            contrib_types(sub)
    return graph
