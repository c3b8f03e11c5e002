"""How often a CPU convolution's weight is reordered when every call brings a new input size.

For each OCR/detection model of the zoo, a dynashape session is fed ``--calls`` new sizes (the
ranges of benchmarks/new_sizes.py). Per call it counts, after the first:
- explicit reorders (``torch.ops.mkldnn._reorder_convolution_weight``, seen by torch's profiler;
  ops/cpu_conv.py ``PackedWeight`` makes one per weight at its first call and none after);
- reorders oneDNN makes itself inside a convolution, from its verbose log (a reorder primitive whose
  layouts are a weight's, an upper-case block letter): a convolution whose layout for this size
  differs from the one the weight was reordered into, or a ConvTranspose, whose weight torch
  reorders at every call;
- the convolutions executed.
oneDNN's verbose log goes to the process's stdout (fd 1), captured through a temporary file; the
times are not reported (the log slows every call).

    python -m benchmarks.conv_weight_reorders [--calls 12] [--models ocr_det_v4,nudenet_320n] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

from benchmarks.new_sizes import MODELS, model_path, ranges
from dynashape import InferenceSession, random_shapes


def verbose_lines(fn) -> list[str]:
    """oneDNN's verbose log of ``fn()``."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                fn()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace").splitlines()


def _weight_reorder(line: str) -> bool:
    f = line.split(",")
    return len(f) > 8 and f[3] == "exec" and f[5] == "reorder" and any(c.isupper() for c in f[8])


def count(name: str, calls: int, seed: int) -> dict:
    sess = InferenceSession(str(model_path(name)))
    inp = sess.get_inputs()[0].name
    sets = random_shapes.draw(random_shapes.parse([ranges(name, inp)], 1), calls, seed)
    rng = np.random.default_rng(seed)
    rows = []
    for i, s in enumerate(sets):
        x = rng.uniform(-1, 1, s[inp]).astype(np.float32)
        if i == 0:  # the first call reorders every weight once
            sess.run(None, {inp: x})
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            lines = verbose_lines(lambda feeds={inp: x}: sess.run(None, feeds))
        explicit = sum(e.count for e in prof.key_averages() if "reorder_convolution_weight" in e.key)
        rows.append({"shape": list(s[inp]), "explicit_reorders": explicit,
                     "onednn_weight_reorders": sum(map(_weight_reorder, lines)),
                     "convolutions": sum(1 for ln in lines if ",exec," in ln and ",convolution," in ln)})
    out = {"calls_counted": len(rows), "per_call": rows}
    for k in ("explicit_reorders", "onednn_weight_reorders", "convolutions"):
        out[k] = sum(r[k] for r in rows)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    doc = {"threads": a.threads, "calls": a.calls, "seed": a.seed, "torch": torch.__version__, "models": {}}
    for name in a.models.split(","):
        r = count(name, a.calls, a.seed)
        doc["models"][name] = r
        print(f"{name}: {r['calls_counted']} calls after the first: explicit reorders {r['explicit_reorders']}, "
              f"oneDNN's own weight reorders {r['onednn_weight_reorders']} over {r['convolutions']} convolutions",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
