"""Every C kernel in ops/csrc builds wherever a C compiler is found: for this CPU, and (on x86) for
AVX2 and plain x86-64 ones. The kernels' own tests skip where no build exists, so a source that no
longer compiles would otherwise pass CI as skips while every op quietly ran its torch path."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import pytest

from dynashape.ops import native
from tests.native_report import NATIVE_SKIP, OFF_ON_PURPOSE

SOURCES = sorted(p.stem for p in (Path(native.__file__).parent / "csrc").glob("*.c"))
COMPILER = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(COMPILER is None or not native.enabled(), reason=f"{NATIVE_SKIP}: " + (
    OFF_ON_PURPOSE if not native.enabled() else "no C compiler (cc, gcc or clang) on PATH"))


def test_the_sources_are_there():
    assert {"attention", "dq_lstm", "elementwise", "lstm", "lut", "qgemm"} <= set(SOURCES)


@pytest.mark.parametrize("name", SOURCES)
def test_builds_for_this_cpu(name):
    assert native.library(name) is not None, native.why(name)


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
@pytest.mark.parametrize("name", SOURCES)
def test_builds_for_other_x86_cpus(tmp_path, name, arch):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 builds")
    native.build(name, arch=arch, cache=tmp_path)  # OSError with the compiler's message if it fails
