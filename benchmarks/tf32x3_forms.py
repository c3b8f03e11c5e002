"""Float32 products as three TF32 tensor-core products through cuBLAS and cuDNN (experiment).

``benchmarks/tf32x3_gemm.py`` found Triton's in-register tf32x3 split no faster than cuBLAS's strict
fp32. This one splits the operands in memory (``hi`` = the value with its 13 low mantissa bits
cleared, exact in TF32; ``lo`` = value - hi, exact in fp32) and lets cuBLAS / cuDNN run their TF32
kernels on the parts: ``hi*hi + hi*lo + lo*hi``, either as three calls accumulated in place or as
one call over the parts concatenated along the reduced axis (K for a product, input channels for a
convolution). It also answers whether the TF32 kernels truncate a float32 operand to TF32 or round
it (if they truncate, the raw operand serves as its own ``hi``).

Shapes: BERT-base's products (tokens x 768 -> 768/2304/3072, 3072 -> 768) and ResNet-50's
convolutions at batch 32 (NHWC). Times are medians of CUDA events over rotated inputs; errors are
||out - ref|| / ||ref|| against a float64 result.

    python -m benchmarks.tf32x3_forms [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from benchmarks.common import cuda_event_ms, rel_err

MASK = -8192  # 0xFFFFE000: sign, exponent and the 10 mantissa bits TF32 keeps


def hi_lo(t: torch.Tensor):
    hi = (t.view(torch.int32) & MASK).view(torch.float32)
    return hi, t - hi


def tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


# ---- products ------------------------------------------------------------------------------------
def mm_fp32(a, w, wp):
    return a @ w


def mm_tf32(a, w, wp):
    return a @ w


def mm_three(a, w, wp):
    """hi*hi + hi*lo + lo*hi, three calls, the weight's parts made once (wp)."""
    w_hi, w_lo, _ = wp
    a_hi, a_lo = hi_lo(a)
    c = a_hi @ w_hi
    c.addmm_(a_hi, w_lo)
    return c.addmm_(a_lo, w_hi)


def mm_three_raw(a, w, wp):
    """The same with the raw operands as their own hi parts (right only if the kernels truncate)."""
    _, w_lo, _ = wp
    a_lo = a - (a.view(torch.int32) & MASK).view(torch.float32)
    c = a @ w
    c.addmm_(a, w_lo)
    return c.addmm_(a_lo, w)


def mm_concat(a, w, wp):
    """One call over K tripled: [a_hi | a_hi | a_lo] @ [w_hi; w_lo; w_hi]."""
    w3 = wp[2]
    a_hi, a_lo = hi_lo(a)
    return torch.cat([a_hi, a_hi, a_lo], 1) @ w3


def split_only(a, w, wp):
    return hi_lo(a)


PRODUCTS = {"fp32": mm_fp32, "tf32": mm_tf32, "three": mm_three, "three_raw": mm_three_raw,
            "concat": mm_concat, "split_only": split_only}


def product_rows() -> list:
    rows = []
    for tokens in (256, 1024, 3072, 6144, 12288):
        for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768)):
            sets = []
            for _ in range(3):
                a = torch.randn(tokens, k, device="cuda")
                w = torch.randn(k, n, device="cuda") / k ** 0.5
                w_hi, w_lo = hi_lo(w)
                sets.append((a, w, (w_hi, w_lo, torch.cat([w_hi, w_lo, w_hi], 0))))
            a, w, wp = sets[0]
            ref = a.double() @ w.double()
            r = {"M": tokens, "K": k, "N": n}
            for name, f in PRODUCTS.items():
                tf32(name == "tf32" or name.startswith(("three", "concat")))
                r[name + "_ms"] = cuda_event_ms(f, sets, warmup=2)
                if name != "split_only":
                    r[name + "_err"] = rel_err(f(a, w, wp), ref)
            tf32(False)
            rows.append(r)
            print(f"mm {tokens:6d}x{k:4d}x{n:4d} " + "  ".join(
                f"{nm} {r[nm + '_ms']:.3f}" + (f" ({r[nm + '_err']:.1e})" if nm + "_err" in r else "")
                for nm in PRODUCTS), flush=True)
    return rows


