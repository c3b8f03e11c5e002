import numpy as np
import pytest

from .harness import check_op

SEQ2 = [[(2, 3), (2, 3)], [(5, 3), (1, 3)], [(1, 3), (4, 1, 3)], [(5, 3), (1, 3)], [(7, 1), (1, 6)]]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"])
def test_binary_broadcast_sequence(op):
    # onnx's reference Mean writes the broadcast result into its first input: it fails when that
    # input is the smaller one, so Mean is checked against onnxruntime alone.
    check_op(op, SEQ2, references=("ort",) if op == "Mean" else ("ort", "ref"))


def test_variadic_three_inputs():
    check_op("Sum", [[(2, 3), (3,), (1, 3)], [(4, 1), (1, 5), (4, 5)], [(2, 3), (3,), (1, 3)],
                     [(6, 2), (2,), (6, 1)], [(1, 1), (3, 1), (1, 7)]])


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    check_op(op, SEQ2)


def test_integer_div_truncates_toward_zero():
    def mk(i, shape, rng):
        x = rng.integers(-50, 50, size=shape).astype(np.int64)
        if i == 1:
            x[x == 0] = 3
        return x
    check_op("Div", SEQ2, dtypes=[np.int64, np.int64], make_input=mk)


@pytest.mark.parametrize("op", ["Abs", "Neg", "Exp", "Floor", "Ceil", "Sigmoid", "Tanh", "Relu", "Erf",
                                "Sin", "Cos", "Softplus", "Softsign", "HardSwish", "Sign"])
def test_unary(op):
    check_op(op, [[(3, 4)], [(1, 9)], [(6, 2)], [(3, 4)], [(2, 5)]])


def test_isnan_isinf():
    def mk(i, shape, rng):
        x = rng.uniform(-2, 2, size=shape).astype(np.float32)
        x.reshape(-1)[:: 3] = np.nan
        x.reshape(-1)[1:: 4] = np.inf
        return x
    seq = [[(3, 4)], [(1, 9)], [(6, 2)], [(3, 4)], [(2, 5)]]
    check_op("IsNaN", seq, make_input=mk)
    check_op("IsInf", seq, make_input=mk)


def test_where_broadcast():
    check_op("Where", [[(2, 3), (2, 3), (1, 3)], [(4, 1), (1, 5), (4, 5)], [(3,), (2, 3), (1,)],
                       [(2, 3), (2, 3), (1, 3)], [(1,), (6, 2), (6, 1)]],
             dtypes=[np.bool_, np.float32, np.float32])
