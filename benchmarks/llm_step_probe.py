"""Where a paged engine step's time goes (issue 39): the workload of llm_load.py driven step by step
in this thread (conversations join at steps, not seconds), under cProfile; the session's static
impl counters and the engine's host time by part.

    python benchmarks/llm_step_probe.py --device cuda [--layers 12] [--static-impls off] [--steps 400]
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
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--static-impls", default=None)
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--kernels", action="store_true", help="the device's kernels over 20 steps (torch.profiler)")
    args = ap.parse_args()
    cfg = {**(llama.TINY if args.tiny else config(args.layers, "float32")), "mask_input": True, "position_ids": True}
    path = str(llama.model_path(cfg))
    extra = {"static_impls": args.static_impls} if args.static_impls else {}
    eng = PagedEngine(path, device=args.device, max_rows=64, token_budget=1024, chunk=256, **extra)
    convs = workload(args.conversations, 0, (16, 512), (16, 512), cfg["vocab"], 0)
    for i, (_, p, n) in enumerate(convs):
        eng.add(i, p, n)
    for _ in range(30):  # first calls out of the profile
        eng.step()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.steps):
        if eng.idle:
            break
        eng.step()
    prof.disable()
    if args.device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    st = eng.stats()
    print(f"{args.steps} steps in {wall:.2f} s ({1e3 * wall / args.steps:.2f} ms a step); rows a run "
          f"{st['rows'] / st['runs']:.1f}")
    print({k: v for k, v in st.items() if "graph" in k or k.startswith("host") or k == "read_s"})
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    if args.kernels and not eng.idle:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(20):
                eng.step()
            torch.cuda.synchronize()
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
