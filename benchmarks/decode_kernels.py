"""The kernels of one streaming decode step (experiment): the 12-layer hidden-768 decoder of
benchmarks/generate_gpu.py through ``dynashape.generate``, after two warm generations; torch.profiler
over ``--steps`` steps, each kernel's calls a step and mean time, the step's summed kernel time and its
wall time. What a step's floor is made of, where it is bound by its kernels.

    python benchmarks/decode_kernels.py [--dtype float32] [--batch 1] [--folder BUILDER_FOLDER] [--json out.json]

``--folder``: a model folder (onnxruntime-genai's builder) instead of the 12-layer decoder.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import gpu_header, write_json  # noqa: E402
from benchmarks.generate_builder_gpu import loop  # noqa: E402
from benchmarks.generate_gpu import model_folder, steps_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--folder")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.folder:
        import dynashape.generate as dg
        model, vocab = dg.Model(args.folder, device="cuda"), 200
    else:
        model, cfg = model_folder(args.dtype)
        vocab = cfg["vocab"]
    prompt = np.random.default_rng(0).integers(4, vocab, (args.batch, 8)).tolist()
    for _ in range(2):
        t = steps_of(loop(model, prompt, 240))
    wall = sorted(t[1:])[len(t[1:]) // 2]
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in loop(model, prompt, args.steps):
            pass
        torch.cuda.synchronize()
    rows = [(e.key, e.count / args.steps, e.device_time_total / max(e.count, 1))
            for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA and e.count]
    rows.sort(key=lambda r: -r[1] * r[2])
    per_step = sum(c * us for _, c, us in rows)
    print(f"{args.dtype} batch {args.batch}: median step {wall * 1e3:.3f} ms, kernels a step "
          f"{sum(c for _, c, _ in rows):.0f}, their time {per_step / 1e3:.3f} ms")
    for name, c, us in rows:
        print(f"  {c:6.1f} x {us:7.2f} us  {name[:110]}")
    if args.json:
        write_json(args.json, {**gpu_header(), "dtype": args.dtype, "batch": args.batch, "median_step_ms": wall * 1e3,
                               "kernels": [{"name": n, "per_step": c, "mean_us": us} for n, c, us in rows]})
    time.sleep(0)


if __name__ == "__main__":
    main()
