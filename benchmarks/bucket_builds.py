"""When do ResNet-50's batch-bucket graphs arrive, and what does each build cost? (diagnosis)

A fresh session at default options (CUDA static impls async, batch buckets on) serves ``--calls``
calls at a random batch 1-32; after each call the number of static impls built so far is read, so
the call at which each bucket's graph lands is known. Then the builds still queued are waited for,
the build time is split into its phases (``static_build_warm_s``: the region's run on scratch
live-ins with the forms' timing, Triton compiles and the handles; ``static_build_capture_s``), and
the same calls run again on the now-warm session against eager's warm time at each batch: what the
bucketed graphs give once they exist. A second fresh session in the same process repeats the first
pass (its builds find Triton's kernels and the library handles made).

    python benchmarks/bucket_builds.py [--calls 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import model_for, shapes_for  # noqa: E402


def timed(call, feeds) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call(feeds)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def session_pass(path, names, feed_list, options) -> dict:
    sess = dynashape.InferenceSession(path, device="cuda", **options)
    run = lambda f: sess.run(None, dict(zip(names, f)))  # noqa: E731
    t_start = time.perf_counter()
    times, landed = [], []
    for f in feed_list:
        times.append(timed(run, f))
        n = sess.stats().get("static_builds", 0)
        if n > len(landed):
            landed += [(len(times), round(time.perf_counter() - t_start, 3))] * (n - len(landed))
    first_pass_s = time.perf_counter() - t_start
    ctx = sess.compiled.context
    t0 = time.perf_counter()
    if ctx is not None:
        ctx.wait(120)
    waited = time.perf_counter() - t0
    again = [timed(run, f) for f in feed_list]
    st = sess.stats()
    keep = ("static_builds", "static_build_time_s", "static_build_warm_s", "static_build_capture_s", "static_hits",
            "static_misses", "static_refused", "build_wait_s", "static_bytes", "static_builds_aligned")
    out = {"times_s": times, "landed_at_call_and_s": landed, "first_pass_s": first_pass_s,
           "waited_after_s": waited, "again_times_s": again, "stats": {k: st.get(k) for k in keep},
           "refusals": list(sess.compiled.refusals)}
    sess = None
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tmp = tempfile.mkdtemp()
    model, path, names, feeds = model_for("resnet_random", tmp)
    g = torch.Generator().manual_seed(0)
    shapes = shapes_for("resnet_random", args.calls, 1)
    feed_list = [feeds(s, g) for s in shapes]
    with torch.inference_mode():
        for f in feed_list:
            model(*f)  # every batch seen: eager's warm time per call below
        eager = [timed(lambda f: model(*f), f) for f in feed_list]
    model = None
    gc.collect()
    torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "shapes": shapes,
           "eager_warm_times_s": eager}
    for name in ("first_session", "second_session"):
        r = out[name] = session_pass(path, names, feed_list, {})
        print(f"{name}: first pass {sum(r['times_s']):.3f} s (eager warm {sum(eager):.3f}), builds landed at "
              f"(call, s) {r['landed_at_call_and_s']}, then waited {r['waited_after_s']:.2f} s; again "
              f"{sum(r['again_times_s']):.3f} s = {sum(eager) / sum(r['again_times_s']):.2f}x eager warm", flush=True)
        print("  ", r["stats"], r["refusals"][:3], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
