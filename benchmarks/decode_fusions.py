"""Whole-step decode with and without the fusions of the step's small kernels (``fuse_matmul_add``:
the residual add in the product's epilogue; ``fuse_silu_mul``: the SwiGLU gate in one kernel;
``fuse_norm_linear``: a single row's RMSNorm inside the product that reads it;
``fuse_rope_append``: the rotary embedding of queries and keys and the KV writes in one kernel),
side by side in one process, beside PyTorch eager of the same module.

The 12-layer / hidden-768 test decoder (benchmarks/decode_graphs.py's config). Greedy decode of
``--steps`` tokens after a 16-token prompt; the runtimes alternate round by round after a warm-up
round each; tokens/s from the median round. "without" is the same session options with the two
passes taken out of the pipeline before the session is made and the step's rewrite turned off
(``DYNASHAPE_STEP_FUSIONS=0``) while it builds its code (load and the warm-up round).

    python benchmarks/decode_fusions.py --device cuda [--dtype float32 bfloat16] [--batch 1 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone, print_table, write_json  # noqa: E402
from benchmarks.decode_graphs import config, greedy_past  # noqa: E402
from dynashape.compile import pipeline  # noqa: E402
from tests.models import llama  # noqa: E402

PASSES = ("fuse_matmul_add", "fuse_silu_mul", "fuse_norm_linear")


def session(path, dev, fused: bool, drop=PASSES + ("step",)):
    """A session made with or without the passes in ``drop`` ("step": the step's own rewrite);
    the pipeline's lists restored after."""
    passes, device_passes = pipeline.FUSION_PASSES, pipeline.device_passes
    if not fused:
        pipeline.FUSION_PASSES = [p for p in passes if p[0] not in drop]
        pipeline.device_passes = lambda d: [p for p in device_passes(d) if p[0] not in drop]
    try:
        with step_fusions(fused or "step" not in drop):
            return dynashape.InferenceSession(path, device=str(dev))
    finally:
        pipeline.FUSION_PASSES, pipeline.device_passes = passes, device_passes


@contextlib.contextmanager
def step_fusions(on: bool):
    """The whole step's rewrites on or off while code is generated."""
    old = os.environ.get("DYNASHAPE_STEP_FUSIONS")
    os.environ["DYNASHAPE_STEP_FUSIONS"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["DYNASHAPE_STEP_FUSIONS"]
        else:
            os.environ["DYNASHAPE_STEP_FUSIONS"] = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--drop", nargs="+", default=list(PASSES) + ["step"],
                    help="what 'without' leaves out: pass names and/or 'step' (the step's rewrite)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device(args.device)
    rows, data = [], {}
    for dt in args.dtype:
        cfg = config(args.layers, dt)
        path, names = str(llama.model_path(cfg)), llama.input_names(cfg)
        eager = llama.build(cfg).to(dev)
        for batch in args.batch:
            prompt = torch.randint(0, cfg["vocab"], (batch, 16), generator=torch.Generator().manual_seed(batch)).to(dev)
            sessions = {"with": session(path, dev, True), "without": session(path, dev, False, tuple(args.drop))}
            steps = {}
            for name, sess in sessions.items():
                def ds_step(ids, past, sess=sess, names=names):
                    out = sess.run(None, dict(zip(names, [ids, *past])))
                    return out[0], out[1:]
                steps[name] = ds_step

            def eager_step(ids, past, eager=eager):
                with torch.no_grad():
                    out = eager(ids, *past)
                return out[0], list(out[1:])
            steps["PyTorch eager"] = eager_step
            times = {k: [] for k in steps}
            toks = {}
            for r in range(args.rounds + 1):  # round 0 warms each up (graphs built), not timed
                for name, step in steps.items():
                    # the warm-up round builds the step's code
                    with step_fusions(name != "without" or "step" not in args.drop):
                        t, toks[name] = greedy_past(step, prompt, cfg, args.steps, dev)
                    if r:
                        times[name].append(t)
            kernels = {k: sessions[k].stats().get("decode_graph_replays", 0) for k in sessions}
            for name in steps:
                s = statistics.median(times[name])
                tps = batch * (args.steps - 1) / s
                same = float((toks[name] == toks["PyTorch eager"]).float().mean())
                rows.append([dt, batch, name, tps, 1e3 * s / (args.steps - 1), same])
                data[f"{dt} batch {batch} {name}"] = {"tokens_per_s": tps, "ms_per_step": 1e3 * s / (args.steps - 1),
                                                      "rounds_s": times[name], "same_tokens_as_eager": same,
                                                      "replays": kernels.get(name)}
            del sessions, steps
            gone()
        del eager
        gone()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print_table(f"whole-step decode with / without the residual fusions, {args.steps} tokens, {name}",
                ["dtype", "batch", "runtime", "tokens/s", "ms per step", "tokens equal to eager"], rows)
    write_json(args.json, {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                           "steps": args.steps, "rounds": args.rounds, "results": data})


if __name__ == "__main__":
    main()
