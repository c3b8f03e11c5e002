"""The forms a static impl can call a product in (``dynashape/ops/tuned_gemm.py``), timed as
static impls replay them (``impls/tuning.py``: CUDA graphs, cold operands), beside ``F.linear``
on the 3-D activation (what the dynamic path and PyTorch eager call). BERT-base's products:
QKV fused (+ bias), attention output (+ residual), MLP up (+ bias), MLP down (+ bias).

    python benchmarks/linear_forms.py [--rows 16,64,256,1024] [--dtype float32] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402
from dynashape.impls.tuning import timings  # noqa: E402
from dynashape.ops import tuned_gemm as tg  # noqa: E402

PRODUCTS = [(2304, 768, "bias"), (768, 768, "residual"), (3072, 768, "bias"), (768, 3072, "bias")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="16,64,256,1024")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dt = getattr(torch, args.dtype)
    rows, data = [], []
    for m in [int(r) for r in args.rows.split(",")]:
        for n, k, epi in PRODUCTS:
            x = torch.randn(1, m, k, device="cuda", dtype=dt)
            w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dt)
            b = torch.randn(n, device="cuda", dtype=dt) if epi == "bias" else None
            r = torch.randn(m, n, device="cuda", dtype=dt) if epi == "residual" else None
            x2 = x.view(m, k)
            forms = tg.forms(b, r)
            runs = [(lambda f=f, x2=x2, w=w, b=b, r=r: tg._run(f, x2, w, True, b, r, None)) for f in forms]
            runs.append(lambda x=x, w=w, b=b, r=r: F.linear(x, w, b) if r is None else F.linear(x, w).add_(r))
            t = timings(runs)
            ref = x2.double() @ w.double().t() + (b.double() if b is not None else 0) + \
                (r.double() if r is not None else 0)
            errs = [float((tg._run(f, x2, w, True, b, r, None).double() - ref).abs().max()) for f in forms]
            best = min(range(len(forms)), key=t.__getitem__)
            times = dict(zip(forms, t))
            rows.append([m, f"{n}x{k}", epi, t[-1], times.get("epilogue"), times.get("then_add"),
                         times.get("c_bias", ""), forms[best], t[-1] / t[best], max(errs)])
            data.append({"rows": m, "out": n, "in": k, "epilogue": epi, "f_linear_us": t[-1], "forms_us": times,
                         "best": forms[best], "max_err": errs})
    print_table(f"products, {torch.cuda.get_device_name()}, {args.dtype} (us)",
                ["rows", "out x in", "adds", "F.linear", "epilogue", "then_add", "c_bias", "best",
                 "F.linear / best", "max err"], rows)
    write_json(args.json, {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "products": data})


if __name__ == "__main__":
    main()
