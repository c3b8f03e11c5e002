"""The next KV bucket's graph built ahead on a background thread against built in the call that
passes the end of the bucket (``decode_ahead``), over one decode from a fresh session.

The 12-layer / hidden-768 test decoder (benchmarks/decode_graphs.py's config), fp32. Per setting a
new session decodes ``--steps`` tokens after a 16-token prompt, reading each token back to the host
as a generation loop that streams its tokens does; every graph build falls inside the timed run
(a first session, not timed, compiles the Triton kernels and warms cuBLAS for all). Reported: tokens/s
over the whole decode, the slowest step, the steps at the bucket changes, and the thread's builds and
waits; a third setting synchronizes the device after every step, as a user timing each step does
(it waits while the thread captures: impls/capture_guard.py). The settings alternate (off, ahead,
ahead + synchronize, off, ...) so that drift hits them alike.

    python benchmarks/decode_ahead.py --device cuda [--steps 1024] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone, print_table, write_json  # noqa: E402
from benchmarks.decode_graphs import config  # noqa: E402
from dynashape.impls import capture_guard  # noqa: E402
from tests.models import llama  # noqa: E402


def one_decode(path, names, cfg, dev, steps: int, ahead: str, sync: bool = False) -> dict:
    sess = dynashape.InferenceSession(path, device=str(dev), decode_ahead=ahead)
    past = [torch.zeros(1, cfg["kv_heads"], 0, cfg["head_dim"], dtype=llama.dtype_of(cfg), device=dev)
            for _ in range(2 * cfg["layers"])]
    tok = torch.randint(0, cfg["vocab"], (1, 16), generator=torch.Generator().manual_seed(0)).to(dev)
    times, toks = [], []
    waits0 = capture_guard.waits()["waits"]
    t_all = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sess.run(None, dict(zip(names, [tok, *past])))
        past = out[1:]
        tok = out[0][:, -1:].argmax(-1)
        toks.append(int(tok.item()))  # the host reads each token (a streaming loop): the step is done
        if sync:  # as a user timing each step does: device-wide, waits while the thread captures
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    total = time.perf_counter() - t_all
    st = {k: v for k, v in sess.stats().items() if k.startswith("decode_graph")}
    waits = capture_guard.waits()["waits"] - waits0
    changes = [i for i in range(1, steps) if times[i] > 5 * statistics.median(times)]
    label = ahead + (" + torch.cuda.synchronize() each step" if sync else "")
    res = {"decode_ahead": label, "tokens_per_s": (steps - 1) / (total - times[0]),
           "median_step_ms": 1e3 * statistics.median(times[1:]), "max_step_ms": 1e3 * max(times[1:]),
           "slow_steps": {i: round(1e3 * times[i], 2) for i in changes}, "stats": st, "tokens": toks,
           "synchronizes_that_waited_for_a_capture": waits}
    del sess, past, out
    gone()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cfg = config(args.layers, "float32")
    path, names = str(llama.model_path(cfg)), llama.input_names(cfg)
    one_decode(path, names, cfg, dev, 300, "off")  # Triton kernels compiled, cuBLAS warmed: for all alike
    runs = {"off": [], "64": [], "64 sync": []}
    for _ in range(args.repeats):
        for ahead in runs:
            r = one_decode(path, names, cfg, dev, args.steps, ahead.split()[0], sync=ahead.endswith("sync"))
            runs[ahead].append(r)
            print(ahead, {k: v for k, v in r.items() if k != "tokens"}, flush=True)
    rows = []
    for rs in runs.values():
        failed = sum(r["stats"].get("decode_graph_ahead_failures", 0) for r in rs)
        mid = sorted(rs, key=lambda r: r["tokens_per_s"])[len(rs) // 2]
        rows.append([mid["decode_ahead"], mid["tokens_per_s"], mid["median_step_ms"], mid["max_step_ms"],
                     ", ".join(f"{i}: {ms}" for i, ms in mid["slow_steps"].items()),
                     mid["stats"].get("decode_graph_ahead_waits", 0), failed,
                     mid["synchronizes_that_waited_for_a_capture"], rs[0]["tokens"] == runs["off"][0]["tokens"]])
    dev_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print_table(f"one decode of {args.steps} tokens from a fresh session, fp32 batch 1, {dev_name}",
                ["decode_ahead", "tokens/s", "median step ms", "max step ms", "slow steps (ms)", "waits",
                 "failed captures (all runs)", "synchronizes held", "tokens equal"], rows)
    if args.json:
        write_json(args.json, {"device": dev_name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                               "steps": args.steps, "runs": runs})


if __name__ == "__main__":
    main()
