"""The bad-input table (cases.py): each case gives its typed error with the words it must say, or
onnxruntime's answer for odd-but-valid input; the session is correct afterwards; nothing is
allocated for an absurd size. Both executors."""

from __future__ import annotations

import pytest

from .cases import all_cases
from .table import run_case

CASES = all_cases()


def test_the_table_has_at_least_100_cases():
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("executor", ["compiled", "interpreter"])
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case, executor, device):
    out = run_case(case, executor, device)
    assert out.passed, f"{case.id}: {out.why} (got {out.got}: {out.message}; afterwards {out.after})"
