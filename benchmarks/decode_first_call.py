"""The first calls of a decode: what a user waits for before whole-step graphs serve (issue: LLM
decode at the memory-bandwidth limit, "no minute of compiling in the user's way").

One fresh process per run (``--triton-cache DIR`` names Triton's kernel cache: an empty one is a
first run on the machine, a filled one any later run). It times the session's load, the prompt
call, then every decode step of ``--steps``, and profiles the step that builds the first graph
(``--profile``: cProfile, the functions with the most cumulative time, Triton's compiler summed
apart), in a first session and a second one of the same process. The same decode with PyTorch
eager of the module is timed before them for scale.

    python benchmarks/decode_first_call.py --device cuda [--layers 12] [--dtype float32]
                                           [--steps 32] [--profile] [--json out.json]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone, sync, write_json  # noqa: E402
from benchmarks.decode_graphs import config  # noqa: E402
from tests.models import llama  # noqa: E402


def _timed(dev, f):
    sync(dev)
    t0 = time.perf_counter()
    out = f()
    sync(dev)
    return out, time.perf_counter() - t0


def _profile_summary(prof: cProfile.Profile, top: int) -> dict:
    st = pstats.Stats(prof)
    rows = []
    triton_s = 0.0
    for (file, line, fn), (_cc, _nc, _tt, ct, _callers) in st.stats.items():
        rows.append((ct, f"{os.path.basename(file)}:{line}:{fn}"))
        if fn == "compile" and "triton" in file and "compiler" in file:
            triton_s += ct
    rows.sort(reverse=True)
    return {"triton_compile_s": triton_s, "top": [[round(c, 4), n] for c, n in rows[:top]]}


def decode(step, prompt, past, steps, dev, profile: bool = False):
    """Per-call seconds: the prompt call, then each decode step; with ``profile``, the profile of
    the first call that built a decode graph (``step`` returns how many it built)."""
    times, kept = [], None

    def call(f):
        prof = cProfile.Profile() if profile and kept is None else None
        if prof is not None:
            prof.enable()
        (logits, past, built), t = _timed(dev, f)
        if prof is not None:
            prof.disable()
        times.append(t)
        return logits, past, (prof if built else None)
    logits, past, kept = call(lambda: step(prompt, past))
    tok = logits[:, -1:].argmax(-1)
    for _ in range(steps):
        logits, past, prof = call(lambda tok=tok, past=past: step(tok, past))
        kept = kept or prof
        tok = logits[:, -1:].argmax(-1)
    return times, kept


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="profile the call that builds the first graph")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cfg = config(args.layers, args.dtype)
    path, names = str(llama.model_path(cfg)), llama.input_names(cfg)
    prompt = torch.randint(0, cfg["vocab"], (args.batch, args.prompt), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(dev)
    past = [torch.zeros(args.batch, cfg["kv_heads"], 0, cfg["head_dim"], dtype=llama.dtype_of(cfg), device=dev)
            for _ in range(2 * cfg["layers"])]
    data = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "triton_cache": os.environ.get("TRITON_CACHE_DIR"),
            "config": cfg, "batch": args.batch}

    eager = llama.build(cfg).to(dev)

    def eager_step(ids, past):
        with torch.no_grad():
            out = eager(ids, *past)
        return out[0], list(out[1:]), 0
    times, _ = decode(eager_step, prompt, past, args.steps, dev)
    data["eager"] = {"prompt_s": times[0], "steps_s": times[1:]}
    eager = None  # its memory goes before dynashape is timed
    gone()
    for run in ("first session", "second session"):  # the second finds Triton's kernels loaded
        t0 = time.perf_counter()
        sess = dynashape.InferenceSession(path, device=str(dev))
        load = time.perf_counter() - t0
        builds = []

        def ds_step(ids, past, sess=sess, builds=builds):
            before = sess.stats().get("decode_graph_builds", 0)
            out = sess.run(None, dict(zip(names, [ids, *past])))
            builds.append(sess.stats().get("decode_graph_builds", 0) - before)
            return out[0], out[1:], builds[-1]
        times, prof = decode(ds_step, prompt, past, args.steps, dev, profile=args.profile)
        d = data[run] = {"load_s": load, "prompt_s": times[0], "steps_s": times[1:], "builds_per_call": builds,
                         "stats": {k: v for k, v in sess.stats().items() if k.startswith("decode_graph")}}
        if prof is not None:
            d["build_profile"] = _profile_summary(prof, args.top)
        del sess, ds_step
        gone()
    for k in ("eager", "first session", "second session"):
        d = data[k]
        s = sorted(d["steps_s"])
        print(f"{k}: load {d.get('load_s', 0):.2f} s, prompt {d['prompt_s'] * 1e3:.1f} ms, first steps "
              f"{[round(x * 1e3, 1) for x in d['steps_s'][:4]]} ms, median step {s[len(s) // 2] * 1e3:.2f} ms, "
              f"builds {d.get('builds_per_call', [])[:6]}", flush=True)
        if "build_profile" in d:
            p = d["build_profile"]
            print(f"  profile of the build (Triton compile {p['triton_compile_s']:.3f} s):")
            for c, n in p["top"]:
                print(f"  {c:8.4f}  {n}")
    write_json(args.json, data)


if __name__ == "__main__":
    main()
