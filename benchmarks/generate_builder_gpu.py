"""Generation on the GPU from onnxruntime-genai's model builder folders (GroupQueryAttention,
MatMulNBits): ``dynashape.generate`` as it runs by default on CUDA (the op written out as exporters
write attention, ``gqa_as_concat``: the steps run as whole-step CUDA graphs) against the same with
the op kept (``gqa_as_concat=False``: every step on the dynamic path). Greedy, one prompt of 8
tokens, every token read back a step, timed after two warm generations. Then both sessions fed the
op path's tokens: their last-position logits compared step by step, and whether their argmax agrees
wherever the op path's top two logits differ by more than 1e-2 (int4 with int8 activations turns a
last-bit difference into another quantized value now and then: near-ties may flip).

    python benchmarks/generate_builder_gpu.py FOLDER [FOLDER ...] [--steps 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape.generate as dg  # noqa: E402
from benchmarks.common import gpu_header, write_json  # noqa: E402
from benchmarks.generate_gpu import generate_loop, steps_of  # noqa: E402


def loop(model, prompt, steps: int):
    """A streaming greedy loop of ``steps`` tokens (EOS banned), each read back."""
    return generate_loop(model, prompt, steps, no_eos=True)


def timed(model, prompt, steps: int) -> tuple[dict, list]:
    for _ in range(2):  # loads, first calls, builds
        toks = []
        t = steps_of(tok for tok in loop(model, prompt, steps) if not toks.append(tok))
    rest = t[1:]
    med = statistics.median(rest)
    return {"tokens_per_s": len(rest) / sum(rest), "median_step_ms": med * 1e3, "slowest_vs_median": max(rest) / med,
            "stats": {k: v for k, v in model.last_stats.items() if k.startswith(("decode_graph_replays", "gqa"))}}, \
        [t[0] for t in toks]


def forced_logits(model, prompt: list[int], tokens: list[int]) -> list[np.ndarray]:
    """The last position's logits after the prompt and after each of ``tokens`` (fed, not chosen)."""
    params = dg.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + len(tokens) + 1)
    gen = dg.Generator(model, params)
    gen.append_tokens(np.asarray([prompt]))
    out = [gen.get_logits()[0].copy()]
    for t in tokens:
        gen.append_tokens(np.asarray([[t]]))
        out.append(gen.get_logits()[0].copy())
    return out


def weight_bytes(folder: str) -> int:
    """The bytes a decode step reads of the model's initializers: all but the token embedding's table
    (one row of it a token)."""
    import onnx
    g = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False).graph
    embed = {n.input[0] for n in g.node if n.op_type in ("Gather", "GatherBlockQuantized")}
    total = 0
    for t in g.initializer:
        if t.name in embed:
            continue
        ext = {e.key: e.value for e in t.external_data}
        total += int(ext["length"]) if "length" in ext else len(t.raw_data) or t.ByteSize()
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--small-rows", type=int, help="kv_attention.SMALL_ROWS for this run (an A/B of the decode "
                    "attention's sums form against its dot form)")
    ap.add_argument("--only-default", action="store_true", help="no run with the op kept")
    ap.add_argument("--bandwidth", type=float, default=4.8, help="the device's memory bandwidth, TB/s (H200: 4.8)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (the option is then set explicitly)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.small_rows is not None:
        from dynashape.ops import kv_attention
        kv_attention.SMALL_ROWS = args.small_rows
    dev = args.device
    written = {} if dev == "cuda" else {"gqa_as_concat": True, "decode_graphs": "on"}
    data = {**(gpu_header() if dev == "cuda" else {"device": "cpu"}), "steps": args.steps, "models": {}}
    for folder in args.folders:
        path = os.path.normpath(folder)  # the builder writes into .../NAME/out: NAME names it
        name = os.path.basename(os.path.dirname(path)) if os.path.basename(path) == "out" else os.path.basename(path)
        rows, tokens = {}, {}
        nbytes = weight_bytes(folder)
        variants = (("written out (default)", written), ("op kept", {"gqa_as_concat": False}))
        for label, opts in variants[:1] if args.only_default else variants:
            model = dg.Model(folder, device=dev, **opts)
            prompt = np.random.default_rng(0).integers(4, 200, (1, 8)).tolist()
            rows[label], tokens[label] = timed(model, prompt, args.steps)
            r = rows[label]
            print(f"{name:24s} {label:22s} {r['tokens_per_s']:8.0f} tokens/s  median step {r['median_step_ms']:.3f} ms"
                  f"  slowest {r['slowest_vs_median']:.1f}x  {r['stats']}", flush=True)
            del model
        step = rows["written out (default)"]["median_step_ms"] * 1e-3
        limit = nbytes / (args.bandwidth * 1e12)
        print(f"  weights read a step {nbytes / 1e6:.0f} MB: at {args.bandwidth} TB/s {limit * 1e3:.3f} ms, the step "
              f"{step * 1e3:.3f} ms ({limit / step:.1%} of the bandwidth limit)", flush=True)
        data["models"][name] = {"rows": rows, "weight_bytes": nbytes, "bandwidth_limit_ms": limit * 1e3,
                                "fraction_of_limit": limit / step}
        if args.only_default:
            continue
        a, b = np.asarray(tokens["written out (default)"]), np.asarray(tokens["op kept"])
        same = float((a == b).mean())
        first = int(np.argmax(a != b)) if (a != b).any() else None
        ref = forced_logits(dg.Model(folder, device=dev, gqa_as_concat=False), prompt[0], list(b[:64]))
        got = forced_logits(dg.Model(folder, device=dev, **written), prompt[0], list(b[:64]))
        gaps = [float(np.diff(np.sort(r)[-2:])[0]) for r in ref]
        clear = [i for i, g in enumerate(gaps) if g > 1e-2]
        agree = sum(int(np.argmax(ref[i]) == np.argmax(got[i])) for i in clear)
        diff = max(float(np.abs(x - y).max()) for x, y in zip(ref, got))
        print(f"  tokens equal {same:.3f} (first differing step {first}); forced 64 steps: max logit diff {diff:.2e}, "
              f"argmax equal at {agree}/{len(clear)} steps whose top two differ by > 1e-2", flush=True)
        data["models"][name].update({"tokens_equal": same, "first_differing_step": first,
                                     "forced_max_logit_diff": diff, "forced_clear_steps": len(clear),
                                     "forced_argmax_equal": agree})
    write_json(args.json, data)


if __name__ == "__main__":
    main()
