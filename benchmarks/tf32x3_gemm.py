"""Can a float32 product run faster than cuBLAS's strict fp32 and stay as exact? (experiment)

Strict fp32 (TF32 off) runs cuBLAS's SIMT kernels; the tensor cores only take TF32 (10 mantissa
bits). Splitting each operand into a TF32 high part and a TF32 remainder and summing three tensor-
core products (hi*hi + hi*lo + lo*hi, Triton's ``input_precision="tf32x3"``) keeps ~21 bits, close to
fp32's own rounding. This measures, at the products of BERT-base (tokens x 768 -> 768/2304/3072)
and ResNet-50's 1x1 convolutions at batch 32 (NHWC rows x Cin -> Cout): time of torch.mm strict
fp32, torch.mm TF32, and the Triton tf32x3 kernel; and each one's error against a float64 product.

    python -m benchmarks.tf32x3_gemm [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton
import triton.language as tl

from benchmarks.common import cuda_event_ms, rel_err

CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
           for bm, bn, bk, w, s in [(128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                                    (128, 256, 32, 8, 3), (64, 64, 32, 4, 4), (128, 128, 64, 8, 3)]]


@triton.autotune(CONFIGS, key=["M", "N", "K"])
@triton.jit
def _mm(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak, mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn, mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, y, acc, input_precision=PREC)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_mm(a: torch.Tensor, b: torch.Tensor, prec: str = "tf32x3") -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))  # noqa: E731
    _mm[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
              PREC=prec)
    return c


def shapes() -> list:
    out = []
    for tokens in (512, 3072, 12288):
        out += [("bert", tokens, 768, n) for n in (768, 2304, 3072)] + [("bert", tokens, 3072, 768)]
    for hw, cin, mid in ((56, 256, 64), (28, 512, 128), (14, 1024, 256), (7, 2048, 512)):
        out += [("resnet1x1", 32 * hw * hw, cin, mid), ("resnet1x1", 32 * hw * hw, mid, cin)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for model, M, K, N in shapes():
        a = torch.randn(M, K, device="cuda")
        b = torch.randn(K, N, device="cuda") / K ** 0.5
        ref = a.double() @ b.double()
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = cuda_event_ms(lambda a=a, b=b: a @ b, reps=30)
        e32 = rel_err(a @ b, ref)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32 = cuda_event_ms(lambda a=a, b=b: a @ b, reps=30)
        etf = rel_err(a @ b, ref)
        torch.backends.cuda.matmul.allow_tf32 = False
        x3 = cuda_event_ms(lambda a=a, b=b: triton_mm(a, b))
        ex3 = rel_err(triton_mm(a, b), ref)
        ieee = cuda_event_ms(lambda a=a, b=b: triton_mm(a, b, "ieee"))
        r = {"model": model, "M": M, "K": K, "N": N, "fp32_ms": fp32, "tf32_ms": tf32, "tf32x3_ms": x3,
             "triton_ieee_ms": ieee, "err_fp32": e32, "err_tf32": etf, "err_tf32x3": ex3,
             "tflops_fp32": 2 * M * N * K / fp32 / 1e9, "tflops_tf32x3": 2 * M * N * K / x3 / 1e9}
        rows.append(r)
        print(f"{model:9s} {M:6d}x{K:4d}x{N:4d}  fp32 {fp32:7.3f} ms ({r['tflops_fp32']:5.1f} TF)  tf32 {tf32:7.3f}  "
              f"tf32x3 {x3:7.3f} ({r['tflops_tf32x3']:5.1f} TF, x{fp32 / x3:4.2f})  triton-ieee {ieee:7.3f}  "
              f"err fp32 {e32:.1e} tf32 {etf:.1e} tf32x3 {ex3:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
