"""When a call's first kernel starts and how busy the GPU is within it (experiment): BERT-base on the
dynamic path (static impls off) and PyTorch eager at a few shapes after warm-up, one profiled call each
(torch.profiler, CPU and CUDA): the time from the call's start to its first kernel's start, the GPU's
busy time (the union of its kernels' intervals), the idle time between the first kernel and the last,
and the time from the last kernel's end to the call's return.

    python benchmarks/call_timeline.py [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gpu_header, write_json  # noqa: E402
from benchmarks.new_shapes_gpu import strict_bert  # noqa: E402

SHAPES = [(1, 16), (8, 128), (8, 256), (16, 256)]


def timeline(call, feeds) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function
    for _ in range(3):
        call(feeds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("CALL"):
            call(feeds)
        torch.cuda.synchronize()
    evs = prof.events()
    outer = next(e for e in evs if e.name == "CALL" and e.device_type == torch.autograd.DeviceType.CPU)
    ks = sorted((e.time_range.start, e.time_range.end) for e in evs
                if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "CALL")
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in ks:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    t0, t1 = outer.time_range.start, outer.time_range.end
    first, last = ks[0][0], max(e for _, e in ks)
    return {"call_us": t1 - t0, "to_first_kernel_us": first - t0, "gpu_busy_us": busy,
            "gpu_idle_within_us": (last - first) - busy, "after_last_kernel_us": t1 - last, "kernels": len(ks)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    module, path, names, make = strict_bert()
    g = torch.Generator().manual_seed(0)
    sess = dynashape.InferenceSession(path, device="cuda", static_impls="off")
    rows = []
    for s in SHAPES:
        f = make(s, g)
        for name, call in (("eager", lambda f: module(*f)),
                           ("dynashape", lambda f: sess.run(None, dict(zip(names, f))))):
            with torch.no_grad():
                r = {"runtime": name, "shape": list(s), **timeline(call, f)}
            rows.append(r)
            shown = {k: round(v) if isinstance(v, float) else v for k, v in r.items() if k not in ("runtime", "shape")}
            print(name, s, shown, flush=True)
    write_json(args.json, {**gpu_header(), "rows": rows})


if __name__ == "__main__":
    main()
