"""ONNX ModelProto -> Graph. Parsing only: no shape reasoning beyond the declared inputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from ..errors import InvalidModelError, OptionsError
from ..ir import Graph, Node, Value
from ..ir.dtypes import to_torch
from ..shape import Dimension, PartialShape, is_placeholder
from .options import ModelDim, ParseOptions, resolve_input_shapes
from .validate import _subgraphs, validate_model

ModelSource = "str | os.PathLike | bytes | onnx.ModelProto"


def load_model_proto(model) -> onnx.ModelProto:
    """Read a model from a path, bytes or a ModelProto, with external data; typed errors."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as e:
            raise InvalidModelError(f"the model bytes ({len(model)} bytes) are not a valid ONNX model: {e}") from e
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise InvalidModelError(f"model file {str(path)!r} does not exist")
        try:
            proto = onnx.load(str(path), load_external_data=True)
        except (DecodeError, ValueError, RuntimeError) as e:
            raise InvalidModelError(f"model file {str(path)!r} ({path.stat().st_size} bytes) is truncated or "
                                    f"not an ONNX model: {e}") from e
        except (FileNotFoundError, OSError) as e:
            raise InvalidModelError(f"model file {str(path)!r}: external data could not be read: {e}") from e
    else:
        raise InvalidModelError(f"a model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise InvalidModelError("the model has no graph (empty, truncated or not an ONNX model)")
    return proto


def prepare_proto(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Inline model-local functions and annotate element types with ONNX's own inference."""
    if proto.functions:
        from onnx import inliner
        proto = inliner.inline_local_functions(proto)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=_names_unique(proto.graph))
    except Exception:  # noqa: BLE001  inference is a hint; our own passes decide
        pass
    return proto


def _names_unique(g: onnx.GraphProto, seen: set | None = None) -> bool:
    """No value name is defined in two graphs. ONNX's data propagation keeps the values it derives
    by name for the whole model, so where two If branches each define a name (optimum's merged
    decoders: both branches are the same decoder, one with past), one branch's Reshape gets the
    other's target shape and a wrong rank (measured: a rank-4 value typed rank 3). Then inference
    runs without data propagation."""
    seen = set() if seen is None else seen
    for n in g.node:
        for o in n.output:
            if o and o in seen:
                return False
            seen.add(o)
        if not all(_names_unique(sg, seen) for sg in _subgraphs(n)):
            return False
    return True


def parse_model(proto: onnx.ModelProto, options: ParseOptions) -> Graph:
    validate_model(proto)  # a bad model fails here, with InvalidModelError, not at the first run
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in proto.opset_import}
    opsets.setdefault("", 1)
    hints = _value_info(proto.graph)
    return _Parser(opsets, hints, options).graph(proto.graph, outer_scope=None, top=True)


def _value_info(g: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto]:
    info = {}
    for vi in list(g.value_info) + list(g.output) + list(g.input):
        info[vi.name] = vi
    return info


def declared_dims(vi: onnx.ValueInfoProto) -> list[ModelDim] | None:
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [ModelDim(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None,
                     _symbol(d.dim_param)) for d in t.tensor_type.shape.dim]


def _symbol(dim_param: str) -> str | None:
    return None if is_placeholder(dim_param) else dim_param.strip()


def hint_shape(vi: onnx.ValueInfoProto | None) -> PartialShape | None:
    """An ONNX ValueInfo's shape as a PartialShape (symbols kept, ranges unknown)."""
    dims = None if vi is None else declared_dims(vi)
    if dims is None:
        return None
    return PartialShape(Dimension(d.value, d.value) if d.value is not None else Dimension.dynamic(d.symbol)
                        for d in dims)


def _kind_and_type(vi: onnx.ValueInfoProto | None) -> tuple[str, int]:
    if vi is None:
        return "tensor", 0
    t = vi.type
    which = t.WhichOneof("value")
    if which == "tensor_type":
        return "tensor", t.tensor_type.elem_type
    if which == "sequence_type":
        inner = t.sequence_type.elem_type
        return "sequence", inner.tensor_type.elem_type if inner.HasField("tensor_type") else 0
    if which == "optional_type":
        inner = t.optional_type.elem_type
        return "optional", inner.tensor_type.elem_type if inner.HasField("tensor_type") else 0
    if which == "sparse_tensor_type":
        return "tensor", t.sparse_tensor_type.elem_type
    return "tensor", 0


