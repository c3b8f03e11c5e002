"""ResNet-50's convolutions (with a block end's bias, residual and ReLU) in every form a static
impl's build times (``ops/tuned_conv.py``): cuDNN (benchmark mode, its fused epilogue), matrix
products (cuBLAS) over the images or their unfolded windows, Winograd F(2x2, 3x3). Timed as the
build times them (``impls/tuning.py``: cold operands, kernels back to back), fp32 with TF32 off.

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
from dynashape.ops import specialise, tuned_conv  # noqa: E402


def forms(x, w, b, z, st, pad):
    """Every form a static impl's build times for this convolution (``ops/tuned_conv.py``), with
    the bias, a residual and the ReLU of a ResNet block's end."""
    st, pad = (st, st), (pad, pad)
    with specialise.specialised(lambda key, runs: 0):  # a build's context: the forms are offered
        names = tuned_conv.forms(x, w, st, pad)
    own = lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, st, pad, (1, 1), 1)  # noqa: E731
    return {f: (lambda f=f: tuned_conv._run(f, x, w, b, st, pad, True, z, own)) for f in names}


def cases(batches: str):
    """Strict fp32 with cuDNN's benchmark mode; then per batch and distinct ResNet-50 convolution:
    (batch, (in, out, k, stride, size), x, w, bias, residual, the float64 reference of relu(conv + bias
    + residual))."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    for b in [int(v) for v in batches.split(",")]:
        for cin, cout, k, st, hw in _SHAPES:
            x = torch.randn(b, cin, hw, hw, device="cuda")
            w = torch.randn(cout, cin, k, k, device="cuda") * 0.05
            bias = torch.randn(cout, device="cuda")
            ref = F.conv2d(x.double(), w.double(), bias.double(), st, k // 2)
            z = torch.randn(ref.shape, device="cuda")
            yield b, (cin, cout, k, st, hw), x, w, bias, z, (ref + z.double()).relu()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,3,8,16")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, data, totals = [], [], {}
    for b, (cin, cout, k, st, hw), x, w, bias, z, ref in cases(args.batches):
        fs = forms(x, w, bias, z, st, k // 2)
        errs = {n: float((f().double() - ref).abs().max()) for n, f in fs.items()}
        t = dict(zip(fs, timings(list(fs.values()))))
        best = min(t, key=t.get)
        tot = totals.setdefault(b, [0.0, 0.0])
        tot[0] += t["cudnn"]
        tot[1] += t[best]
        rows.append([b, f"{cin}->{cout} k{k} s{st} @{hw}", t["cudnn"], best, t[best], t["cudnn"] / t[best],
                     " ".join(f"{n} {v:.1f}" for n, v in t.items()), max(errs.values())])
        data.append({"batch": b, "conv": [cin, cout, k, st, hw], "us": t, "max_err": errs})
    print_table(f"convolutions, {torch.cuda.get_device_name()}, fp32 (us)",
                ["batch", "conv", "cuDNN", "fastest", "its us", "cuDNN / best", "every form (us)", "max err"], rows)
    print("sum over the distinct convolutions (us): cuDNN / best of both:",
          {b: (round(c, 1), round(bb, 1)) for b, (c, bb) in totals.items()})
    write_json(args.json, {"device": torch.cuda.get_device_name(), "convs": data})


if __name__ == "__main__":
    main()
