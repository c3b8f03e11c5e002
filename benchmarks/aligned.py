"""FC fake alignment (``codegen/align.py``): a decode whose batch changes between requests, with
static impls of regions (whole-step decode graphs off, so the regions serve every step), the
regions aligned along the batch (``DYNASHAPE_FC_ALIGN=8``) against one impl per batch (``=0``),
in one process, interleaved round by round.

Per round, for each batch of ``--batches`` in turn: a prefill of 8 tokens, then ``--steps``
decode steps, the present fed back as the past. Reported: static impl builds and their time,
graph memory, the median step time per batch over the rounds after the first, and the largest
difference between the two sessions' logits.

    python benchmarks/aligned.py [--device cuda] [--config small] [--batches 1 3 5 2 8 4 7 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.decode import CONFIGS, _loop  # noqa: E402
from tests.models import llama  # noqa: E402


def session(path: str, cfg: dict, dev: torch.device, align: int):
    os.environ["DYNASHAPE_FC_ALIGN"] = str(align)  # read at session creation
    sess = dynashape.InferenceSession(path, device=str(dev), static_impls="sync", decode_graphs="off")
    names = llama.input_names(cfg)

    def step(ids, past):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        return out[0], [o.clone() for o in out[1:]]
    step.session = sess
    return step


def empty_past(cfg: dict, batch: int, dev: torch.device) -> list[torch.Tensor]:
    return [torch.zeros(batch, cfg["kv_heads"], 0, cfg["head_dim"], device=dev) for _ in range(2 * cfg["layers"])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 3, 5, 2, 8, 4, 7, 6])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, cfg = torch.device(args.device), CONFIGS[args.config]
    path = str(llama.model_path(cfg))
    steps = {a: session(path, cfg, dev, a) for a in (0, 8)}
    times = {a: {b: [] for b in args.batches} for a in steps}
    worst = 0.0
    rng = np.random.default_rng(0)
    for r in range(args.rounds + 1):
        for b in args.batches:
            ids = torch.from_numpy(rng.integers(0, cfg["vocab"], (b, 8 + args.steps))).to(dev)
            for a, step in steps.items():
                t = _loop(step, empty_past(cfg, b, dev), ids, args.steps, dev)
                if r:
                    times[a][b] += t
            # the same inputs through both: their last logits
            outs = {a: steps[a](ids[:, :8], empty_past(cfg, b, dev))[0] for a in steps}
            worst = max(worst, float((outs[0] - outs[8]).abs().max()))
    rows, data = [], {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                      "config": args.config, "batches": args.batches, "max_logit_diff": worst, "results": {}}
    for a, step in steps.items():
        st = step.session.stats()
        med = {b: statistics.median(ts) * 1e3 for b, ts in times[a].items()}
        rows.append([f"DYNASHAPE_FC_ALIGN={a}", st.get("static_builds", 0), st.get("static_builds_aligned", 0),
                     round(st.get("static_build_time_s", 0.0), 2),
                     round(st.get("static_bytes", 0) / 2**20, 1),
                     " ".join(f"{b}:{med[b]:.3f}" for b in args.batches), round(statistics.mean(med.values()), 3)])
        data["results"][f"align_{a}"] = {"stats": {k: v for k, v in st.items() if isinstance(v, (int, float))},
                                         "median_step_ms": med}
    print_table(f"decode with changing batch, static impls of regions, {data['device']} ({args.config})",
                ["alignment", "builds", "aligned builds", "build s", "impls' MiB",
                 "median step ms per batch", "mean of medians"], rows)
    print(f"largest logit difference between the two: {worst:.2e}")
    write_json(args.json, data)


if __name__ == "__main__":
    main()
