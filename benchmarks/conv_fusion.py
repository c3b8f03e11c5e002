"""Is a cuDNN fused convolution (+ bias + ReLU, + residual add) faster than the convolution and
its element-wise epilogue as separate kernels? ResNet-50's convolution shapes, fp32 (TF32 off),
each variant captured in a CUDA graph and replayed (host cost out), cudnn.benchmark on.

    python benchmarks/conv_fusion.py [--batches 1,8,16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import graph_us  # noqa: E402

# (in channels, out channels, kernel, stride, spatial size of the input): ResNet-50's distinct convs
_SHAPES = [(64, 64, 1, 1, 56), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56), (256, 64, 1, 1, 56),
           (256, 128, 1, 1, 56), (128, 128, 3, 2, 56), (128, 512, 1, 1, 28), (512, 128, 1, 1, 28),
           (128, 128, 3, 1, 28), (512, 256, 1, 1, 28), (256, 256, 3, 2, 28), (256, 1024, 1, 1, 14),
           (1024, 256, 1, 1, 14), (256, 256, 3, 1, 14), (1024, 512, 1, 1, 14), (512, 512, 3, 2, 14),
           (512, 2048, 1, 1, 7), (2048, 512, 1, 1, 7), (512, 512, 3, 1, 7)]


def _graph_time(fn, reps: int = 50) -> float:
    return graph_us(fn, reps=reps)  # us


_VARIANTS = ("plain", "relu", "fused_relu", "add_relu", "fused_add_relu")


def _measure(b: int, cin: int, cout: int, k: int, st: int, hw: int) -> dict:
    dev = torch.device("cuda")
    x = torch.randn(b, cin, hw, hw, device=dev)
    w = torch.randn(cout, cin, k, k, device=dev) * 0.05
    bias = torch.randn(cout, device=dev)
    pad = k // 2
    z = torch.randn(F.conv2d(x, w, bias, st, pad).shape, device=dev)
    args = ([st, st], [pad, pad], [1, 1], 1)
    fns = {"plain": lambda: F.conv2d(x, w, bias, st, pad),
           "relu": lambda: torch.relu_(F.conv2d(x, w, bias, st, pad)),
           "fused_relu": lambda: torch.cudnn_convolution_relu(x, w, bias, *args),
           "add_relu": lambda: F.conv2d(x, w, bias, st, pad).add_(z).relu_(),
           "fused_add_relu": lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, bias, *args)}
    r = {"batch": b, "shape": [cin, cout, k, st, hw],
         "err_relu": float((fns["fused_relu"]() - fns["relu"]()).abs().max()),
         "err_add_relu": float((fns["fused_add_relu"]() - fns["add_relu"]()).abs().max())}
    r.update({k: _graph_time(f) for k, f in fns.items()})
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    rows = []
    for b in map(int, args.batches.split(",")):
        tot = dict.fromkeys(_VARIANTS, 0.0)
        for shape in _SHAPES:
            r = _measure(b, *shape)
            for key in tot:
                tot[key] += r[key]
            rows.append(r)
            print(r, flush=True)
        print("batch", b, "totals us", {k: round(v, 1) for k, v in tot.items()}, flush=True)
        rows.append({"batch": b, "totals": tot})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
