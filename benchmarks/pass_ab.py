"""Compile passes measured against their absence: sessions of one model, alternated call by call.

Each configuration is the compiled pipeline less some named passes (``compile/pipeline.py``'s
FUSION_PASSES and device passes); all its sessions live in one process and run the same feeds,
one call each in turn, the order reversed every other turn (A B B A: on this project's machine the
second of two sessions alternated in one order ran ~10% faster whichever it was). Reported per
configuration: the median and least of its calls, and the largest difference of its first output
from the first configuration's (the passes must not change results beyond rounding).

    python benchmarks/pass_ab.py MODEL SHAPE [--without a,b ...] [--calls 30] [--threads 2] [--json out.json]

MODEL is a name of benchmarks/real_models_specs.py (its .onnx in .cache/real_models or
.cache/generated); SHAPE its first input's shape (``6x3x48x320``), one of the spec's feeds.
``--without`` once per configuration, the full pipeline always first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import print_table, write_json  # noqa: E402


def _feeds(name: str, shape: tuple[int, ...]) -> dict:
    from benchmarks import real_models_specs as S
    spec = {s.name: s for s in list(S.SPECS) + list(S.GENERATED)}[name]
    for _, f in spec.feeds(0):
        if tuple(next(iter(f.values())).shape) == shape:
            return f
    raise SystemExit(f"{name} has no feed of shape {shape}")


def _session(path: str, without: set[str]):
    import dynashape
    from dynashape.compile import pipeline
    fusion, device_passes = list(pipeline.FUSION_PASSES), pipeline.device_passes
    pipeline.FUSION_PASSES[:] = [p for p in fusion if p[0] not in without]
    pipeline.device_passes = lambda d: [p for p in device_passes(d) if p[0] not in without]
    try:
        return dynashape.InferenceSession(path)
    finally:
        pipeline.FUSION_PASSES[:] = fusion
        pipeline.device_passes = device_passes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("shape")
    ap.add_argument("--without", action="append", default=[], help="comma-separated passes left out")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    found = [ROOT / ".cache" / d / f"{a.model}.onnx" for d in ("real_models", "generated")]
    path = next((str(p) for p in found if p.exists()), None)
    if path is None:
        raise SystemExit(f"no .cache/*/{a.model}.onnx (benchmarks/real_models.py --fetch-only)")
    feeds = _feeds(a.model, tuple(int(x) for x in a.shape.split("x")))
    configs = [set()] + [set(w.split(",")) for w in a.without]
    sessions = [_session(path, c) for c in configs]
    firsts = [np.array(s.run(None, feeds)[0], copy=True) for s in sessions]
    times: list[list[float]] = [[] for _ in sessions]
    for turn in range(a.calls):
        order = list(enumerate(sessions))
        for i, s in order if turn % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[i].append(time.perf_counter() - t0)
    rows, out = [], []
    for c, t, f in zip(configs, times, firsts):
        name = "all passes" if not c else "without " + ", ".join(sorted(c))
        diff = float(np.abs(f.astype(np.float64) - firsts[0]).max())
        rows.append([name, statistics.median(t) * 1e3, min(t) * 1e3, diff])
        out.append({"config": name, "median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3, "max_diff": diff})
    print_table(f"{a.model} {a.shape}, {a.calls} calls each, alternated", ["configuration", "median ms", "least ms",
                                                                          "max |diff|"], rows)
    write_json(a.json, {"model": a.model, "shape": a.shape, "threads": a.threads, "calls": a.calls, "configs": out})


if __name__ == "__main__":
    main()
