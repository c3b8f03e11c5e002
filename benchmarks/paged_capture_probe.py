"""Diagnostic (issue 39): a paged engine decode step of the attention that reads the pool in place,
run eagerly under torch's sync debug mode, then captured alone with the traceback of a failure;
then eager steps profiled (cProfile) and timed.

    python benchmarks/paged_capture_probe.py [--layers 12] [--tiny]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.decode_graphs import config  # noqa: E402
from benchmarks.llm_load import workload  # noqa: E402
from dynashape.paged.engine import PagedEngine  # noqa: E402
from tests.models import llama  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    cfg = {**(llama.TINY if args.tiny else config(args.layers, "float32")), "mask_input": True, "position_ids": True}
    path = str(llama.model_path(cfg))
    eng = PagedEngine(path, device="cuda", max_rows=64, token_budget=4096, chunk=512, step_graphs=False,
                      static_impls="off")
    convs = workload(32, 0, (16, 200), (300, 400), cfg["vocab"], 0)
    for i, (_, p, n) in enumerate(convs):
        eng.add(i, p, n)
    for _ in range(5):
        eng.step()
    rows = [r for r in eng.scheduler.plan().rows]
    print("rows", len(rows), "decode", all(r.end - r.start == 1 for r in rows))
    eng.graphs = None
    batch = eng._batch(rows)
    t = batch.tensors(eng.dev, eng._int, eng.io, scratch=None)
    req = eng.model.session.create_infer_request()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eng.body(req, batch, t, eng.dense(batch))
        print("eager run: no sync")
    except Exception:
        traceback.print_exc()
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    for mode in ("thread_local", "relaxed"):
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, capture_error_mode=mode):
                eng.body(req, batch, t, eng.dense(batch))
            print(f"capture ({mode}): ok")
            break
        except Exception:
            print(f"capture ({mode}) failed:")
            traceback.print_exc()
            torch.cuda.synchronize()
    # eager steps, profiled
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    prof.enable()
    n = 0
    for _ in range(args.steps):
        if eng.idle:
            break
        eng.step()
        n += 1
    prof.disable()
    torch.cuda.synchronize()
    print(f"{n} eager steps: {1e3 * (time.perf_counter() - t0) / max(n, 1):.2f} ms a step")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
