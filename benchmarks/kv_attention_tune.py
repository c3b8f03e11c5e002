"""Time the decode attention over KV storages (ops/kv_attention.py) per block size and warps,
against its torch form, each as 100 calls replayed from one CUDA graph.

    python benchmarks/kv_attention_tune.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.gemv_layouts import timed  # noqa: E402
from dynashape.ops import kv_attention as ka  # noqa: E402


def main() -> None:
    print("dtype batch cap | torch us | (block, warps): us")
    for dt in (torch.float32, torch.bfloat16):
        for b, cap in ((1, 256), (1, 1024), (16, 256)):
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
            row = []
            for block in (16, 32, 64, 128):
                for warps in (1, 2, 4):
                    ka.BLOCK_N, ka.NUM_WARPS = block, warps
                    row.append(f"({block},{warps}): {timed(call, reps=100):.2f}")
            print(f"{str(dt)[6:]} {b} {cap} | {base:.2f} | " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
