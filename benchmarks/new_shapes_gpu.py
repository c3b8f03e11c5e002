"""Shapes that never repeat, on the GPU, timed as a user runs them (issue: shape-agnostic impls).

Every call is timed from the first, on a fresh session per workload, shapes drawn at random (or
cycling a few), strict fp32 (TF32 off) on every side, each output compared with PyTorch eager's
of the same call. Runtimes in one process, one at a time (the previous one deleted, gc'd):
PyTorch eager, dynashape (``--options`` as keyword options, e.g. ``static_impls=off``) and
``torch.compile(dynamic=True)`` of the same module (``--compile``).

Workloads (``--workloads``):
- ``resnet_random``: torchvision's ResNet-50, a random batch 1-32 on each of ``--resnet-calls`` calls;
- ``bert_random``: transformers' BERT-base, a random (batch 1-32, seq 8-384) on each of ``--bert-calls``;
- ``resnet_cycle`` / ``bert_cycle``: a few shapes cycled for 60 calls.

``--cache-dir D`` passes dynashape's disk cache (a folder ``D/<workload>`` each); ``--second-process``
then runs the dynashape rows again in a new process over the same caches (what a restarted service
sees). ``--sync-debug``
lists the host syncs dynashape makes after its first calls (``torch.cuda.set_sync_debug_mode``).

    python benchmarks/new_shapes_gpu.py --workloads resnet_random bert_random --compile --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import gone, print_table  # noqa: E402
from benchmarks.static_impls import bert_model, export, resnet_model  # noqa: E402

RESNET_CYCLE = [1, 8, 3, 16, 1]
BERT_CYCLE = [(1, 16), (4, 64), (2, 128), (8, 32), (1, 128), (16, 64), (32, 384)]


def shapes_for(workload: str, calls: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))
    if workload == "resnet_random":
        return [(pick(1, 32),) for _ in range(calls)]
    if workload == "bert_random":
        return [(pick(1, 32), pick(8, 384)) for _ in range(calls)]
    if workload == "resnet_cycle":
        return [(RESNET_CYCLE[i % len(RESNET_CYCLE)],) for i in range(60)]
    if workload == "bert_cycle":
        return [BERT_CYCLE[i % len(BERT_CYCLE)] for i in range(60)]
    raise SystemExit(f"unknown workload {workload}")


def model_for(workload: str, tmp: str):
    """(eager module on the device, ONNX path, input names, feeds maker) of a workload's model."""
    dev = torch.device("cuda")
    if workload.startswith("resnet"):
        path = os.path.join(tmp, "resnet50.onnx")
        model = resnet_model()
        if not os.path.exists(path):
            export(model, (torch.randn(2, 3, 224, 224),), ["x"],
                   {"x": {0: torch.export.Dim("batch", min=1, max=64)}}, path)

        def feeds(shape, g):
            return (torch.randn(shape[0], 3, 224, 224, generator=g).to(dev),)
        return model.to(dev), path, ["x"], feeds
    path = os.path.join(tmp, "bert.onnx")
    model = bert_model(12)
    if not os.path.exists(path):
        b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=512)
        args = (torch.randint(0, 30522, (2, 7)), torch.ones(2, 7, dtype=torch.int64))
        export(model, args, ["input_ids", "attention_mask"], {"input_ids": {0: b, 1: s},
                                                              "attention_mask": {0: b, 1: s}}, path)

    def feeds(shape, g):
        bb, ss = shape
        ids = torch.randint(0, 30522, (bb, ss), generator=g)
        mask = torch.ones(bb, ss, dtype=torch.int64)
        mask[:, ss - ss // 4:] = torch.randint(0, 2, (bb, ss // 4), generator=g)  # some padding
        return ids.to(dev), mask.to(dev)
    return model.to(dev), path, ["input_ids", "attention_mask"], feeds


class FullCollections:
    """Python's full (generation 2) garbage collections while calls ran: (call index, ms) each."""

    def __init__(self) -> None:
        self.at, self.call, self._t0 = [], None, 0.0

    def __call__(self, phase, info) -> None:
        if info.get("generation") != 2 or self.call is None:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.at.append((self.call, round((time.perf_counter() - self._t0) * 1e3, 1)))

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def timed_calls(call, feed_list, ref=None, sync_debug_after=None, after=None) -> dict:
    """Seconds of every call (synchronised), the largest relative error against ``ref``'s outputs, and
    the full garbage collections that ran inside calls (``gc_full``: call index and ms)."""
    with FullCollections() as full:
        res = _timed_calls(call, feed_list, ref, sync_debug_after, full, after)
    res["gc_full"] = full.at
    return res


def _timed_calls(call, feed_list, ref, sync_debug_after, full, after=None) -> dict:
    times, errs, outs, syncs = [], [], [], []
    for i, feeds in enumerate(feed_list):
        full.call = i
        if sync_debug_after is not None and i == sync_debug_after:
            torch.cuda.set_sync_debug_mode("warn")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if sync_debug_after is not None and i >= sync_debug_after:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                out = call(feeds)
            for x in w:
                if "synchroniz" in str(x.message):
                    syncs.append(f"{x.filename}:{x.lineno}")
        else:
            out = call(feeds)
        out = out[0] if isinstance(out, (tuple, list)) else out
        out = torch.as_tensor(out, device="cuda")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        full.call = None  # (the comparison below is not the call's)
        if after is not None:
            after(i)
        if ref is None:
            outs.append(out.float())
        else:
            r = ref[i]
            errs.append(float((out.float() - r).norm() / r.norm().clamp_min(1e-30)))
    torch.cuda.set_sync_debug_mode("default")
    res = {"times_s": times}
    if ref is None:
        res["outs"] = outs
    else:
        res["max_rel_err"] = max(errs)
    if syncs:
        res["sync_sites"] = {s: syncs.count(s) for s in sorted(set(syncs))}
    return res


def summary(r: dict, eager: dict) -> dict:
    t, e = r["times_s"], eager["times_s"]
    return {"total_s": sum(t), "vs_eager_total": sum(e) / sum(t),
            "last50_vs_eager": sum(e[-50:]) / sum(t[-50:]), "first60_vs_eager": sum(e[:60]) / sum(t[:60]),
            "first_call_s": t[0], "slowest_after_first_s": max(t[1:]),
            "slowest_after_first_vs_eager_slowest": max(t[1:]) / max(e),
            "worst_call_vs_eager_same_call": max(a / b for a, b in zip(t[1:], e[1:]))}


def run_dynashape(path, names, feed_list, ref, options, sync_debug) -> dict:
    t0 = time.perf_counter()
    sess = dynashape.InferenceSession(path, device="cuda", **options)
    load_s = time.perf_counter() - t0
    per_call, last = [], {}

    def after(i, sess=sess, keys=("static_hits", "static_misses", "padded_calls", "syncs_waited_on_capture",
                       "static_builds", "static_refused_runs")):
        st = sess.stats()  # (after the call's timing) what served it: NEW_SHAPES_PER_CALL=1
        per_call.append({k: st.get(k, 0) - last.get(k, 0) for k in keys})
        last.update({k: st.get(k, 0) for k in keys})
    res = timed_calls(lambda f, sess=sess: sess.run(None, dict(zip(names, f))), feed_list, ref,
                      sync_debug_after=3 if sync_debug else None,
                      after=after if os.environ.get("NEW_SHAPES_PER_CALL") else None)
    if per_call:
        res["per_call"] = per_call
    st = sess.stats()
    res["stats"] = {k: v for k, v in st.items() if any(w in k for w in ("static", "host_sync", "build", "bucket",
                                                                          "capture", "impl", "tuned", "cache", "pad",
                                                                          "elements"))}
    res["refusals"] = list(sess.compiled.refusals)[-3:] if sess.compiled is not None else []
    res["stats"]["device_reserved_gib"] = torch.cuda.memory_reserved() / 2**30  # the session's memory at its end
    res["load_s"] = load_s
    del sess, after
    gone()
    return res


def workload_run(workload, args, options, tmp, only_dynashape=False) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    calls = args.resnet_calls if workload.startswith("resnet") else args.bert_calls
    shapes = shapes_for(workload, calls, args.seed)
    model, path, names, make = model_for(workload, tmp)
    g = torch.Generator().manual_seed(args.seed + 1)
    feed_list = [make(s, g) for s in shapes]
    out = {"shapes": shapes}

    def eager_call(f):
        with torch.no_grad():
            return model(*f)
    eager = timed_calls(eager_call, feed_list)
    ref = eager.pop("outs")
    out["eager"] = eager
    label = "dynashape " + (",".join(f"{k}={v}" for k, v in options.items()) or "default")
    out[label] = run_dynashape(path, names, feed_list, ref, options, args.sync_debug)
    if args.compile and not only_dynashape:
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=True)

        def compiled_call(f):
            with torch.no_grad():
                return compiled(*f)
        out["torch.compile(dynamic=True)"] = timed_calls(compiled_call, feed_list, ref)
        del compiled
        torch._dynamo.reset()
        gone()
    del ref
    gone()
    for k, r in out.items():
        if k != "shapes":
            r["summary"] = summary(r, out["eager"])
    return out


