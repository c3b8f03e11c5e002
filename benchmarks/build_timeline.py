"""When do a session's background builds land? Every call of a random-shape workload with the
session's build counters after it (static_builds, static_hits, build_wait_s), so that a build
that never lands within the workload shows (issue 36: ResNet-50's batch buckets at a random batch
on every call had landed none after 100 calls in every GPU run).

    python benchmarks/build_timeline.py --workload resnet_random --calls 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import _warm_libraries, model_for, shapes_for  # noqa: E402
from dynashape.ops import specialise  # noqa: E402

KEYS = ("static_builds", "static_builds_tuned", "static_hits", "static_misses", "build_wait_s", "static_build_warm_s",
        "static_build_capture_s", "static_refused")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="resnet_random")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models-dir", default="/tmp/models")
    ap.add_argument("--options", nargs="*", default=[], help="dynashape keyword options, k=v")
    ap.add_argument("--label", default="")
    ap.add_argument("--log", action="store_true", help="the compile worker's jobs as they end (logging)")
    ap.add_argument("--per-call", action="store_true", help="a line per call (with --log: beside the worker's jobs)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.log:
        logging.basicConfig(format="%(relativeCreated)8.0f ms %(threadName)s %(message)s")
        logging.getLogger("dynashape.impls.context").setLevel(logging.DEBUG)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.models_dir, exist_ok=True)
    _warm_libraries()
    shapes = shapes_for(args.workload, args.calls, args.seed)
    _, path, names, make = model_for(args.workload, args.models_dir)
    g = torch.Generator().manual_seed(args.seed + 1)
    feeds = [make(s, g) for s in shapes]
    options = dict(o.split("=", 1) for o in args.options)
    t_load = time.perf_counter()
    sess = dynashape.InferenceSession(path, device="cuda", **options)
    load_s = time.perf_counter() - t_load
    print(f"load {load_s:.2f} s", {k: v for k, v in sess.stats().items() if "disk_cache" in k})
    rows, t_start = [], time.perf_counter()
    for s, f in zip(shapes, feeds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sess.run(None, dict(zip(names, f)))
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        st = sess.stats()
        rows.append({"shape": list(s), "at_s": t0 - t_start, "ms": (t1 - t0) * 1e3,
                     "forms_timed": specialise.STATS["tuned"], "tune_s": specialise.STATS["tune_s"],
                     **{k: st.get(k, 0) for k in KEYS}})
        if args.per_call:
            r = rows[-1]
            logging.getLogger("timeline").warning("call %d %s: %.1f ms, hits %d, builds %d, tuned %d, forms %d",
                                                  len(rows) - 1, s, r["ms"], r["static_hits"], r["static_builds"],
                                                  r["static_builds_tuned"], r["forms_timed"])
    for i in range(0, len(rows), 10):
        chunk = rows[i:i + 10]
        print(f"calls {i:3d}-{i + len(chunk) - 1:3d} at {chunk[0]['at_s']:6.2f}s: "
              f"{sum(r['ms'] for r in chunk):8.1f} ms  builds {chunk[-1]['static_builds']:3d}  "
              f"tuned {chunk[-1]['static_builds_tuned']:3d}  hits {chunk[-1]['static_hits']:4d}  "
              f"forms timed {chunk[-1]['forms_timed']:4d} in {chunk[-1]['tune_s']:.2f} s")
    last = rows[-1]
    ctx = sess.compiled.context if sess.compiled is not None else None
    pending = ctx.pending() if ctx is not None else 0
    t0 = time.perf_counter()
    if ctx is not None:
        ctx.wait(120)
    idle_s = time.perf_counter() - t0
    st = sess.stats()
    print({k: last[k] for k in KEYS}, f"pending {pending}; with no calls they landed in {idle_s:.2f} s:",
          {k: st.get(k, 0) for k in KEYS})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "label": args.label, "options": options,
                       "load_s": load_s,
                       "pending_at_end": pending, "idle_wait_s": idle_s, "after_idle": {k: st.get(k, 0) for k in KEYS},
                       "env": {k: v for k, v in os.environ.items() if k.startswith("DYNASHAPE")}, "rows": rows}, fh)


if __name__ == "__main__":
    main()
