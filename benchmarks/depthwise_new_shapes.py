"""A depthwise convolution at an input size new to it: oneDNN's first call (which builds the
primitive), its repeat, and the C pass (ops/csrc/depthwise.c) that ops/cpu_conv.py runs at a new
size. Channels-last inputs, batch 1, ReLU, 2 threads; each size met once (five sizes a layer, the
median kept).

    python -m benchmarks.depthwise_new_shapes [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import write_json
from dynashape.ops import cpu_conv

LAYERS = ((32, 3, 1, 48), (64, 3, 2, 48), (64, 5, 1, 40), (128, 3, 1, 40), (64, 3, 1, 96), (256, 5, 1, 20),
          (128, 3, 1, 80), (32, 3, 1, 160))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    conv = torch.ops.mkldnn._convolution_pointwise
    rows = []
    for c, k, s, hw in LAYERS:
        w, b = torch.randn(c, 1, k, k), torch.randn(c)
        cache = [-1, None]
        new, ours = [], []
        for j in range(5):
            x = torch.randn(1, c, hw + j, hw + 2 * j).contiguous(memory_format=torch.channels_last)
            t0 = time.perf_counter()
            ref = conv(x, w, b, [k // 2] * 2, [s, s], [1, 1], c, "relu", [], "")
            t1 = time.perf_counter()
            got = cpu_conv._depthwise(x, w, b, (s, s), (k // 2, k // 2), cpu_conv.DEPTHWISE_ACTS["relu"], cache)
            t2 = time.perf_counter()
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
            new.append(t1 - t0)
            ours.append(t2 - t1)
        t0 = time.perf_counter()
        conv(x, w, b, [k // 2] * 2, [s, s], [1, 1], c, "relu", [], "")
        repeat = time.perf_counter() - t0
        r = {"channels": c, "kernel": k, "stride": s, "side": hw, "onednn_new_us": 1e6 * statistics.median(new),
             "onednn_repeat_us": 1e6 * repeat, "c_us": 1e6 * statistics.median(ours)}
        rows.append(r)
        print(f"{c:4d} ch {k}x{k} s{s} ~{hw}px: oneDNN new {r['onednn_new_us']:6.0f} us, repeat "
              f"{r['onednn_repeat_us']:6.0f}, C {r['c_us']:6.0f}", flush=True)
    write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "device": "cpu", "threads": 2, "rows": rows})


if __name__ == "__main__":
    main()
