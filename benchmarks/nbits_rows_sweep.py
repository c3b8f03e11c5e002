"""MatMulNBits' rows kernel (ops/nbits_triton.py ``rows``: a decode step's few rows times a 4-bit
packed weight) over its tile choices (experiment): outputs a program, K values a loop step, warps;
each timed as 50 launches in a CUDA graph (benchmarks/common.py graph_us), on the layer shapes of
the builder's 8-layer hidden-512 model, of a 1B Llama (hidden 2048, intermediate 8192, 8 KV heads)
and of TinyLlama's 1.1B (intermediate 5632, 4 KV heads), float32 A at accuracy level 4 (the
builder's CPU models) and float16 A. Reported: each shape's time per config, its best, and the
packed weight's bytes over the time; and the rule's time with every load masked (``masked``: before whole
tiles of K and N loaded without masks).

With ``--prequant``: the 1.1B's and the mid model's shapes over a loop step's size, each with A's
level-4 blocks made in the kernel or first by a kernel of their own (its launch timed too). The
results of 2026-11-30 named split and pairs came from two forms measured and then removed (K split over
programs; a byte's two weights kept apart): results/nbits_rows_{split,pairs}_h200_2026-11-30.json.

    python benchmarks/nbits_rows_sweep.py [--rows 1] [--prequant] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import gpu_header, graph_us, write_json  # noqa: E402
from dynashape.ops import nbits_triton  # noqa: E402

SHAPES = {"mid qkv": (512, 1024), "mid o": (512, 512), "mid gate": (512, 1408), "mid down": (1408, 512),
          "mid lm_head": (512, 8000), "1B qkv": (2048, 3072), "1B o": (2048, 2048), "1B gate": (2048, 8192),
          "1B down": (8192, 2048), "1B lm_head": (2048, 32000), "1.1B qkv": (2048, 2560), "1.1B gate": (2048, 5632),
          "1.1B down": (5632, 2048)}
CONFIGS = list(itertools.product((4, 8, 16), (256, 512, 1024), (2, 4, 8)))
PREQUANT_SHAPES = ("mid qkv", "mid down", "1.1B qkv", "1B o", "1.1B gate", "1.1B down", "1B lm_head")
PREQUANT_CONFIGS = list(itertools.product((4, 8), (512, 1024), (4,), (False, True)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--prequant", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    out = {**gpu_header(), "rows": args.rows, "results": {}}
    kinds = ((torch.float32, True),) if args.prequant else ((torch.float32, True), (torch.float16, False))
    shapes = {s: SHAPES[s] for s in PREQUANT_SHAPES} if args.prequant else SHAPES
    for dtype, level4 in kinds:
        for name, (k, n) in shapes.items():
            bs, nb = 32, k // 32
            b = torch.randint(0, 256, (n, nb, 16), dtype=torch.uint8, device=dev)
            scales = torch.rand(n, nb, device=dev, dtype=dtype) * 0.05
            zp = torch.randint(0, 256, (n, (nb + 1) // 2), dtype=torch.uint8, device=dev)
            a = torch.randn(args.rows, k, device=dev, dtype=dtype)
            call = functools.partial(nbits_triton.rows, a, b, scales, zp, None, k, n, bs, level4)
            times = {}
            for cfg in PREQUANT_CONFIGS if args.prequant else CONFIGS:
                if cfg[1] < bs:
                    continue
                nbits_triton.ROWS_CONFIG = cfg[:3]
                nbits_triton.PREQUANT = cfg[3] if len(cfg) > 3 else False
                try:
                    times[cfg] = graph_us(call, calls=50, reps=5)
                except Exception as e:  # noqa: BLE001  a tile the compiler refuses (registers)
                    times[cfg] = float("nan")
                    print(f"  {cfg}: {type(e).__name__}", flush=True)
            nbits_triton.ROWS_CONFIG = nbits_triton.PREQUANT = None
            default = graph_us(call, calls=50, reps=5)
            nbits_triton.EVEN = False  # the rule with masked loads, as before whole tiles went unmasked
            masked = graph_us(call, calls=50, reps=5)
            nbits_triton.EVEN = None
            ok = {c: t for c, t in times.items() if t == t}
            best = min(ok, key=ok.get)
            gbs = n * k / 2 / (ok[best] * 1e-6) / 1e9
            print(f"{str(dtype)[6:]:8s} {name:12s} K={k:5d} N={n:5d}: rule {default:6.2f} us (masked {masked:6.2f}), "
                  f"best {ok[best]:6.2f} us "
                  f"at {best} ({gbs:5.0f} GB/s of packed weight)", flush=True)
            out["results"][f"{dtype} {name}"] = {"k": k, "n": n, "rule_us": default, "masked_us": masked,
                                                 "best": list(best),
                                                 "best_us": ok[best],
                                                 "all": {str(c): t for c, t in times.items()}}
    write_json(args.json, out)


if __name__ == "__main__":
    main()
