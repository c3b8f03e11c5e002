"""Diagnostic (issue 39): which of the paged engine's CUDA paths change a conversation's greedy tokens.
The 12-layer decoder of llm_load.py, conversations all at once, each served alone first
(dynashape.generate), then by engines with the prompt-chunk graphs and the overlap on and off (and
every run eager): how many conversations equal their lone tokens, and where the others first differ
(the first token comes from a prompt-chunk run, the others from decode runs).

    python benchmarks/paged_equal_probe.py [--layers 12] [--conversations 24]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.decode_graphs import config  # noqa: E402
from benchmarks.llm_load import lone_runs, workload  # noqa: E402
from dynashape.paged.engine import PagedEngine  # noqa: E402
from tests.models import llama  # noqa: E402

CASES = {"eager (no step graphs)": {"step_graphs": False, "overlap": False},
         "decode graphs, in turn": {"overlap": False},
         "decode graphs, overlapped": {"overlap": True},
         "decode + chunk graphs, in turn": {"overlap": False, "chunk_graphs": True},
         "decode + chunk graphs, overlapped": {"overlap": True, "chunk_graphs": True}}


def serve(path: str, convs, device: str, **opts) -> tuple[list[list[int]], dict]:
    eng = PagedEngine(path, device=device, max_rows=64, token_budget=1024, chunk=256, **opts)
    got = {}
    for i, (_, prompt, n) in enumerate(convs):
        eng.add(i, prompt, n)
        got[i] = []
    while not eng.idle:
        for e in eng.step():
            got[e.key].append(e.token)
    st = eng.stats()
    keys = sorted(k for k in (eng.graphs.keys if eng.graphs else {}) if not isinstance(eng.graphs.keys[k], str))
    info = {"last_only": eng.last_only, "chunk_graphs": eng.chunk_graphs, "keys": keys,
            "refused": st.get("step_graphs_refused", 0)}
    del eng
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return [got[i] for i in range(len(convs))], info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    cfg = {**config(args.layers, "float32"), "mask_input": True, "position_ids": True}
    path = str(llama.model_path(cfg))
    convs = workload(args.conversations, 0, (16, 512), (8, 48), cfg["vocab"], 0)
    lone = lone_runs(path, args.device, convs)["tokens"]
    gc.collect()
    for name, opts in CASES.items():
        tokens, info = serve(path, convs, args.device, **opts)
        diff = [(i, next((j for j, (a, b) in enumerate(zip(t, lone[i])) if a != b), min(len(t), len(lone[i]))))
                for i, t in enumerate(tokens) if t != lone[i]]
        print(f"{name}: {len(convs) - len(diff)}/{len(convs)} equal; first differing token (conv, index): "
              f"{diff[:12]}; {info}", flush=True)


if __name__ == "__main__":
    main()
