"""tests/native_report.py's hooks, run by an inner pytest over a module whose tests skip for want
of a native build: counted in a summary line, or errors where CI is set (but not where the kernels
are off on purpose)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MODULE = '''
import pytest
from tests.native_report import NATIVE_SKIP

@pytest.mark.skipif(True, reason=f"{NATIVE_SKIP}: qgemm: no C compiler (cc, gcc or clang) on PATH")
def test_needs_a_build():
    pass

def test_skips_inside():
    pytest.skip(f"{NATIVE_SKIP}: qgemm: no C compiler (cc, gcc or clang) on PATH")

@pytest.mark.skipif(True, reason=f"{NATIVE_SKIP}: DYNASHAPE_NATIVE=0")
def test_off_on_purpose():
    pass

@pytest.mark.skipif(True, reason="needs a GPU")
def test_other_skip():
    pass

def test_runs():
    assert 1 + 1 == 2
'''


def _inner(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text("from tests.native_report import pytest_runtest_makereport, "
                                          "pytest_terminal_summary  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(MODULE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_without_ci_the_skips_are_summed_up(tmp_path):
    r = _inner(tmp_path, None)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 4 skipped" in r.stdout
    assert "3 native-kernel tests skipped" in r.stdout
    assert "    2 x no native build: qgemm: no C compiler (cc, gcc or clang) on PATH" in r.stdout
    assert "    1 x no native build: DYNASHAPE_NATIVE=0" in r.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_a_missing_build_is_an_error(tmp_path, ci):
    r = _inner(tmp_path, ci)
    assert r.returncode == 1, r.stdout + r.stderr
    # the skipif one fails in its setup (an error), the one that skips inside fails its call
    assert "1 failed, 1 passed, 2 skipped, 1 error" in r.stdout, r.stdout
    assert "CI is set, and CI machines have a C compiler" in r.stdout
    assert "1 native-kernel tests skipped" in r.stdout  # DYNASHAPE_NATIVE=0: still a skip
    assert "    1 x no native build: DYNASHAPE_NATIVE=0" in r.stdout
