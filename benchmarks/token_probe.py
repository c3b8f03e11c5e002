"""Token regions (codegen/tokens.py) on CUDA, one shape at a time: the products' forms the graphs
take, the error against eager, and a shape's time through the token graphs against the dynamic path.

    DYNASHAPE_TOKEN_BUCKETS=auto python benchmarks/token_probe.py
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.new_shapes_gpu import model_for  # noqa: E402
from dynashape.ops import specialise  # noqa: E402


def timed(fn, reps=20) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, path, names, make = model_for("bert_random", "/tmp/models")
    g = torch.Generator().manual_seed(0)
    shapes = [(16, 200), (8, 300), (2, 40), (32, 384)]
    feeds = {s: make(s, g) for s in shapes}
    for mode in ("off", "sync", "async"):
        sess = dynashape.InferenceSession(path, device="cuda", static_impls=mode)
        for _ in range(3):
            for s in shapes:
                sess.run(None, dict(zip(names, feeds[s])))
        if mode == "async":
            time.sleep(5)  # the background builds land
            for s in shapes:
                sess.run(None, dict(zip(names, feeds[s])))
        for s in shapes:
            f = dict(zip(names, feeds[s]))
            with torch.no_grad():
                ref = model(*feeds[s])
            out = sess.run(None, f)[0]
            out = torch.as_tensor(out, device="cuda")
            err = float((out - ref).norm() / ref.norm())
            ms = timed(lambda f=f, sess=sess: sess.run(None, f))
            print(f"{mode:5s} {s}: {ms:7.2f} ms  err {err:.2e}", flush=True)
        st = sess.stats()
        print(mode, {k: v for k, v in st.items() if k.startswith(("static_builds", "static_hits", "static_refused"))})
        print(mode, "forms:", {k: v for k, v in specialise.STATS.items() if k.startswith("chose_gemm")})
        print(mode, "refusals:", [r[:300] for r in list(sess.compiled.refusals)[-2:]])
        del sess
        torch.cuda.empty_cache()
    with torch.no_grad():
        for s in shapes:
            print(f"eager {s}: {timed(lambda s=s: model(*feeds[s])):7.2f} ms")


if __name__ == "__main__":
    main()
