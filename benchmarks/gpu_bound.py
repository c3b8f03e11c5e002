"""How far is a call from its kernels? Wall time against the GPU's own kernel time, per shape.

For ResNet-50 and BERT-base (benchmarks/new_shapes_gpu.py's models, strict fp32), at a few shapes
after warm-up: PyTorch eager's wall time per call, the summed device time of the kernels it
launches (torch.profiler), and the same for dynashape once its static impls for the shape are built
(``static_impls="sync"``: the timed calls replay them). When dynashape's wall time is its kernel
time and its kernels take as long as eager's, the call is bound by the kernels, not by the host:
no amount of launch-overhead removal makes it faster than eager's kernel time, and the ceiling on
``eager wall / dynashape wall`` is ``eager wall / eager kernel time``.

    python benchmarks/gpu_bound.py [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import model_for  # noqa: E402

SHAPES = {"resnet": [(1,), (4,), (8,), (16,), (32,)],
          "bert": [(1, 16), (4, 64), (8, 128), (16, 256), (32, 384)]}


def wall_ms(call, feeds, reps=10) -> float:
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(feeds)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def kernel_ms(call, feeds, reps=5) -> float:
    """Summed device time of everything the calls ran on the GPU, per call."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call(feeds)
        torch.cuda.synchronize()
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / reps / 1e3


def measure(name: str, call, feed_list) -> list:
    rows = []
    for shape, feeds in feed_list:
        for _ in range(3):
            call(feeds)
        rows.append({"shape": list(shape), "wall_ms": wall_ms(call, feeds), "kernel_ms": kernel_ms(call, feeds)})
        r = rows[-1]
        print(f"{name:10s} {str(shape):12s} wall {r['wall_ms']:7.2f} ms  kernels {r['kernel_ms']:7.2f} ms", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--models", nargs="+", default=["resnet", "bert"])
    ap.add_argument("--static", default="sync", help="dynashape's static_impls ('off': the dynamic path's wall time)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "static_impls": args.static}
    tmp = tempfile.mkdtemp()
    g = torch.Generator().manual_seed(0)
    for m in args.models:
        model, path, names, feeds = model_for(m + "_random", tmp)
        feed_list = [(s, feeds(s, g)) for s in SHAPES[m]]
        with torch.inference_mode():
            eager = measure("eager", lambda f, model=model: model(*f), feed_list)
        model = None  # eager's module gone before dynashape is timed
        gc.collect()
        torch.cuda.empty_cache()
        sess = dynashape.InferenceSession(path, device="cuda", static_impls=args.static)
        ours = measure("dynashape", lambda f, sess=sess, names=names: sess.run(None, dict(zip(names, f))), feed_list)
        out[m] = {"eager": eager, "dynashape": ours}
        for e, d in zip(eager, ours):
            print(f"{m} {e['shape']}: eager wall/kernels {e['wall_ms'] / e['kernel_ms']:.2f}, "
                  f"dynashape wall/kernels {d['wall_ms'] / d['kernel_ms']:.2f}, "
                  f"kernels dynashape/eager {d['kernel_ms'] / e['kernel_ms']:.2f}, "
                  f"speed-up {e['wall_ms'] / d['wall_ms']:.2f}, ceiling {e['wall_ms'] / d['kernel_ms']:.2f}")
        sess = None
        gc.collect()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
