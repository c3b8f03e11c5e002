"""How long a first graph's capture holds a device-wide synchronisation (experiment): ResNet-50,
``static_impls="async"``, one bucket's first graph built (a) while the calling thread sleeps, (b)
while it calls back to back with stream-level waits, (c) with ``torch.cuda.synchronize()`` after each
call (what the benchmarks do): the build's warm and capture phases (stats) and the waits on the capture.

    python benchmarks/capture_phase.py [--json out.json]
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
from benchmarks.common import gpu_header, write_json  # noqa: E402
from benchmarks.new_shapes_gpu import _warm_libraries, model_for  # noqa: E402


def one(path, x, mode: str) -> dict:
    sess = dynashape.InferenceSession(path, device="cuda")
    sess.run(None, {"x": x})
    sess.run(None, {"x": x})  # the key came back: its first graph is queued
    t0, calls = time.perf_counter(), 0
    while sess.stats().get("static_builds", 0) < 1 and time.perf_counter() - t0 < 20:
        if mode == "idle":
            time.sleep(0.005)
            continue
        sess.run(None, {"x": x})
        calls += 1
        if mode == "device_sync":
            torch.cuda.synchronize()
        else:
            torch.cuda.current_stream().synchronize()
    st = sess.stats()
    keep = ("static_build_warm_s", "static_build_capture_s", "static_build_time_s", "syncs_waited_on_capture",
            "sync_wait_on_capture_s", "static_builds")
    out = {"mode": mode, "calls_meanwhile": calls, "landed_after_s": time.perf_counter() - t0,
           **{k: st.get(k) for k in keep}}
    del sess
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _warm_libraries()
    _, path, _, _ = model_for("resnet_cycle", tempfile.mkdtemp())
    x = torch.randn(8, 3, 224, 224, device="cuda")
    rows = [one(path, x, m) for m in ("idle", "stream_sync", "device_sync", "idle", "stream_sync", "device_sync")]
    for r in rows:
        print(r, flush=True)
    write_json(args.json, {**gpu_header(), "rows": rows})


if __name__ == "__main__":
    main()
