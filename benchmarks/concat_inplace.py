"""In-place concat in CNNs whose blocks concatenate branches: bytes the Concats copy, with the
branches' producers writing straight into their slots (``inplace_concat=True``, the default)
and without, side by side with onnxruntime, over a sequence of changing batch sizes.

    python benchmarks/concat_inplace.py [--device cpu|cuda] [--models inception_v1 squeezenet ...]
                                        [--batches 1 2 4 3] [--rounds 3] [--json out.json]

Models: the CNNs shipped with onnx (random weights, tests/models/cnn.py). Inception blocks and
SqueezeNet's Fire modules concatenate Relu outputs along the channels; DenseNet concatenates
Conv outputs, which torch cannot write into a given buffer (its Concats still copy them).
Per model and setting: Concat bytes copied per inference (after the first run, which has no
layout yet), Concat inputs found in place, peak engine bytes, median latency per batch size,
and the largest difference from onnxruntime's output. The two dynashape settings must agree
bit for bit.
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
from benchmarks.common import print_table, write_json  # noqa: E402

MODELS = ("inception_v1", "inception_v2", "squeezenet", "densenet121")


def sessions(name: str, device: str):
    import onnxruntime as ort

    from tests.models import cnn
    path = str(cnn.model_path(name, "random"))
    dims = cnn.dynamic_dims(name)
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return {
        "inplace": dynashape.InferenceSession(path, device=device, dynamic_dims=dims),
        "copy": dynashape.InferenceSession(path, device=device, dynamic_dims=dims, inplace_concat=False),
        "onnxruntime": ort.InferenceSession(cnn.ort_model(name, "random"), so, providers=["CPUExecutionProvider"]),
    }, cnn.light_models()[name][1]


def concat_inputs(sess) -> int:
    return sum(len(i.node.inputs) for i in sess._default.network.insts if i.op_type == "Concat")


def bench_model(name: str, device: str, batches: list[int], rounds: int) -> dict:
    sess, inp = sessions(name, device)
    rng = np.random.default_rng(0)
    feeds = {b: {inp: rng.standard_normal((b, 3, 224, 224)).astype(np.float32)} for b in batches}
    times = {k: {b: [] for b in batches} for k in sess}
    outs = {k: {} for k in sess}
    first = {}
    for r in range(rounds + 1):  # round 0 warms up (and is the run without a layout)
        for b in batches:
            for k, s in sess.items():
                if device == "cuda" and k != "onnxruntime":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                out = s.run(None, feeds[b])[0]
                if device == "cuda" and k != "onnxruntime":
                    torch.cuda.synchronize()
                if r:
                    times[k][b].append(time.perf_counter() - t0)
                outs[k][b] = out
        if r == 0:
            first = {k: sess[k].memory_stats()["concat_bytes_copied"] for k in ("inplace", "copy")}
    runs = rounds * len(batches)
    res = {"concat_inputs": concat_inputs(sess["inplace"]), "settings": {}}
    for k in ("inplace", "copy"):
        m = sess[k].memory_stats()
        res["settings"][k] = {
            "copied_MB_per_inference": (m["concat_bytes_copied"] - first[k]) / runs / 2**20,
            "inputs_in_place_per_inference": m["concat_inputs_in_place"] / (runs + len(batches)),
            "peak_MB": m["peak_bytes"] / 2**20,
            "max_abs_diff_vs_ort": max(float(np.abs(outs[k][b] - outs["onnxruntime"][b]).max()) for b in batches),
        }
    res["identical"] = all(np.array_equal(outs["inplace"][b], outs["copy"][b]) for b in batches)
    res["median_ms"] = {k: {b: statistics.median(v[b]) * 1e3 for b in batches} for k, v in times.items()}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 3])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    results = {"device": a.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
               "batches": a.batches, "rounds": a.rounds, "models": {}}
    rows = []
    for name in a.models:
        r = bench_model(name, a.device, a.batches, a.rounds)
        results["models"][name] = r
        on, off = r["settings"]["inplace"], r["settings"]["copy"]
        for b in a.batches:
            ms = r["median_ms"]
            rows.append([f"{name} b{b}", f"{on['copied_MB_per_inference']:.2f} / {off['copied_MB_per_inference']:.2f}",
                         f"{on['inputs_in_place_per_inference']:.0f}/{r['concat_inputs']}",
                         f"{on['peak_MB']:.0f} / {off['peak_MB']:.0f}",
                         ms["inplace"][b], ms["copy"][b], ms["onnxruntime"][b],
                         f"{on['max_abs_diff_vs_ort']:.1e}", r["identical"]])
    print_table(f"in-place concat, {a.device}, batches {a.batches}",
                ["model", "copied MB/inf (in place / copy)", "in place", "peak MB", "ms in place", "ms copy",
                 "ms ORT", "max |diff| ORT", "identical"], rows)
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
