"""ResNet-50's convolutions as split TF32 products (experiment): float32 at float32's accuracy on
tensor cores. The input is split into its TF32 part and remainder, the weight likewise, and one
cuDNN TF32 convolution runs over the parts concatenated along the input channels,
``conv([x_lo | x_hi | x_hi], [w_hi | w_lo | w_hi])`` (``torch._convolution`` takes ``allow_tf32``
per call: no process-wide switch). Against cuDNN's float32 convolution and the fastest of the forms
a static impl's build times today (``ops/tuned_conv.py``), each with a block end's bias, residual
and ReLU, timed as a build times them (``impls/tuning.py``: cold operands, kernels back to back);
errors against float64. *tf32* (one TF32 convolution, no split) shows that the switch took effect.

    python benchmarks/conv_split.py [--batches 8,16,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.conv_forms import cases, forms  # noqa: E402
from dynashape.impls.tuning import timings  # noqa: E402
from dynashape.ops import split_tf32, tuned_conv  # noqa: E402


def _conv_tf32(x, w, b, st, pad):
    return torch._convolution(x, w, b, st, pad, (1, 1), False, (0, 0), 1, True, False, True, True)


def split_forms(x, w, b, z, st, pad):
    st, pad = (st, st), (pad, pad)
    n, c, h, wd = x.shape
    cout = w.shape[0]
    w3 = split_tf32._split(w, cout, w[0].numel(), 3, False, False).view(cout, 3 * c, *w.shape[2:])

    def split3():
        x3 = split_tf32._split(x, n, c * h * wd, 3, True, False).view(n, 3 * c, h, wd)
        return tuned_conv._epilogue(_conv_tf32(x3, w3, b, st, pad), z, True)

    def tf32():
        return tuned_conv._epilogue(_conv_tf32(x, w, b, st, pad), z, True)
    out = {"split3": split3, "tf32": tf32}
    # bfloat16 parts, float32 accumulation and output (cuBLAS): [w_hi | w_lo | w_hi] @ [x_lo; x_hi; x_hi]
    kk = w[0].numel()
    wb = split_tf32._split(w.reshape(cout, kk), cout, kk, 3, False, True).view(cout, 3 * kk)
    ho, wo = tuned_conv._out_hw(x, w, st, pad)
    zf = z.reshape(n, cout, ho * wo)

    def bf16_batched():
        if w.shape[2:] == (1, 1) and st == (1, 1):
            cols = x.reshape(n, c, h * wd)
        else:
            cols = tuned_conv.windows(x, tuple(w.shape[2:]), st, pad)
        k, ll = cols.shape[1], cols.shape[2]
        x3 = split_tf32._split(cols, n, k * ll, 3, True, True).view(n, 3 * k, ll)
        src = torch.bmm(wb.expand(n, cout, 3 * k), x3, out_dtype=torch.float32)
        y = src.view(n, cout, ho, wo)
        tuned_conv.bias_add_relu(src, b, zf, True, out=y.view(n, cout, ho * wo))
        return y

    def bf16_merged():
        if w.shape[2:] == (1, 1) and st == (1, 1):
            cols = x.reshape(n, c, h * wd).transpose(0, 1).reshape(c, n * h * wd)
        else:
            cols = tuned_conv.windows(x, tuple(w.shape[2:]), st, pad, merged=True)
        k, ll = cols.shape
        x3 = split_tf32._split(cols, 1, k * ll, 3, True, True).view(3 * k, ll)
        src = torch.mm(wb, x3, out_dtype=torch.float32).view(cout, n, ho * wo).transpose(0, 1)
        y = torch.empty(n, cout, ho, wo, device=x.device)
        tuned_conv.bias_add_relu(src, b, zf, True, out=y.view(n, cout, ho * wo))
        return y
    out["bf16_batched"] = bf16_batched
    if n > 1:
        out["bf16_merged"] = bf16_merged
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, data, totals = [], [], {}
    for bsz, (cin, cout, k, st, hw), x, w, bias, z, ref in cases(args.batches):
        fs = dict(forms(x, w, bias, z, st, k // 2))
        fs.update(split_forms(x, w, bias, z, st, k // 2))
        errs = {f: float((g().double() - ref).norm() / ref.norm()) for f, g in fs.items()}
        t = dict(zip(fs, timings(list(fs.values()))))
        mine = ("split3", "tf32", "bf16_batched", "bf16_merged")
        today = min((f for f in t if f not in mine), key=t.get)
        bf = min((f for f in t if f.startswith("bf16")), key=t.get)
        tot = totals.setdefault(bsz, [0.0, 0.0, 0.0, 0.0, 0.0])
        tot[0] += t["cudnn"]
        tot[1] += t[today]
        tot[2] += t["split3"]
        tot[3] += t[bf]
        tot[4] += min(t[today], t[bf])
        rows.append([bsz, f"{cin}->{cout} k{k} s{st} @{hw}", t["cudnn"], f"{today} {t[today]:.1f}", t["split3"],
                     f"{bf} {t[bf]:.1f}", t[today] / t[bf], t["tf32"], f"{errs[today]:.1e}",
                     f"{errs['split3']:.1e}", f"{errs[bf]:.1e}", f"{errs['tf32']:.1e}"])
        data.append({"batch": bsz, "conv": [cin, cout, k, st, hw], "us": t, "rel_err": errs})
    print_table(f"convolutions as split TF32, {torch.cuda.get_device_name()} (us)",
                ["batch", "conv", "cuDNN fp32", "fastest today", "split3", "bf16 parts", "today / bf16", "tf32 alone",
                 "err today", "err split3", "err bf16", "err tf32"], rows)
    print("sums over the distinct convolutions (us): cuDNN fp32 / fastest today / split3 / bf16 parts / best of "
          "today and bf16:",
          {b: tuple(round(v, 1) for v in vals) for b, vals in totals.items()})
    write_json(args.json, {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "convs": data,
                           "totals_us": totals})


if __name__ == "__main__":
    main()
