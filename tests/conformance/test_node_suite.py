"""Every node test case of the installed onnx package, through dynashape's onnx backend.

A case must pass unless expected_failures.txt lists it (with its reason); a listed case that
passes fails the test too, so the list stays true. DYNASHAPE_TEST_DEVICE=cuda runs it on a GPU,
where expected_failures_cuda.txt adds the cases that fail only there.

Cases listed as "random" have expected data drawn from numpy's generators, which nothing else
reproduces: their values are not compared, their properties are (random_cases.py).
"""

from __future__ import annotations

import pytest

from tests.ops.harness import DEVICE

from .random_cases import check_random_case
from .suite import cases, expected_failures, run_case

CASES = cases()
EXPECTED = expected_failures(DEVICE)
RANDOM = sorted(name for name, reason in EXPECTED.items() if reason.startswith("random"))


def test_expected_failures_name_real_cases():
    names = {c.name for c in CASES}
    assert not set(EXPECTED) - names, f"listed but not in the suite: {sorted(set(EXPECTED) - names)}"
    assert all(EXPECTED.values()), "every expected failure needs a reason"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_node_case(case):
    if case.name in RANDOM:
        # the values are numpy's draws: a small output matches them by chance now and then, so
        # whether run_case passes says nothing; what the spec defines is checked instead
        check_random_case(case, DEVICE)
        return
    reason = run_case(case, DEVICE)
    if case.name in EXPECTED:
        assert reason is not None, f"{case.name} passes now: remove it from the expected-failure list"
    else:
        assert reason is None, reason


def test_random_cases_are_the_bernoulli_and_training_dropout_ones():
    # a new random case (or a listed case whose reason starts with "random" by mistake) must get a
    # property check in random_cases.py, which fails the case until it has one
    assert RANDOM and all(n.startswith(("test_bernoulli", "test_training_dropout")) for n in RANDOM), RANDOM
