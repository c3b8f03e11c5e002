"""ops/cpu_conv.py: a 1x1 convolution of a 1x1 image as a matrix product on the CPU (the
squeeze-and-excitation blocks of MobileNet-style networks), against torch's convolution and, in a
model whose pooled image size changes, against onnxruntime; other convolutions are torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.ops import cpu_conv


@pytest.mark.parametrize("n,c,o", [(1, 16, 8), (4, 96, 24), (3, 7, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_pooled_1x1_is_the_convolution(n, c, o, bias):
    g = torch.Generator().manual_seed(n * c + o)
    x, w = torch.randn(n, c, 1, 1, generator=g), torch.randn(o, c, 1, 1, generator=g)
    b = torch.randn(o, generator=g) if bias else None
    got = cpu_conv.conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1)
    want = torch.conv2d(x, w, b)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    w.mul_(-0.5)  # update_weights writing in place: the [C, O] copy the product reads follows
    torch.testing.assert_close(cpu_conv.conv2d(x, w, b, (1, 1), (0, 0), (1, 1), 1), torch.conv2d(x, w, b),
                               rtol=1e-5, atol=1e-5)


def test_other_convolutions_are_torchs():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 4, 5, 6, generator=g), torch.randn(3, 4, 1, 1, generator=g)
    assert torch.equal(cpu_conv.conv2d(x, w, None, (1, 1), (0, 0), (1, 1), 1), torch.conv2d(x, w))
    x1 = torch.randn(2, 4, 1, 1, generator=g)
    # padded: the image is no longer 1x1 inside the convolution
    assert torch.equal(cpu_conv.conv2d(x1, w, None, (1, 1), (1, 1), (1, 1), 1), torch.conv2d(x1, w, None, 1, 1))


def test_squeeze_excitation_block_matches_onnxruntime_over_shapes():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    import dynashape
    rng = np.random.default_rng(2)
    c, r = 24, 6
    inits = [numpy_helper.from_array(rng.standard_normal((r, c, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(r).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((c, r, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b2")]
    nodes = [helper.make_node("GlobalAveragePool", ["X"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["h"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("Conv", ["hr", "w2", "b2"], ["s"], kernel_shape=[1, 1]),
             helper.make_node("HardSigmoid", ["s"], ["a"]),
             helper.make_node("Mul", ["X", "a"], ["Y"])]
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("X", TP.FLOAT, ["n", c, "h", "w"])],
                              [helper.make_tensor_value_info("Y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    sess = dynashape.InferenceSession(model)
    for n, h, w in [(1, 8, 8), (3, 5, 11), (2, 1, 1), (1, 8, 8)]:
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        (got,) = sess.run(None, {"X": x})
        (want,) = ref.run(None, {"X": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
