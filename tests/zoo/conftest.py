"""Fixtures of the generated zoo: the generation script as a module, the per-model stats.

The end of a run of tests/zoo/test_generated.py prints, per model, how far dynashape is from
onnxruntime and how far onnxruntime's default level is from its ORT_DISABLE_ALL level.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

STATS: dict[str, dict] = {}


def load_generator():
    """scripts/make_zoo_models.py as the module ``make_zoo_models`` (scripts/ is not a package)."""
    from benchmarks.real_models_specs import generator
    return generator()


def run_builder(d, precision: str):
    """onnxruntime-genai's model builder over the checkpoint ``d / "hf"`` (``-p precision -e cpu``, offline):
    the folder ``d / "out"``; its error's tail is the failure's message."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(d / "hf"), "-o",
                        str(d / "out"), "-p", precision, "-e", "cpu", "-c", str(d / "cache")],
                       cwd=d, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stderr or r.stdout)[-2000:]
    return d / "out"


@pytest.fixture(scope="session")
def zoo_model(request):
    """(name, path) of the generated model, made now when not cached. Skips only when a tool the
    chain needs is not installed; a tool that runs and fails is a failure."""
    g = load_generator()
    name = request.param
    try:
        return name, g.generate(name)
    except g.ToolUnavailable as e:
        pytest.skip(f"generation tool unavailable: {e}")
    except g.GenerationError as e:
        pytest.fail(f"generation failed: {e}", pytrace=False)


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
