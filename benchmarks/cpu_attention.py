"""Attention of small heads in one C call (ops/csrc/attention.c) against torch's CPU
scaled_dot_product_attention, on this CPU: (batch, heads, tokens, head dim) from a tiny BERT's to
BERT-base's and a 512-token one, an additive key mask; interleaved round by round
(benchmarks/common.py), median microseconds per call, and the largest difference between the two.

    python -m benchmarks.cpu_attention [--threads 2] [--json out.json]
"""

from __future__ import annotations

import platform
import time

import torch
import torch.nn.functional as F

from benchmarks.common import cpu_args, interleaved, write_json

SHAPES = [(4, 4, 16, 16), (8, 4, 32, 16), (1, 4, 64, 16), (1, 12, 16, 64), (2, 2, 200, 32), (4, 12, 64, 64),
          (8, 12, 128, 64), (1, 12, 384, 64), (1, 8, 512, 64)]


def main() -> None:
    args = cpu_args(__doc__)
    from dynashape.ops import cpu_attention, native
    rows = []
    print(f"{'B x N x S x D':>20} {'sdpa us':>10} {'C us':>10} {'speedup':>8} {'max diff':>10}")
    for b, n, s, d in SHAPES:
        g = torch.Generator().manual_seed(b * n + s)
        q, k, v = (torch.randn(b, n, s, d, generator=g) for _ in range(3))
        mask = torch.zeros(b, 1, 1, s)
        mask[..., s - s // 4:] = -10000.0  # the last quarter of the keys padded away
        reps = max(5, int(3e4 / (b * n * s * s * d / 1e3 + 10)))
        call = (q, k, v, mask, d ** -0.5)
        if cpu_attention.attention(*call) is None:  # not served (MAX_HEAD): the ops run torch's
            print(f"{b:4d} x{n:3d} x{s:4d} x{d:3d}   not served: torch's kernel")
            rows.append({"shape": [b, n, s, d], "served": False})
            continue
        med = interleaved({"sdpa": lambda a=call: F.scaled_dot_product_attention(*a[:3], attn_mask=a[3], scale=a[4]),
                           "c": lambda a=call: cpu_attention.attention(*a)}, reps, 7)
        t_sdpa, t_c = med["sdpa"]["median_s"] * 1e6, med["c"]["median_s"] * 1e6
        diff = float((cpu_attention.attention(q, k, v, mask, d ** -0.5)
                      - F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=d ** -0.5)).abs().max())
        rows.append({"shape": [b, n, s, d], "served": True, "sdpa_us": t_sdpa, "c_us": t_c, "max_diff": diff})
        print(f"{b:4d} x{n:3d} x{s:4d} x{d:3d} {t_sdpa:10.1f} {t_c:10.1f} {t_sdpa / t_c:8.2f} {diff:10.2e}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpu": native.cpuinfo("model name") or platform.processor(),
                "threads": args.threads, "torch": torch.__version__}
        write_json(args.json, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
