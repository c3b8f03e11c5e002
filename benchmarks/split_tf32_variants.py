"""BERT-base at a random (batch, seq) on every call (new_shapes_gpu.py's bert_random), dynashape alone,
under variants of the split TF32 products (ops/split_tf32.py): the K piece size of the large product,
the K up to which a product is one call over three parts (``ONE_CALL_K``), and the dynamic path's
rule. Each variant in a fresh session after its own eager pass (experiment).

    python benchmarks/split_tf32_variants.py --models-dir /tmp/models [--json out.json]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import new_shapes_gpu as ns  # noqa: E402

from dynashape.ops import split_tf32  # noqa: E402

RULES = {
    "rows": split_tf32.worth,
    "macs2^31": lambda m, n, k: split_tf32.MODE.get() == "split" or m * n * k >= 1 << 31,
    "rows2k": lambda m, n, k: split_tf32.MODE.get() == "split" or m >= 2048,
}
# (fp32_products, CHUNK, rule, ONE_CALL_K)
VARIANTS = [("ieee", None, "rows", 0), ("auto", 1024, "rows", 0), ("auto", 1024, "rows", 1024),
            ("auto", 1024, "rows2k", 1024), ("auto", 1024, "rows", 1 << 20)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir")
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--json")
    a = ap.parse_args()
    args = argparse.Namespace(bert_calls=a.calls, resnet_calls=100, seed=0, compile=False, sync_debug=False)
    tmp = a.models_dir or tempfile.mkdtemp()
    ns._warm_libraries()
    rows = []
    for mode, chunk, rule, one in VARIANTS:
        split_tf32.CHUNK = chunk or 0
        split_tf32.ONE_CALL_K = one
        split_tf32.worth = RULES[rule]
        r = ns.workload_run("bert_random", args, {"fp32_products": mode}, tmp, only_dynashape=True)
        s = next(v["summary"] for k, v in r.items() if k.startswith("dynashape"))
        err = next(v.get("max_rel_err") for k, v in r.items() if k.startswith("dynashape"))
        rows.append({"mode": mode, "chunk": chunk, "rule": rule, "one_call_k": one, **s, "max_rel_err": err})
        print(f"{mode:5s} chunk {chunk!s:5s} rule {rule:9s} one call to K {one:7d} "
              f"total x eager {s['vs_eager_total']:.2f}  last 50 "
              f"{s['last50_vs_eager']:.2f}  first 60 {s['first60_vs_eager']:.2f}  slowest/eager "
              f"{s['slowest_after_first_vs_eager_slowest']:.2f}  err {err:.2e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
