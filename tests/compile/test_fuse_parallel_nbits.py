"""fuse_parallel_matmul on onnxruntime's MatMulNBits: products of one activation by 4-bit weights
with the same K, bits, block size and accuracy level (the model builder's gate and up projections)
become one product by the weights, scales and zero points stacked along N, each result a Slice of it.
Each output is computed as before: the fused session's results equal the interpreter's (the graph as
exported) bit for bit, and onnxruntime's within its own summation order, over a sequence of changing
row counts with fresh inputs; a product with other attributes, a flat or a 2-D scale, and one without
zero points where the others have them are each left or merged as they must be."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynashape

MS = "com.microsoft"
K = 96


def _nbits(rng, name: str, n: int, *, zp: bool = True, level: int = 4, flat_scales: bool = True):
    nb = -(-K // 32)
    consts = [numpy_helper.from_array(rng.integers(0, 256, (n, nb, 16), dtype=np.uint8), f"{name}_b"),
              numpy_helper.from_array(rng.uniform(0.01, 0.05, n * nb if flat_scales else (n, nb)).astype(np.float32),
                                      f"{name}_s")]
    ins = ["x", f"{name}_b", f"{name}_s"]
    if zp:
        consts.append(numpy_helper.from_array(rng.integers(0, 256, n * ((nb + 1) // 2), dtype=np.uint8), f"{name}_z"))
        ins.append(f"{name}_z")
    node = helper.make_node("MatMulNBits", ins, [name], domain=MS, K=K, N=n, bits=4, block_size=32,
                            accuracy_level=level)
    return node, consts


def _model(rng):
    gate, c1 = _nbits(rng, "gate", 40)
    up, c2 = _nbits(rng, "up", 24, flat_scales=False)
    other, c3 = _nbits(rng, "other", 16, level=0)  # another accuracy level: not merged with the two
    plain, c4 = _nbits(rng, "plain", 8, zp=False)  # no zero points: not merged with the two
    nodes = [gate, up, other, plain, helper.make_node("Sigmoid", ["gate"], ["sg"]),
             helper.make_node("Mul", ["gate", "sg"], ["silu"]),
             helper.make_node("Slice", ["silu", "z0", "e24", "am1"], ["silu24"]),
             helper.make_node("Mul", ["silu24", "up"], ["y"])]
    idx = [numpy_helper.from_array(np.array([v], np.int64), nm) for nm, v in (("z0", 0), ("e24", 24), ("am1", -1))]
    outs = [helper.make_tensor_value_info(nm, TensorProto.FLOAT, None) for nm in ("y", "other", "plain")]
    g = helper.make_graph(nodes, "nbits_parallel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", K])],
                          outs, c1 + c2 + c3 + c4 + idx)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def test_products_of_one_input_merge_and_keep_their_values():
    rng = np.random.default_rng(5)
    model = _model(rng)
    fused = dynashape.InferenceSession(model)
    nbits = [nd for nd in fused.program.fused.nodes if nd.op_type == "MatMulNBits"]
    assert sorted(nd.attrs["N"] for nd in nbits) == [8, 16, 64], [nd.attrs["N"] for nd in nbits]
    reference = dynashape.InferenceSession(model, executor="interpreter")
    ort_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b in (1, 5, 1, 17, 2):
        feed = {"x": (rng.standard_normal((b, K)) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32)}
        got, want = fused.run(None, feed), reference.run(None, feed)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        for g, w in zip(got, ort_sess.run(None, feed)):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


@pytest.mark.parametrize("bias", [False, True])
def test_a_product_with_a_bias_or_an_input_of_its_own_is_left(bias):
    rng = np.random.default_rng(6)
    a, ca = _nbits(rng, "a", 16)
    b, cb = _nbits(rng, "b", 16)
    if bias:  # a bias: left as it is (the merged product takes none)
        cb.append(numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b_bias"))
        b.input.extend(["", "b_bias"])
    else:  # an input of its own
        b.input[0] = "x2"
    ins = [helper.make_tensor_value_info(nm, TensorProto.FLOAT, ["n", K]) for nm in ("x", "x2")]
    g = helper.make_graph([a, b], "two", ins, [helper.make_tensor_value_info(nm, TensorProto.FLOAT, None)
                                               for nm in ("a", "b")], ca + cb)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    sess = dynashape.InferenceSession(model)
    assert sorted(nd.attrs["N"] for nd in sess.program.fused.nodes if nd.op_type == "MatMulNBits") == [16, 16]
    feed = {"x": rng.standard_normal((3, K)).astype(np.float32), "x2": rng.standard_normal((3, K)).astype(np.float32)}
    for g, w in zip(sess.run(None, feed), dynashape.InferenceSession(model, executor="interpreter").run(None, feed)):
        np.testing.assert_array_equal(g, w)
