"""Where the split product's error comes from (experiment), and what the product costs, for TF32
parts and for bfloat16 parts (``split_tf32.BF16``, DYNASHAPE_SPLIT_PARTS=bf16).

For K in 256..4096: ||hi@hi (TF32) - hi@hi (float64)|| / ||ref|| (the parts are exact in TF32, so
this is the tensor cores' accumulation alone), ``split_tf32.product``'s error with either parts
(with a bias, as Gemm's) and cuBLAS float32's. Then at BERT-base's products: the time of
``split_tf32.product`` with either parts against cuBLAS float32 (CUDA events, medians, the
weight's parts made before).

    python -m benchmarks.split_tf32_error [--json FILE]
"""

import argparse
import json

import torch

from benchmarks.common import cuda_event_ms, rel_err
from dynashape.ops import split_tf32

PARTS = (("tf32", False), ("bf16", True))


def _product(x, w, bias, bf16):
    split_tf32.BF16 = bf16
    return split_tf32.product(x, w, True, bias)


def errors():
    rows = []
    for k in (256, 768, 1536, 3072, 4096):
        x = torch.randn(4096, k, device="cuda")
        w = torch.randn(768, k, device="cuda") / k ** 0.5  # Linear's [out, in]
        bias = torch.randn(768, device="cuda")
        ref = x.double() @ w.double().t() + bias.double()
        xh, xl = split_tf32.split(x)
        wh, wl = split_tf32.split(w)
        torch.backends.cuda.matmul.allow_tf32 = True
        acc = rel_err(xh @ wh.t(), xh.double() @ wh.double().t())
        torch.backends.cuda.matmul.allow_tf32 = False
        row = {"k": k, "tf32_accumulation": acc, "ieee": rel_err(torch.addmm(bias, x, w.t()), ref)}
        for name, bf16 in PARTS:
            row[name] = rel_err(_product(x, w, bias, bf16), ref)
        rows.append(row)
        print("K {k:5d}  tf32 accumulation of exact parts {tf32_accumulation:.2e}  split tf32 {tf32:.2e}  "
              "split bf16 {bf16:.2e}  cuBLAS fp32 {ieee:.2e}".format(**row), flush=True)
    return rows


def times():
    rows = []
    for m in (512, 1024, 2048, 3072, 6144, 12288):
        for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768)):
            x = torch.randn(m, k, device="cuda")
            w = torch.randn(n, k, device="cuda") / k ** 0.5
            row = {"m": m, "k": k, "n": n, "ieee_ms": cuda_event_ms(lambda x=x, w=w: x @ w.t())}
            for name, bf16 in PARTS:
                _product(x, w, None, bf16)  # the weight's parts, made once
                row[f"{name}_ms"] = cuda_event_ms(lambda x=x, w=w, bf16=bf16: _product(x, w, None, bf16))
            rows.append(row)
            print("M {m:5d} {k}->{n}  fp32 {ieee_ms:.3f}  tf32 split {tf32_ms:.3f}  bf16 split {bf16_ms:.3f} ms".format(
                **row), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "errors": errors(), "times": times()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
