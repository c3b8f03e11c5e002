"""A new input size on every call, every call counted: the OCR and detection models of the zoo
(PyPI wheels, benchmarks/real_models_specs.py) against onnxruntime and OpenVINO.

What an OCR or detection service sees: a new image size (or batch of text lines) on almost every
call. Each model runs ``dynashape bench --random-shapes`` in a process of its own: ``--calls``
calls, each at a shape drawn new within the model's ranges (images 96-640 in steps of 32, text-line
widths 64-632 in steps of 8, batches 1-47), the same shapes and inputs for every runtime, one
runtime at a time (the previous session deleted and collected), no warm-up. Reported per model
and runtime: the total and the worst call; dynashape's total against the faster of onnxruntime
and OpenVINO, and its worst call against onnxruntime's worst.

    python -m benchmarks.new_sizes [--calls 24] [--threads 2] [--rounds 1] [--models ocr_det_v4,...] [--device cpu]
        [--json benchmarks/results/new_sizes_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.common import dynashape_bench
from benchmarks.real_models_specs import SPECS, fetch

# each model's random shape: per-range steps as in issue 37's measurements
RANGES = {
    "ocr_det_v4": "1x3x96..640/32x96..640/32",  # a page or crop resized to multiples of 32
    "ocr_rec_v4": "1..47x3x48x64..632/8",  # text lines 48 high, batched, padded to the widest
    "ocr_cls_v2": "1..47x3x48x192",  # rapidocr resizes every line to 48x192: the batch changes
    "nudenet_320n": "1x3x96..640/32x96..640/32",  # YOLOv8n at any multiple of 32
}
MODELS = tuple(RANGES)


def ranges(name: str, input_name: str) -> str:
    """The --random-shapes item of a model: ``input=DIMS``."""
    return f"{input_name}={RANGES[name]}"


def model_path(name: str) -> Path:
    """The model's file, downloaded from its wheel on first use."""
    return fetch(next(s for s in SPECS if s.name == name))


def _input_name(path: Path) -> str:
    import onnx
    g = onnx.load(str(path), load_external_data=False).graph
    inits = {t.name for t in g.initializer}
    return next(i.name for i in g.input if i.name not in inits)


def run_model(name: str, a) -> dict:
    """One `dynashape bench --random-shapes` process; its JSON document."""
    path = model_path(name)
    return dynashape_bench(name, path, ["--random-shapes", ranges(name, _input_name(path)), "--calls", str(a.calls),
                                        "--seed", str(a.seed), "--threads", str(a.threads), "--device", a.device,
                                        "--compare", a.compare])


def summarise(doc: dict) -> dict:
    """Totals and worst calls per runtime, dynashape's against the others'."""
    rts = {k: v for k, v in doc["runtimes"].items() if v.get("status") == "ok" and v.get("calls")}
    row = {k: {"total_ms": v["total_ms"], "worst_ms": v["worst_call"]["ms"], "worst_shape": v["worst_call"]["shape"],
               "p50_ms": v["latency_ms"]["p50"], "p90_ms": v["latency_ms"]["p90"]} for k, v in rts.items()}
    others = [row[k]["total_ms"] for k in ("onnxruntime", "openvino") if k in row]
    if "dynashape" in row and others:
        row["total_vs_fastest_other"] = row["dynashape"]["total_ms"] / min(others)
    if "dynashape" in row and "onnxruntime" in row:
        row["worst_vs_onnxruntime_worst"] = row["dynashape"]["worst_ms"] / row["onnxruntime"]["worst_ms"]
    row["skipped"] = {k: v.get("note", "") for k, v in doc["runtimes"].items() if v.get("status") != "ok"}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1, help="processes per model, each over new shapes (seed + "
                    "round); the median round's figures are reported, every round's ratios kept")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--compare", default="onnxruntime,openvino",
                    help="runtimes beside dynashape (one not installed is reported as skipped)")
    ap.add_argument("--json", default=None, help="[default: benchmarks/results/new_sizes_<device>.json]")
    a = ap.parse_args()
    names = a.models.split(",")
    unknown = [n for n in names if n not in RANGES]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {list(RANGES)}")
    results = {}
    seed = a.seed
    for name in names:
        rounds = []
        for r in range(a.rounds):  # each a process of its own over shapes of its own (seed + round)
            a.seed = seed + r
            before = os.getloadavg()[0]
            doc = run_model(name, a)
            # other processes' load, which on a shared machine moves these figures more than anything
            rounds.append({"seed": a.seed, "load_avg_1min": [before, os.getloadavg()[0]], "summary": summarise(doc),
                           "bench": doc})
        a.seed = seed
        # the round whose total ratio is the median stands for the model; every round's ratios are kept
        ratios = [x["summary"].get("total_vs_fastest_other") or float("inf") for x in rounds]
        mid = sorted(range(len(rounds)), key=lambda i: ratios[i])[len(rounds) // 2]
        results[name] = {"ranges": RANGES[name], **rounds[mid],
                         "rounds": [{"seed": x["seed"], **{k: x["summary"].get(k) for k in
                                                           ("total_vs_fastest_other", "worst_vs_onnxruntime_worst")}}
                                    for x in rounds]}
    print(f"{'model':14} {'dynashape total':>16} {'onnxruntime':>12} {'openvino':>10} {'x faster':>9} "
          f"{'worst':>8} {'ort worst':>10} {'x':>6} {'load':>10}  rounds' x faster")
    for name, r in results.items():
        s = r["summary"]

        def ms(rt, key, s=s):
            return f"{s[rt][key]:.0f}" if rt in s else "-"
        ratio = s.get("total_vs_fastest_other")
        load = "{:.1f}-{:.1f}".format(*r["load_avg_1min"])
        worst = s.get("worst_vs_onnxruntime_worst")
        print(f"{name:14} {ms('dynashape', 'total_ms'):>16} {ms('onnxruntime', 'total_ms'):>12} "
              f"{ms('openvino', 'total_ms'):>10} {f'{ratio:.2f}' if ratio else '-':>9} "
              f"{ms('dynashape', 'worst_ms'):>8} {ms('onnxruntime', 'worst_ms'):>10} "
              f"{f'{worst:.2f}' if worst else '-':>6} {load:>10}  "
              + " ".join(f"{x['total_vs_fastest_other']:.2f}" for x in r["rounds"] if x["total_vs_fastest_other"]))
    path = Path(a.json or Path(__file__).parent / "results" / f"new_sizes_{a.device}.json")
    path.write_text(json.dumps({"calls": a.calls, "threads": a.threads, "seed": a.seed, "rounds": a.rounds,
                                "device": a.device, "models": results}, indent=1))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
