"""Fixtures shared by the test packages."""

from __future__ import annotations

import os

import pytest

# skips of the native-kernel tests: summed up at the end of the run, errors where CI is set
from tests.native_report import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401


def _models_onnxruntime_loads() -> None:
    """Models the tests make without an IR version get the newest one the installed onnxruntime
    loads, where onnx writes a newer one than it does (the GPU hosts: onnx 1.20's IR 14 against
    onnxruntime 1.30's 13); elsewhere nothing changes. onnxruntime is the tests' reference."""
    import onnx
    from onnx import TensorProto, helper
    try:
        import onnxruntime as ort
    except ImportError:
        return
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    for ir in range(onnx.IR_VERSION, 7, -1):
        try:
            probe = helper.make_model(g, ir_version=ir, opset_imports=[helper.make_opsetid("", 13)])
            ort.InferenceSession(probe.SerializeToString())
        except Exception:  # noqa: BLE001  too new for it: the next one down
            continue
        if ir == onnx.IR_VERSION:
            return
        make_model = helper.make_model

        def capped(graph, _make=make_model, _ir=ir, **kwargs):
            kwargs.setdefault("ir_version", _ir)
            return _make(graph, **kwargs)
        helper.make_model = capped
        return


_models_onnxruntime_loads()


@pytest.fixture(scope="session")
def device() -> str:
    """The device the dynashape side runs on: DYNASHAPE_TEST_DEVICE (CI has no GPU: cpu)."""
    import torch

    dev = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"DYNASHAPE_TEST_DEVICE={dev} but torch sees no CUDA device")
    return dev
