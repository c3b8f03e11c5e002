"""One MatMulNBits node on the CPU (4-bit weights, blocks of 32, float32 A): dynashape against
onnxruntime, one runtime at a time (the other's session deleted first), 2 threads each, at the
products of the builder's models (the hidden-256 and the 110M Llama: layers and LM head), at
accuracy level 4 (onnxruntime's int8 kernel, ops/nbits_int8.py) and 0 (float32,
ops/nbits_f32.py), over a decode step's row and a prompt's rows. Median of a call's time after
warm-up, each weight read from memory as a session re-reads it (the calls back to back: a small
weight stays in the caches, as it does not in a model's step).

    python benchmarks/nbits_cpu.py [--rows 1,16,128] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import write_json  # noqa: E402

SHAPES = {"h256 qkv": (256, 512), "h256 gate+up": (256, 2048), "h256 down": (1024, 256), "h256 LM head": (256, 32000),
          "110M qkv": (768, 1280), "110M gate+up": (768, 4096), "110M down": (2048, 768),
          "110M LM head": (768, 32000)}


def model(k: int, n: int, level: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nb = -(-k // 32)
    consts = [numpy_helper.from_array(rng.integers(0, 256, (n, nb, 16), dtype=np.uint8), "b"),
              numpy_helper.from_array(rng.uniform(0.001, 0.03, n * nb).astype(np.float32), "s")]
    node = helper.make_node("MatMulNBits", ["a", "b", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=4,
                            block_size=32, accuracy_level=level)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def timed(sess, a, reps: int) -> float:
    feed = {"a": a}
    for _ in range(5):
        sess.run(None, feed)
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sess.run(None, feed)
        t.append(time.perf_counter() - t0)
    return statistics.median(t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,128")
    ap.add_argument("--json")
    args = ap.parse_args()
    import onnxruntime as ort
    import torch

    import dynashape
    torch.set_num_threads(2)
    rows = [int(r) for r in args.rows.split(",")]
    from dynashape.ops.native import cpuinfo
    device = f"CPU {cpuinfo('model name') or 'x86'}, {os.cpu_count()} cores"
    out = {"date": time.strftime("%Y-%m-%d"), "device": device, "threads": 2, "rows": rows, "results": {}}
    for level in (4, 0):
        for name, (k, n) in SHAPES.items():
            m = model(k, n, level)
            inputs = {r: np.random.default_rng(r).standard_normal((r, k)).astype(np.float32) for r in rows}
            res = {}
            for rt in ("onnxruntime", "dynashape"):
                if rt == "onnxruntime":
                    so = ort.SessionOptions()
                    so.intra_op_num_threads = 2
                    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                else:
                    sess = dynashape.InferenceSession(m)
                res[rt] = {r: timed(sess, inputs[r], 200 if r == 1 else 20) for r in rows}
                del sess
                gc.collect()
            out["results"][f"level {level} {name}"] = {"k": k, "n": n, "ms": res}
            print(f"level {level} {name:14s} K={k:5d} N={n:5d}: " + "  ".join(
                f"{r} rows {res['dynashape'][r]:.3f} ms ({res['dynashape'][r] / res['onnxruntime'][r]:.2f}x ort)"
                for r in rows), flush=True)
    write_json(args.json, out)


if __name__ == "__main__":
    main()
