"""Where a whole-step decode's time goes: the host's time per ``run``, the replayed graph's GPU
time alone, and the kernels in one step (torch.profiler), for the Llama-style decoder.

    python benchmarks/profile_decode.py [--layers 12] [--batch 1] [--dtype float32]
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
from benchmarks.decode_graphs import config  # noqa: E402
from tests.models import llama  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = config(args.layers, args.dtype)
    names = llama.input_names(cfg)
    sess = dynashape.InferenceSession(str(llama.model_path(cfg)), device="cuda")
    dt = llama.dtype_of(cfg)
    past = [torch.zeros(args.batch, 4, 0, 64, dtype=dt, device="cuda") for _ in range(2 * cfg["layers"])]
    tok = torch.randint(0, cfg["vocab"], (args.batch, 16), device="cuda")
    host, full = [], []
    for i in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = sess.run(None, dict(zip(names, [tok, *past])))
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i > 4:
            host.append(t1 - t0)
            full.append(t2 - t0)
        past, tok = out[1:], out[0][:, -1:].argmax(-1)
    decs = [st.step for st in sess._default.runner.states.values() if st.step is not None]
    print({k: v for k, v in sess.stats().items() if k.startswith("decode_graph")}, list(sess.compiled.refusals))
    impl = next(b.impl for d in decs for b in d.buckets.values() if b.impl is not None)
    reps = []
    for _ in range(50):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        impl.graph.replay()
        torch.cuda.synchronize()
        reps.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        impl.graph.replay()
    torch.cuda.synchronize()
    back = (time.perf_counter() - t0) / 50
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):  # a decode loop as users write it: no sync between steps
        out = sess.run(None, dict(zip(names, [tok, *past])))
        past, tok = out[1:], out[0][:, -1:].argmax(-1)
    torch.cuda.synchronize()
    loop = (time.perf_counter() - t0) / 50
    print(f"per step: run() host {statistics.median(host) * 1e3:.3f} ms, "
          f"run() + sync {statistics.median(full) * 1e3:.3f} ms, graph replay alone "
          f"{statistics.median(reps) * 1e3:.3f} ms, replays back to back {back * 1e3:.3f} ms,"
          f" decode loop {loop * 1e3:.3f} ms", flush=True)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            out = sess.run(None, dict(zip(names, [tok, *past])))
            past, tok = out[1:], out[0][:, -1:].argmax(-1)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
