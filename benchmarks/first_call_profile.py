"""Where the host time of a session's first calls at new batches goes: torch.profiler's CPU ops by
self time over ResNet-50's first call (batch 1) and its first call at each of three new batches,
on the dynamic path (static impls off), with the prior's convolution forms and without
(DYNASHAPE_FORM_PRIORS=0 in the environment). ``--eager-first``: eager runs each batch first, as
new_shapes_gpu.py's cycles find it (its cuDNN plans made in the process before the session's).

    python benchmarks/first_call_profile.py [--top 15] [--eager-first]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import model_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 3, 16])
    ap.add_argument("--eager-first", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    module, path, names, feeds = model_for("resnet_random", tempfile.mkdtemp())
    if args.eager_first:
        g = torch.Generator().manual_seed(1)
        with torch.inference_mode():
            for b in args.batches:
                for _ in range(2):
                    t0 = time.perf_counter()
                    module(*feeds((b,), g))
                    torch.cuda.synchronize()
                    print(f"== eager batch {b}: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    sess = dynashape.InferenceSession(path, device="cuda", static_impls="off")
    g = torch.Generator().manual_seed(0)
    from torch.profiler import ProfilerActivity, profile
    for b in args.batches:
        f = feeds((b,), g)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            sess.run(None, dict(zip(names, f)))
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        sess.run(None, dict(zip(names, f)))
        torch.cuda.synchronize()
        again = (time.perf_counter() - t0) * 1e3
        priors = os.environ.get("DYNASHAPE_FORM_PRIORS", "1")
        print(f"== priors {priors} batch {b}: first {ms:.1f} ms, again {again:.1f} ms")
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:args.top]
        for e in rows:
            print(f"  {e.self_cpu_time_total / 1e3:8.2f} ms self {e.count:5d}x  {e.key[:90]}")


if __name__ == "__main__":
    main()
