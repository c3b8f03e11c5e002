"""Small model builders shared by the core tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper


def add_chain(n: int = 3, shape=("N", 4), opset: int = 17) -> onnx.ModelProto:
    """y = x + b + b + ... (n Adds)."""
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "b"], [f"t{i}" if i < n - 1 else "y"])
             for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, list(shape)),
                                           helper.make_tensor_value_info("b", TP.FLOAT, [1, shape[-1]])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, list(shape))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def two_inputs_shared_symbol() -> onnx.ModelProto:
    """z = x * y where x and y are both [batch, 3]."""
    g = helper.make_graph([helper.make_node("Mul", ["x", "y"], ["z"])], "mul",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 3]),
                           helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 3])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, ["batch", 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def shape_subgraph_model() -> onnx.ModelProto:
    """y = x * (Shape(x)[1] cast to float): a shape_of subgraph feeding data."""
    inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "idx")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "idx"], ["d"], axis=0),
             helper.make_node("Cast", ["d"], ["df"], to=TP.FLOAT),
             helper.make_node("Mul", ["x", "df"], ["y"])]
    g = helper.make_graph(nodes, "shapesub", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "M"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "M"])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def rand(*shape, rng=None) -> np.ndarray:
    rng = rng or np.random.default_rng()
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


# Statistical checks of random outputs. A correct generator lands outside SIGMAS standard
# deviations of the expectation with probability ~2e-9 per check (the normal tail; the sample sizes
# the tests use make the normal approximation good), so a failure means a wrong distribution, not
# bad luck, and the bounds stay tight enough to catch a wrong rate, scale or range.
SIGMAS = 6.0


def assert_binomial(k: int, n: int, p: float, what: str) -> None:
    """k successes in n independent draws of probability p (0 < p < 1)."""
    sd = (n * p * (1 - p)) ** 0.5
    assert abs(k - n * p) <= SIGMAS * sd, (f"{what}: {k} of {n} ({k / n:.5f}), expected p = {p} "
                                           f"(n p = {n * p:.1f} +- {SIGMAS:g} x {sd:.1f})")


def assert_moments(x: np.ndarray, mean: float, var: float, mu4: float, what: str) -> None:
    """The sample mean and variance of x against a distribution's mean, variance and fourth central
    moment mu4 (which sets the spread of the sample variance: (mu4 - var^2) / n)."""
    x = np.asarray(x, np.float64).ravel()
    n = x.size
    m, v = x.mean(), x.var(ddof=1)
    sd_mean, sd_var = (var / n) ** 0.5, ((mu4 - var * var) / n) ** 0.5
    assert abs(m - mean) <= SIGMAS * sd_mean, f"{what}: mean {m:.5g}, expected {mean} +- {SIGMAS * sd_mean:.3g}"
    assert abs(v - var) <= SIGMAS * sd_var, f"{what}: variance {v:.5g}, expected {var} +- {SIGMAS * sd_var:.3g}"


def run_interpreted(code: str, timeout: float = 900, ends_ok: bool = True) -> str:
    """Run ``code`` (a script that sets TRITON_INTERPRET=1 before importing triton and, with ``ends_ok``,
    prints "ok" at its end) in a fresh process from the repository's root: Triton kernels checked on the
    CPU, where CI runs. Skipped without triton, and where a GPU is present (the compiled kernels are
    tested there, and the interpreter differs between Triton versions). Returns what it printed."""
    import os
    import subprocess
    import sys

    import pytest
    import torch
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("a GPU: the compiled kernels are tested instead")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0 and (res.stdout.strip().endswith("ok") or not ends_ok), res.stderr[-3000:]
    return res.stdout
