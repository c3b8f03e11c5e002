"""Float32 attention split onto bfloat16 tensor cores (ops/split_attention.py) against torch's
float32 scaled_dot_product_attention (TF32 off), at BERT-base's shapes: q, k, v as views of the
[B, S, 3 * 768] projection (12 heads of 64), an additive [B, 1, 1, S] mask with a quarter of each
row's keys padded with finfo.min, the result written heads-last as the model reads it. Device time
by CUDA events (medians), the host's time per launch, and each one's error against float64.
``--sweep``: the kernel's tiles (rows, keys a block, warps, stages) at the largest shape.

    python -m benchmarks.split_attention [--sweep] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
import torch.nn.functional as F

from benchmarks.common import cuda_event_ms, rel_err
from dynashape.ops import split_attention as sa
from dynashape.ops import split_tf32

SHAPES = [(1, 16), (4, 64), (1, 384), (32, 32), (8, 128), (4, 384), (16, 256), (32, 384)]
HEADS, D = 12, 64


def operands(b: int, s: int):
    qkv = torch.randn(b, s, 3 * HEADS * D, device="cuda")
    q, k, v = (t.view(b, s, HEADS, D).transpose(1, 2) for t in qkv.split(HEADS * D, -1))
    mask = torch.zeros(b, 1, 1, s, device="cuda")
    mask[..., s - s // 4:] = torch.finfo(torch.float32).min
    return q, k, v, mask


def reference(q, k, v, mask):
    s = q.double() @ k.double().transpose(-1, -2) / D ** 0.5 + mask.double()
    return torch.softmax(s, -1) @ v.double()


def host_us(f, n: int = 200) -> float:
    """The host's time per call with the device kept busy behind it (calls queued, not waited for)."""
    f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def compare() -> list[dict]:
    rows = []
    for b, s in SHAPES:
        q, k, v, mask = operands(b, s)
        ref = reference(q, k, v, mask)
        torch_f = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=mask, scale=D ** -0.5)
        ours = functools.partial(sa.attention, q, k, v, mask, D ** -0.5, heads_last=True)
        row = {"batch": b, "seq": s, "torch_ms": cuda_event_ms(torch_f), "split_ms": cuda_event_ms(ours),
               "torch_err": rel_err(torch_f(), ref), "split_err": rel_err(ours(), ref),
               "torch_host_us": host_us(torch_f), "split_host_us": host_us(ours)}
        row["speedup"] = row["torch_ms"] / row["split_ms"]
        rows.append(row)
        print("{batch:3d} x {seq:3d}: torch {torch_ms:7.3f} ms (err {torch_err:.1e}, host {torch_host_us:5.1f} us)  "
              "split {split_ms:7.3f} ms (err {split_err:.1e}, host {split_host_us:5.1f} us)  {speedup:5.2f}x"
              .format(**row), flush=True)
    return rows


def sweep() -> list[dict]:
    """The main kernel's tiles at the largest shape (the keys' and values' parts made once before)."""
    b, s = SHAPES[-1]
    q, k, v, mask = operands(b, s)
    m = mask.expand(b, HEADS, s, s)
    parts = torch.stack([t.reshape(b * HEADS, s, D) for t in (*split_tf32.split(k, True), *split_tf32.split(v, True))])
    rows = []
    for bm, bn, warps, stages in [(128, 64, 8, 2), (128, 64, 4, 2), (128, 64, 8, 3), (128, 32, 4, 2),
                                  (64, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 2), (64, 32, 4, 2), (128, 64, 8, 4)]:
        out = torch.empty(b, s, HEADS, D, device="cuda")
        o = out.transpose(1, 2)

        def launch(bm=bm, bn=bn, warps=warps, stages=stages, o=o):
            sa._attention_kernel[((s + bm - 1) // bm, b * HEADS)](
                q, parts, m, o, *q.stride()[:3], *m.stride(), *o.stride()[:3], HEADS, 1, s, s, parts[0].numel(),
                D ** -0.5, HAS_MASK=True, ALIGNED=True, EXACT=False, D=D, BM=bm, BN=bn, num_warps=warps,
                num_stages=stages)
        try:
            ms = cuda_event_ms(launch)
        except Exception as e:  # noqa: BLE001  a tile that does not fit: said, the sweep goes on
            print(f"BM {bm} BN {bn} warps {warps} stages {stages}: {type(e).__name__}", flush=True)
            continue
        rows.append({"bm": bm, "bn": bn, "warps": warps, "stages": stages, "ms": ms})
        print(f"BM {bm:3d} BN {bn:3d} warps {warps} stages {stages}: {ms:.3f} ms", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = split_tf32.MODE.set("split")
    try:
        doc = {"benchmark": "split_attention", "device": torch.cuda.get_device_name(),
               "date": time.strftime("%Y-%m-%d"), "rows": compare()}
        if a.sweep:
            doc["sweep"] = sweep()
    finally:
        split_tf32.MODE.reset(tok)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
