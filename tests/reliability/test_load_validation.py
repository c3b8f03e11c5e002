"""A bad model fails when the session is created, with InvalidModelError naming the node (name and
op type) or initializer and what was expected; valid edge cases still load and run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.errors import InvalidModelError

from ..helpers import rand


def model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=(), name="g") -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def vi(name, shape, dt=TP.FLOAT):
    return helper.make_tensor_value_info(name, dt, shape)


def attr(name, value, kind=None):
    return helper.make_attribute(name, value, attr_type=kind)


def concat_without_axis():
    return model([helper.make_node("Concat", ["x", "x"], ["y"], name="cat")], [vi("x", [2, 3])], [vi("y", None)])


def cast_to_999():
    return model([helper.make_node("Cast", ["x"], ["y"], name="caster", to=999)], [vi("x", [2])], [vi("y", None)])


def softmax_float_axis():
    n = helper.make_node("Softmax", ["x"], ["y"], name="sm")
    n.attribute.append(attr("axis", 1.5))
    return model([n], [vi("x", [2, 3])], [vi("y", [2, 3])], opset=13)


def transpose_not_a_permutation():
    return model([helper.make_node("Transpose", ["x"], ["y"], name="tr", perm=[0, 0])],
                 [vi("x", [2, 3])], [vi("y", None)])


def transpose_wrong_length():
    return model([helper.make_node("Transpose", ["x"], ["y"], name="tr3", perm=[2, 0, 1])],
                 [vi("x", [2, 3])], [vi("y", None)])


def concat_axis_out_of_range():
    return model([helper.make_node("Concat", ["x", "x"], ["y"], name="cat2", axis=2)],
                 [vi("x", ["N", 3])], [vi("y", None)])


def gather_axis_5():
    idx = numpy_helper.from_array(np.array([0, 1], np.int64), "idx")
    return model([helper.make_node("Gather", ["x", "idx"], ["y"], name="gat", axis=5)],
                 [vi("x", [4, 3])], [vi("y", None)], inits=[idx])


def softmax_axis_out_of_range_on_intermediate():
    """The rank comes from ONNX's shape inference (the Relu output has no declared shape)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["y"], name="sm2", axis=-4)]
    return model(nodes, [vi("x", [2, 3, 4])], [vi("y", None)], opset=13)


def unsqueeze_axes_out_of_range():
    return model([helper.make_node("Unsqueeze", ["x"], ["y"], name="unsq", axes=[0, 4])],
                 [vi("x", [2, 3])], [vi("y", None)], opset=11)


def reshape_without_shape():
    return model([helper.make_node("Reshape", ["x"], ["y"], name="rs")], [vi("x", [2, 3])], [vi("y", None)])


def gemm_alpha_as_string():
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    n = helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm0")
    n.attribute.append(attr("alpha", "two"))
    return model([n], [vi("x", [2, 3])], [vi("y", None)], inits=[w])


def maxpool_kernel_as_int():
    n = helper.make_node("MaxPool", ["x"], ["y"], name="pool")
    n.attribute.append(attr("kernel_shape", 2))  # an INT where INTS is required
    return model([n], [vi("x", [1, 1, 4, 4])], [vi("y", None)])


def opset_99():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2])], [vi("y", [2])], opset=99)


def opset_99_ai_onnx():
    m = opset_99()
    m.opset_import[0].domain = "ai.onnx"
    return m


def tensor(name, dt, dims, raw=None, **fields):
    """A TensorProto built by hand: helper.make_tensor refuses data of the wrong size."""
    t = onnx.TensorProto(name=name, data_type=dt, dims=dims)
    if raw is not None:
        t.raw_data = raw
    for k, v in fields.items():
        getattr(t, k).extend(v)
    return t


def initializer_wrong_size():
    w = tensor("weights", TP.FLOAT, [4, 3], raw=np.ones(5, np.float32).tobytes())
    return model([helper.make_node("MatMul", ["x", "weights"], ["y"], name="mm")],
                 [vi("x", [2, 4])], [vi("y", None)], inits=[w])


def initializer_wrong_size_typed():
    w = tensor("bias", TP.INT64, [2, 2], int64_data=[1, 2, 3])
    return model([helper.make_node("Add", ["x", "bias"], ["y"], name="add")],
                 [vi("x", [2, 2], TP.INT64)], [vi("y", None, TP.INT64)], inits=[w])


