"""The one-row product with its residual (and SwiGLU gate) as one Triton kernel (ops/residual.py
``_gemv_add``) against cuBLAS's addmm (and the gate's own kernel before it), over tile shapes: each
form replayed as a CUDA graph of 200 calls back to back (as in a decode step's graph), per call,
over a ring of weight copies larger than the L2 cache (a decode step reads each layer's weights
once: from memory, not from L2).

    python benchmarks/gemv_add_sweep.py [--dtype bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import ring_graph_us  # noqa: E402
from dynashape.ops import residual  # noqa: E402

SHAPES = [(768, 768, False), (2048, 768, True), (2048, 768, False), (768, 2304, False), (768, 1280, False),
          (768, 4096, False), (4096, 4096, True)]
TILES = [(4, 256, 4), (4, 512, 4), (8, 256, 4), (8, 512, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8), (2, 1024, 4),
         (4, 1024, 4), (4, 2048, 8), (32, 128, 4), (2, 512, 2), (1, 1024, 2), (2, 2048, 4), (1, 2048, 4)]


RING_BYTES = 256 << 20  # several times an H100's or H200's L2


def ring(w: torch.Tensor) -> list[torch.Tensor]:
    return [w.clone() for _ in range(max(4, -(-RING_BYTES // (w.numel() * w.element_size()))))]


def per_call_us(fns) -> float:
    """200 calls taken in turn from ``fns`` (one per weight of the ring)."""
    return ring_graph_us(fns, calls=200)


def cublas(a, gate, w, r, out, g2):
    """What the ops ran before: the gate's kernel, then addmm (the residual copied into the output first)."""
    n, k = w.shape
    x = residual._silu_mul(a, gate, out=g2) if gate is not None else a
    torch.addmm(r.view(1, n), x.view(1, k), w.t(), out=out.view(1, n))


def norm_then_linear(x, nw, w):
    return torch.nn.functional.linear(torch.nn.functional.rms_norm(x, (x.shape[-1],), nw, 1e-6), w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for k, n, gated in SHAPES:
        merged = torch.randn(1, 1, 2 * k, device="cuda", dtype=dt)
        a, b = merged[..., :k], merged[..., k:]
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dt)
        r = torch.randn(1, 1, n, device="cuda", dtype=dt)
        out = torch.empty(1, 1, n, device="cuda", dtype=dt)
        g2 = torch.empty(1, 1, k, device="cuda", dtype=dt)
        want = ((residual.silu_mul_torch(a, b) if gated else a).float() @ w.float().t() + r.float())

        ws = ring(w)
        gate = b if gated else None
        res = {"k": k, "n": n, "gated": gated,
               "cublas_us": per_call_us([functools.partial(cublas, a, gate, x, r, out, g2) for x in ws])}
        for bn, bk, nw in TILES:
            residual._gemv_add(a, gate, w, r, out, tiles=(bn, bk, nw))
            err = (out.float() - want).abs().max().item()
            res[f"triton_{bn}x{bk}w{nw}_us"] = per_call_us(
                [functools.partial(residual._gemv_add, a, gate, x, r, out, tiles=(bn, bk, nw)) for x in ws])
            res[f"triton_{bn}x{bk}w{nw}_err"] = err
        if not gated:  # the norm's kernel over the same shape (RMSNormLinear, one row)
            nw = torch.randn(k, device="cuda", dtype=dt)
            res["norm_cublas_us"] = per_call_us([functools.partial(norm_then_linear, a, nw, x) for x in ws])
            for bn, bk, warps in TILES:
                res[f"norm_{bn}x{bk}w{warps}_us"] = per_call_us(
                    [functools.partial(residual._norm_gemv, a, nw, x, 1e-6, tiles=(bn, bk, warps)) for x in ws])
            nbest = min((v, key) for key, v in res.items() if key.startswith("norm_") and key[5].isdigit())
            print(f"  RMSNormLinear k {k} n {n}: rms_norm + cuBLAS {res['norm_cublas_us']:.2f} us, 4x256w4 "
                  f"{res['norm_4x256w4_us']:.2f}, best {nbest[1]} {nbest[0]:.2f} us", flush=True)
        best = min((v, key) for key, v in res.items() if key.startswith("triton") and key.endswith("_us"))
        print(f"k {k} n {n} gated {gated}: cuBLAS {res['cublas_us']:.2f} us, best Triton {best[1]} {best[0]:.2f} us",
              flush=True)
        rows.append(res)
    print(json.dumps(rows, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "dtype": args.dtype,
                       "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
