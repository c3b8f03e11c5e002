"""Small recurrent models at batch 1, one call at a time: dynashape vs onnxruntime per call (issue 37).

At batch 1 these models (silero-vad, openWakeWord's silero v4 and mel front end, a GRU seq2seq
romanizer) do a few small kernels a call: per-call cost around them decides. Per model and
runtime, one runtime at a time (the other's session deleted and garbage-collected), 2 threads:

  * first pass: a session warmed up on the spec's point outside the sequence walks the batch-1
    points of the sequence once, each call timed;
  * steady: median of --repeat calls at each batch-1 point after the first pass (fresh random
    inputs, state included, every call);
  * the silero-vad package loop: 4 s of 16 kHz audio in chunks of 512 samples (+64 of context, as
    silero-vad's OnnxWrapper prepends), state carried from call to call, total per pass (median of
    --passes).

    python benchmarks/small_recurrent.py [--models a,b] [--repeat N] [--passes P] [--rounds R]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.real_models_specs import SPECS, fetch  # noqa: E402

THREADS = 2
MODELS = ("silero_vad", "silero_vad_ifless", "oww_silero_vad_v4", "oww_melspectrogram",
          "romanizer_gru_enc", "romanizer_gru_dec")
BY_NAME = {s.name: s for s in SPECS}


def session(runtime: str, path: str):
    if runtime == "onnxruntime":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    import torch

    import dynashape
    torch.set_num_threads(THREADS)
    return dynashape.InferenceSession(path)


def points(spec) -> list:
    """The batch-1 points of the spec's sequence, in order, each once."""
    seen = []
    for p in spec.sequence:
        if p[0] == 1 and p not in seen:
            seen.append(p)
    return seen or [spec.warmup]


def per_call(spec, runtime: str, path: str, repeat: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    pts = points(spec)
    sess = session(runtime, path)
    sess.run(None, spec.make(rng, spec.warmup))  # outside the sequence: the first pass meets a warm session
    first = []
    for p in pts:
        feeds = spec.make(rng, p)
        t0 = time.perf_counter()
        sess.run(None, feeds)
        first.append(time.perf_counter() - t0)
    steady = []
    for p in pts:
        ts = []
        for _ in range(repeat + 2):
            feeds = spec.make(rng, p)
            t0 = time.perf_counter()
            sess.run(None, feeds)
            ts.append(time.perf_counter() - t0)
        steady.append(statistics.median(ts[2:]))
    del sess
    gc.collect()
    return {"first": sum(first) / len(first), "steady": sum(steady) / len(steady),
            "points": [list(p) for p in pts]}


def silero_loop(runtime: str, path: str, passes: int, seed: int) -> float:
    """silero-vad's OnnxWrapper over 4 s of audio: 125 chunks of 512 samples, 64 of context, state carried."""
    rng = np.random.default_rng(seed)
    audio = (0.1 * rng.standard_normal(4 * 16000)).astype(np.float32)
    sess = session(runtime, path)
    sr = np.array(16000, dtype=np.int64)
    totals = []
    for _ in range(passes + 1):
        state = np.zeros((2, 1, 128), dtype=np.float32)
        context = np.zeros((1, 64), dtype=np.float32)
        t0 = time.perf_counter()
        for i in range(0, len(audio) - 511, 512):
            x = np.concatenate([context, audio[None, i:i + 512]], axis=1)
            out, state = sess.run(None, {"input": x, "state": state, "sr": sr})
            context = x[:, -64:]
        totals.append(time.perf_counter() - t0)
    del sess
    gc.collect()
    return statistics.median(totals[1:])


def _set_threads(n: int) -> None:
    global THREADS
    THREADS = n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runtimes", default="onnxruntime,dynashape")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="runtimes alternated; the least figure is kept")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=THREADS, help="every runtime's threads (default 2)")
    opts = ap.parse_args()
    _set_threads(opts.threads)
    runtimes = opts.runtimes.split(",")
    for name in opts.models.split(","):
        spec = BY_NAME[name]
        path = str(fetch(spec))
        best: dict = {}
        for _ in range(opts.rounds):
            for r in runtimes:
                rec = per_call(spec, r, path, opts.repeat, opts.seed)
                if name in ("silero_vad", "silero_vad_ifless"):
                    rec["loop"] = silero_loop(r, path, opts.passes, opts.seed)
                old = best.get(r)
                best[r] = rec if old is None else {k: (min(v, old[k]) if isinstance(v, float) else v)
                                                   for k, v in rec.items()}
        line = [f"{name:20s}"]
        for key in ("steady", "first", "loop"):
            if key not in best[runtimes[0]]:
                continue
            vals = [best[r][key] * 1e3 for r in runtimes]
            ratio = f" ({vals[1] / vals[0]:.2f}x)" if len(vals) == 2 else ""
            line.append(f"{key} " + " / ".join(f"{v:.3f}" for v in vals) + f" ms{ratio}")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
