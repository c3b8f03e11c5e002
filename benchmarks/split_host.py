"""The host's cost of a split product (ops/split_tf32.py; its parts bfloat16 or TF32 as
DYNASHAPE_SPLIT_PARTS says) against one float32 product, at a new row count on every call, and of
each of its parts: where a BERT-base call at a large random shape
spends its host time (benchmarks/host_split_gpu.py found such calls bound by the host).

    python benchmarks/split_host.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dynashape.ops import split_tf32 as S  # noqa: E402


def host_us(fn, rows: list[int], reps: int = 3) -> float:
    """Median host microseconds of ``fn(m)`` over ``rows`` (a new m each call), nothing waited."""
    best = []
    for _ in range(reps):
        ts = []
        for m in rows:
            torch.cuda.synchronize()
            torch.cuda._sleep(2_000_000)  # the GPU busy: launches never wait for it
            t0 = time.perf_counter()
            fn(m)
            ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        best.append(sorted(ts)[len(ts) // 2])
    return min(best) * 1e6


def main() -> None:
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    k, n = 768, 2304
    w = torch.randn(n, k, device=dev)
    b = torch.randn(n, device=dev)
    xs = {m: torch.randn(m, k, device=dev) for m in range(4000, 4800, 16)}
    rows = list(xs)
    S.parts(w, True)
    tok = S.MODE.set("split")
    try:
        S.product(xs[rows[0]], w, True, b)
        x3 = {m: S._split(xs[m], m, k, 3, True, S.BF16).view(m, 3 * k) for m in rows}
        w3 = S.parts(w, True, True)
        mm = S._bf16_mm if S.BF16 else S._switched
        cases = {
            "F.linear (float32 cuBLAS)": lambda m: torch.nn.functional.linear(xs[m], w, b),
            "split product (all of it)": lambda m: S.product(xs[m], w, True, b),
            "  eligible and worth": lambda m: S.eligible(xs[m], w) and S.worth(m, n, k),
            "  the split (Triton launch)": lambda m: S._split(xs[m], m, k, 3, True, S.BF16),
            "  parts lookup": lambda m: S.parts(w, True, True),
            "  _open/_close": lambda m: (S._open(), S._close()),
            "  the product of the parts": lambda m: mm(b, x3[m], w3, None),
            "  torch.empty(M*3K)": lambda m: torch.empty(m * 3 * k, device=dev),
        }
        for name, fn in cases.items():
            fn(rows[0])
            print(f"{name:32s} {host_us(fn, rows):8.1f} us host")
        same = [rows[0]] * len(rows)
        print(f"{'split product, the same M':32s} {host_us(lambda m: S.product(xs[m], w, True, b), same):8.1f} us host")
        print(f"{'F.linear, the same M':32s} {host_us(lambda m: torch.nn.functional.linear(xs[m], w, b), same):8.1f}"
              " us host")
    finally:
        S.MODE.reset(tok)


if __name__ == "__main__":
    main()
