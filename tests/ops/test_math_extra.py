"""Det, CumProd, LpNormalization, Shrink over sequences of shapes through one session, against
onnxruntime and the onnx reference evaluator."""

import numpy as np
import pytest

from .harness import check_op, rand


# Det ----------------------------------------------------------------------------------------
def test_det_batched():
    # rank changes along the sequence (2-D, then batched): inputs declared with unknown rank
    check_op("Det", [[(3, 3)], [(2, 4, 4)], [(1, 1)], [(3, 2, 2, 2)], [(3, 3)]], opset=11, rtol=1e-3, atol=1e-4)


def test_det_double_opset22():
    check_op("Det", [[(2, 3, 3)], [(5, 2, 2)], [(1, 5, 5)], [(2, 3, 3)]], opset=22, dtypes=[np.float64],
             references=("ref",))  # onnxruntime has no Det-22 kernel


# CumProd ------------------------------------------------------------------------------------
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1, 1])
def test_cumprod(exclusive, reverse, axis):
    # values in [0.5, 1.5]: products of a few of them stay well scaled
    def make(i, shape, rng):
        return np.array(axis, dtype=np.int64) if i == 1 else rand(shape, np.float32, rng, 0.5, 1.5)
    check_op("CumProd", [[(3, 4), ()], [(5, 2, 3), ()], [(2, 1), ()], [(3, 4), ()], [(4, 6, 2), ()]],
             {"exclusive": exclusive, "reverse": reverse}, opset=26, dtypes=[np.float32, np.int64], make_input=make)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64, np.float64])
def test_cumprod_types(dtype):
    def make(i, shape, rng):
        if i == 1:
            return np.array(0, dtype=np.int32)
        return rand(shape, dtype, rng, 1, 4)
    check_op("CumProd", [[(4, 3), ()], [(6, 2), ()], [(2, 5), ()], [(4, 3), ()]], {"exclusive": 1},
             opset=26, dtypes=[dtype, np.int32], make_input=make)


# LpNormalization ----------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [{}, {"p": 1}, {"axis": 0, "p": 2}, {"axis": 1, "p": 1}])
def test_lp_normalization(attrs):
    # the reference evaluator's p=1 sums x, not |x|: onnxruntime only there
    refs = ("ort",) if attrs.get("p") == 1 else ("ort", "ref")
    check_op("LpNormalization", [[(3, 4)], [(5, 2)], [(1, 7)], [(3, 4)], [(2, 3)]], attrs, opset=22,
             references=refs)


def test_lp_normalization_zero_vector_opset1():
    def make(i, shape, rng):
        x = rand(shape, np.float32, rng)
        x[0] = 0  # a zero row normalizes to zeros, not NaN
        return x
    check_op("LpNormalization", [[(3, 4)], [(2, 5)], [(4, 2)]], {"axis": -1}, opset=1, make_input=make)


# Shrink -------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [{}, {"lambd": 1.0}, {"lambd": 0.7, "bias": 0.3}])
def test_shrink(attrs):
    check_op("Shrink", [[(3, 4)], [(5,)], [(2, 3, 4)], [(3, 4)], [(1, 1)]], attrs, opset=9)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.float64])
def test_shrink_types(dtype):
    check_op("Shrink", [[(3, 4)], [(6,)], [(2, 2, 2)], [(3, 4)]], {"lambd": 1.5, "bias": 1.0}, opset=9,
             dtypes=[dtype], make_input=lambda i, shape, rng: rand(shape, dtype, rng, -5, 5))