class _Parser:
    def __init__(self, opsets: dict[str, int], hints: dict, options: ParseOptions) -> None:
        self.opsets, self.hints, self.options = opsets, hints, options
        self.counter = 0
        # options that widen the inputs make the model's own value_info and output shapes stale
        # (an output declared [1, 1000] of a model now run at batch 1..8): their types still hold,
        # their shapes are left to shape inference
        self.shapes_hold = not options.dynamic_dims

    def graph(self, g: onnx.GraphProto, outer_scope: dict[str, Value] | None, top: bool = False) -> Graph:
        values: dict[str, Value] = {}
        outer: list[Value] = []
        hints = dict(self.hints)
        hints.update(_value_info(g))

        def new_value(name: str) -> Value:
            kind, et = _kind_and_type(hints.get(name))
            v = Value(name, et, hint_shape(hints.get(name)) if self.shapes_hold else None, kind)
            values[name] = v
            return v

        def lookup(name: str, where: str) -> Value:
            if name in values:
                return values[name]
            if outer_scope is not None and name in outer_scope:
                v = outer_scope[name]
                if v not in outer:
                    outer.append(v)
                return v
            raise InvalidModelError(f"{where} reads {name!r}, which no node, initializer or graph input "
                                    f"produces (truncated or malformed model?)")

        for init in g.initializer:
            v = new_value(init.name)
            v.elem_type = init.data_type
            arr = numpy_helper.to_array(init)
            v.const = to_torch(arr, init.data_type)
            v.shape = PartialShape(arr.shape)
        for sp in g.sparse_initializer:
            v = new_value(sp.values.name)
            arr = _sparse_to_dense(sp)
            v.elem_type = sp.values.data_type
            v.const = to_torch(arr, sp.values.data_type)
            v.shape = PartialShape(arr.shape)

        inputs = [vi for vi in g.input if vi.name not in values]
        if top:
            declared = {vi.name: declared_dims(vi) for vi in inputs}
            shapes = resolve_input_shapes(declared, self.options)
        graph_inputs = []
        for vi in inputs:
            v = new_value(vi.name)
            if top:
                v.shape = shapes[vi.name]
            graph_inputs.append(v)

        nodes = []
        for n in g.node:
            name = n.name or f"{n.op_type}_{self.counter}"
            self.counter += 1
            domain = "" if n.domain == "ai.onnx" else n.domain
            if domain not in self.opsets:
                raise InvalidModelError(f"node {name!r} ({n.op_type}) uses domain {domain!r}, which the model "
                                        f"does not import (opset_import: {sorted(self.opsets)})")
            ins = [None if not i else lookup(i, f"node {name!r} ({n.op_type})") for i in n.input]
            scope = {**(outer_scope or {}), **values}
            attrs, subgraphs = {}, {}
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    subgraphs[a.name] = self.graph(a.g, scope)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for i, sg in enumerate(a.graphs):
                        subgraphs[f"{a.name}.{i}"] = self.graph(sg, scope)
                else:
                    attrs[a.name] = _attr_value(a, name)
            outs = []
            for o in n.output:
                if not o:
                    outs.append(None)
                    continue
                if o in values:
                    raise InvalidModelError(f"value {o!r} is produced twice (second time by node {name!r})")
                outs.append(new_value(o))
            node = Node(n.op_type, domain, name, ins, outs, attrs, self.opsets[domain], subgraphs)
            nodes.append(node)
            for sub in subgraphs.values():  # subgraphs see outer values by name: record them
                for v in sub.outer:
                    if v.name not in values and v not in outer and outer_scope and v.name in outer_scope:
                        outer.append(v)

        graph_outputs = [lookup(o.name, f"graph output {o.name!r}") for o in g.output]
        for o in g.output:  # the declared output types are hints for values that lack one
            v = values.get(o.name)
            if v is not None and not v.elem_type:
                v.kind, v.elem_type = _kind_and_type(o)
        graph = Graph(g.name or "main", graph_inputs, graph_outputs, nodes, values, dict(self.opsets), outer)
        graph.rebuild_users()
        return graph


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
    vals = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dense = np.zeros(tuple(sp.dims), dtype=vals.dtype)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = vals
    else:
        dense[tuple(idx.T)] = vals
    return dense


def _attr_value(a: onnx.AttributeProto, node_name: str) -> Any:
    T = onnx.AttributeProto
    if a.ref_attr_name:
        raise OptionsError(f"node {node_name!r}: attribute {a.name!r} refers to a function attribute outside a "
                           f"function")
    if a.type == T.FLOAT:
        return a.f
    if a.type == T.INT:
        return a.i
    if a.type == T.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == T.TENSOR:
        return to_torch(numpy_helper.to_array(a.t), a.t.data_type)
    if a.type == T.SPARSE_TENSOR:
        return to_torch(_sparse_to_dense(a.sparse_tensor), a.sparse_tensor.values.data_type)
    if a.type == T.FLOATS:
        return list(a.floats)
    if a.type == T.INTS:
        return list(a.ints)
    if a.type == T.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    if a.type == T.TENSORS:
        return [to_torch(numpy_helper.to_array(t), t.data_type) for t in a.tensors]
    if a.type == T.TYPE_PROTO:
        return a.tp
    if a.type == T.TYPE_PROTOS:
        return list(a.type_protos)
    raise InvalidModelError(f"node {node_name!r}: attribute {a.name!r} has unknown type {a.type}")
