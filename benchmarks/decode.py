"""Decode speed of the Llama-style test decoder: tokens/s of dynashape, PyTorch eager of the same
module, onnxruntime, and torch.compile (optional), over a decode loop whose past grows every step.

Each step feeds the last step's present back as the past (torch tensors for dynashape and eager,
numpy arrays for onnxruntime, as a user of each would). Per round: a prefill of 8 tokens, then
``--steps`` decode steps of one token, each step timed; tokens/s = batch / the median step time
over all rounds (the machines are shared and noisy: the median of many steps is robust to the
odd slow one). dynashape and the torch module share torch's thread pool and alternate round by
round; onnxruntime runs after them, alone, and its session is deleted before anything else runs,
so that no other runtime's thread pool spins while one is timed. Warm-up rounds come first, until
dynashape's static impls (built in the background, on CPU and CUDA by default for a decoder) are
settled; the first warm-up round's slowest step and total are reported beside the steady figures.

    python benchmarks/decode.py [--batch 1 4] [--steps 128] [--rounds 5] [--device cpu|cuda]
                                [--threads 2] [--config tiny|small] [--compile] [--static off]
                                [--deterministic] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone as _gone  # noqa: E402
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.common import sync as _sync  # noqa: E402
from tests.models import llama  # noqa: E402

CONFIGS = {"tiny": llama.TINY,
           # a 12-layer / hidden-768 decoder (~125M parameters), the size of the issues' GPU runs
           "small": dict(layers=12, hidden=768, heads=12, kv_heads=4, head_dim=64, ffn=2048, vocab=32000,
                         rope_theta=10000.0, eps=1e-5, seed=0)}



def _loop(step, past0, ids, steps: int, dev: torch.device) -> list[float]:
    """Seconds of each of ``steps`` decode steps after a prefill (``step(ids, past) -> (logits, past)``)."""
    _, past = step(ids[:, :8], past0)
    _sync(dev)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        _, past = step(ids[:, 8 + i:9 + i], past)
        _sync(dev)
        times.append(time.perf_counter() - t0)
    return times


def dynashape_step(path: str, cfg: dict, dev: torch.device, static: str | None = None, deterministic=False):
    sess = dynashape.InferenceSession(path, device=str(dev), deterministic=deterministic,
                                      **({"static_impls": static} if static else {}))
    names = llama.input_names(cfg)

    def step(ids, past):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        return out[0], out[1:]
    step.session = sess
    return step


def eager_step(cfg: dict, dev: torch.device, compiled: bool = False):
    model = llama.build(cfg).to(dev)
    fn = torch.compile(model, dynamic=True) if compiled else model

    def step(ids, past):
        with torch.no_grad():
            out = fn(ids, *past)
        return out[0], list(out[1:])
    return step


def _static_work(steps_by_name: dict) -> tuple | None:
    """The static builds done or refused so far, per dynashape session, or None while a session
    may not build yet (a CPU decoder before its first calls, or inductor's imports not done)."""
    out = []
    for step in steps_by_name.values():
        sess = getattr(step, "session", None)
        if sess is not None and sess.compiled.context is not None:
            if not sess.compiled.trace_ready():
                return None
            sess.compiled.context.wait(600)
            st = sess.stats()
            out.append((st.get("static_builds", 0), st.get("static_refused", 0)))
    return tuple(out)


def torch_rounds(steps_by_name: dict, cfg, batch, steps, rounds, dev, max_warm: int = 12) -> tuple[dict, dict, int]:
    """Round by round, each runtime in turn (they share torch's thread pool). Warm-up rounds first,
    until static impls settle (a round that built or refused none; at most ``max_warm``): their
    traces and background builds are spread over calls (and wait for inductor's imports on CPU),
    so a single warm-up round may not see them all. Returns the step times of the timed rounds,
    those of the first warm-up round (where a build that stalls the loop shows) and the number
    of warm-up rounds."""
    rng = np.random.default_rng(0)

    def one_round() -> dict[str, list[float]]:
        ids = torch.from_numpy(rng.integers(0, cfg["vocab"], (batch, 8 + steps))).to(dev)
        out = {}
        for name, step in steps_by_name.items():
            past = [torch.zeros(batch, cfg["kv_heads"], 0, cfg["head_dim"], device=dev)
                    for _ in range(2 * cfg["layers"])]
            out[name] = _loop(step, past, ids, steps, dev)
        return out
    warm = one_round()
    settled, n = _static_work(steps_by_name), 1
    while n < max_warm:
        one_round()
        n += 1
        now = _static_work(steps_by_name)
        if now is not None and now == settled:
            break
        settled = now
    times: dict[str, list[float]] = {k: [] for k in steps_by_name}
    for _ in range(rounds):
        for name, t in one_round().items():
            times[name] += t
    return times, warm, n


def ort_rounds(path: str, cfg: dict, batch: int, steps: int, rounds: int, threads: int) -> list[float]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = llama.input_names(cfg)

    def step(ids, past):
        out = sess.run(None, dict(zip(names, [ids.numpy(), *past])))
        return out[0], out[1:]
    rng = np.random.default_rng(0)
    times: list[float] = []
    for r in range(rounds + 1):
        ids = torch.from_numpy(rng.integers(0, cfg["vocab"], (batch, 8 + steps)))
        past = [np.zeros((batch, cfg["kv_heads"], 0, cfg["head_dim"]), np.float32) for _ in range(2 * cfg["layers"])]
        t = _loop(step, past, ids, steps, torch.device("cpu"))
        if r:
            times += t
    return times  # the session (and its thread pool) goes with this frame



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--compile", action="store_true", help="also torch.compile(dynamic=True) of the module")
    ap.add_argument("--static", nargs="*", default=[],
                    help="also dynashape with these static_impls modes (on CPU: regions compiled by inductor), "
                         "timed after the warm-up round's background builds are done")
    ap.add_argument("--deterministic", action="store_true",
                    help="dynashape sessions with deterministic=True (static impls built in the call that asks)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cfg = CONFIGS[args.config]
    path = str(llama.model_path(cfg))
    rows, data = [], {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                      "torch": torch.__version__, "threads": args.threads, "config": args.config, "results": {}}
    for batch in args.batch:
        det = args.deterministic
        steps_by_name = {"dynashape": dynashape_step(path, cfg, dev, deterministic=det),
                         "PyTorch eager": eager_step(cfg, dev)}
        for mode in args.static:
            steps_by_name[f"dynashape static_impls={mode}"] = dynashape_step(path, cfg, dev, mode, det)
        if args.compile:
            steps_by_name["torch.compile"] = eager_step(cfg, dev, compiled=True)
        times, warm, n_warm = torch_rounds(steps_by_name, cfg, batch, args.steps, args.rounds, dev)
        data.setdefault("warmup_rounds", {})[f"batch {batch}"] = n_warm
        del steps_by_name
        _gone()
        if dev.type == "cpu":
            time.sleep(1.0)  # torch's idle workers stop spinning before onnxruntime is timed
            times["onnxruntime"] = ort_rounds(path, cfg, batch, args.steps, args.rounds, args.threads)
            _gone()
        med = {k: statistics.median(v) for k, v in times.items()}
        tps = {k: batch / m for k, m in med.items()}
        data["results"][f"batch {batch}"] = {k: {"tokens_per_s": tps[k], "median_step_ms": med[k] * 1e3,
                                                 "p10_step_ms": float(np.percentile(times[k], 10)) * 1e3,
                                                 "p90_step_ms": float(np.percentile(times[k], 90)) * 1e3,
                                                 **({"warmup_round_max_step_ms": max(warm[k]) * 1e3,
                                                     "warmup_round_total_ms": sum(warm[k]) * 1e3} if k in warm else {})}
                                             for k in times}
        for k in times:
            rows.append([f"batch {batch}", k, tps[k], med[k] * 1e3, float(np.percentile(times[k], 10)) * 1e3,
                         float(np.percentile(times[k], 90)) * 1e3, tps[k] / tps["PyTorch eager"],
                         max(warm[k]) * 1e3 if k in warm else float("nan"),
                         sum(warm[k]) * 1e3 if k in warm else float("nan")])
    print_table(f"decode, {args.config} Llama-style decoder, {args.steps} steps, {dev}, {args.threads} threads",
                ["batch", "runtime", "tokens/s", "ms/step (median)", "p10", "p90", "x eager",
                 "warm-up round: max step ms", "total ms"], rows)
    write_json(args.json, data)


if __name__ == "__main__":
    main()
