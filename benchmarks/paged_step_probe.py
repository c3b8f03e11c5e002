"""Diagnostic (issue 39): the device time of the paged engine's captured step graphs by key (rows, new
positions) on the 12-layer decoder of llm_load.py, and the kernels of one prompt-chunk run (eager, on
padding rows, under torch.profiler): where a step with a prompt chunk spends its time.

    python benchmarks/paged_step_probe.py [--layers 12] [--profile 1 64]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import replay_us  # noqa: E402
from benchmarks.decode_graphs import config  # noqa: E402
from dynashape.paged.batch import padding_batch  # noqa: E402
from dynashape.paged.engine import PagedEngine  # noqa: E402
from tests.models import llama  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--profile", type=int, nargs=2, default=(1, 64), metavar=("ROWS", "NEW"))
    args = ap.parse_args()
    cfg = {**config(args.layers, "float32"), "mask_input": True, "position_ids": True}
    eng = PagedEngine(str(llama.model_path(cfg)), device="cuda", max_rows=64, token_budget=1024, chunk=256)
    for (b, _, s), k in sorted(eng.graphs.keys.items()):
        if not isinstance(k, str):
            print(f"rows {b:3d}, new {s:3d}: {replay_us(k.graph) / 1e3:.3f} ms a replay", flush=True)
    b, s = args.profile
    batch = padding_batch(eng.pool, b, s, eng.table_width)
    t = batch.tensors(eng.dev, eng._int, eng.io, scratch=eng.pool.scratch_slot)
    for _ in range(3):
        eng.body(eng.request, batch, t, ())
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        eng.body(eng.request, batch, t, ())
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