# ---- convolutions --------------------------------------------------------------------------------
def conv_rows() -> list:
    rows = []
    specs = [(56, 64, 64, 3, 1), (28, 128, 128, 3, 1), (14, 256, 256, 3, 1), (7, 512, 512, 3, 1),
             (56, 64, 256, 1, 1), (56, 256, 64, 1, 1), (14, 1024, 256, 1, 1), (112, 64, 128, 3, 2)]
    for batch in (8, 32):
        for hw, cin, cout, ks, stride in specs:
            sets = []
            for _ in range(3):
                x = torch.randn(batch, cin, hw, hw, device="cuda").to(memory_format=torch.channels_last)
                w = (torch.randn(cout, cin, ks, ks, device="cuda") / (cin * ks * ks) ** 0.5).to(
                    memory_format=torch.channels_last)
                w_hi, w_lo = hi_lo(w.contiguous())
                w_hi, w_lo = (t.to(memory_format=torch.channels_last) for t in (w_hi, w_lo))
                w3 = torch.cat([w_hi, w_lo, w_hi], 1).to(memory_format=torch.channels_last)
                sets.append((x, w, (w_hi, w_lo, w3)))
            x, w, wp = sets[0]
            pad = ks // 2
            ref = F.conv2d(x.double(), w.double(), stride=stride, padding=pad)

            def fp32(x, w, wp, stride=stride, pad=pad):
                return F.conv2d(x, w, stride=stride, padding=pad)

            def three(x, w, wp, stride=stride, pad=pad):
                w_hi, w_lo, _ = wp
                x_hi, x_lo = hi_lo(x.contiguous(memory_format=torch.channels_last))
                c = F.conv2d(x_hi, w_hi, stride=stride, padding=pad)
                c += F.conv2d(x_hi, w_lo, stride=stride, padding=pad)
                c += F.conv2d(x_lo, w_hi, stride=stride, padding=pad)
                return c

            def concat(x, w, wp, stride=stride, pad=pad):
                x_hi, x_lo = hi_lo(x.contiguous(memory_format=torch.channels_last))
                x3 = torch.cat([x_hi, x_hi, x_lo], 1)
                return F.conv2d(x3, wp[2], stride=stride, padding=pad)

            r = {"batch": batch, "hw": hw, "cin": cin, "cout": cout, "k": ks, "stride": stride}
            for name, f in (("fp32", fp32), ("tf32", fp32), ("three", three), ("concat", concat)):
                tf32(name != "fp32")
                r[name + "_ms"] = cuda_event_ms(f, sets, warmup=2)
                r[name + "_err"] = rel_err(f(x, w, wp), ref)
            tf32(False)
            rows.append(r)
            print(f"conv b{batch} {hw}x{hw} {cin}->{cout} k{ks}s{stride} " + "  ".join(
                f"{nm} {r[nm + '_ms']:.3f} ({r[nm + '_err']:.1e})" for nm in ("fp32", "tf32", "three", "concat")),
                flush=True)
    return rows


def truncation() -> dict:
    """Does a TF32 product see a float32 operand truncated or rounded? Operands whose low 13 bits are
    set: compare the TF32 product of the raw operands with those of their truncated and rounded forms."""
    a = torch.randn(512, 512, device="cuda")
    b = torch.randn(512, 512, device="cuda")
    trunc_a, trunc_b = hi_lo(a)[0], hi_lo(b)[0]
    # round to nearest TF32: add half an ulp of TF32 before clearing the bits (ties away; enough here)
    rnd = lambda t: ((t.view(torch.int32) + 4096) & MASK).view(torch.float32)  # noqa: E731
    tf32(True)
    raw = a @ b
    d_trunc = float((raw - trunc_a @ trunc_b).abs().max())
    d_round = float((raw - rnd(a) @ rnd(b)).abs().max())
    x = torch.randn(4, 64, 16, 16, device="cuda")
    w = torch.randn(64, 64, 3, 3, device="cuda")
    craw = F.conv2d(x, w, padding=1)
    c_trunc = float((craw - F.conv2d(hi_lo(x)[0], hi_lo(w)[0], padding=1)).abs().max())
    c_round = float((craw - F.conv2d(rnd(x), rnd(w), padding=1)).abs().max())
    tf32(False)
    out = {"mm_vs_truncated": d_trunc, "mm_vs_rounded": d_round, "conv_vs_truncated": c_trunc,
           "conv_vs_rounded": c_round}
    print("tf32 operand handling:", out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "truncation": truncation(), "products": product_rows(), "convs": conv_rows()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
