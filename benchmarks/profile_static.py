"""Where the time of one call goes with static impls on: cProfile of the host side and CUDA
events around the whole call and around the replays, for BERT-base at one shape.

    python benchmarks/profile_static.py --device cuda [--layers 12] [--shape 4x64]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.static_impls import bert_model, export  # noqa: E402
from dynashape.impls import static as static_mod  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--shape", default="4x64")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device(args.device)
    b, s = map(int, args.shape.split("x"))
    model = bert_model(args.layers)
    path = os.path.join(tempfile.mkdtemp(), "bert.onnx")
    d = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("seq", min=1, max=512)}
    export(model, (torch.randint(0, 30522, (2, 7)), torch.ones(2, 7, dtype=torch.int64)),
           ["input_ids", "attention_mask"], {"input_ids": d, "attention_mask": d}, path)
    sess = dynashape.InferenceSession(path, device=str(dev), static_impls="sync")
    feeds = {"input_ids": torch.randint(0, 30522, (b, s), device=dev),
             "attention_mask": torch.ones(b, s, dtype=torch.int64, device=dev)}
    for _ in range(5):
        sess.run(None, feeds)
    torch.cuda.synchronize()
    replay_ms = []
    orig = static_mod.CudaGraphImpl.__call__

    def timed(self, ins):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        out = orig(self, ins)
        e1.record()
        replay_ms.append((e0, e1))
        return out
    static_mod.CudaGraphImpl.__call__ = timed
    t0 = time.perf_counter()
    for _ in range(args.calls):
        sess.run(None, feeds)
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t0) / args.calls * 1e3
    gpu = sum(a.elapsed_time(b) for a, b in replay_ms) / args.calls
    t0 = time.perf_counter()
    for _ in range(args.calls):
        sess.run(None, feeds)
        torch.cuda.synchronize()
    synced = (time.perf_counter() - t0) / args.calls * 1e3
    print(f"per call (pipelined) {per_call:.3f} ms, per call (synced) {synced:.3f} ms, "
          f"replays (events, incl. refresh copies) {gpu:.3f} ms per call")
    static_mod.CudaGraphImpl.__call__ = orig
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.calls):
        sess.run(None, feeds)
        torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