def constant_value_wrong_size():
    t = tensor("c", TP.FLOAT, [3], float_data=[1.0, 2.0])
    nodes = [helper.make_node("Constant", [], ["c"], name="const", value=t),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    return model(nodes, [vi("x", [3])], [vi("y", None)])


def cycle():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="entry"),
             helper.make_node("Add", ["a", "c"], ["b"], name="loop_add"),
             helper.make_node("Neg", ["b"], ["c"], name="loop_neg"),
             helper.make_node("Identity", ["b"], ["y"], name="exit")]
    return model(nodes, [vi("x", [2])], [vi("y", [2])])


def self_loop():
    return model([helper.make_node("Add", ["x", "s"], ["s"], name="me"),
                  helper.make_node("Identity", ["s"], ["y"], name="out")], [vi("x", [2])], [vi("y", [2])])


def cycle_in_loop_body():
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "w"], ["u"], name="body_add"),
         helper.make_node("Mul", ["u", "u"], ["w"], name="body_mul"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [vi("i", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("v_in", [2])],
        [vi("cond_out", [], TP.BOOL), vi("w", [2])])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    cond = numpy_helper.from_array(np.array(True), "cond")
    n = helper.make_node("Loop", ["trip", "cond", "x"], ["y"], name="the_loop", body=body)
    return model([n], [vi("x", [2])], [vi("y", [2])], inits=[trip, cond])


def unsorted_nodes():
    nodes = [helper.make_node("Neg", ["a"], ["y"], name="second"),
             helper.make_node("Relu", ["x"], ["a"], name="first")]
    return model(nodes, [vi("x", [2])], [vi("y", [2])])


def required_input_empty():
    return model([helper.make_node("Gather", ["x", ""], ["y"], name="gat2")], [vi("x", [2])], [vi("y", None)])


BAD = [
    (concat_without_axis, ["'cat'", "Concat", "'axis'", "required", "missing", "INT"]),
    (cast_to_999, ["'caster'", "Cast", "'to'", "999", "not a TensorProto data type"]),
    (softmax_float_axis, ["'sm'", "Softmax", "'axis'", "FLOAT", "1.5", "expects INT"]),
    (transpose_not_a_permutation, ["'tr'", "Transpose", "'perm'", "[0, 0]", "not a permutation"]),
    (transpose_wrong_length, ["'tr3'", "Transpose", "'perm'", "rank 2"]),
    (concat_axis_out_of_range, ["'cat2'", "Concat", "'axis'", "2", "[-2, 1]", "rank 2"]),
    (gather_axis_5, ["'gat'", "Gather", "'axis'", "5", "[-2, 1]", "'x'", "rank 2"]),
    (softmax_axis_out_of_range_on_intermediate, ["'sm2'", "Softmax", "-4", "[-3, 2]", "'r'", "rank 3"]),
    (unsqueeze_axes_out_of_range, ["'unsq'", "Unsqueeze", "'axes'", "[0, 4]", "[-4, 3]"]),
    (reshape_without_shape, ["'rs'", "Reshape", "1 input(s)", "expects 2"]),
    (gemm_alpha_as_string, ["'gemm0'", "Gemm", "'alpha'", "STRING", "expects FLOAT"]),
    (maxpool_kernel_as_int, ["'pool'", "MaxPool", "'kernel_shape'", "INT", "expects INTS"]),
    (opset_99, ["opset 99", f"up to {onnx.defs.onnx_opset_version()}", "onnx"]),
    (opset_99_ai_onnx, ["opset 99", "'ai.onnx'", f"up to {onnx.defs.onnx_opset_version()}"]),
    (initializer_wrong_size, ["'weights'", "[4, 3]", "12 elements", "holds 5 elements"]),
    (initializer_wrong_size_typed, ["'bias'", "[2, 2]", "4 elements", "holds 3 elements"]),
    (constant_value_wrong_size, ["'const'", "Constant", "'value'", "[3]", "holds 2 elements"]),
    (cycle, ["cycle", "'loop_add' (Add)", "'loop_neg' (Neg)"]),
    (self_loop, ["cycle", "'me' (Add)"]),
    (cycle_in_loop_body, ["cycle", "'body_add' (Add)", "'body_mul' (Mul)"]),
    (unsorted_nodes, ["'second' (Neg)", "'first' (Relu)", "'a'", "topological order"]),
    (required_input_empty, ["'gat2'", "Gather", "input 1", "required"]),
]


@pytest.mark.parametrize("make, words", BAD, ids=[f.__name__ for f, _ in BAD])
def test_bad_model_fails_at_load(make, words):
    m = make()
    with pytest.raises(InvalidModelError) as info:
        dynashape.InferenceSession(m)
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("make", [cast_to_999, initializer_wrong_size, cycle, opset_99],
                         ids=lambda f: f.__name__)
def test_bytes_and_interpreter_fail_alike(make):
    data = make().SerializeToString()
    with pytest.raises(InvalidModelError):
        dynashape.InferenceSession(data, executor="interpreter")


def test_unnamed_node_is_named_as_the_parser_names_it():
    n = helper.make_node("Concat", ["x", "x"], ["y"])
    m = model([helper.make_node("Relu", ["x"], ["r"]), n], [vi("x", [2])], [vi("y", None)])
    with pytest.raises(InvalidModelError, match=r"node 'Concat_1' \(Concat\)"):
        dynashape.InferenceSession(m)


# ---- valid edge cases still load and run ---------------------------------------------------------
def run(m, feeds):
    import onnxruntime as ort
    got = dynashape.InferenceSession(m).run(None, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_negative_axes_at_the_edges():
    idx = numpy_helper.from_array(np.array([0, 2], np.int64), "idx")
    nodes = [helper.make_node("Concat", ["x", "x"], ["c"], axis=-2),
             helper.make_node("Gather", ["c", "idx"], ["g"], axis=-1),
             helper.make_node("Flatten", ["g"], ["f"], axis=2),  # Flatten allows axis == rank
             helper.make_node("Softmax", ["f"], ["y"], axis=-2)]
    run(model(nodes, [vi("x", ["N", 3])], [vi("y", None)], inits=[idx], opset=13), {"x": rand(2, 3)})


def test_unknown_rank_is_not_checked():
    # x has no declared shape: any axis might be valid, so loading must not refuse it
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=3)], [vi("x", None)], [vi("y", None)], opset=13)
    s = dynashape.InferenceSession(m)
    x = rand(1, 2, 3, 4)
    e = np.exp(x - x.max(axis=3, keepdims=True))
    np.testing.assert_allclose(s.run(None, {"x": x})[0], e / e.sum(axis=3, keepdims=True), rtol=1e-5)


