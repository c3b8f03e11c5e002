"""Greedy generation through the generate API, dynashape against onnxruntime-genai on one folder.

The 2-layer Llama of scripts/make_zoo_models.py (random weights) built by onnxruntime-genai's model
builder (``-p int4 -e cpu`` by default), one prompt of 8 random tokens, ``--steps`` tokens each
read back to the host as a streaming loop does (``get_next_tokens``), the same code for both
runtimes (``dynashape.generate`` takes onnxruntime-genai's API); one runtime at a time, the other's
objects deleted first. Reports tokens/s after the prompt and whether the tokens are equal.

    python -m benchmarks.generate_genai [--steps 200] [--precision int4] [--size tiny|small] [--arch llama|qwen2|phi3]
        [--folder /tmp/genai_int4] [--accuracy-level 0]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


# ~110M parameters: the 12-layer hidden-768 decoder of the GPU runs, as the builder writes it
SIZES = {"tiny": {}, "small": dict(vocab=32000, hidden=768, intermediate=2048, layers=12, heads=12, kv_heads=4),
         # the 2-layer hidden-256 configuration of issue 38's CPU figures
         "h256": dict(vocab=32000, hidden=256, intermediate=1024, layers=2, heads=4, kv_heads=2)}


def build(folder: Path, precision: str, size: str = "tiny", arch: str = "llama", ep: str = "cpu") -> Path:
    """The builder's folder for ``ep``'s execution provider ('cpu'; 'cuda': its float16 CUDA graph, for the GPU)."""
    from benchmarks.real_models_specs import generator
    out = folder / "out"
    if (out / "genai_config.json").exists():
        return out
    g = generator()
    g.LLAMA["max_positions"] = 1024
    g.LLAMA.update(SIZES[size])
    g.make_llama_checkpoint(folder / "hf", arch)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder / "hf"), "-o",
                        str(out), "-p", precision, "-e", ep, "-c", str(folder / "cache")],
                       cwd=folder, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    return out


def with_accuracy_level(out: Path, level: int) -> Path:
    """A copy of the builder's folder whose MatMulNBits nodes take ``level`` (the builder's CPU folders
    are written at 4; onnxruntime's quantizer writes 0 unless told otherwise), beside it."""
    import shutil

    import onnx
    dest = out.parent / f"out_level{level}"
    if (dest / "model.onnx").exists():
        return dest
    dest.mkdir(exist_ok=True)
    for f in out.iterdir():
        if not f.name.startswith("model.onnx"):
            shutil.copy(f, dest / f.name)
    m = onnx.load(str(out / "model.onnx"))
    for node in m.graph.node:
        if node.op_type == "MatMulNBits":
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = level
    onnx.save(m, str(dest / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return dest


def greedy(mod, folder: Path, prompt: np.ndarray, steps: int) -> tuple[list[int], float]:
    model = mod.Model(str(folder))
    params = mod.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + steps)
    gen = mod.Generator(model, params)
    gen.append_tokens(prompt)
    tokens = []
    t0 = time.perf_counter()
    while not gen.is_done():
        gen.generate_next_token()
        tokens.append(int(gen.get_next_tokens()[0]))
    return tokens, len(tokens) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--folder", default="/tmp/genai_int4")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny",
                    help="tiny: the zoo's 2-layer hidden-64 Llama; h256: 2 layers of hidden 256; small: ~110M")
    ap.add_argument("--arch", choices=["llama", "qwen2", "phi3"], default="llama",
                    help="the transformers architecture the builder converts")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each runtime, alternating which goes first; "
                    "the medians are reported (this machine's load drifts within minutes)")
    ap.add_argument("--accuracy-level", type=int, help="MatMulNBits' accuracy level set in a copy of the folder")
    ap.add_argument("--json", help="write the figures here (docs/benchmarks.md reads them)")
    args = ap.parse_args()
    import onnxruntime_genai as og
    import torch

    import dynashape.generate as dg
    torch.set_num_threads(2)
    out = build(Path(args.folder), args.precision, args.size, args.arch)
    if args.accuracy_level is not None:
        out = with_accuracy_level(out, args.accuracy_level)
    prompt = np.random.default_rng(0).integers(4, 256, 8).astype(np.int32)
    runtimes = [("onnxruntime-genai", og), ("dynashape", dg)]
    tokens, rates = {}, {name: [] for name, _ in runtimes}
    for r in range(args.rounds):
        for name, mod in (runtimes if r % 2 == 0 else runtimes[::-1]):
            greedy(mod, out, prompt, 16)  # loads, first calls
            tokens[name], rate = greedy(mod, out, prompt, args.steps)
            rates[name].append(rate)
            gc.collect()
    a, b = tokens["onnxruntime-genai"], tokens["dynashape"]
    ra, rb = (float(np.median(rates[n])) for n in ("onnxruntime-genai", "dynashape"))
    ratios = [y / x for x, y in zip(rates["onnxruntime-genai"], rates["dynashape"])]
    print(f"onnxruntime-genai {ra:.0f} tokens/s; dynashape {rb:.0f} tokens/s ({rb / ra:.3f}x, rounds "
          f"{' '.join(f'{x:.2f}' for x in ratios)}); tokens equal: {a == b}")
    if args.json:
        import json

        from dynashape.ops.native import cpuinfo
        device = f"CPU {cpuinfo('model name') or 'x86'}, {os.cpu_count()} cores"
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "device": device, "threads": 2,
                       "precision": args.precision, "size": args.size, "arch": args.arch, "steps": args.steps,
                       "accuracy_level": args.accuracy_level,
                       "tokens_per_s": {"onnxruntime-genai": ra, "dynashape": rb}, "rounds": rates,
                       "tokens_equal": a == b}, f, indent=1)


if __name__ == "__main__":
    main()
