"""Dense convolutions on the CPU: the C tile (ops/csrc/conv_nhwc.c, what ops/cpu_conv.py runs) against
oneDNN (torch's fused convolution with its weight reordered once, as the runtime ran it before),
layer by layer: oneDNN's first call at a size (its primitive built), its repeat, and the C tile's
median call. The layers are YOLOv8n's and PP-OCR's at small and large images (channels-last,
SiLU or HardSwish as the models have them, 2 threads).

    python -m benchmarks.conv_dense [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import write_json
from dynashape.memory import host_malloc
from dynashape.ops import cpu_conv_dense, native

# (batch, cin, cout, kernel, stride, height, width, activation)
LAYERS = ((1, 3, 16, 3, 2, 96, 96, "swish"), (1, 16, 32, 3, 2, 48, 48, "swish"), (1, 32, 32, 3, 1, 24, 32, "swish"),
          (1, 64, 64, 3, 1, 12, 16, "swish"), (1, 128, 128, 3, 1, 6, 8, "swish"), (1, 256, 256, 1, 1, 3, 4, "swish"),
          (1, 32, 32, 3, 1, 160, 168, "swish"), (1, 64, 64, 3, 1, 80, 88, "swish"),
          (1, 128, 128, 3, 1, 40, 48, "swish"), (1, 256, 256, 3, 1, 20, 28, "swish"),
          (1, 128, 64, 1, 1, 80, 88, "swish"), (36, 240, 240, 1, 1, 12, 152, "hardswish"),
          (8, 128, 128, 1, 1, 12, 80, "hardswish"))


def _median_call(fn, budget_s: float = 0.3) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    times = []
    for _ in range(max(3, min(200, int(budget_s / max(one, 1e-6))))):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    host_malloc.tune()  # as a CPU session does: large results reuse the heap, no page faults a call
    if native.library("conv_nhwc") is None:
        raise SystemExit(f"the C tile cannot be built here: {native.why('conv_nhwc')}")
    fused = torch.ops.mkldnn._convolution_pointwise
    rows = []
    for n, cin, cout, k, s, hgt, wid, act in LAYERS:
        w, b = torch.randn(cout, cin, k, k) / (cin * k * k) ** 0.5, torch.randn(cout)
        pad = [k // 2] * 2
        packed = torch.ops.mkldnn._reorder_convolution_weight(w, pad, [s, s], [1, 1], 1, [1, cin, 32, 32])
        tile = cpu_conv_dense.DenseConv(w, b, (s, s), tuple(pad), (1, 1), cpu_conv_dense.ACTS[act])
        x = torch.randn(n, cin, hgt, wid).contiguous(memory_format=torch.channels_last)
        t0 = time.perf_counter()
        ref = fused(x, packed, b, pad, [s, s], [1, 1], 1, act, [], "")
        first = time.perf_counter() - t0

        def onednn(x=x, packed=packed, b=b, pad=pad, s=s, act=act):
            return fused(x, packed, b, pad, [s, s], [1, 1], 1, act, [], "")

        def ours(x=x, tile=tile):
            return tile(x)

        torch.testing.assert_close(ours(), ref, rtol=1e-4, atol=1e-4)
        repeat, c = _median_call(onednn), _median_call(ours)
        macs = n * cout * cin * k * k * ref.shape[2] * ref.shape[3]
        r = {"batch": n, "cin": cin, "cout": cout, "kernel": k, "stride": s, "height": hgt, "width": wid,
             "activation": act,
             "onednn_first_us": 1e6 * first, "onednn_repeat_us": 1e6 * repeat, "c_us": 1e6 * c,
             "c_gflops": 2 * macs / c / 1e9, "onednn_gflops": 2 * macs / repeat / 1e9}
        rows.append(r)
        print(f"{n:3d}x{cin:4d}->{cout:4d} {k}x{k} s{s} {hgt:4d}x{wid:<4d}: "
              f"oneDNN first {r['onednn_first_us']:8.0f} us, "
              f"repeat {r['onednn_repeat_us']:8.0f} ({r['onednn_gflops']:4.0f} GF/s), C {r['c_us']:8.0f} "
              f"({r['c_gflops']:4.0f} GF/s)", flush=True)
    write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "device": "cpu", "threads": 2,
                           "cpu": native.cpuinfo("model name"), "rows": rows})


if __name__ == "__main__":
    main()