def strict_bert():
    """TF32 off on every side, cuBLAS and cuDNN loaded, then BERT-base's (eager module, ONNX path,
    input names, feeds maker): what the BERT probes (bert_host.py, call_timeline.py) start from."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    _warm_libraries()
    return model_for("bert_random", tempfile.mkdtemp())


def _warm_libraries() -> None:
    """cuBLAS and cuDNN loaded and their handles made before anything is timed: a process pays
    that once, and it belongs to no runtime (the first runtime timed would carry it)."""
    x = torch.randn(2, 3, 16, 16, device="cuda")
    torch.nn.functional.conv2d(x, torch.randn(4, 3, 3, 3, device="cuda"))
    torch.randn(8, 8, device="cuda") @ torch.randn(8, 8, device="cuda")
    torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["resnet_random", "bert_random", "resnet_cycle", "bert_cycle"])
    ap.add_argument("--resnet-calls", type=int, default=100)
    ap.add_argument("--bert-calls", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--options", nargs="*", default=[], help="dynashape keyword options, k=v")
    ap.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True) side by side")
    ap.add_argument("--cache-dir", help="dynashape's disk cache (cache_dir=)")
    ap.add_argument("--second-process", action="store_true", help="then the dynashape rows in a new process")
    ap.add_argument("--only-dynashape", action="store_true")
    ap.add_argument("--sync-debug", action="store_true")
    ap.add_argument("--models-dir", help="where the exported models are kept (default: a temporary folder)")
    ap.add_argument("--json")
    args = ap.parse_args()
    options = dict(kv.split("=", 1) for kv in args.options)
    if args.cache_dir:
        options["cache_dir"] = args.cache_dir
    tmp = args.models_dir or tempfile.mkdtemp()
    _warm_libraries()
    data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "options": options}
    rows = []
    for w in args.workloads:
        # a folder per workload: the cycling workloads share their model with the random ones, and
        # a first process must not find the cache another workload left (the second process finds
        # the one its own workload left)
        opts = {**options, "cache_dir": os.path.join(args.cache_dir, w)} if args.cache_dir else options
        data[w] = r = workload_run(w, args, opts, tmp, args.only_dynashape)
        for k, v in r.items():
            if k == "shapes":
                continue
            s = v["summary"]
            rows.append([w, k, s["total_s"], s["vs_eager_total"], s["last50_vs_eager"], s["first60_vs_eager"],
                         s["first_call_s"], s["slowest_after_first_vs_eager_slowest"], v.get("max_rel_err", 0.0)])
            if "stats" in v:
                print(w, k, json.dumps(v["stats"]))
                for why in v.get("refusals", []):
                    print(w, k, "refused:", why[:1500])
            if "sync_sites" in v:
                print(w, k, "host syncs after the first calls:", json.dumps(v["sync_sites"]))
            if v.get("gc_full"):
                print(w, k, "full garbage collections in calls (call, ms):", v["gc_full"])
    if args.second_process and args.cache_dir:
        cmd = [sys.executable, __file__, "--workloads", *args.workloads, "--only-dynashape", "--models-dir", tmp,
               "--cache-dir", args.cache_dir, "--resnet-calls", str(args.resnet_calls), "--bert-calls",
               str(args.bert_calls), "--seed", str(args.seed), "--options", *args.options]
        second = os.path.join(tmp, "second.json")
        done = subprocess.run([*cmd, "--json", second]).returncode == 0
        if done:
            with open(second) as f:
                data["second_process"] = json.load(f)
        else:  # the first process's rows are still printed and kept
            print("the second process failed")
        for w in args.workloads if done else ():
            for k, v in data["second_process"][w].items():
                if k not in ("shapes", "eager"):
                    s = v["summary"]
                    rows.append([w, "2nd process " + k, s["total_s"], s["vs_eager_total"], s["last50_vs_eager"],
                                 s["first60_vs_eager"], s["first_call_s"], s["slowest_after_first_vs_eager_slowest"],
                                 v.get("max_rel_err", 0.0)])
    print_table(f"every call from the first ({data['device']}, strict fp32)",
                ["workload", "runtime", "total s", "x eager", "last 50 x eager", "first 60 x eager", "first call s",
                 "slowest/eager slowest", "max rel err"], rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, default=str)


if __name__ == "__main__":
    main()
