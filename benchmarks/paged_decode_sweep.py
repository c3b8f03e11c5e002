"""The paged engine's decode attention kernel (ops/paged_attention.py ``_triton``: one query a row,
split over the table) over its tiles: positions a program, the query heads' products as a dot of
16 rows at least or as sums (``small``), warps. A 12-layer decoder's shapes at ~48 rows (4 KV heads
of 64, 12 query heads, blocks of 16, contexts 16-1024), each layer's pool its own (read from memory,
as in a step), replayed as a CUDA graph of 12 calls; every variant checked against the torch form.

    python benchmarks/paged_decode_sweep.py [--rows 48] [--json out.json]
    TRITON_INTERPRET=1 python benchmarks/paged_decode_sweep.py --check   # the variants' values on the CPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import ring_graph_us  # noqa: E402
from dynashape.ops import paged_attention as pa  # noqa: E402

VARIANTS = [(64, False, 4), (64, True, 4), (64, True, 2), (32, True, 2), (128, True, 4), (128, True, 8),
            (128, False, 4), (256, True, 8)]


def setup(rows: int, layers: int, ctx: int, dev, kvh=4, heads=12, d=64, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = ctx // bs
    blocks = rows * width + 1
    pools = [tuple(torch.randn(blocks, bs, kvh, d, generator=g).to(dev) for _ in range(2)) for _ in range(layers)]
    tables = torch.randperm(blocks - 1, generator=g)[:rows * width].view(rows, width).to(dev)
    lens = torch.randint(16, ctx + 1, (rows,), generator=g).to(dev)
    q = torch.randn(rows, heads, 1, d, generator=g).to(dev)
    return pools, tables, lens, q


def check(rows=5, ctx=256) -> None:
    pools, tables, lens, q = setup(rows, 1, ctx, torch.device("cpu"))
    pk, pv = pools[0]
    want = pa._torch(q, pk, pv, tables, lens - 1, lens, 0.125)
    for bn, small, warps in VARIANTS:
        got = pa._triton(q, pk, pv, tables, lens, 0.125, block_n=bn, small=small, warps=warps)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    print("ok")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 48])
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.check:
        check()
        return
    dev = torch.device("cuda")
    res = []
    for rows in args.rows:
        pools, tables, lens, q = setup(rows, 12, args.ctx, dev)
        want = pa._torch(q, *pools[0], tables, lens - 1, lens, 0.125)
        row = {"rows": rows, "ctx": args.ctx}
        for bn, small, warps in VARIANTS:
            name = f"{bn}{'s' if small else 'd'}w{warps}"
            got = pa._triton(q, *pools[0], tables, lens, 0.125, block_n=bn, small=small, warps=warps)
            row[name + "_err"] = (got - want).abs().max().item()
            row[name + "_us"] = ring_graph_us([functools.partial(pa._triton, q, pk, pv, tables, lens, 0.125,
                                                                 block_n=bn, small=small, warps=warps)
                                               for pk, pv in pools], reps=10)
        print(rows, " ".join(f"{k[:-3]}={v:.1f}" for k, v in row.items() if k.endswith("_us")),
              f"max err {max(v for k, v in row.items() if k.endswith('_err')):.1e}", flush=True)
        res.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "rows": res}, f,
                      indent=1)


if __name__ == "__main__":
    main()
