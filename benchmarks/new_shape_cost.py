"""What a call at a shape never seen costs beyond the same call repeated (experiment): BERT-base on
CUDA at shapes of 1,024-4,096 tokens, where the random workload (new_shapes_gpu.py) gains least over
eager. For each shape: the first call and its repeat (wall, synchronised), eager's likewise; then
cProfile's functions by own time over further first calls and over their repeats, and one first
call's and one repeat's kernels (torch.profiler: launches, kernel time).

    python benchmarks/new_shape_cost.py [--shapes 16] [--top 25] [--json FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import _warm_libraries, model_for  # noqa: E402


def _shapes(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < n:
        b, s = int(torch.randint(1, 33, (1,), generator=g)), int(torch.randint(8, 385, (1,), generator=g))
        if 1024 <= b * s < 4096 and (b, s) not in out:
            out.append((b, s))
    return out


def _timed(f):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _profile(calls, top):
    prof = cProfile.Profile()
    prof.enable()
    for c in calls:
        c()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def _kernels(f):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as p:
        f()
        torch.cuda.synchronize()
    ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels": len(ev), "kernel_ms": sum(e.device_time for e in ev) / 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _warm_libraries()
    module, path, names, make = model_for("bert_random", tempfile.mkdtemp())
    g = torch.Generator().manual_seed(5)
    shapes = _shapes(3 * args.shapes + 2, 11)
    feeds = [make(s, g) for s in shapes]
    sess = dynashape.InferenceSession(path, device="cuda", static_impls="off")
    run = [lambda f=f: sess.run(None, dict(zip(names, f))) for f in feeds]
    eager = [lambda f=f: module(*f) for f in feeds]
    rows = []
    with torch.no_grad():
        run[0](), eager[0]()
        for i in range(1, args.shapes + 1):
            rows.append({"shape": shapes[i], "new_s": _timed(run[i]), "repeat_s": _timed(run[i]),
                         "eager_new_s": _timed(eager[i]), "eager_repeat_s": _timed(eager[i])})
            print(rows[-1], flush=True)
        fresh = run[args.shapes + 1:2 * args.shapes + 1]
        new_prof = _profile(fresh, args.top)
        rep_prof = _profile(fresh, args.top)
        k_new = _kernels(run[-1])
        k_rep = _kernels(run[-1])
    tot = {k: sum(r[k] for r in rows) for k in ("new_s", "repeat_s", "eager_new_s", "eager_repeat_s")}
    print("totals", tot)
    print("kernels of a first call", k_new, "of its repeat", k_rep)
    print("== first calls, by own time\n" + new_prof)
    print("== their repeats, by own time\n" + rep_prof)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "totals": tot, "kernels_new": k_new, "kernels_repeat": k_rep,
                       "profile_new": new_prof, "profile_repeat": rep_prof}, f, indent=1)


if __name__ == "__main__":
    main()
