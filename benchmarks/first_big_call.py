"""What BERT-base's first call at a larger shape than any before costs (experiment): the cycle of
new_shapes_gpu.py's bert_cycle up to (16, 64), then (32, 384) for the first time, profiled (cProfile,
the host's side; the device synchronised before and after), then again. The first such call took
224 ms where eager's took 61 (H200, results/new_shapes_alone_h200_2026-11-29.json).

    python benchmarks/first_big_call.py [--options static_impls=off ...]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import BERT_CYCLE, _warm_libraries, model_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--options", nargs="*", default=[], help="dynashape keyword options, k=v")
    ap.add_argument("--models-dir", default="/tmp/models")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    os.makedirs(a.models_dir, exist_ok=True)
    _warm_libraries()
    _, path, names, make = model_for("bert_cycle", a.models_dir)
    g = torch.Generator().manual_seed(1)
    sess = dynashape.InferenceSession(path, device="cuda", **dict(o.split("=", 1) for o in a.options))
    for shape in BERT_CYCLE[:-1]:
        sess.run(None, dict(zip(names, make(shape, g))))
    torch.cuda.synchronize()
    big = dict(zip(names, make(BERT_CYCLE[-1], g)))
    reserved = torch.cuda.memory_reserved()
    for label in ("first", "again"):
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        sess.run(None, big)
        torch.cuda.synchronize()
        prof.disable()
        ms = (time.perf_counter() - t0) * 1e3
        print(f"== {label} call at {BERT_CYCLE[-1]}: {ms:.1f} ms; reserved {reserved / 2**30:.2f} -> "
              f"{torch.cuda.memory_reserved() / 2**30:.2f} GiB")
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(a.top)
        print("\n".join(line[:160] for line in out.getvalue().splitlines()[6:6 + a.top + 3]))
        reserved = torch.cuda.memory_reserved()
    print({k: v for k, v in sess.stats().items() if "split" in k or "replan" in k or "plan" in k})


if __name__ == "__main__":
    main()
