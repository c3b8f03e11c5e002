"""The host time of a product's call at a row count never seen against the same call repeated
(experiment): cuBLAS and cuBLASLt keep per-shape plans, and a dynamic call at a new shape pays for
every product that makes one. Forms: float32 (F.linear, mm, addmm with a bias [N] or an addend
[M, N], TF32 on and off), bfloat16 operands with float32 output (``out_dtype``: the split
product's, ops/split_tf32.py) with and without an addend. Run it again with
DISABLE_ADDMM_CUDA_LT=1 in the environment to see torch's addmm kept off cuBLASLt.

    python benchmarks/new_shape_blas.py [--rows 24] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _host_us(f):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6


def forms(k=768, n=2304):
    w = torch.randn(n, k, device="cuda") / k ** 0.5
    wt = w.t()
    b = torch.randn(n, device="cuda")
    w3 = torch.randn(3 * k, n, device="cuda").bfloat16()
    f32 = torch.float32

    def tf32(f):
        def g(x):
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                return f(x)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
        return g
    return {
        "linear_bias": lambda x: torch.nn.functional.linear(x, w, b),
        "mm": lambda x: torch.mm(x, wt),
        "addmm_bias": lambda x: torch.addmm(b, x, wt),
        "addmm_2d": lambda x: torch.addmm(x[:, :1].expand(-1, n), x, wt),
        "tf32_addmm_bias": tf32(lambda x: torch.addmm(b, x, wt)),
        "tf32_mm": tf32(lambda x: torch.mm(x, wt)),
        "bf16_mm_f32out": lambda x: torch.mm(x, w3, out_dtype=f32),
        "bf16_addmm_bias_f32out": lambda x: torch.addmm(b, x, w3, out_dtype=f32),
        "bf16_mm": lambda x: torch.mm(x, w3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.randn(8, 8, device="cuda") @ torch.randn(8, 8, device="cuda")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "DISABLE_ADDMM_CUDA_LT": os.environ.get("DISABLE_ADDMM_CUDA_LT"), "forms": {}}
    for i, (name, f) in enumerate(forms().items()):
        # row counts no form has seen: each form its own set
        ms = [1024 + 7 * (i * args.rows + j) + 1 for j in range(args.rows)]
        half = name.startswith("bf16")  # bfloat16 operands [M, 3K], made before
        xs = [torch.randn(m, 3 * 768 if half else 768, device="cuda", dtype=torch.bfloat16 if half else None)
              for m in ms]
        new = [_host_us(lambda x=x, f=f: f(x)) for x in xs]
        rep = [_host_us(lambda x=x, f=f: f(x)) for x in xs]
        new.sort(), rep.sort()
        out["forms"][name] = {"new_us_median": new[len(new) // 2], "repeat_us_median": rep[len(rep) // 2]}
        print(f"{name:24s} new {new[len(new) // 2]:7.1f} us  repeat {rep[len(rep) // 2]:7.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
