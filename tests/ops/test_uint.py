"""uint16/32/64 through the element-wise ops (torch lacks most of their kernels: ops/elementwise.py
computes them on int64), BitCast, and the Mod / string Equal fixes made alongside."""

import numpy as np
import onnx
import pytest

from .harness import check_op, make_model, run_sequence

UINTS = [np.uint16, np.uint32, np.uint64]
SEQ2 = [[(2, 3), (2, 3)], [(5, 3), (1, 3)], [(1, 3), (4, 1, 3)], [(5, 3), (1, 3)], [(7, 1), (1, 6)]]


def _full_range(dtype, nonzero=False):
    """Values over the whole range of the type, the top half included (uint64: past 2**63, where
    its int64 bit pattern is negative), plus small ones so that ordering and division see both."""
    info = np.iinfo(dtype)

    def mk(i, shape, rng):
        big = rng.integers(0, int(info.max), size=shape, dtype=np.uint64, endpoint=True).astype(dtype)
        small = rng.integers(0, 50, size=shape).astype(dtype)
        x = np.where(rng.random(shape) < 0.5, big, small)
        if nonzero or i == 0:
            x[x == 0] = 7
        return x
    return mk


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Max", "Min", "Sum", "Greater", "Less", "GreaterOrEqual",
                                "LessOrEqual", "Equal", "BitwiseAnd", "BitwiseXor"])
def test_binary(op, dtype):
    # onnxruntime has no uint16/32/64 kernels for most of these: numpy's reference checks them
    check_op(op, SEQ2, opset=18, dtypes=[dtype, dtype], make_input=_full_range(dtype), references=("ref",))


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("op,attrs", [("Div", {}), ("Mod", {}), ("Mod", {"fmod": 1})])
def test_division(op, attrs, dtype):
    check_op(op, SEQ2, attrs=attrs, dtypes=[dtype, dtype], make_input=_full_range(dtype, nonzero=True),
             references=("ref",))


def test_uint64_division_by_large_divisors():
    # divisors at and past 2**63 (quotient 0 or 1) and just below it, dividends around them
    top = np.uint64(1 << 63)
    a = np.array([top, top - np.uint64(1), np.uint64(2**64 - 1), np.uint64(5), top + np.uint64(3),
                  np.uint64(2**64 - 2)], dtype=np.uint64)
    b = np.array([top, top, top - np.uint64(1), np.uint64(2**64 - 1), np.uint64(2**64 - 1),
                  np.uint64(3)], dtype=np.uint64)
    for op in ("Div", "Mod"):
        model = make_model(op, 2, [onnx.TensorProto.UINT64] * 2, opset=13)
        run_sequence(model, [{"in0": a, "in1": b}, {"in0": a[:4], "in1": b[:4]}, {"in0": a, "in1": b}],
                     references=("ref",))


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift(direction, dtype):
    bits = 8 * np.dtype(dtype).itemsize
    full = _full_range(dtype)

    def mk(i, shape, rng):
        return full(i, shape, rng) if i == 0 else rng.integers(0, bits, size=shape).astype(dtype)
    check_op("BitShift", SEQ2, attrs={"direction": direction}, dtypes=[dtype, dtype], make_input=mk,
             references=("ref",))


@pytest.mark.parametrize("dtype", UINTS)
def test_bitwise_not_and_clip(dtype):
    seq = [[(3, 4)], [(1, 9)], [(6, 2)], [(3, 4)]]
    check_op("BitwiseNot", seq, opset=18, dtypes=[dtype], make_input=_full_range(dtype), references=("ref",))
    info = np.iinfo(dtype)
    bounds = {1: np.array(info.max // 4, dtype), 2: np.array(info.max // 4 * 3, dtype)}
    check_op("Clip", seq, opset=13, dtypes=[dtype], make_input=_full_range(dtype), const_inputs=bounds,
             references=("ref",))


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.uint64, np.float64), (np.uint16, np.float16),
                                     (np.bool_, np.uint8), (np.int8, np.uint8), (np.float64, np.uint64)])
def test_bitcast(src, dst):
    def mk(i, shape, rng):  # random bytes seen as src: every bit pattern, NaNs and infs included
        if np.dtype(src) == np.bool_:
            return rng.random(shape) < 0.5
        raw = rng.integers(0, 256, size=(*shape, np.dtype(src).itemsize), dtype=np.uint8)
        return raw.view(src).reshape(shape)
    to = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    # onnxruntime 1.31 has no BitCast (opset 26) yet
    check_op("BitCast", [[(2, 3)], [(5,)], [()], [(2, 3)]], attrs={"to": to}, opset=26, dtypes=[src],
             make_input=mk, references=("ref",))


def test_float_mod_follows_divisor_sign():
    # fmod=0 on floats: the sign of the divisor, like numpy's mod (fmod=1 keeps the dividend's).
    # onnxruntime refuses fmod=0 on floats (the spec asks for fmod=1 there): the reference checks it.
    check_op("Mod", SEQ2, attrs={"fmod": 0}, opset=13, references=("ref",))
    check_op("Mod", SEQ2, attrs={"fmod": 1}, opset=13)


def test_equal_strings():
    model = make_model("Equal", 2, [onnx.TensorProto.STRING] * 2, opset=19)
    words = np.array(["a", "bb", "", "ccc", "bb", "a"], dtype=object)
    feeds = [{"in0": words, "in1": words[::-1].copy()}, {"in0": words.reshape(2, 3), "in1": np.array(["bb"], object)},
             {"in0": words[:2], "in1": words[:2]}]
    run_sequence(model, feeds, references=("ref",), device="cpu")  # strings stay on the host
