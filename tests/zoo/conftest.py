"""Fixtures of the generated zoo: the generation script as a module, the device, the per-model stats.

The end of a run of tests/zoo/test_generated.py prints, per model, how far dynashape is from
onnxruntime and how far onnxruntime's default level is from its ORT_DISABLE_ALL level.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_zoo_models.py"
STATS: dict[str, dict] = {}


def load_generator():
    """scripts/make_zoo_models.py as the module ``make_zoo_models`` (scripts/ is not a package)."""
    mod = sys.modules.get("make_zoo_models")
    if mod is None:
        spec = importlib.util.spec_from_file_location("make_zoo_models", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["make_zoo_models"] = mod
        spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def device() -> str:
    import torch

    dev = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"DYNASHAPE_TEST_DEVICE={dev} but torch sees no CUDA device")
    return dev


@pytest.fixture(scope="session")
def zoo_stats() -> dict[str, dict]:
    return STATS


def pytest_terminal_summary(terminalreporter):
    if not STATS:
        return
    tr = terminalreporter
    tr.section("generated zoo: max |difference| over all steps and outputs")
    tr.write_line(f"{'model':16s} {'steps':>5s} {'dyn-vs-ort':>11s} {'dyn-vs-noopt':>12s} {'ort-vs-noopt':>12s}"
                  f"  {'|ort| max':>9s}  status")
    for name, s in sorted(STATS.items()):
        def f(k, s=s):
            v = s.get(k)
            return "-" if v is None else f"{v:.3g}"

        tr.write_line(f"{name:16s} {s.get('steps', 0):5d} {f('dyn'):>11s} {f('dyn_noopt'):>12s} {f('ort_gap'):>12s}"
                      f"  {f('scale'):>9s}  {s.get('status', '')}")
