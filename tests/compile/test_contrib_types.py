"""``contrib_types`` (compile/contrib_types.py): the outputs of onnxruntime's contrib ops that
ONNX's inference leaves untyped get their schema's types, so the memory plan gives them buffers
and the kernels write into them (no result allocated per call); the results stay onnxruntime's."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tests.compile.test_fusion import check_sequence, randn

MS = "com.microsoft"
H = 16


def _model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), n) for n in ("g", "b", "bias")]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b", "bias"], ["y", "", "", "sum"],
                              domain=MS, epsilon=1e-5),
             helper.make_node("FastGelu", ["y", "bias"], ["z"], domain=MS),
             helper.make_node("Add", ["z", "sum"], ["out"])]
    ins = [helper.make_tensor_value_info(n, TP.FLOAT, ["b", "t", H]) for n in ("x", "s")]
    g = helper.make_graph(nodes, "ct", ins, [helper.make_tensor_value_info("out", TP.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def test_contrib_outputs_typed_and_written_in_place():
    rng = np.random.default_rng(1)
    feeds = [{"x": randn(rng, b, t, H), "s": randn(rng, b, t, H)} for b, t in [(1, 3), (2, 5), (1, 1)]]
    sess = check_sequence(_model(), feeds)
    types = {v.name: v.elem_type for n in sess.program.fused.nodes for v in n.outputs if v is not None}
    assert types["y"] == types["sum"] == types["z"] == TP.FLOAT
    src = sess.compiled.specs[0].source
    assert "k_" in src and "out=(" in src  # the SkipLayerNormalization gets its buffers
