"""What a new input size costs beyond a repeated one: per model and runtime, the time of the first
call at a new size against the same size called again (issue 37).

Each model runs once at a warm-up size (the session's first call: its build, not a new size's
cost), then at ``--sizes`` new sizes, each called ``--repeats`` times with fresh random inputs (made
outside the timed call). Per size: first call / the fastest of the repeats; reported per model and
runtime: the median of these ratios, and the sum of first calls against the sum of steady ones.
One runtime at a time, the other's session deleted and collected, ``--threads`` threads each.
``--clock cpu`` times the process's CPU time instead of the wall clock: on a machine other
processes load, 2 OpenMP threads wait for each other descheduled and wall times swing 20x; run it
with OMP_WAIT_POLICY=PASSIVE so that waiting threads do not spin (their spin would count).

    python -m benchmarks.first_call_ratio [--sizes 12] [--repeats 3] [--threads 2]
        [--models ocr_det_v4,...] [--runtimes dynashape,onnxruntime] [--clock wall|cpu] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.real_models_specs import SPECS, fetch

# a model's size at index i (i = -1: the warm-up size, outside the measured ones); the same ranges
# as benchmarks/new_sizes.py (images 96-640 in steps of 32, text lines 64-632 wide, batches 1-47)


def _det(i: int, rng) -> tuple:
    if i < 0:
        return (1, 256, 256)
    return (1, int(rng.integers(3, 21)) * 32, int(rng.integers(3, 21)) * 32)


def _rec(i: int, rng) -> tuple:
    if i < 0:
        return (2, 48, 240)
    return (int(rng.integers(1, 48)), 48, int(rng.integers(8, 80)) * 8)


def _cls(i: int, rng) -> tuple:
    if i < 0:
        return (2, 48, 192)
    return (int(rng.integers(1, 48)), 48, 192)


SIZES = {"ocr_det_v4": _det, "ocr_rec_v4": _rec, "ocr_cls_v2": _cls, "nudenet_320n": _det}
MODELS = tuple(SIZES)


def points(name: str, n: int, seed: int) -> list[tuple]:
    """The warm-up point, then n distinct new points."""
    rng = np.random.default_rng(seed)
    out, seen = [SIZES[name](-1, rng)], set()
    while len(out) < n + 1:
        p = SIZES[name](len(out), rng)
        if p not in seen and p != out[0]:
            seen.add(p)
            out.append(p)
    return out


def _runner(runtime: str, path: Path, threads: int):
    if runtime == "dynashape":
        import torch

        import dynashape
        torch.set_num_threads(threads)
        sess = dynashape.InferenceSession(str(path), device="cpu")
        return (lambda feeds: sess.run(None, feeds)), sess
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return (lambda feeds: sess.run(None, feeds)), sess


def measure(name: str, runtime: str, a) -> dict:
    """Per size: the first call's ms and the repeats' ms, for one runtime."""
    spec = next(s for s in SPECS if s.name == name)
    pts = points(name, a.sizes, a.seed)
    rng = np.random.default_rng(a.seed + 1)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    run, sess = _runner(runtime, fetch(spec), a.threads)
    try:
        run(spec.make(rng, pts[0]))
        rows = []
        for p in pts[1:]:
            ms = []
            for _ in range(1 + a.repeats):
                feeds = spec.make(rng, p)
                t0 = clock()
                run(feeds)
                ms.append((clock() - t0) * 1e3)
            rows.append({"point": list(p), "first_ms": ms[0], "repeat_ms": ms[1:]})
        stats = sess.stats() if runtime == "dynashape" else {}
    finally:
        del run, sess
        gc.collect()
    ratios = [r["first_ms"] / min(r["repeat_ms"]) for r in rows]
    return {"rows": rows, "median_ratio": statistics.median(ratios),
            "sum_ratio": sum(r["first_ms"] for r in rows) / sum(min(r["repeat_ms"]) for r in rows),
            "first_total_ms": sum(r["first_ms"] for r in rows),
            "steady_total_ms": sum(min(r["repeat_ms"]) for r in rows),
            "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runtimes", default="dynashape,onnxruntime")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {}
    print(f"{'model':14} {'runtime':12} {'median first/steady':>20} {'sum first/steady':>17} "
          f"{'first ms':>9} {'steady ms':>10}")
    for name in a.models.split(","):
        out[name] = {}
        for rt in a.runtimes.split(","):
            r = out[name][rt] = measure(name, rt, a)
            print(f"{name:14} {rt:12} {r['median_ratio']:>20.2f} {r['sum_ratio']:>17.2f} "
                  f"{r['first_total_ms']:>9.0f} {r['steady_total_ms']:>10.0f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"sizes": a.sizes, "repeats": a.repeats, "threads": a.threads,
                                            "clock": a.clock, "seed": a.seed, "models": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
