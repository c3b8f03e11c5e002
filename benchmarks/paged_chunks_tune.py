"""Diagnostic (issue 39): the prompt-chunk attention kernel (ops/paged_attention.py ``_chunks``) timed
as a captured step replays it, over its tile choices, on the 12-layer decoder's shapes (12 query
heads over 4 KV heads of 64, blocks of 16, tables 256 blocks wide as a captured step's): query rows
a program holds, positions a loop step reads, warps; each against the default's output (float32 in
IEEE precision throughout).

    python benchmarks/paged_chunks_tune.py
"""

from __future__ import annotations

import functools
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import graph_us  # noqa: E402
from dynashape.ops import paged_attention as pa  # noqa: E402

CASES = [(1, 64, 0), (1, 256, 256), (4, 256, 0), (8, 64, 448)]  # (rows, new positions, first position)


def inputs(b: int, s: int, start: int, blocks: int = 4096, bs: int = 16, width: int = 256):
    g = torch.Generator(device="cuda").manual_seed(0)
    pk = torch.randn(blocks + 1, bs, 4, 64, device="cuda", generator=g)
    pv = torch.randn(blocks + 1, bs, 4, 64, device="cuda", generator=g)
    q = torch.randn(b, s, 12, 64, device="cuda", generator=g).transpose(1, 2)  # [B, H, S, D] as the model's
    perm = torch.randperm(blocks, device="cuda", generator=g)
    tables = perm[: b * width].view(b, width).contiguous()
    starts = torch.full((b,), start, device="cuda", dtype=torch.int64)
    return q, pk, pv, tables, starts, starts + s


def time_us(fn, *args, **kw) -> float:
    """Device time of one call, as in the engine's captured steps (no launch overhead)."""
    return graph_us(functools.partial(fn, *args, **kw), calls=20, reps=5, warmup=2)


def main() -> None:
    for b, s, start in CASES:
        args = inputs(b, s, start)
        want = pa._triton_chunks(*args, 0.125)
        print(f"rows {b}, new {s}, from {start}:", flush=True)
        results = []
        for rows, block_n, warps in itertools.product((16, 32, 64), (16, 32, 64), (2, 4, 8)):
            try:
                got = pa._triton_chunks(*args, 0.125, rows=rows, block_n=block_n, warps=warps)
                err = (got - want).abs().max().item()
                us = time_us(pa._triton_chunks, *args, 0.125, rows=rows, block_n=block_n, warps=warps)
            except Exception as e:  # noqa: BLE001  a tile that does not compile
                print(f"  rows {rows} n {block_n} warps {warps}: {type(e).__name__}")
                continue
            results.append((us, rows, block_n, warps, err))
        for us, rows, block_n, warps, err in sorted(results)[:8]:
            print(f"  {us:8.1f} us  rows {rows:2d} n {block_n:2d} warps {warps}  max diff {err:.1e}")
        default = next(r for r in results if r[1:4] == (pa.CHUNK_ROWS, pa.BLOCK_N, 4))
        tf32 = time_us(pa._triton_chunks, *args, 0.125, ieee=False)
        k = torch.randn(b, 4, start + s, 64, device="cuda")
        sdpa = time_us(torch.nn.functional.scaled_dot_product_attention, args[0], k, k, enable_gqa=True)
        print(f"  default {default[0]:.1f} us; tf32 {tf32:.1f} us; torch sdpa over a dense past {sdpa:.1f} us",
              flush=True)


if __name__ == "__main__":
    main()
