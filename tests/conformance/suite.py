"""Run the onnx package's node test cases through the backend and compare like onnx's runner.

``python -m tests.conformance.suite [--device cpu] [--json out.json] [--filter substr]`` prints
one line per failing case and the pass count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


def cases():
    with warnings.catch_warnings():  # generating the cases warns (divide by zero, casts) by design
        warnings.simplefilter("ignore")
        return sorted(collect_testcases(None), key=lambda c: c.name)


def expected_failures(device: str = "cpu") -> dict[str, str]:
    """name -> reason, from expected_failures.txt (and expected_failures_cuda.txt on CUDA)."""
    files = [HERE / "expected_failures.txt"]
    if device.startswith("cuda"):
        files.append(HERE / "expected_failures_cuda.txt")
    out = {}
    for f in files:
        for line in f.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, reason = line.partition(" ")
                out[name] = reason.strip()
    return out


HERE = Path(__file__).parent


def _normalize(x):
    if hasattr(x, "SerializeToString") and hasattr(x, "data_type"):
        return numpy_helper.to_array(x)
    return x


def assert_similar(ref, out, rtol: float, atol: float, where: str) -> None:
    """onnx's backend runner's rules (floats within rtol/atol with NaN == NaN, strings equal),
    with integers and bools exact, and sequences compared element by element at any depth
    (onnx's runner cannot compare a sequence of 0-d tensors)."""
    if isinstance(ref, (list, tuple)):
        assert isinstance(out, (list, tuple)), f"{where}: {type(out).__name__} given, a sequence expected"
        assert len(out) == len(ref), f"{where}: sequence of {len(out)}, {len(ref)} expected"
        for j, (r, o) in enumerate(zip(ref, out)):
            assert_similar(_normalize(r), o, rtol, atol, f"{where}[{j}]")
        return
    if ref is None:
        assert out is None, f"{where}: a value given, an empty optional expected"
        return
    assert isinstance(out, np.ndarray), f"{where}: {type(out).__name__} given, numpy array expected"
    assert out.shape == ref.shape, f"{where}: shape {out.shape}, {ref.shape} expected"
    if ref.dtype == object:
        np.testing.assert_array_equal(out, ref, err_msg=where)
        return
    assert out.dtype == ref.dtype, f"{where}: dtype {out.dtype}, {ref.dtype} expected"
    if ref.dtype.kind in "iub":
        np.testing.assert_array_equal(out, ref, err_msg=where)
    elif ref.dtype.kind in "fc":
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=where)
    else:  # ml_dtypes (bfloat16, float8, int4, ...): compare their values as float32
        wide_rtol = max(rtol, 2 ** -6) if ref.dtype.name == "bfloat16" else rtol
        np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=wide_rtol, atol=atol,
                                   err_msg=where)


def op_of(case) -> str:
    """The op a case tests: its single node's op; an _expanded case counts for the op it expands."""
    nodes = case.model.graph.node
    if case.name.endswith("_expanded") or len(nodes) != 1:
        return _EXPANDED_OPS.get(case.name.removesuffix("_expanded"), nodes[0].op_type if nodes else "?")
    return nodes[0].op_type


_EXPANDED_OPS: dict[str, str] = {}


def run_case(case, device: str = "cpu", trace: bool = False) -> str | None:
    """None when the case passes, else a one-line reason."""
    from dynashape.backend import DynashapeBackend
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = DynashapeBackend.prepare(case.model, device)
            for inputs, refs in case.data_sets:
                outs = rep.run([_normalize(x) for x in inputs])
                assert len(outs) == len(refs), f"{len(outs)} outputs, {len(refs)} expected"
                for k, (r, o) in enumerate(zip(refs, outs)):
                    assert_similar(_normalize(r), o, case.rtol, case.atol, f"output {k}")
    except AssertionError as e:
        if trace:
            traceback.print_exc()
        return "mismatch: " + " ".join(str(e).split())[:300]
    except Exception as e:  # noqa: BLE001 - the reason is what we report
        if trace:
            traceback.print_exc()
        return f"{type(e).__name__}: " + " ".join(str(e).split())[:300]
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--json")
    p.add_argument("--filter", default="")
    p.add_argument("--trace", action="store_true")
    a = p.parse_args(argv)
    results = {}
    t0 = time.perf_counter()
    all_cases = cases()
    _EXPANDED_OPS.update({c.name: c.model.graph.node[0].op_type for c in all_cases
                          if len(c.model.graph.node) == 1})
    for c in all_cases:
        if a.filter not in c.name:
            continue
        r = run_case(c, a.device, a.trace)
        results[c.name] = {"op": op_of(c), "error": r}
        if r is not None:
            print(f"FAIL {c.name}: {r}")
    n = len(results)
    ok = sum(r["error"] is None for r in results.values())
    print(f"{ok}/{n} passed in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            import onnx
            import torch
            json.dump({"device": a.device, "onnx": onnx.__version__, "torch": torch.__version__, "passed": ok,
                       "cases": n, "results": results}, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
