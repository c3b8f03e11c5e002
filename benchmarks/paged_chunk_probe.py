"""Diagnostic (issue 39): where the paged engine's prompt-chunk runs (eager, on the session's dynamic
path) spend their host time: 64 conversations arriving at once, the first steps (every prompt's
chunks) under cProfile, the session's host-sync counters, and one chunk run timed with and without
a device synchronisation before it.

    python benchmarks/paged_chunk_probe.py [--layers 12]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.decode_graphs import config  # noqa: E402
from benchmarks.llm_load import workload  # noqa: E402
from dynashape.paged.engine import PagedEngine  # noqa: E402
from tests.models import llama  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    cfg = {**config(args.layers, "float32"), "mask_input": True, "position_ids": True}
    eng = PagedEngine(str(llama.model_path(cfg)), device="cuda", max_rows=64, token_budget=1024, chunk=256)
    convs = workload(64, 0, (16, 512), (16, 512), cfg["vocab"], 0)
    for rnd in range(2):
        for i, (_, p, n) in enumerate(convs):
            eng.add((rnd, i), p, n)
        t0 = time.perf_counter()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(25):
            eng.step()
        prof.disable()
        torch.cuda.synchronize()
        c = eng.counters
        print(f"round {rnd}: 25 steps {1e3 * (time.perf_counter() - t0) / 25:.2f} ms a step; chunk runs "
              f"{c['chunk_runs']}, their host time {c['host_chunk_s']:.3f} s")
        while not eng.idle:
            eng.step()
    st = eng.request.stats()
    print({k: v for k, v in st.items() if "sync" in k or "specializ" in k or "trace" in k})
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
