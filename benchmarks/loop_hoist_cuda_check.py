"""The Loop-invariant hoisting (compile/hoist_loop_invariants.py) on a CUDA session: the tests' Loop
models (tests/compile/test_hoist_loop_invariants.py), flat and nested, over changing shapes and trip
counts against onnxruntime (CPU), and the session's fused graph checked to have hoisted. The pass
runs on CUDA sessions since this check passed on an H200 (2026-11-29); it is switched on here as well,
in case ``pipeline.HOIST_DEVICES`` leaves CUDA out again.

    python benchmarks/loop_hoist_cuda_check.py
"""

import os
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from dynashape.compile import pipeline  # noqa: E402
from tests.compile.test_hoist_loop_invariants import _feeds, _loop_model  # noqa: E402


def main() -> None:
    pipeline.HOIST_DEVICES = tuple({*pipeline.HOIST_DEVICES, "cuda"})
    for nested in (False, True):
        model = _loop_model(nested)
        sess = dynashape.InferenceSession(model.SerializeToString(), device="cuda")
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        worst = 0.0
        for feeds in _feeds(np.random.default_rng(2), [(2, 3), (1, 5), (3, 0), (2, 1), (4, 7)]):
            for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
                worst = max(worst, float(np.abs(np.asarray(got) - want).max()) if want.size else 0.0)
        g = sess.program.fused
        loop = next(n for n in g.nodes if n.op_type == "Loop")
        before = [n.op_type for n in g.nodes[:g.nodes.index(loop)]]
        # the body's product, fused to Linear on CUDA, and what reads it run before the Loop now
        ok = worst < 1e-4 and ("MatMul" in before or "Linear" in before)
        print(f"nested={nested}: max abs diff {worst:.2e}, hoisted before the Loop: {before}", "ok" if ok else "FAIL")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
