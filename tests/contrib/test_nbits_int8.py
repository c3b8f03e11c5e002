"""MatMulNBits at accuracy_level 4 (4-bit weights, blocks of 32, float32 A) against onnxruntime's
CPU kernel, to the bit: onnxruntime quantizes A to int8 per block and sums in its own order
(ops/nbits_int8.py), and a model feeds each output into the next product's quantization, where a
one-ulp difference can move an int8 value. Over sequences of changing row counts with fresh random
inputs of changing magnitude; K with and without a tail block, groups of 4 blocks and blocks left
over; N with and without a remainder of 4; with zero points and bias; the C kernel and the torch
path. The order written there is that of onnxruntime's AVX-512 VNNI kernel: on another CPU
onnxruntime runs other kernels, and these tests say so and skip."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynashape
from dynashape.ops import native

pytestmark = pytest.mark.skipif("avx512_vnni" not in native.cpuinfo("flags").split(),
                                reason="onnxruntime's MatMulNBits int8 kernel sums in another order on a CPU "
                                       "without AVX-512 VNNI (the order here is that one's)")

MS = "com.microsoft"


def _model(rng, k: int, n: int, zero_points: bool, bias: bool):
    nb = -(-k // 32)
    consts = [numpy_helper.from_array(rng.integers(0, 256, (n, nb, 16), dtype=np.uint8), "b"),
              numpy_helper.from_array(rng.uniform(0.001, 0.03, n * nb).astype(np.float32), "s")]
    ins = ["a", "b", "s"]
    if zero_points:
        consts.append(numpy_helper.from_array(rng.integers(0, 256, (n, (nb + 1) // 2), dtype=np.uint8), "z"))
        ins.append("z")
    if bias:
        consts.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        ins += [""] * (5 - len(ins)) + ["bias"]
    node = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=k, N=n, bits=4, block_size=32, accuracy_level=4)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", "s", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def _compare(model, rng, shapes) -> None:
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sessions = {ex: dynashape.InferenceSession(model, executor=ex) for ex in ("compiled", "interpreter")}
    k = model.graph.node[0].attribute[0].i
    for b, s in shapes:
        # magnitudes from 1e-3 to 30: the block scales (amax / 127) and their products vary
        a = (rng.standard_normal((b, s, k)) * 10.0 ** rng.uniform(-3, 1.5)).astype(np.float32)
        want = ref.run(None, {"a": a})[0]
        for ex, sess in sessions.items():
            got = sess.run(None, {"a": a})[0]
            assert got.shape == want.shape
            differ = int((got != want).sum())
            assert differ == 0, (f"{ex}, A {a.shape}: {differ} of {want.size} outputs differ from onnxruntime, "
                                 f"by up to {np.abs(got - want).max()}")
    if native.library("nbits_int8") is not None:  # the compiled runner's kernel bound to the weight (block_quant)
        assert sessions["compiled"].stats()["bound_kernels"] == 1


SHAPES = [(1, 1), (2, 5), (1, 1), (3, 17), (1, 40), (1, 1)]


@pytest.mark.parametrize("k, n", [(64, 64), (64, 7), (70, 24), (128, 258), (160, 36), (288, 64), (512, 130)])
@pytest.mark.parametrize("zero_points, bias", [(False, False), (True, True)])
def test_bits_equal_onnxruntime(k, n, zero_points, bias):
    rng = np.random.default_rng(k * 7 + n + 3 * zero_points)
    before = native.counters().get("nbits_int8_native_calls", 0)
    _compare(_model(rng, k, n, zero_points, bias), rng, SHAPES)
    if native.library("nbits_int8") is not None:  # the C kernel served (else the torch path, counted)
        assert native.counters()["nbits_int8_native_calls"] > before


@pytest.mark.parametrize("k, n", [(64, 7), (160, 36), (288, 64)])
def test_the_torch_path_gives_the_same_bits(monkeypatch, k, n):
    """Without the C kernel (no compiler, DYNASHAPE_NATIVE=0) the torch ops compute the same bits."""
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    rng = np.random.default_rng(k + n)
    before = native.counters().get("nbits_int8_torch_fallbacks", 0)
    _compare(_model(rng, k, n, True, True), rng, SHAPES[:4])
    assert native.counters()["nbits_int8_torch_fallbacks"] > before


def test_adjacent_floats_across_an_int8_rounding_boundary():
    """Two values of one element of A, one ulp apart, that onnxruntime quantizes to neighbouring
    int8 values (round(a * (127 / amax)), half to even): its outputs differ between them, and ours
    equal its at both."""
    rng = np.random.default_rng(11)
    model = _model(rng, 64, 16, False, False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = dynashape.InferenceSession(model)
    a = rng.uniform(-1, 1, (1, 1, 64)).astype(np.float32)
    a[0, 0, 0] = 2.0  # the block's amax, so that moving element 5 leaves the scale as it is
    inv = np.float32(127) / np.float32(2.0)
    v = np.float32(np.float32(10.5) / inv)
    for _ in range(8):  # down to the largest float below 10.5 / inv that rounds to 10
        if np.rint(np.float32(v * inv)) == 10:
            break
        v = np.nextafter(v, np.float32(0))
    pair = [v, np.nextafter(v, np.float32(1))]
    assert [np.rint(np.float32(x * inv)) for x in pair] == [10, 11]
    outs = []
    for x in pair:
        a[0, 0, 5] = x
        want = ref.run(None, {"a": a})[0]
        np.testing.assert_array_equal(sess.run(None, {"a": a})[0], want)
        outs.append(want)
    assert not np.array_equal(outs[0], outs[1])
