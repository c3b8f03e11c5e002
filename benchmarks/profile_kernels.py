"""Which kernels a call's GPU time goes to: torch.profiler (CUPTI) over calls of dynashape with
static impls (replayed CUDA graphs) and of PyTorch eager of the same module, at one shape.

    python benchmarks/profile_kernels.py --model bert --shape 1x16
    python benchmarks/profile_kernels.py --model resnet --shape 1
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.static_impls import bert_model, export, resnet_model  # noqa: E402


def setup(model: str, shape: str, dev):
    path = os.path.join(tempfile.mkdtemp(), f"{model}.onnx")
    if model == "bert":
        b, s = map(int, shape.split("x"))
        m = bert_model(12)
        d = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("seq", min=1, max=512)}
        export(m, (torch.randint(0, 30522, (2, 7)), torch.ones(2, 7, dtype=torch.int64)),
               ["input_ids", "attention_mask"], {"input_ids": d, "attention_mask": d}, path)
        mask = torch.ones(b, s, dtype=torch.int64, device=dev)
        mask[:, s - s // 4:] = 0
        feeds = [torch.randint(0, 30522, (b, s), device=dev), mask]
    else:
        m = resnet_model()
        export(m, (torch.randn(2, 3, 224, 224),), ["x"], {"x": {0: torch.export.Dim("batch", min=1, max=64)}}, path)
        feeds = [torch.randn(int(shape), 3, 224, 224, device=dev)]
    return m.to(dev), path, feeds


def kernel_table(fn, calls: int, top: int, title: str) -> None:
    from torch.profiler import ProfilerActivity, profile
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = per[e.name[:90]]
            k[0] += e.device_time_total
            k[1] += 1
    total = sum(v[0] for v in per.values()) / calls
    n = sum(v[1] for v in per.values()) / calls
    print(f"\n== {title}: {total / 1e3:.3f} ms of kernels per call, {n:.0f} kernels per call")
    for name, (t, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{t / calls:9.1f} us  {c / calls:5.1f}x  {name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert", choices=["bert", "resnet"])
    ap.add_argument("--shape", default="1x16")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--options", nargs="*", default=["static_impls=sync"],
                    help="session options as key=value (static_impls=off profiles the dynamic path)")
    ap.add_argument("--no-untuned", action="store_true", help="skip the run with the products untuned")
    args = ap.parse_args()
    opts = dict(o.split("=", 1) for o in args.options)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    m, path, feeds = setup(args.model, args.shape, dev)
    sess = dynashape.InferenceSession(path, device="cuda", **opts)
    names = [i.name for i in sess.get_inputs()]
    kernel_table(lambda: sess.run(None, dict(zip(names, feeds))), args.calls, args.top,
                 f"dynashape {' '.join(args.options)}, {args.model} {args.shape}")
    from dynashape.ops import specialise
    for key, choice in specialise.choices().items():
        print("tuned", key[:5], "->", choice)
    if not args.no_untuned and opts.get("static_impls") == "sync":  # the same without the tuned products
        sess2 = dynashape.InferenceSession(path, device="cuda", static_impls="sync")
        from dynashape.impls import static as static_mod
        orig = static_mod.CudaGraphImpl.__init__

        def untuned(self, *a, **kw):
            kw["tune"] = False
            orig(self, *a, **kw)
        static_mod.CudaGraphImpl.__init__ = untuned
        kernel_table(lambda: sess2.run(None, dict(zip(names, feeds))), args.calls, args.top,
                     f"dynashape static, products untuned, {args.model} {args.shape}")
        static_mod.CudaGraphImpl.__init__ = orig

    def eager():
        with torch.no_grad():
            return m(*feeds)
    kernel_table(eager, args.calls, args.top, f"PyTorch eager, {args.model} {args.shape}")


if __name__ == "__main__":
    main()
