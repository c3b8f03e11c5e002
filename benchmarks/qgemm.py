"""The 8-bit product in one C call (ops/csrc/qgemm.c) against the torch path it replaces, on this CPU.

DynQuantMatMul (quantize_dynamic's DynamicQuantizeLinear -> MatMulInteger -> scales -> bias) over
(M, K, N) from a tiny BERT's (64 x 64 x 64) to BERT-base's (512 x 768 x 3072): the same function
with DYNASHAPE_NATIVE=1 and =0, interleaved round by round (benchmarks/common.py), median
microseconds per call; results identical bit for bit (checked). Where the C call does not serve a
size (a CPU with AMX above 2^24 multiply-adds: qgemm.py), the "C" column is the torch path too,
and marked.

    python -m benchmarks.qgemm [--threads 2] [--json out.json]
"""

from __future__ import annotations

import os
import platform
import time

import torch

from benchmarks.common import cpu_args, interleaved, write_json

SIZES = [(64, 64, 64), (256, 64, 256), (256, 256, 64), (16, 512, 512), (1, 512, 2048), (128, 512, 512),
         (128, 512, 2048), (512, 768, 768), (512, 768, 3072)]


def main() -> None:
    args = cpu_args(__doc__)
    from dynashape.ops import fused_quant, native, qgemm
    rows = []
    print(f"{'M x K x N':>18} {'torch us':>10} {'C us':>10} {'speedup':>8}")
    for m, k, n in SIZES:
        g = torch.Generator().manual_seed(m * k + n)
        b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
        ws, bias = torch.tensor([0.01]), torch.randn(n, generator=g)
        x = torch.randn(m, k, generator=g)
        out = torch.empty(m, n)
        reps = max(3, int(2e6 // (m * k * n) + 3))
        results = {}
        for env in ("0", "1"):
            os.environ["DYNASHAPE_NATIVE"] = env
            before = native.counters().get("qgemm_native_calls", 0)
            results[env] = fused_quant._dyn_quant_matmul(x, b, ws, None, bias).clone()
            served = native.counters().get("qgemm_native_calls", 0) > before

        def call(env, a=(x, b, ws, None, bias), o=out):
            os.environ["DYNASHAPE_NATIVE"] = env
            return fused_quant._dyn_quant_matmul(*a, out=o)
        med = interleaved({env: (lambda e=env: call(e)) for env in ("0", "1")}, reps, 7)
        times = {env: med[env]["median_s"] * 1e6 for env in med}
        same = bool(torch.equal(results["0"], results["1"]))
        rows.append({"m": m, "k": k, "n": n, "torch_us": times["0"], "c_us": times["1"], "c_served": served,
                     "identical": same})
        mark = "" if served else "  (torch: not served)"
        print(f"{m:5d} x{k:5d} x{n:5d} {times['0']:10.1f} {times['1']:10.1f} {times['0'] / times['1']:8.2f}"
              f"{'' if same else '  DIFFERENT'}{mark}")
    os.environ.pop("DYNASHAPE_NATIVE", None)
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpu": native.cpuinfo("model name") or platform.processor(),
                "threads": args.threads, "int8_weights_vnni": qgemm._int8_weights(),
                "serves_large": qgemm._serves_large()}
        write_json(args.json, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
