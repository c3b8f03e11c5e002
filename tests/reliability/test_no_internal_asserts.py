"""No ``assert`` statement inside a function of the package (issue 35): an internal assertion on
the run path reached a user as ``ExecutionError: run failed: AssertionError: memo inputs are
group members``, and under ``python -O`` it would not even be checked. A condition a feed can
break gets a typed error, or a way around it that is counted in stats(); a module-level check
of the package's own tables at import is not on the run path and stays."""

from __future__ import annotations

import ast
from pathlib import Path

import dynashape

PACKAGE = Path(dynashape.__file__).parent


def _asserts_in_functions(tree: ast.AST) -> list[int]:
    lines = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines += [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Assert)]
    return sorted(set(lines))


def test_no_assert_statement_inside_a_function():
    found = []
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 100  # the package itself was found
    for path in files:
        for line in _asserts_in_functions(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    assert not found, f"assert statements on code paths (raise a typed error instead): {found}"


def test_the_check_finds_an_assert():
    src = "def f(x):\n    if x:\n        assert x > 1, 'no'\n    return x\nassert True\n"
    assert _asserts_in_functions(ast.parse(src)) == [3]
