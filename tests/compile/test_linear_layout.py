"""The pass that stores MatMul weights in torch's Linear layout where that was measured faster
(compile/linear_layout.py: every float dtype on CUDA, half precision on CPU): which products it takes, and
that the result is the same product."""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from dynashape.compile.pipeline import compile_graph
from dynashape.frontend.options import ParseOptions
from dynashape.frontend.parse import parse_model as _parse
from dynashape.ops.fused import _linear
from tests.models import llama


def _model(out_dim: int, dtype=np.float32) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, out_dim)).astype(dtype), "W")
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", et, ["b", 8])],
                          [helper.make_tensor_value_info("y", et, ["b", out_dim])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def parse_model(m):
    return _parse(m, ParseOptions())


def _ops(program) -> list[str]:
    return [n.op_type for n in program.fused.nodes]


def test_which_products_take_the_linear_layout():
    m = _model(16)
    assert _ops(compile_graph(parse_model(m), device="cuda")) == ["Linear"]
    assert _ops(compile_graph(parse_model(m), device="cpu")) == ["MatMul"]
    # half precision on CUDA too: its one-row kernels (ops/residual.py) read [out, in]
    assert _ops(compile_graph(parse_model(_model(16, np.float16)), device="cuda")) == ["Linear"]
    assert _ops(compile_graph(parse_model(_model(16, np.float16)), device="cpu")) == ["Linear"]
    assert _ops(compile_graph(parse_model(_model(9000)), device="cuda")) == ["MatMul"]  # a wide LM head


def test_half_precision_on_cpu_runs_the_same_product():
    import dynashape
    m = _model(16, np.float16)
    sess = dynashape.InferenceSession(m.SerializeToString())
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float16)
    w = numpy_helper.to_array(m.graph.initializer[0]).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0].astype(np.float32), x.astype(np.float32) @ w,
                               rtol=2e-2, atol=2e-2)


def test_the_stored_weight_is_the_transpose_and_gives_the_same_product():
    program = compile_graph(parse_model(_model(16)), device="cuda")
    (node,) = program.fused.nodes
    w = numpy_helper.to_array(_model(16).graph.initializer[0])
    wt = node.inputs[1].const
    assert tuple(wt.shape) == (16, 8) and wt.is_contiguous()
    x = torch.randn(3, 8)
    torch.testing.assert_close(_linear(x, wt), x @ torch.from_numpy(w))


def test_llama_projections_all_move():
    program = compile_graph(parse_model(onnx.load(str(llama.model_path()))), device="cuda")
    ops = _ops(program)
    assert "MatMul" not in ops  # the attention's products are in its fused op; every projection moved
    # q/k/v merged and gate/up merged, each read from its RMSNorm in one op (fuse_norm_linear), and
    # the LM head (a vocabulary of 1000: in the Linear layout) from the final norm
    assert ops.count("RMSNormLinear") == 2 * llama.TINY["layers"] + 1
    # the output and down projections end residual branches: the add rides the product, which
    # reads the weight in the Linear layout too (the down projection with the SwiGLU gate)
    adds = [n for n in program.fused.nodes if n.op_type in ("MatMulAdd", "GatedMatMulAdd")]
    assert len(adds) == 2 * llama.TINY["layers"] and all(n.attrs["transposed"] == 1 for n in adds)
