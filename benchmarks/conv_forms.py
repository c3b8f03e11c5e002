"""ResNet-50's convolutions as cuDNN runs them (benchmark mode, as a static impl's build) against
the same convolutions written as matrix products (cuBLAS): a 1x1 convolution is W [out, in] times
each image's [in, H*W]; any other one is W [out, in*kh*kw] times its unfolded windows. Timed as
static impls replay them (``impls/tuning.py``: CUDA graphs, cold operands), fp32 with TF32 off.

    python benchmarks/conv_forms.py [--batches 1,3,8,16] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.conv_fusion import _SHAPES  # noqa: E402
from dynashape.impls.tuning import timings  # noqa: E402


def forms(x, w, st, pad):
    b, cin, h, _ = x.shape
    cout, _, k, _ = w.shape
    ho = (h + 2 * pad - k) // st + 1
    w2 = w.reshape(cout, -1)
    out = {"cudnn": lambda: F.conv2d(x, w, None, st, pad)}
    if k == 1 and st == 1:
        out["gemm"] = lambda: torch.matmul(w2, x.view(b, cin, h * h))
    elif k == 1:
        out["gemm"] = lambda: torch.matmul(w2, x[:, :, ::st, ::st].reshape(b, cin, ho * ho))
    else:
        out["unfold_gemm"] = lambda: torch.matmul(w2, F.unfold(x, k, padding=pad, stride=st))
    return out, (b, cout, ho, ho)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,3,8,16")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    rows, data, totals = [], [], {}
    for b in [int(v) for v in args.batches.split(",")]:
        for cin, cout, k, st, hw in _SHAPES:
            x = torch.randn(b, cin, hw, hw, device="cuda")
            w = torch.randn(cout, cin, k, k, device="cuda") * 0.05
            fs, shape = forms(x, w, st, k // 2)
            ref = F.conv2d(x.double(), w.double(), None, st, k // 2)
            errs = {n: float((f().double().reshape(shape) - ref).abs().max()) for n, f in fs.items()}
            t = dict(zip(fs, timings(list(fs.values()))))
            other = [n for n in fs if n != "cudnn"][0]
            best = min(t, key=t.get)
            tot = totals.setdefault(b, [0.0, 0.0])
            tot[0] += t["cudnn"]
            tot[1] += t[best]
            rows.append([b, f"{cin}->{cout} k{k} s{st} @{hw}", t["cudnn"], t[other], other, t["cudnn"] / t[best],
                         max(errs.values())])
            data.append({"batch": b, "conv": [cin, cout, k, st, hw], "us": t, "max_err": errs})
    print_table(f"convolutions, {torch.cuda.get_device_name()}, fp32 (us)",
                ["batch", "conv", "cuDNN", "as products", "form", "cuDNN / best", "max err"], rows)
    print("sum over the distinct convolutions (us): cuDNN / best of both:",
          {b: (round(c, 1), round(bb, 1)) for b, (c, bb) in totals.items()})
    write_json(args.json, {"device": torch.cuda.get_device_name(), "convs": data})


if __name__ == "__main__":
    main()
