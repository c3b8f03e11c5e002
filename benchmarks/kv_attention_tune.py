"""Time the decode attention over KV storages (ops/kv_attention.py) per block size, warps and blocks
a program (``ITERS``: a running softmax over several blocks; one program per KV head where it spans
the capacity, with no combine kernel), against its torch form, each as 100 calls replayed from one
CUDA graph, the length at half the capacity.

    python benchmarks/kv_attention_tune.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.gemv_layouts import timed  # noqa: E402
from dynashape.ops import kv_attention as ka  # noqa: E402

# (batch, capacity) shapes; blocks, warps, blocks a program and the combine's warps swept
FULL = (((1, 256), (1, 1024), (1, 4096), (4, 256), (16, 256), (16, 1024)), (32, 64, 128), (2, 4), (1, 2, 4, 8, 16),
        (4,))
QUICK = (((1, 256), (1, 1024), (16, 256), (16, 1024)), (32, 64), (1, 2, 4), (1, 2), (1, 4))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and forms, warps of 1 and the combine's too")
    args = ap.parse_args()
    shapes, blocks, warps_swept, iters_swept, combine_swept = QUICK if args.quick else FULL
    rows = []
    print("dtype batch cap | torch us | rule us | best (block, warps, iters, combine warps): us", flush=True)
    for dt in (getattr(torch, name) for name in args.dtypes):
        for b, cap in shapes:
            q = torch.randn(b, 12, 1, 64, device="cuda", dtype=dt)
            k = torch.randn(b, 4, cap, 64, device="cuda", dtype=dt)
            v = torch.randn_like(k)
            length = torch.tensor([cap // 2], device="cuda")
            neg = torch.zeros(1, 1, 1, cap, device="cuda", dtype=dt)
            neg[..., cap // 2 + 1:] = float("-inf")

            def call(q=q, k=k, v=v, length=length, neg=neg):
                ka.kv_attention(q, k, v, length, 1, neg, 0.125)
            saved = ka.triton
            ka.triton = None
            base = timed(call, reps=100)
            ka.triton = saved
            rule = timed(call, reps=100)  # blocks_for's choice
            found = {}
            for block in blocks:
                for warps in warps_swept:
                    for iters in iters_swept:
                        for cw in combine_swept:
                            if block * iters > 2 * cap:
                                continue
                            ka.BLOCK_N, ka.NUM_WARPS, ka.ITERS, ka.COMBINE_WARPS = block, warps, iters, cw
                            found[(block, warps, iters, cw)] = timed(call, reps=100)
            ka.BLOCK_N, ka.NUM_WARPS, ka.ITERS, ka.COMBINE_WARPS = None, None, None, None
            best = sorted(found.items(), key=lambda kv: kv[1])[:4]
            print(f"{str(dt)[6:]} {b} {cap} | {base:.2f} | {rule:.2f} | "
                  + "  ".join(f"{key}: {us:.2f}" for key, us in best)
                  + f" | (64,4,1,4): {found[(64, 4, 1, 4)]:.2f}", flush=True)
            rows.append({"dtype": str(dt)[6:], "batch": b, "capacity": cap, "torch_us": base, "rule_us": rule,
                         "configs": {",".join(map(str, key)): us for key, us in found.items()}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
