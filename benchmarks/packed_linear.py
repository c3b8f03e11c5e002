"""CPU products by a constant matrix: torch's own (``F.linear``: MKL) against oneDNN with the
weight packed once (``torch.ops.mkldnn._linear_pointwise``, what ``compile/cpu_packed_linear.py``
uses), over weight shapes and row counts, with the layout packed for 1 row and for many. Each
time is the median of repeated calls with the weight warm in cache; ``--cold`` also times the one-
row product with the weights read from memory (enough copies that none stays in cache), the
decode step's case, as GB/s of weight read.

    python benchmarks/packed_linear.py [--threads 2] [--cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402

SHAPES = [(64, 64), (128, 512), (256, 1024), (512, 2048), (768, 768), (768, 3072), (3072, 768), (2048, 768)]
ROWS = [1, 4, 16, 64, 256]


def _us(fn, *args, seconds: float = 0.15) -> float:
    for _ in range(10):
        fn(*args)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _cold(make, nbytes: int, total: float = 6e8) -> float:
    calls = [make() for _ in range(max(2, int(total // nbytes)))]
    t = time.perf_counter()
    n = 0
    while time.perf_counter() - t < 1.0:
        for c in calls:
            c()
        n += len(calls)
    return nbytes / ((time.perf_counter() - t) / n) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mk = torch.ops.mkldnn
    rows, data = [], {"threads": args.threads, "torch": torch.__version__, "results": []}
    for k, n in SHAPES:
        w, b = torch.randn(n, k), torch.randn(n)
        p1, pm = mk._reorder_linear_weight(w, 1), mk._reorder_linear_weight(w, 64)
        for m in ROWS:
            x = torch.randn(m, k)
            r = {"in": k, "out": n, "rows": m, "mkl_us": _us(F.linear, x, w, b),
                 "onednn_packed_1_us": _us(mk._linear_pointwise, x, p1, b, "none", [], ""),
                 "onednn_packed_64_us": _us(mk._linear_pointwise, x, pm, b, "none", [], "")}
            data["results"].append(r)
            rows.append([f"{k} x {n}", m, r["mkl_us"], r["onednn_packed_1_us"], r["onednn_packed_64_us"],
                         r["mkl_us"] / r["onednn_packed_64_us"]])
    print_table(f"CPU products, {args.threads} threads, us (weight warm)",
                ["in x out", "rows", "F.linear (MKL)", "oneDNN packed for 1 row", "oneDNN packed for 64",
                 "MKL / packed64"], rows)
    if args.cold:
        crow = []
        for k, n in [(768, 4096), (2048, 768), (768, 1280), (768, 32000)]:
            x = torch.randn(1, k)

            def plain(k=k, n=n, x=x):
                w = torch.randn(n, k)
                return lambda: F.linear(x, w)

            def packed(k=k, n=n, x=x):
                p = mk._reorder_linear_weight(torch.randn(n, k), 64)
                return lambda: mk._linear_pointwise(x, p, None, "none", [], "")
            gp, gk = _cold(plain, k * n * 4), _cold(packed, k * n * 4)
            data.setdefault("cold_one_row_gbs", []).append({"in": k, "out": n, "mkl": gp, "onednn_packed": gk})
            crow.append([f"{k} x {n}", gp, gk])
        print_table("one row, weights from memory: GB/s of weight read",
                    ["in x out", "F.linear (MKL)", "oneDNN packed"], crow)
    write_json(args.json, data)


if __name__ == "__main__":
    main()
