"""The Triton TF32 product a background build takes (ops/split_tf32.py ``_flag_free``) against
cuBLAS's TF32 product, at BERT-base's split products, over a few tile configurations.

    python benchmarks/tf32_triton_sweep.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dynashape.ops import split_tf32  # noqa: E402

CONFIGS = [(128, 128, 32, 8, 3), (128, 128, 32, 4, 4), (128, 256, 32, 8, 3), (128, 128, 64, 8, 3),
           (64, 128, 32, 4, 4), (256, 128, 32, 8, 3), (128, 64, 32, 4, 4), (128, 256, 64, 8, 3)]
# (M, K', N): the one-call form's [x_lo | x_hi | x_hi] (K' = 3K) and the two-part form's (K' = 2K)
SHAPES = [(3200, 2304, 2304), (3200, 2304, 768), (3200, 2304, 3072), (3200, 6144, 768), (6144, 2304, 3072),
          (1024, 2304, 2304)]


def timed(fn, reps=30) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3  # us


def main() -> None:
    rows = []
    for m, k, n in SHAPES:
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(n, k, device="cuda").t()
        bias = torch.randn(n, device="cuda")
        torch.backends.cuda.matmul.allow_tf32 = True
        cublas = timed(lambda a=a, b=b, bias=bias: torch.addmm(bias, a, b))
        torch.backends.cuda.matmul.allow_tf32 = False
        line = [f"{m}x{k}x{n}", f"cublas {cublas:7.1f}"]
        for cfg in CONFIGS:
            split_tf32.MM_CONFIG = cfg
            try:
                t = timed(lambda a=a, b=b, bias=bias: split_tf32._flag_free(bias, a, b))
                line.append(f"{cfg} {t:7.1f}")
            except Exception as e:  # noqa: BLE001  a configuration the GPU refuses (shared memory)
                line.append(f"{cfg} fail {type(e).__name__}")
        rows.append(line)
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
