"""Small images, seen once before: the OCR and detection models of the zoo at crops of 48-160 pixels
(text lines 48 high and 48-160 wide in batches of 1-13), their second pass against onnxruntime and
OpenVINO.

Where the per-call cost around the kernels decides: a crop's arithmetic is a few milliseconds.
Each model runs ``dynashape bench --shapes-file`` in a process of its own: the shapes in turn, each
shape's first call left out (the first pass), then three rounds over them timed (``-n`` = 3 x the
shapes, ``--warmup 0``); one runtime at a time on the same shapes and inputs. Reported per model and
runtime: the sum over the shapes of each shape's median call, and dynashape's against onnxruntime's
and the faster peer's.

    python -m benchmarks.small_sizes [--threads 2] [--models ocr_det_v4,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import dynashape_bench
from benchmarks.new_sizes import _input_name, model_path

# (batch, height, width) of the crops each model sees: detectors at sides that are multiples of 32
SHAPES = {
    "ocr_det_v4": [(1, 64, 64), (1, 64, 160), (1, 96, 96), (1, 96, 128), (1, 128, 160), (1, 160, 160)],
    "ocr_rec_v4": [(1, 48, 48), (3, 48, 64), (6, 48, 96), (13, 48, 120), (8, 48, 160), (2, 48, 80)],
    "ocr_cls_v2": [(1, 48, 192), (3, 48, 192), (6, 48, 192), (13, 48, 192)],
    "nudenet_320n": [(1, 64, 64), (1, 64, 160), (1, 96, 96), (1, 96, 128), (1, 128, 160), (1, 160, 160)],
}


def run_model(name: str, a) -> dict:
    path = model_path(name)
    inp = _input_name(path)
    shapes = SHAPES[name]
    with tempfile.TemporaryDirectory() as tmp:
        seq = Path(tmp) / "shapes.txt"
        seq.write_text("".join(f"{inp}={n}x3x{h}x{w}\n" for n, h, w in shapes))
        return dynashape_bench(name, path, ["--shapes-file", str(seq), "--warmup", "0", "-n", str(3 * len(shapes)),
                                            "--threads", str(a.threads), "--compare", a.compare])


def summarise(doc: dict) -> dict:
    rts = {k: v for k, v in doc["runtimes"].items() if v.get("status") == "ok" and v.get("per_shape_p50_ms")}
    row = {k: {"sum_of_medians_ms": sum(v["per_shape_p50_ms"].values()), "per_shape_p50_ms": v["per_shape_p50_ms"],
               "first_pass_ms": sum(v["first_call_ms"].values()) if isinstance(v.get("first_call_ms"), dict)
               else v.get("first_call_ms")} for k, v in rts.items()}
    ds = row.get("dynashape", {}).get("sum_of_medians_ms")
    if ds and "onnxruntime" in row:
        row["x_onnxruntime"] = ds / row["onnxruntime"]["sum_of_medians_ms"]
    peers = [row[k]["sum_of_medians_ms"] for k in ("onnxruntime", "openvino") if k in row]
    if ds and peers:
        row["x_faster_peer"] = ds / min(peers)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--compare", default="onnxruntime,openvino")
    ap.add_argument("--json", default=None, help="[default: benchmarks/results/small_sizes_cpu.json]")
    a = ap.parse_args()
    results = {}
    for name in a.models.split(","):
        before = os.getloadavg()[0]
        doc = run_model(name, a)
        results[name] = {"shapes": SHAPES[name], "load_avg_1min": [before, os.getloadavg()[0]],
                         "summary": summarise(doc), "bench": doc}
    print(f"{'model':14} {'dynashape ms':>13} {'onnxruntime':>12} {'openvino':>9} {'x ort':>6} {'x faster':>9}")
    for name, r in results.items():
        s = r["summary"]

        def ms(rt, s=s):
            return f"{s[rt]['sum_of_medians_ms']:.2f}" if rt in s else "-"
        print(f"{name:14} {ms('dynashape'):>13} {ms('onnxruntime'):>12} {ms('openvino'):>9} "
              f"{s.get('x_onnxruntime', 0):>6.2f} {s.get('x_faster_peer', 0):>9.2f}")
    path = Path(a.json or Path(__file__).parent / "results" / "small_sizes_cpu.json")
    path.write_text(json.dumps({"threads": a.threads, "device": "cpu", "models": results}, indent=1))
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
