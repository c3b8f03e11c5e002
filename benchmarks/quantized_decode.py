"""The zoo's quantized GPT-2 (onnxruntime's transformers optimizer, then quantize_dynamic:
DynamicQuantizeMatMul, Attention with past, SkipLayerNormalization, FastGelu) decoding: dynashape
vs onnxruntime on the CPU.

A prompt of --prompt tokens, then --steps single-token steps, the presents fed back as the next
step's pasts (numpy arrays, as an onnxruntime user's loop hands them), for each batch size in
--batches. Each runtime gets the machine in its turn (its session is deleted and garbage-collected
before the other's exists); both use --threads threads. Reported per batch: the whole loop, the
median of --repeat warm passes, the ratio, and the largest difference of the logits.

    python benchmarks/quantized_decode.py [--batches 1,4] [--prompt 8] [--steps 24] [--repeat 7]
                                          [--threads 2] [--rounds 1] [--new-prompts 40,72,104]
                                          [--json out.json]

The first loop of each session (every length new to it, dynashape's specializations built) is
reported beside the warm median.

The model is scripts/make_zoo_models.py's ``gpt2-opt-qdyn`` (built into .cache/generated when missing).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def decode_loop(run, gen, batch: int, prompt: int, steps: int, seed: int = 0) -> list:
    """The loop; returns the logits of every step."""
    c = gen.GPT2
    heads, hd = c["heads"], c["hidden"] // c["heads"]
    past_names = gen.gpt2_io()[0][3:]
    rng = np.random.default_rng(seed)
    past = {n: np.zeros((batch, heads, 0, hd), np.float32) for n in past_names}
    mask = np.ones((batch, prompt), np.int64)
    logits = []
    for k, s in enumerate([prompt] + [1] * steps):
        if k:
            mask = np.concatenate([mask, np.ones((batch, s), np.int64)], axis=1)
        pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -s:].astype(np.int64)
        feeds = {"input_ids": rng.integers(0, c["vocab"], (batch, s)).astype(np.int64), "attention_mask": mask,
                 "position_ids": pos, **past}
        out = run(feeds)
        logits.append(out[0])
        past = {n: out[1 + i] for i, n in enumerate(past_names)}
    return logits


def measure(make, gen, batch: int, args) -> tuple[float, list]:
    holder = [make()]

    def run(feeds):
        return holder[0].run(None, feeds)

    t0 = time.perf_counter()
    first = decode_loop(run, gen, batch, args.prompt, args.steps)
    cold = time.perf_counter() - t0  # the session's first loop: every length new (a first generation)
    decode_loop(run, gen, batch, args.prompt, args.steps)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        decode_loop(run, gen, batch, args.prompt, args.steps)
        times.append(time.perf_counter() - t0)
    holder.clear()  # the session and its thread pool gone before the other runtime's exists
    gc.collect()
    return statistics.median(times), first, cold


def fresh_lengths(make, gen, batch: int, args) -> float:
    """Generations whose every length is new to the session: after a warm-up generation (prompt
    --prompt), one of each prompt in --new-prompts, timed together (a chat whose lengths differ
    from one turn to the next: the groups of each new length built, the arena re-planned)."""
    holder = [make()]

    def run(feeds):
        return holder[0].run(None, feeds)

    decode_loop(run, gen, batch, args.prompt, args.steps)
    t0 = time.perf_counter()
    for p in (int(x) for x in args.new_prompts.split(",")):
        decode_loop(run, gen, batch, p, args.steps)
    t = time.perf_counter() - t0
    holder.clear()
    gc.collect()
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,4")
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1,
                   help="sessions of each runtime per batch, in the order A B B A ...: medians over them")
    p.add_argument("--new-prompts", default="",
                   help="e.g. 40,72,104: also time generations of these prompts, every length new to the session")
    p.add_argument("--json")
    args = p.parse_args()

    import onnxruntime as ort
    import torch

    import dynashape
    from benchmarks.real_models_specs import generator
    torch.set_num_threads(args.threads)
    gen = generator()
    path = gen.generate("gpt2-opt-qdyn")  # the cached file, made when missing

    def make_ort():
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    makers = {"onnxruntime": make_ort, "dynashape": lambda: dynashape.InferenceSession(str(path))}
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        got: dict = {name: [] for name in makers}
        logits: dict = {}
        for r in range(args.rounds):
            order = list(makers) if r % 2 == 0 else list(makers)[::-1]  # A B, B A, ...: no runtime always first
            for name in order:
                t, out, cold = measure(makers[name], gen, b, args)
                got[name].append((t, cold))
                logits[name] = out
        err = max(float(np.abs(x - y).max()) for x, y in zip(logits["dynashape"], logits["onnxruntime"]))
        t_ort, t_ds = (statistics.median(t for t, _ in got[n]) for n in ("onnxruntime", "dynashape"))
        c_ort, c_ds = (statistics.median(c for _, c in got[n]) for n in ("onnxruntime", "dynashape"))
        per_round = [d[0] / o[0] for d, o in zip(got["dynashape"], got["onnxruntime"])]
        fresh = {}
        if args.new_prompts:
            runs: dict = {name: [] for name in makers}
            for r in range(args.rounds):
                for name in (list(makers) if r % 2 == 0 else list(makers)[::-1]):
                    runs[name].append(fresh_lengths(makers[name], gen, b, args))
            fresh = {f"new_lengths_{n}_ms": statistics.median(v) * 1e3 for n, v in runs.items()}
            fresh["new_lengths_ratio"] = fresh["new_lengths_dynashape_ms"] / fresh["new_lengths_onnxruntime_ms"]
        rows.append({"batch": b, "onnxruntime_ms": t_ort * 1e3, "dynashape_ms": t_ds * 1e3, "ratio": t_ds / t_ort,
                     "ratio_per_round": per_round, "first_loop_onnxruntime_ms": c_ort * 1e3,
                     "first_loop_dynashape_ms": c_ds * 1e3, "max_abs_logits": err, "steps": args.steps,
                     "prompt": args.prompt, "rounds": args.rounds, **fresh})
        print(f"gpt2-opt-qdyn batch {b}: onnxruntime {t_ort * 1e3:.2f} ms, dynashape {t_ds * 1e3:.2f} ms, "
              f"ratio {t_ds / t_ort:.2f} (rounds: {', '.join(f'{x:.2f}' for x in per_round)}); first loop "
              f"{c_ort * 1e3:.1f} / {c_ds * 1e3:.1f} ms; max |logits diff| {err:.1e}")
        if fresh:
            print(f"  generations of new lengths (prompts {args.new_prompts}): onnxruntime "
                  f"{fresh['new_lengths_onnxruntime_ms']:.2f} ms, dynashape "
                  f"{fresh['new_lengths_dynashape_ms']:.2f} ms, ratio {fresh['new_lengths_ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "rounds": args.rounds, "rows": rows},
                                              indent=1))


if __name__ == "__main__":
    main()
