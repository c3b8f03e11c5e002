"""Split emitted with its sizes from the shape program's output dims (the kernel reads them back
from a tensor and checks them): parts copied into their buffers by narrow, or torch.split's views
where the memory plan adopts them; as onnxruntime and the interpreter over changing shapes, for
the opsets' three ways of giving the sizes, uneven splits and a negative axis."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from tests.ops.harness import DEVICE


def _model(opset: int, axis: int, split, n_out: int, width: int = 12):
    inits, ins, attrs = [], ["x"], {"axis": axis}
    if split is not None and opset >= 13:
        inits.append(numpy_helper.from_array(np.array(split, np.int64), "split"))
        ins.append("split")
    elif split is not None:
        attrs["split"] = split
    elif opset >= 18:
        attrs["num_outputs"] = n_out
    outs = [f"y{k}" for k in range(n_out)]
    nodes = [helper.make_node("Split", ins, outs, **attrs)]
    # each part through an Add: the parts feed kernels, as in a model (and get buffers of their own)
    nodes += [helper.make_node("Add", [o, o], [f"z{k}"]) for k, o in enumerate(outs)]
    g = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", "s", width])],
                          [helper.make_tensor_value_info(f"z{k}", TP.FLOAT, None) for k in range(n_out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset, axis, split, n_out", [
    (11, 2, [4, 4, 4], 3), (13, -1, [2, 7, 3], 3), (18, 2, None, 3), (13, 2, None, 2), (18, -1, None, 5),
    (13, 1, None, 1)])
def test_split_emitted(opset, axis, split, n_out):
    # opset 18's uneven num_outputs: 13 into 5 is 3, 3, 3, 3 and 1 (12 would end in an empty part,
    # which onnxruntime 1.30 refuses)
    width = 13 if n_out == 5 else 12
    import onnxruntime as ort
    if axis == 1 and split is None:  # an equal split of a dynamic dim: sizes from the output dims
        shapes = [(2, 4), (1, 6), (3, 4)]
    else:
        shapes = [(2, 3), (1, 5), (4, 1), (2, 3)]
    m = _model(opset, axis, split, n_out, width)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    ref = dynashape.InferenceSession(m, device=DEVICE, executor="interpreter")
    o = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in shapes:
        feeds = {"x": np.random.default_rng(b * 10 + s).standard_normal((b, s, width)).astype(np.float32)}
        for got, inter, want in zip(sess.run(None, feeds), ref.run(None, feeds), o.run(None, feeds)):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(inter, want)
    src = "".join(sp.source for sp in sess.compiled.specs)
    assert ".narrow(" in src or "torch.split(" in src


def _qkv_model(returned: bool):
    """A product split into three parts, each reshaped and read (a fused QKV projection);
    ``returned``: the graph also returns the first part."""
    w = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
    outs = ["q", "k", "v"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["qkv"]),
             helper.make_node("Split", ["qkv", "split"], outs, axis=2)]
    nodes += [helper.make_node("Reshape", [o, "heads"], [f"{o}h"]) for o in outs]
    nodes += [helper.make_node("Add", ["qh", "kh"], ["qk"]), helper.make_node("Mul", ["qk", "vh"], ["z"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([4, 4, 4], np.int64), "split"),
             numpy_helper.from_array(np.array([0, 0, 2, 2], np.int64), "heads")]
    results = ["z"] + (["q"] if returned else [])
    g = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", "s", 8])],
                          [helper.make_tensor_value_info(r, TP.FLOAT, None) for r in results], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("returned", [False, True])
def test_parts_of_a_planned_buffer_are_views_made_with_its_group(returned):
    """The parts of a Split of an arena buffer are narrowed views made when the group of their
    symbols is built (no copy per call: memory_plan's ``_split_as_views``); a part the graph
    returns keeps its own buffer. Values as onnxruntime's over changing shapes."""
    import onnxruntime as ort
    m = _qkv_model(returned)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    o = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for b, s in [(2, 3), (1, 5), (2, 3), (3, 1)]:
        feeds = {"x": rng.standard_normal((b, s, 8)).astype(np.float32)}
        for got, want in zip(sess.run(None, feeds), o.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    src = sess.compiled.specs[0].source
    run = src[src.index("def run("):]
    if returned:
        assert ".copy_(" in run or "torch.split(" in run or "k_" in run
    else:
        assert ".copy_(" not in run  # views, not copies
        if DEVICE == "cpu":  # made with the group, once per signature (on CUDA the product's own
            assert run.count(".narrow(") == 0 and src.count(".narrow(") == 3  # result: where it runs)


def test_parts_of_a_kernels_own_result_are_views_where_it_runs():
    """A Split of what a kernel returns fresh (Pow has no out=; on CUDA a product bound to its
    weight): narrowed views of it, made where the node runs, no copy; values as onnxruntime's."""
    import onnxruntime as ort
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("Split", ["p", "split"], ["a", "b"], axis=1),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([3, 3], np.int64), "split")]
    g = helper.make_graph(nodes, "pw", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 6])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    o = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for b in (2, 5, 1):
        feeds = {"x": rng.standard_normal((b, 6)).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], o.run(None, feeds)[0], rtol=1e-6, atol=1e-6)
    run = sess.compiled.specs[0].source.split("def run(")[1]
    assert ".copy_(" not in run and run.count(".narrow(") == 2, run


def test_a_split_of_a_channels_last_image_is_views_its_convolutions_read_in_place():
    """A YOLOv8 C2f block: a convolution's channels split in two, one half through two more
    convolutions and a residual add, the three concatenated. Its tensors are channels-last on the
    CPU: the halves are strided views of the first convolution's result (no copy per part), and the
    values are onnxruntime's over changing image sizes and batches."""
    import onnxruntime as ort
    rng = np.random.default_rng(3)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.3
    inits = [numpy_helper.from_array(w(16, 3, 3, 3), "w0"), numpy_helper.from_array(w(8, 8, 3, 3), "w1"),
             numpy_helper.from_array(w(8, 8, 3, 3), "w2"), numpy_helper.from_array(w(8, 24, 1, 1), "w3"),
             numpy_helper.from_array(np.array([8, 8], np.int64), "split")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Split", ["r0", "split"], ["a", "b"], axis=1),
             helper.make_node("Conv", ["b", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["b", "c2"], ["m"]),
             helper.make_node("Concat", ["a", "b", "m"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["y"])]
    g = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = dynashape.InferenceSession(m, device=DEVICE)
    o = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, h, wd in [(1, 16, 24), (2, 20, 12), (1, 9, 31), (3, 16, 24)]:
        feeds = {"x": rng.standard_normal((n, 3, h, wd)).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], o.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    if DEVICE == "cpu":  # (channels-last is the CPU's: on CUDA fp32 convolutions stay NCHW)
        plan = sess.compiled.specs[0]
        src = plan.source
        assert "r0.narrow(1, 0, 8)" in src.replace("t_r0", "r0") and "r0.narrow(1, 8, 8)" in src.replace("t_r0", "r0")
        assert ".copy_(t_r0" not in src and ".copy_(r0" not in src  # no part copied out of the first result
