"""docs/benchmarks.md is generated from the results files (scripts/gen_benchmarks_doc.py)."""

import importlib.util
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _gen():
    spec = importlib.util.spec_from_file_location(
        "gen_benchmarks_doc", os.path.join(ROOT, "scripts", "gen_benchmarks_doc.py")
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_doc_is_what_the_script_writes():
    with open(os.path.join(ROOT, "docs", "benchmarks.md")) as f:
        assert f.read() == _gen().render(), "regenerate: python scripts/gen_benchmarks_doc.py"


def test_every_area_has_rows_with_a_date_and_device():
    gen = _gen()
    for area in gen.AREAS:
        runs = [gen.newest(p, x) for p, x in area.files]
        rows = area.rows(runs)
        assert rows, area.title
        for row in rows:
            assert len(row) == len(area.columns), (area.title, row)
            assert "?" not in row[-1], (area.title, row)  # every row names its run's date and device


def test_newest_file_by_date_then_letter():
    gen = _gen()
    order = [
        gen.Run(n, {}).order
        for n in ("x_cpu_2026-11-25.json", "x_cpu_2026-11-26.json", "x_cpu_2026-11-26b.json", "x_cpu_2026-11-26l.json")
    ]
    assert order == sorted(order)
    # the date in the file wins over its name; a file with neither takes the one recorded for it
    assert gen.Run("y_2026-11-20.json", {"env": {"date": "2026-11-27"}}).date == "2026-11-27"
    assert gen.Run("overhead_cuda.json", {}).date == "2026-11-23"
    assert gen.Run("serving_gpu_h200x2.json", {}).device == "2 x NVIDIA H200"
