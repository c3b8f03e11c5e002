"""MatMulNBits with 4-bit weights on CUDA: the packed Triton kernel (ops/nbits_triton.py, reads
the weight as the model stores it) against cuBLAS over the weight dequantized once (the copy the
op kept before: 4x the packed bytes in float16, 8x in float32). Eight weights of each shape used in
turn inside one CUDA graph (the L2 holds none of them, as in a decode step); microseconds a product
and the packed bytes read per second.

    python benchmarks/nbits_cuda.py [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import write_json  # noqa: E402
from benchmarks.gemv_layouts import timed  # noqa: E402
from dynashape.ops import block_quant, nbits_triton  # noqa: E402

SHAPES = [(768, 2048), (2048, 768), (2048, 8192), (8192, 2048), (2048, 32000)]  # (K, N): 110M and 1B-class layers
COPIES = 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    res = {}
    print("dtype rows K x N | packed us (GB/s) | dequantized cuBLAS us | max rel diff")
    for dtype in (torch.float16, torch.float32):
        for k, n in SHAPES:
            nb = k // 32
            ws = [(torch.from_numpy(rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)).to(dev),
                   torch.from_numpy(rng.uniform(0.005, 0.05, (n, nb)).astype(np.float32)).to(dev, dtype))
                  for _ in range(COPIES)]
            deq = [block_quant._nbits_weight(b, s, None, None, k, n, 4, 32, dtype) for b, s in ws]
            for m in (1, 16):
                a = torch.randn(m, k, device=dev, dtype=dtype)

                def packed(a=a, ws=ws, k=k, n=n):
                    for b, s in ws:
                        nbits_triton.matmul(a, b, s, None, None, k, n, 32)

                def cublas(a=a, deq=deq):
                    for w in deq:
                        torch.matmul(a, w.t())
                tp, tc = timed(packed, reps=20) / COPIES, timed(cublas, reps=20) / COPIES
                got = nbits_triton.matmul(a, *ws[0], None, None, k, n, 32).float()
                want = torch.matmul(a, deq[0].t()).float()
                diff = float((got - want).abs().max() / want.abs().max())
                gbs = n * k / 2 / (tp * 1e-6) / 1e9
                key = f"{str(dtype)[6:]} rows {m} {k}x{n}"
                res[key] = {"packed_us": tp, "cublas_dequantized_us": tc, "packed_GBps": gbs, "max_rel_diff": diff}
                print(f"{key} | {tp:.1f} ({gbs:.0f}) | {tc:.1f} | {diff:.1e}", flush=True)
    if args.json:
        write_json(args.json, {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                               "results": res})


if __name__ == "__main__":
    main()
