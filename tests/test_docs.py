import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_operators_doc_matches_registry():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_operators_doc.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_readme_starts_with_the_two_commands():
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    block = "\n".join(lines[:6])
    assert "dynashape demo" in block and "pytest" in block
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    test_cmd = next(line.split("#")[0].strip() for line in lines[:6] if "pytest" in line)
    assert test_cmd in ci  # CI runs the README's test command, as written


def test_recorded_conformance_run_agrees_with_expected_failures():
    """docs/conformance_cpu.json (what operators.md reports) must be a run of the current list."""
    import json

    from tests.conformance.suite import expected_failures
    run = json.load(open(os.path.join(ROOT, "docs", "conformance_cpu.json")))
    failed = {name for name, r in run["results"].items() if r["error"] is not None}
    assert failed == set(expected_failures("cpu")), "re-record: python -m tests.conformance.suite --json " \
                                                     "docs/conformance_cpu.json"


def test_options_doc_lists_every_option_and_variable():
    """docs/options.md is generated from dynashape/options.py, which test_options_table.py holds to
    exactly the options the session takes and the variables the package reads."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_options_doc.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
