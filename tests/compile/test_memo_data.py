"""On the CPU, data computed only from shapes and constants is memo (shape_program ``_memo_data``):
made in the group of the symbols it depends on, once per signature the group meets, and found
again when the signature comes back. A T5-style relative position bias: positions from the
length, their differences bucketed with a Log, a Gather of a learned table, a Transpose. The same
values as onnxruntime and the interpreter over lengths that change and come back."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from tests.compile.test_fusion import check_sequence, spec_of

HEADS, BUCKETS = 3, 8


def bias_model() -> onnx.ModelProto:
    """y = x + bias[len], bias (heads, len, len) from len = x.shape[1] alone."""
    table = np.random.default_rng(0).standard_normal((BUCKETS, HEADS)).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(BUCKETS - 1, np.int64), "top")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "one"], ["n"], axis=0),
        helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["col"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["row"]),
        helper.make_node("Sub", ["row", "col"], ["rel"]),
        helper.make_node("Abs", ["rel"], ["dist"]),
        helper.make_node("Cast", ["dist"], ["distf"], to=TP.FLOAT),
        helper.make_node("Add", ["distf", "two"], ["d2"]),
        helper.make_node("Log", ["d2"], ["logd"]),
        helper.make_node("Mul", ["logd", "two"], ["scaled"]),
        helper.make_node("Cast", ["scaled"], ["bucket"], to=TP.INT64),
        helper.make_node("Min", ["bucket", "top"], ["capped"]),
        helper.make_node("Gather", ["table", "capped"], ["emb"], axis=0),
        helper.make_node("Transpose", ["emb"], ["bias"], perm=[2, 0, 1]),
        helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    g = helper.make_graph(nodes, "bias", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", "n", "n"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_bias_made_from_the_length_is_made_once_per_length():
    rng = np.random.default_rng(1)
    lengths = [3, 5, 3, 9, 5, 1, 9]
    feeds = [{"x": rng.standard_normal((HEADS, n, n)).astype(np.float32)} for n in lengths]
    sess = check_sequence(bias_model(), feeds)
    src = spec_of(sess, feeds[-1]).source
    run = src[src.index("def run("):]
    for made_with_the_group in ("torch.log", "index_select", "Min", "permute"):
        assert made_with_the_group not in run, run
    assert "torch.log" in src[:src.index("def run(")]
    assert sess.stats()["group_hits"] >= 3  # 3, 5 and 9 came back


def test_without_memo_data_the_bias_is_data():
    """On a device such a bias would be made on the host and copied at each group build: the
    trace makes it memo only when asked (the compiled runtime asks on the CPU)."""
    from dynashape.compile.shape_program import trace
    g = dynashape.InferenceSession(bias_model()).program.fused
    kinds = {flag: {ni.node.op_type: ni.kind for ni in trace(g, [(HEADS, 4, 4)], memo_data=flag).nodes}
             for flag in (True, False)}
    assert kinds[True]["Log"] == "memo" and kinds[True]["Transpose"] == "memo"
    assert kinds[False]["Log"] == "data"
