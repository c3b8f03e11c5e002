"""A bfloat16 split product at a new row count run at its bucket's rows (split_tf32.PAD_ROWS) against
at its own, in one process, the modes alternating call by call so that the host's speed, which moves
by ~1.5x between processes on the H200's machine, weighs on both alike: BERT-base at a random
(batch 1-32, seq 8-384) on every call (new_shapes_gpu.py's shapes), static impls off, each call
followed by eager's at the same inputs. Per mode and band of tokens: our time over eager's.

    python benchmarks/pad_rows_ab.py [--calls 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import _warm_libraries, model_for, shapes_for  # noqa: E402
from dynashape.ops import split_tf32  # noqa: E402

BANDS = ((0, 1024), (1024, 4096), (4096, 8192), (8192, 1 << 20))


def _timed(f):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    f()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _warm_libraries()
    module, path, names, make = model_for("bert_random", tempfile.mkdtemp())
    shapes = shapes_for("bert_random", args.calls, 3)
    g = torch.Generator().manual_seed(4)
    sess = dynashape.InferenceSession(path, device="cuda", static_impls="off")
    rows = []
    with torch.no_grad():
        for i, shape in enumerate(shapes):
            feeds = make(shape, g)
            split_tf32.PAD_ROWS = bool(i % 2)
            ours = _timed(lambda feeds=feeds: sess.run(None, dict(zip(names, feeds))))
            eager = _timed(lambda feeds=feeds: module(*feeds))
            rows.append({"shape": shape, "padded": bool(i % 2), "ours_s": ours, "eager_s": eager})
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": rows[2:], "bands": []}
    for lo, hi in BANDS:
        for padded in (False, True):
            sel = [r for r in rows[2:] if r["padded"] == padded and lo <= r["shape"][0] * r["shape"][1] < hi]
            if sel:
                ours, eager = sum(r["ours_s"] for r in sel), sum(r["eager_s"] for r in sel)
                out["bands"].append({"tokens": [lo, hi], "padded": padded, "calls": len(sel), "ours_s": ours,
                                     "eager_s": eager, "x_eager": eager / ours})
                print(f"tokens {lo:5d}-{hi:7d} padded {padded!s:5s} calls {len(sel):3d}  ours {ours:.3f} s  "
                      f"eager {eager:.3f} s  x eager {eager / ours:.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
