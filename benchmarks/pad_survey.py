"""Which models of the zoo the padding proof accepts (compile/pad_proof.py; experiment, CPU, no timing):
per model, traced at its first point, the axes a call may pad (all dynamic symbols together, else one
alone) or the node that refuses, for the models of docs/models.md (benchmarks/real_models_specs.py).
Issue 36 asks which regions qualify and why others don't: this is that list for whole calls.

    python -m benchmarks.pad_survey [--json benchmarks/results/pad_survey_cpu.json] [--models a,b]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import dynashape
from benchmarks.real_models_specs import SPECS, fetch
from dynashape.compile.pad_proof import PadProof, prove
from dynashape.compile.shape_program import trace


def survey(spec) -> dict:
    sess = dynashape.InferenceSession(str(fetch(spec)))
    if sess.compiled is None:
        return {"model": spec.name, "result": "no compiled graph (interpreter)"}
    point = spec.sequence[0]
    feeds = spec.make(np.random.default_rng(0), point)
    names = [v.name for v in sess.compiled.inputs]
    shapes = [tuple(np.asarray(feeds[n]).shape) if n in feeds else None for n in names]
    t = trace(sess.compiled.graph, shapes, sess.compiled.inputs)
    p = prove(t)
    symbols = sorted({d.symbol for d in t.input_dims if d.defines})
    if isinstance(p, PadProof):
        return {"model": spec.name, "symbols": symbols, "padded": list(p.symbols), "limits": p.limits,
                "result": "proven"}
    return {"model": spec.name, "symbols": symbols, "padded": [], "result": p}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--models", help="comma-separated names (default: every model)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    wanted = set(args.models.split(",")) if args.models else None
    rows = []
    for spec in SPECS:
        if wanted is not None and spec.name not in wanted:
            continue
        try:
            row = survey(spec)
        except Exception as e:  # noqa: BLE001  a model that cannot be fetched or traced here: said so
            row = {"model": spec.name, "result": f"not surveyed: {type(e).__name__}: {str(e)[:120]}"}
        rows.append(row)
        print(f"{row['model']:28s} {','.join(row.get('padded', [])) or '-':30s} {row['result'][:110]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "device": "cpu", "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
