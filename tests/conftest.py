"""Fixtures shared by the test packages."""

from __future__ import annotations

import os

import pytest

# skips of the native-kernel tests: summed up at the end of the run, errors where CI is set
from tests.native_report import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401


@pytest.fixture(scope="session")
def device() -> str:
    """The device the dynashape side runs on: DYNASHAPE_TEST_DEVICE (CI has no GPU: cpu)."""
    import torch

    dev = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"DYNASHAPE_TEST_DEVICE={dev} but torch sees no CUDA device")
    return dev
