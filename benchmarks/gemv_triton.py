"""A decode step's products by a constant matrix: cuBLAS (addmm, as the step runs them) against a
Triton kernel of our own written for the purpose (one program per block of output columns, the
few rows' dot products accumulated in float32 over the whole depth), with the weights streamed
from memory as in a step (one copy per layer, 12 layers in turn, so that L2 holds none of them),
each in a CUDA graph. As a product kernel it measured no better than cuBLAS where it counts
(docs/benchmarks.md): the runtime uses its one-row form only with the RMSNorm before it folded in
(``RMSNormLinear`` in dynashape/ops/residual.py), where it beat the two kernels it replaces.

    python benchmarks/gemv_triton.py [--rows 1 4] [--dtype float32 bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the device machine has it
    triton = None

SHAPES = [(768, 1280), (768, 768), (768, 4096), (2048, 768), (768, 32000)]  # (in, out) of the 12-layer decoder
LAYERS = 12


def gemv(x, w, transposed: int, r=None, out=None, block_n: int | None = None, block_k: int | None = None):
    k = x.shape[-1]
    n = w.shape[0] if transposed else w.shape[1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    res = out if out is not None and out.is_contiguous() else torch.empty(*x.shape[:-1], n, dtype=x.dtype,
                                                                           device=x.device)
    r2 = r.reshape(-1, n) if r is not None else None
    if r2 is not None and r2.stride(-1) != 1:
        r2 = r2.contiguous()
    swn, swk = (w.stride(0), w.stride(1)) if transposed else (w.stride(1), w.stride(0))
    bn = block_n or (16 if transposed else 64)
    bk = block_k or (128 if transposed else 32)
    rows = 1 if m == 1 else 2 if m == 2 else 4
    with torch.cuda.device(x.device):
        _gemv_kernel[(triton.cdiv(n, bn),)](
            x2, w, r2 if r2 is not None else x2, res, m, n, k, x2.stride(0), swn, swk,
            r2.stride(0) if r2 is not None else 0, n,
            HAS_R=r2 is not None, ROWS=rows, BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    if out is not None and res is not out:
        out.copy_(res)
        return out
    return res


if triton is not None:
    @triton.jit(do_not_specialize=["M"])
    def _gemv_kernel(X, W, R, OUT, M, N, K, sxm, swn, swk, srm, som,
                     HAS_R: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid = tl.program_id(0)
        n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        nm = n < N
        m = tl.arange(0, ROWS)
        mm = m < M
        acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            km = k < K
            w = tl.load(W + n[:, None] * swn + k[None, :] * swk, mask=nm[:, None] & km[None, :], other=0.0)
            x = tl.load(X + m[:, None] * sxm + k[None, :], mask=mm[:, None] & km[None, :], other=0.0)
            acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
        if HAS_R:
            acc += tl.load(R + m[:, None] * srm + n[None, :], mask=mm[:, None] & nm[None, :], other=0.0).to(tl.float32)
        tl.store(OUT + m[:, None] * som + n[None, :], acc.to(OUT.dtype.element_ty), mask=mm[:, None] & nm[None, :])


def timed(fn, reps=50) -> float:
    """Seconds per call of ``fn`` (which runs all layers' products), in a CUDA graph as a step does."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows_out, data = [], {}
    for dt in args.dtype:
        dtype = getattr(torch, dt)
        for k, n in SHAPES:
            ws = [torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5 for _ in range(LAYERS)]  # [out, in]
            for m in args.rows:
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                r = torch.randn(m, n, device="cuda", dtype=dtype)
                outs = torch.empty(m, n, device="cuda", dtype=dtype)
                want = [torch.addmm(r.float(), x.float(), w.float().t()) for w in ws]
                err = max(float((gemv(x, w, 1, r) .float() - ref).abs().max()) for w, ref in zip(ws, want))
                def cublas(x=x, r=r, outs=outs, ws=ws):
                    return [torch.addmm(r, x, w.t(), out=outs) for w in ws]

                def triton_(bn, bk, x=x, r=r, outs=outs, ws=ws):
                    return [gemv(x, w, 1, r, out=outs, block_n=bn, block_k=bk) for w in ws]
                t_cublas = timed(cublas)
                best = None
                for bn, bk in ((4, 256), (8, 128), (8, 256), (16, 128), (16, 64), (32, 64), (32, 128)):
                    t = timed(lambda bn=bn, bk=bk: triton_(bn, bk))
                    if best is None or t < best[0]:
                        best = (t, bn, bk)
                nbytes = LAYERS * n * k * dtype.itemsize
                row = [dt, f"{k}x{n}", m, 1e6 * t_cublas / LAYERS, 1e6 * best[0] / LAYERS,
                       nbytes / t_cublas / 1e12, nbytes / best[0] / 1e12, f"{best[1]}x{best[2]}", err]
                rows_out.append(row)
                data[f"{dt} {k}x{n} rows {m}"] = dict(zip(["dtype", "shape", "rows", "cublas_us", "triton_us",
                                                           "cublas_TBps", "triton_TBps", "block", "max_err"], row))
                print(row, flush=True)
    print_table(f"products of a decode step, weights from memory, {torch.cuda.get_device_name()}",
                ["dtype", "in x out", "rows", "cuBLAS us", "Triton us", "cuBLAS TB/s", "Triton TB/s",
                 "best block", "max err vs fp32"], rows_out)
    write_json(args.json, {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                           "results": data})


if __name__ == "__main__":
    main()
