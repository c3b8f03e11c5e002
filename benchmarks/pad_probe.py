"""Padded calls (runtime/padded_calls.py) on CUDA, one shape at a time (experiment): BERT-base at a
few (batch, seq), each padded to its bucket; per shape the median call (synchronised) of PyTorch eager,
the dynamic path unpadded (pad_inputs='off', static impls off), the padded call with its graph built
in the call (static_impls='sync', the first graph untimed as a background build makes it), and with
the builds on the worker waited for (async: the first graph, then its tuned rebuild once the calls
pause); and each runtime's error against eager.

    python benchmarks/pad_probe.py [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone, gpu_header, write_json  # noqa: E402
from benchmarks.new_shapes_gpu import strict_bert  # noqa: E402

SHAPES = [(3, 20), (7, 100), (13, 200), (23, 172), (9, 378), (3, 200)]


def median_ms(fn, reps=15) -> float:
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2] * 1e3


def probe(name: str, opts: dict, path, names, feeds, refs, rows) -> None:
    sess = dynashape.InferenceSession(path, device="cuda", **opts)
    for s in SHAPES:
        def call(s=s):
            return sess.run(None, dict(zip(names, feeds[s])))[0]
        out = call()
        if name == "padded_async":
            sess.compiled.context.wait()  # the first graph
            time.sleep(1.0)  # a pause: the tuned rebuild begins
            sess.compiled.context.wait()
            out = call()
        rows[s][f"{name}_err"] = float((out - refs[s]).norm() / refs[s].norm())
        rows[s][f"{name}_ms"] = median_ms(call)
    st = sess.stats()
    print(name, {k: st.get(k) for k in ("padded_calls", "static_hits", "static_builds", "static_refused",
                                        "static_build_time_s", "static_bytes", "padding", "split_tf32_products")})
    if sess.compiled.refusals:
        print("  refusals:", list(sess.compiled.refusals))


def eager(model, feeds, rows) -> dict:
    with torch.no_grad():
        refs = {s: model(*feeds[s]) for s in SHAPES}
        for s in SHAPES:
            rows[s]["eager_ms"] = median_ms(lambda s=s: model(*feeds[s]))
    return refs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    model, path, names, make = strict_bert()
    g = torch.Generator().manual_seed(0)
    feeds = {s: make(s, g) for s in SHAPES}
    rows = {s: {"shape": list(s)} for s in SHAPES}
    refs = eager(model, feeds, rows)
    del model
    gone()
    for name, opts in [("dynamic", dict(pad_inputs="off", static_impls="off")),
                       ("padded_sync", dict(static_impls="sync")), ("padded_async", dict(static_impls="async"))]:
        probe(name, opts, path, names, feeds, refs, rows)
        gone()
    print(f"{'shape':>10} {'eager':>8} {'dynamic':>8} {'pad sync':>9} {'pad async':>10}   errors")
    for s in SHAPES:
        r = rows[s]
        print(f"{str(s):>10} {r['eager_ms']:8.2f} {r['dynamic_ms']:8.2f} {r['padded_sync_ms']:9.2f} "
              f"{r['padded_async_ms']:10.2f}   {r['dynamic_err']:.1e} {r['padded_sync_err']:.1e} "
              f"{r['padded_async_err']:.1e}")
    write_json(args.json, {**gpu_header(), "rows": list(rows.values())})


if __name__ == "__main__":
    main()