def test_empty_list_attribute_of_another_list_type():
    n = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)
    n.attribute.append(attr("axes", [], onnx.AttributeProto.FLOATS))  # empty: its type cannot matter
    s = dynashape.InferenceSession(model([n], [vi("x", [2, 3])], [vi("y", None)], opset=11))
    x = rand(2, 3)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], x.sum(), rtol=1e-5)


def test_optional_inputs_empty_and_newest_opset():
    newest = min(onnx.defs.onnx_opset_version(), 21)
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["y"], name="clip")]
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    run(model(nodes, [vi("x", [4])], [vi("y", None)], inits=[hi], opset=newest), {"x": rand(4)})


def test_cast_to_every_common_type_and_empty_initializer():
    z = numpy_helper.from_array(np.zeros((0, 3), np.float32), "z")
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TP.INT32),
             helper.make_node("Cast", ["i"], ["f"], to=TP.FLOAT),
             helper.make_node("Concat", ["f", "z"], ["y"], axis=0)]
    x = (rand(2, 3) * 4).astype(np.float32)
    run(model(nodes, [vi("x", [2, 3])], [vi("y", None)], inits=[z]), {"x": x})


def test_loop_body_reads_the_outer_scope():
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "step"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [vi("i", [], TP.INT64), vi("cond_in", [], TP.BOOL), vi("v_in", [2])],
        [vi("cond_out", [], TP.BOOL), vi("v_out", [2])])
    nodes = [helper.make_node("Neg", ["x"], ["step"]),
             helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)]
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    cond = numpy_helper.from_array(np.array(True), "cond")
    run(model(nodes, [vi("x", [2])], [vi("y", [2])], inits=[trip, cond]), {"x": rand(2)})


def test_custom_domain_op_is_not_schema_checked():
    # com.microsoft ops have no onnx schema: no attribute checks (FastGelu takes no required ones)
    n = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    m = model([n], [vi("x", [2, 3])], [vi("y", None)], extra_opsets=[("com.microsoft", 1)])
    try:
        s = dynashape.InferenceSession(m)
    except dynashape.errors.UnsupportedOpError:
        pytest.skip("FastGelu not supported")
    assert s.run(None, {"x": rand(2, 3)})[0].shape == (2, 3)
