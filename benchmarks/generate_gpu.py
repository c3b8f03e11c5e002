"""A streaming greedy loop on the GPU: every token read back to the host, as a chat front end does.

The 12-layer hidden-768 Llama-style decoder of benchmarks/decode.py (``small``, fp32, random
weights, ``--batch`` rows in ``--dtype``): a prompt of 8 tokens, then ``--steps`` tokens. Timed after a first generation
(loads, first calls, builds): PyTorch eager of the same module (``.item()`` a step); a plain
dynashape session loop (argmax on the device, ``.item()`` a step, the present fed back as the
past); ``dynashape.generate`` (onnxruntime-genai's API: ``generate_next_token`` then
``get_next_tokens`` a step). Tokens/s over the steps after the prompt, the slowest step against
the median, and a cProfile of the generate loop's host side (``--profile``).

    python benchmarks/generate_gpu.py [--steps 240] [--profile] [--dtype float32] [--batch 1]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
import dynashape.generate as dg  # noqa: E402
from benchmarks.decode import CONFIGS  # noqa: E402
from tests.models import llama  # noqa: E402


def steps_of(loop) -> list[float]:
    """Seconds of each step of ``loop`` (a generator yielding once a step)."""
    out = []
    t0 = time.perf_counter()
    for _ in loop:
        t1 = time.perf_counter()
        out.append(t1 - t0)
        t0 = t1
    return out


def eager_loop(model, prompt, steps, dev):
    cfg = model.cfg
    b, dt = len(prompt), llama.dtype_of(cfg)
    past = [torch.zeros(b, cfg["kv_heads"], 0, cfg["head_dim"], device=dev, dtype=dt) for _ in range(2 * cfg["layers"])]
    ids = torch.tensor(prompt, device=dev)
    with torch.no_grad():
        for _ in range(steps):
            out = model(ids, *past)
            tok = out[0][:, -1].argmax(-1)
            past = list(out[1:])
            yield tok.tolist()  # every row's token read back, as a streaming loop does
            ids = tok[:, None]


def session_loop(sess, cfg, prompt, steps, dev):
    names = llama.input_names(cfg)
    b, dt = len(prompt), llama.dtype_of(cfg)
    past = [torch.zeros(b, cfg["kv_heads"], 0, cfg["head_dim"], device=dev, dtype=dt) for _ in range(2 * cfg["layers"])]
    ids = torch.tensor(prompt, device=dev)
    for _ in range(steps):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        tok = out[0][:, -1].argmax(-1)
        past = out[1:]
        yield tok.tolist()
        ids = tok[:, None]


def generate_loop(model, prompt, steps, no_eos: bool = False):
    """A streaming greedy loop of ``steps`` tokens, each read back; ``no_eos``: the model's EOS banned
    (min_length), so that a random model's loop runs every step."""
    params = dg.GeneratorParams(model)
    n = len(prompt[0]) + steps
    params.set_search_options(max_length=n, **({"min_length": n} if no_eos else {}))
    gen = dg.Generator(model, params)
    gen.append_tokens(np.asarray(prompt))
    while not gen.is_done():
        gen.generate_next_token()
        yield gen.get_next_tokens().tolist()
    model.last_stats = gen.request.stats()


def decoder_folder(dtype: str):
    """(config, ONNX path, model folder) of the 12-layer decoder in ``dtype``: the folder holds the ONNX
    file and a genai_config.json, as onnxruntime-genai's Model reads it."""
    cfg = {**CONFIGS["small"], "dtype": dtype}
    path = llama.model_path(cfg)
    folder = Path(tempfile.mkdtemp())
    shutil.copy(path, folder / "model.onnx")
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"},
                                                                     "eos_token_id": -1, "context_length": 256}}))
    return cfg, path, folder


def model_folder(dtype: str):
    """(dynashape.generate Model on CUDA, config) of the 12-layer decoder in ``dtype``."""
    cfg, _, folder = decoder_folder(dtype)
    return dg.Model(str(folder), device="cuda"), cfg


def summary(name: str, times: list[float], batch: int) -> dict:
    rest = times[1:]  # after the prompt's step
    med = statistics.median(rest)
    r = {"tokens_per_s": batch * len(rest) / sum(rest), "median_step_ms": med * 1e3,
         "slowest_vs_median": max(rest) / med, "first_step_ms": times[0] * 1e3}
    print(f"{name:28s} {r['tokens_per_s']:8.0f} tokens/s  median step {r['median_step_ms']:.3f} ms  slowest "
          f"{r['slowest_vs_median']:.1f}x median  prompt step {r['first_step_ms']:.1f} ms", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    cfg, path, folder = decoder_folder(args.dtype)
    prompt = np.random.default_rng(0).integers(0, cfg["vocab"], (args.batch, 8)).tolist()
    res, tokens = {}, {}
    m = llama.build(cfg).to(dev)
    for _ in range(2):
        toks = []
        t = steps_of(tok for tok in eager_loop(m, prompt, args.steps, dev) if not toks.append(tok))
    res["eager"] = summary("eager (.item() a step)", t, args.batch)
    tokens["eager"] = toks
    m = None
    gc.collect()
    sess = dynashape.InferenceSession(str(path), device="cuda")
    toks = []
    for _ in range(3):  # loads, first calls, background builds
        toks = []
        t = steps_of(tok for tok in session_loop(sess, cfg, prompt, args.steps, dev) if not toks.append(tok))
    res["session"] = summary("dynashape session loop", t, args.batch)
    tokens["session"] = toks
    sess = None
    gc.collect()
    model = dg.Model(str(folder), device="cuda")
    for _ in range(3):
        toks = []
        t = steps_of(tok for tok in generate_loop(model, prompt, args.steps) if not toks.append(tok))
    res["generate"] = summary("dynashape.generate", t, args.batch)
    res["generate"]["stats"] = {k: v for k, v in model.last_stats.items() if k.startswith("decode_")}
    print(res["generate"]["stats"])
    tokens["generate"] = toks
    for name in ("session", "generate"):  # fp32: the same tokens as eager's, but where logits nearly tie
        a, b = np.asarray(tokens[name]), np.asarray(tokens["eager"][:len(tokens[name])])
        res[name]["tokens_equal_to_eager"] = float((a == b).mean())
        res[name]["first_differing_step"] = int(np.argmax((a != b).any(1))) if (a != b).any() else None
        print(f"{name}: tokens equal to eager's {res[name]['tokens_equal_to_eager']:.3f}, first differing step "
              f"{res[name]['first_differing_step']}")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in generate_loop(model, prompt, args.steps):
            pass
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "dtype": args.dtype,
                       "steps": args.steps,
                       "batch": args.batch, **res}, f, indent=1)


if __name__ == "__main__":
    main()
