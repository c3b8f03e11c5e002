"""Where a call's wall time goes on the GPU at shapes that never repeat: the host's time until
``run`` returns (no sync) against the call's wall time (synchronised), per call, and a cProfile of
the host's side over the calls. BERT-base at a random (batch, seq) per call, as new_shapes_gpu.py.

    python benchmarks/host_split_gpu.py --calls 60 [--options static_impls=off] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import model_for, shapes_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="bert_random")
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--options", nargs="*", default=[])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--trace", action="store_true", help="torch.profiler over a third of the calls: the CUDA "
                    "runtime calls (launches, mallocs, syncs) the host's time goes to")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    opts = dict(o.split("=", 1) for o in args.options)
    model, path, names, make = model_for(args.workload, tempfile.mkdtemp())
    g = torch.Generator().manual_seed(1)
    shapes = shapes_for(args.workload, args.calls, 1)
    feeds = [make(s, g) for s in shapes]
    sess = dynashape.InferenceSession(path, device="cuda", **opts)
    rows = []
    prof = cProfile.Profile() if args.profile else None
    tp = None
    for i, (s, f) in enumerate(zip(shapes, feeds)):
        torch.cuda.synchronize()
        if prof is not None and i == args.calls // 3:
            prof.enable()
        if args.trace and i == args.calls // 3:
            from torch.profiler import ProfilerActivity, profile
            tp = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            tp.__enter__()
        if tp is not None and i == 2 * args.calls // 3:
            tp.__exit__(None, None, None)
            print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))
        t0 = time.perf_counter()
        sess.run(None, dict(zip(names, f)))
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        rows.append((s, t1 - t0, t2 - t0))
    if prof is not None:
        prof.disable()
    for s, h, w in rows:
        print(f"{'x'.join(map(str, s)):>8}  host {h * 1e3:7.2f} ms  wall {w * 1e3:7.2f} ms")
    st = sess.stats()
    with torch.no_grad():  # eager's host time against its wall time at the same shapes
        for s, f in list(zip(shapes, feeds))[:20]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(*f)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            print(f"eager {'x'.join(map(str, s)):>8}  host {(t1 - t0) * 1e3:7.2f} ms  wall {wall * 1e3:7.2f} ms")
    print({k: v for k, v in st.items() if "host_sync" in k or "group" in k or "static_b" in k or "plans" in k})
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    if sess.compiled is not None:
        for st in sess._default.runner.states.values():
            print("regions", len(st.spec.regions), "static ones", sum(r.region.static for r in st.spec.regions))


if __name__ == "__main__":
    main()
