"""Diagnostic (issue 39): the paged engine with prompt chunks on a stream of their own
(``PagedEngine(chunk_stream=True)``), driven step by step on the 12-layer decoder of llm_load.py, with a
watchdog: when no step ends for ``--stall`` seconds it prints where the host is (every thread's stack)
and what the device has left (each stream's and each run in flight's event), then exits. The
12-layer load on an H200 made no tokens with it (2026-11-29) while the CUDA tests passed.

    python benchmarks/paged_stream_probe.py [--conversations 32] [--rate 0] [--stall 20]
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.decode_graphs import config  # noqa: E402
from benchmarks.llm_load import workload  # noqa: E402
from dynashape.paged.engine import PagedEngine  # noqa: E402
from tests.models import llama  # noqa: E402


def state(eng) -> str:
    main = torch.cuda.current_stream(eng.dev)
    parts = [f"held {len(eng.held)}, chunks in flight {len(eng.chunks_inflight)} "
             f"(ready: {[inf.event.query() for inf in eng.chunks_inflight]}), main in flight "
             f"{None if eng.inflight is None else eng.inflight.event.query()}, main stream idle {main.query()}, "
             f"chunk stream idle {eng.chunk_stream.query() if eng.chunk_stream is not None else None}, "
             f"running {len(eng.scheduler.running)}, waiting {len(eng.scheduler.waiting)}, "
             f"stats {dict((k, v) for k, v in eng.stats().items() if k in ('steps', 'runs', 'chunk_stream_runs'))}"]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--stall", type=float, default=20.0)
    args = ap.parse_args()
    cfg = {**config(args.layers, "float32"), "mask_input": True, "position_ids": True}
    eng = PagedEngine(str(llama.model_path(cfg)), device="cuda", max_rows=64, token_budget=1024, chunk=256,
                      chunk_stream=True)
    convs = workload(args.conversations, args.rate, (16, 512), (16, 128), cfg["vocab"], 0)
    last = [time.perf_counter()]

    def watchdog():
        while True:
            time.sleep(1)
            if time.perf_counter() - last[0] > args.stall:
                print(f"no step ended for {args.stall:.0f} s", flush=True)
                faulthandler.dump_traceback(all_threads=True)
                print(state(eng), flush=True)
                os._exit(3)
    threading.Thread(target=watchdog, daemon=True).start()
    t0, made, i = time.perf_counter(), 0, 0
    while i < len(convs) or not eng.idle:
        while i < len(convs) and convs[i][0] <= time.perf_counter() - t0:
            eng.add(i, convs[i][1], convs[i][2])
            i += 1
        made += len(eng.step())
        last[0] = time.perf_counter()
    print(f"done: {made} tokens in {time.perf_counter() - t0:.1f} s; {state(eng)}")


if __name__ == "__main__":
    main()
