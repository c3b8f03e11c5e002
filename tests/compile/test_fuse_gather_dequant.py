"""``fuse_gather_dequant``: a Gather of rows of a constant 8-bit table read only by a
DequantizeLinear of one constant scale and zero point is one GatherDequant (bound to its table on
the CPU: one C pass). Bit for bit the interpreter's numbers and onnxruntime's over changing index
shapes, negative indices included; an index outside the table is the op's typed error, and the
session goes on."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.errors import DynashapeError
from tests.compile.test_fusion import fused_ops


def _model(dt, zp: bool, ids_type=TP.INT64):
    rng = np.random.default_rng(0)
    info = np.iinfo(dt)
    table = rng.integers(info.min, info.max + 1, (11, 6)).astype(dt)
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array(0.03, np.float32), "s")]
    ins = ["g", "s"]
    if zp:
        inits.append(numpy_helper.from_array(np.array(7, dt), "z"))
        ins.append("z")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g"], axis=0),
             helper.make_node("DequantizeLinear", ins, ["e"]), helper.make_node("Neg", ["e"], ["y"])]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("ids", ids_type, ["b", "s"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("dt,zp,ids", [(np.uint8, True, TP.INT64), (np.int8, True, TP.INT32),
                                       (np.uint8, False, TP.INT64)])
def test_embedding_lookup_is_one_op_with_the_same_numbers(dt, zp, ids):
    import onnxruntime as ort
    m = _model(dt, zp, ids)
    comp = dynashape.InferenceSession(m)
    interp = dynashape.InferenceSession(m, executor="interpreter")
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    assert fused_ops(comp)["com.dynashape.GatherDequant"] == 1
    rng = np.random.default_rng(1)
    np_ids = np.int64 if ids == TP.INT64 else np.int32
    for shape in [(1, 1), (2, 5), (1, 3), (2, 5)]:
        feeds = {"ids": rng.integers(-11, 11, shape).astype(np_ids)}
        got = comp.run(None, feeds)[0]
        np.testing.assert_array_equal(got, interp.run(None, feeds)[0])
        np.testing.assert_array_equal(got, ref.run(None, feeds)[0])
    assert comp.compiled.stats["bound_kernels"] >= 1
    with pytest.raises(DynashapeError, match="Gather"):
        comp.run(None, {"ids": np.array([[3, 11]], np_ids)})
    feeds = {"ids": np.array([[0, -1]], np_ids)}
    np.testing.assert_array_equal(comp.run(None, feeds)[0], ref.run(None, feeds)[0])  # goes on
