"""Decode-sized matrix products (a few rows times a weight) by weight layout: ``x @ W`` with W
stored [in, out] (ONNX MatMul's layout) against ``F.linear(x, W.T)`` with the weight stored
[out, in] (torch's), on the GPU, each timed as 200 launches replayed from one CUDA graph.

    python benchmarks/gemv_layouts.py [--rows 1 4 16]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import graph_us  # noqa: E402

SHAPES = [(768, 1280), (768, 768), (768, 4096), (2048, 768), (768, 32000)]


def timed(fn, reps: int = 200) -> float:
    """Microseconds per call of ``fn``, from one graph of ``reps`` calls."""
    return graph_us(fn, calls=reps, reps=5, warmup=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print("dtype rows in out | x@W [in,out] us | linear W[out,in] us | GB/s of the better")
    for dt in (torch.float32, torch.bfloat16):
        for rows in args.rows:
            for k, n in SHAPES:
                w = torch.randn(k, n, device="cuda", dtype=dt)
                wt = w.t().contiguous()
                x = torch.randn(1, rows, k, device="cuda", dtype=dt)
                out = torch.empty(1, rows, n, device="cuda", dtype=dt)
                a = timed(lambda x=x, w=w, out=out: torch.matmul(x, w, out=out))
                b = timed(lambda x=x, wt=wt: F.linear(x, wt))
                gbs = w.numel() * w.element_size() / min(a, b) / 1e3
                print(f"{str(dt)[6:]:9s} {rows:3d} {k:5d} {n:6d} | {a:8.2f} | {b:8.2f} | {gbs:7.0f}", flush=True)


if __name__ == "__main__":
    main()
