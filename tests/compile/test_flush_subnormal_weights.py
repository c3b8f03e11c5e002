"""compile/flush_subnormal_weights.py: on the CPU the fused graph's float32 constants below float32's
smallest normal number are zero (counted in stats()); the reference graph keeps them; the outputs
match onnxruntime, which keeps them, over changing shapes; the C convolution tile gives the same
values on subnormal weights and inputs (it flushes them in its own registers, csrc/conv_nhwc.c)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import dynashape

TINY = np.finfo(np.float32).tiny


def _model(w: np.ndarray, m: np.ndarray):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 0, 0, 0]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "m"], ["y"])]
    g = helper.make_graph(nodes, "sub", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, "H", "W"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(m, "m")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _with_subnormals(rng, shape, share=0.3):
    a = rng.standard_normal(shape).astype(np.float32)
    tiny = rng.random(shape) < share
    a[tiny] = (rng.random(int(tiny.sum())) * TINY * 0.5).astype(np.float32)  # subnormal, not zero
    return a


def test_subnormal_weights_are_zero_in_the_fused_graph_and_the_outputs_match_onnxruntime():
    rng = np.random.default_rng(0)
    w, m = _with_subnormals(rng, (16, 8, 1, 1)), _with_subnormals(rng, (16, 5))
    n_sub = int(((w != 0) & (np.abs(w) < TINY)).sum() + ((m != 0) & (np.abs(m) < TINY)).sum())
    assert n_sub > 0
    model = _model(w, m)
    sess = dynashape.InferenceSession(model)
    for g, flushed in ((sess.program.fused, True), (sess.program.graph, False)):
        consts = [v.const for v in g.values.values() if isinstance(v.const, torch.Tensor) and v.const.numel() > 1
                  and v.const.dtype == torch.float32]
        subs = sum(int(((c != 0) & (c.abs() < TINY)).sum()) for c in consts)
        assert (subs == 0) if flushed else (subs == n_sub), (flushed, subs)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, h, wd in [(1, 5, 7), (3, 9, 4), (2, 1, 1)]:
        x = {"x": _with_subnormals(rng, (n, 8, h, wd), 0.2)}
        np.testing.assert_allclose(sess.run(None, x)[0], ref.run(None, x)[0], rtol=1e-5, atol=1e-6)
    assert sess.stats()["subnormal_weights_flushed"] >= n_sub  # counted when the session was made (process-wide)


def test_the_c_tile_flushes_subnormals_and_gives_the_convolutions_values():
    from dynashape.ops import cpu_conv_dense, native
    if native.why("conv_nhwc") or not native.library("conv_nhwc"):
        import pytest
        pytest.skip("no C compiler here: " + str(native.why("conv_nhwc")))
    rng = np.random.default_rng(1)
    w = torch.from_numpy(_with_subnormals(rng, (32, 48, 3, 3)))
    b = torch.from_numpy(rng.standard_normal(32).astype(np.float32))
    tile = cpu_conv_dense.DenseConv(w, b, [1, 1], [1, 1], [1, 1], cpu_conv_dense.ACTS["none"], 0.0, None)
    x = torch.from_numpy(_with_subnormals(rng, (2, 48, 9, 11))).contiguous(memory_format=torch.channels_last)
    got = tile(x)
    assert got is not None
    want = torch.conv2d(x.double(), w.double(), b.double(), 1, 1)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
