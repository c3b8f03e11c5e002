"""Where a BERT-base call's time goes on the dynamic path (experiment): for a few shapes after warm-up,
per runtime, the wall time of a call, its host time (the time to queue it while the GPU is held busy
by a sleep kernel, so that the host never waits on the device: a host sync would show as the
sleep's length), its kernels' summed device time and their count. Runtimes: PyTorch eager, dynashape's
dynamic path (static impls off) with its split rule, and the same splitting products from 1,024 rows
(``split_tf32.AUTO_ROWS``). Then one call's host time by torch op (torch.profiler, CPU).

    python benchmarks/bert_host.py [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gpu_header, write_json  # noqa: E402
from benchmarks.gpu_bound import kernel_ms, wall_ms  # noqa: E402
from benchmarks.new_shapes_gpu import strict_bert  # noqa: E402
from dynashape.impls.tuning import hold_gpu  # noqa: E402
from dynashape.ops import split_tf32  # noqa: E402

SHAPES = [(1, 16), (4, 64), (8, 128), (8, 256), (16, 256), (32, 384)]


def host_ms(call, feeds, reps=7) -> float:
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        hold_gpu(40_000)
        t0 = time.perf_counter()
        call(feeds)
        ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return statistics.median(ts) * 1e3


def kernels(call, feeds) -> int:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call(feeds)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def cpu_table(call, feeds, top=25) -> str:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            call(feeds)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    module, path, names, make = strict_bert()
    g = torch.Generator().manual_seed(0)
    feeds = {s: make(s, g) for s in SHAPES}
    sess = dynashape.InferenceSession(path, device="cuda", static_impls="off")
    rows = []

    def ours(f):
        return sess.run(None, dict(zip(names, f)))

    def eager(f):
        with torch.no_grad():
            return module(*f)
    runs = [("eager", eager, None), ("dynashape", ours, 4096), ("dynashape split from 1,024 rows", ours, 1024)]
    for name, call, rows_rule in runs:
        if rows_rule is not None:
            split_tf32.AUTO_ROWS = rows_rule
        for s in SHAPES:
            for _ in range(3):
                call(feeds[s])
            r = {"runtime": name, "shape": list(s), "wall_ms": wall_ms(call, feeds[s]),
                 "host_ms": host_ms(call, feeds[s]), "kernel_ms": kernel_ms(call, feeds[s]),
                 "kernels": kernels(call, feeds[s])}
            rows.append(r)
            print(f"{name:32s} {str(s):10s} wall {r['wall_ms']:6.2f}  host {r['host_ms']:6.2f}  kernels "
                  f"{r['kernel_ms']:6.2f} ms ({r['kernels']})", flush=True)
    split_tf32.AUTO_ROWS = 4096
    table = cpu_table(ours, feeds[(8, 256)])
    print(table)
    eager_table = cpu_table(eager, feeds[(8, 256)], 12)
    print(eager_table)
    write_json(args.json, {**gpu_header(), "rows": rows, "cpu_table_8x256": table,
                           "eager_cpu_table_8x256": eager_table})


if __name__ == "__main__":
    main()
