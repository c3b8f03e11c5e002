"""ConstantOfShape whose dims the shape program knows is emitted as ``torch.full`` where the node runs
(or its buffer filled): its kernel, given only a host shape, made the tensor on the CPU, and on CUDA
YOLOv8's anchor grid (``ConstantOfShape([H * W, 1]) + offset``) then met a device tensor. The same
values as onnxruntime and the interpreter over changing shapes, for float, int and default (zero)
fills; on a device the line names it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.codegen.emitters import Emit, _constant_of_shape
from dynashape.ir import Node
from tests.ops.harness import DEVICE


def _model(value, dtype=TP.FLOAT):
    """y = ConstantOfShape([h * w, 1]) + c, the dims read from x's shape (YOLOv8's anchor grid)."""
    np_t = helper.tensor_dtype_to_np_dtype(dtype)
    attrs = {} if value is None else {"value": numpy_helper.from_array(np.array([value], np_t))}
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], start=2, end=4),
        helper.make_node("ReduceProd", ["shp"], ["hw"], keepdims=1),
        helper.make_node("Concat", ["hw", "one"], ["dims"], axis=0),
        helper.make_node("ConstantOfShape", ["dims"], ["grid"], **attrs),
        helper.make_node("Add", ["grid", "c"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one"), numpy_helper.from_array(np.array(3, np_t), "c")]
    g = helper.make_graph(nodes, "cos", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 2, "h", "w"])],
                          [helper.make_tensor_value_info("y", dtype, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("value,dtype", [(0.5, TP.FLOAT), (7, TP.INT64), (None, TP.FLOAT)])
def test_filled_where_the_node_runs(value, dtype):
    import onnxruntime as ort
    m = _model(value, dtype)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    ref = dynashape.InferenceSession(m, device=DEVICE, executor="interpreter")
    o = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(1, 2, 4, 5), (2, 2, 3, 3), (1, 2, 8, 1), (1, 2, 4, 5)]:
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        got, want, inter = sess.run(None, feeds)[0], o.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(inter, want)
    src = "".join(sp.source for sp in sess.compiled.specs)
    assert "torch.full(" in src or ".fill_(" in src  # emitted, not the kernel


def test_a_device_line_names_the_device():
    n = Node("ConstantOfShape", "", "cos", [], [], {"value": torch.tensor([2.0])}, 17)
    e = Emit(node=n, ins=["d"], outs=["y"], bufs=[None], kernel="k", in_dims=[(2,)], out_dims=[(3, 4)],
             in_dtypes=[torch.int64], out_dtypes=[torch.float32], values=[None], src=str, on_cpu=False)
    assert _constant_of_shape(e) == ["y = torch.full((3, 4), 2.0, dtype=torch.float32, device=DEV)"]
    e.bufs = ["buf"]
    assert _constant_of_shape(e) == ["y = buf.fill_(2.0)"]
