"""Memory of a Llama-style decode loop: predictor off vs on vs in-place concat, in one process.

    python benchmarks/decode_memory.py [--device cpu|cuda] [--steps 512] [--batches 1 4]
                                       [--model decoder.onnx] [--json out.json] [--plot out.png]

A prefill of 8 tokens, then ``steps`` decode steps of one token, the KV cache growing by one
position per step (present -> past). Settings (each a fresh session on the same model and the
same token ids):
- off        predictor off ("0 0 0 1.0"), no in-place concat, numpy feeds (buffers kept by the
             network, outputs copied out);
- predictor  the ShapePredictor with its defaults, numpy feeds;
- off/torch, predictor/torch: the same with torch feeds: outputs are handed to the caller each
             step (so present buffers are new each step) and past goes back in as a tensor;
- inplace    predictor + in-place concat, torch feeds: the cache is one storage per layer with
             spare room along the sequence axis; a step appends without copying the past.
Per setting: allocations and frees, bytes allocated, seconds spent allocating, peak bytes, the
largest live set any step needs (from the memory dependencies: what must exist at once), median
step latency, bytes moved per step (concat copies of the past + host->device feed copies), and
whether the logits of every step equal those of ``off``.
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

SETTINGS = {
    "off": dict(mode="numpy", preallocation="0 0 0 1.0", inplace_concat=False),
    "predictor": dict(mode="numpy", preallocation=None, inplace_concat=False),
    "off/torch": dict(mode="torch", preallocation="0 0 0 1.0", inplace_concat=False),
    "predictor/torch": dict(mode="torch", preallocation=None, inplace_concat=False),
    "inplace": dict(mode="torch", preallocation=None, inplace_concat=True),
}
BENCH_CFG = dict(layers=4, hidden=256, heads=8, kv_heads=4, head_dim=32, ffn=512, vocab=4096,
                 rope_theta=10000.0, eps=1e-5, seed=0)
PREFILL = 8


def model_path(arg: str | None) -> str:
    if arg:
        return arg
    from tests.models import llama
    from tests.models.cache import cached
    return str(cached("llama_bench", {**BENCH_CFG, "max_past": 1024},
                      lambda p: llama.export(p, BENCH_CFG), module=llama))


def live_set_bytes(net) -> int:
    """The most bytes that must exist at once during the last run: every value the network
    produced (views count with their base) from its producer to its last reader, plus the
    inputs for the whole run; the maximum over the node positions. Values that share memory
    with an input (an in-place KV cache: present extends past) count only what they add; a
    producer that wrote into an in-place Concat's storage counts with that storage (the
    Concat's output). Values that shared a pool record at other times count in full: the
    measure is what the graph needs, not what the pool made of it."""
    from dynashape.compile.memory_deps import basic_memory_dependencies
    deps = getattr(net, "_bench_deps", None) or basic_memory_dependencies(net.graph)
    net._bench_deps = deps
    n = len(net.insts)
    delta = [0] * (n + 2)
    at_input: dict[tuple, int] = {}
    inputs = 0
    for t in (net.vals[s] for s in net.input_slots.values()):
        if isinstance(t, torch.Tensor):
            at_input[(t.untyped_storage().data_ptr(), t.data_ptr())] = t.numel() * t.element_size()
            inputs += t.numel() * t.element_size()
    concat_storages = {net.vals[i.out_slot0].untyped_storage().data_ptr() for i in net.insts
                       if i.inplace is not None and isinstance(net.vals[i.out_slot0], torch.Tensor)}
    for i, inst in enumerate(net.insts):
        for v, s in zip(inst.node.outputs, inst.out_slots):
            t = None if s is None else net.vals[s]
            if v is None or not isinstance(t, torch.Tensor) or inst.view:
                continue
            if inst.inplace is None and t.untyped_storage().data_ptr() in concat_storages:
                continue
            extra = t.numel() * t.element_size() - at_input.get((t.untyped_storage().data_ptr(), t.data_ptr()), 0)
            if extra <= 0:
                continue
            first, last = deps.live_interval(v.name) if v.name in deps.roots else (i, n)
            delta[first] += extra
            delta[last + 1] -= extra
    best = acc = 0
    for d in delta:
        acc += d
        best = max(best, acc)
    return best + inputs


def live_set_bytes_compiled(req, feeds: dict, outs: list) -> int:
    """The same measure for the generated code, from its memory plan: every value a kernel
    produced (not views, not shape values) from its producer to its last reader, plus the inputs;
    a KV cache's present counts what it adds to the past; the maximum over the steps."""
    from dynashape.shape import expr as E
    st = req.runner.last_state
    spec = st.spec
    env = dict(zip(spec.sig_symbols, st.sig))
    plan, t = spec.plan, spec.trace
    inputs = sum(x.numel() * x.element_size() for x in feeds.values() if isinstance(x, torch.Tensor))
    inputs += sum(x.nbytes for x in feeds.values() if isinstance(x, np.ndarray))
    values = {id(v): v for ni in t.nodes for v in ni.node.outputs if v is not None}
    n = len(t.nodes)
    delta = [0] * (n + 2)
    for vid, (first, last) in plan.lifetimes.items():
        c = plan.cls.get(vid)
        if c not in ("arena", "output", "kv", "adopt"):
            continue
        info = t.info.get(vid)
        if info is None or info.dims is None or info.dtype is None:
            continue
        size = info.dtype.itemsize
        for d in info.dims:
            size *= E.evaluate(d.expr if hasattr(d, "expr") else d, env)
        v = values[vid]
        past = v.producer.inputs[0] if c == "kv" else None
        if past is not None and _shares(outs, v, feeds, past, t):  # present extends past in place: what it adds
            pinfo = t.info[id(past)]
            psize = pinfo.dtype.itemsize
            for d in pinfo.dims:
                psize *= E.evaluate(d.expr if hasattr(d, "expr") else d, env)
            size -= psize
        delta[first] += size
        delta[min(last, n) + 1] -= size
    best = acc = 0
    for d in delta:
        acc += d
        best = max(best, acc)
    return best + inputs


def _shares(outs: list, v, feeds: dict, past, t) -> bool:
    """Whether output ``v`` (a present) starts where the fed ``past`` does (extended in place)."""
    names = [o.name for o in t.graph.outputs]
    got, fed = outs[names.index(v.name)], feeds.get(past.name)
    return isinstance(got, torch.Tensor) and isinstance(fed, torch.Tensor) and got.data_ptr() == fed.data_ptr()


def external_feed_bytes(feeds: dict, engine) -> int:
    """Bytes of the feeds that are not the engine's memory (numpy arrays on CPU): they exist
    during the run too, so the peak counts them beside the engine's and the caller's."""
    if engine.device.type != "cpu":
        return 0  # host arrays are staged into engine buffers on the device; those are counted
    return sum(x.nbytes for x in feeds.values() if isinstance(x, np.ndarray))


def run_setting(path: str, device: str, batch: int, steps: int, setting: dict, ids: np.ndarray, trace: bool):
    opts = {"preallocation": setting["preallocation"]} if setting["preallocation"] else {}
    sess = dynashape.InferenceSession(path, device=device, inplace_concat=setting["inplace_concat"], **opts)
    names = [a.name for a in sess.get_inputs()]
    cfg = BENCH_CFG
    kv_shape = (batch, cfg["kv_heads"], 0, cfg["head_dim"])
    torch_mode = setting["mode"] == "torch"
    dev = torch.device(device)
    past = [torch.zeros(kv_shape, device=dev) if torch_mode else np.zeros(kv_shape, np.float32)
            for _ in names[1:]]
    req = sess.create_infer_request()
    logits_all, times, memory_trace, live, external = [], [], [], 0, 0
    req.engine.reset_stats()
    for step in range(steps + 1):
        tok = ids[:, :PREFILL] if step == 0 else ids[:, PREFILL + step - 1:PREFILL + step]
        feed_ids = torch.from_numpy(tok).to(dev) if torch_mode else tok
        feeds = {names[0]: feed_ids, **dict(zip(names[1:], past))}
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = req.run(None, feeds)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        logits, past = outs[0], outs[1:]
        external = max(external, external_feed_bytes(feeds, req.engine))
        logits_all.append(logits.cpu().numpy() if torch_mode else logits)
        live = max(live, live_set_bytes_compiled(req, feeds, outs) if req.runner is not None and req.runner.last_state
                   and not req._stats.get("interpreter_runs") else live_set_bytes(req.network))
        if trace:
            st = req.engine.stats()
            memory_trace.append(st["current_bytes"] + st["caller_held_bytes"])
    m = req.memory_stats()
    moved = (m["concat_bytes_copied"] + m["input_bytes_staged"]) / (steps + 1)
    return {
        "allocations": m["allocations"], "frees": m["frees"], "handed_out": m["handed_out"],
        "allocated_MB": m["allocated_bytes_total"] / 2**20, "alloc_ms": m["alloc_time_s"] * 1e3,
        # the feeds' own arrays, where they are not engine memory, exist beside the engine's peak
        "peak_MB": (m["peak_with_caller_bytes"] + external) / 2**20, "peak_network_MB": m["peak_bytes"] / 2**20,
        "live_set_MB": live / 2**20,
        "step_ms": statistics.median(times[1:]) * 1e3, "moved_KB_per_step": moved / 1024,
        "predictions_made": m["predictions_made"], "predictions_used": m["predictions_used"],
        "reuses": m["reuses"], "memory_trace": memory_trace,
    }, logits_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--model")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # steadier step times on a shared machine; the memory figures do not depend on it
    path = model_path(a.model)
    results = {"device": a.device, "steps": a.steps, "torch": torch.__version__, "config": BENCH_CFG, "runs": {}}
    rng = np.random.default_rng(0)
    for batch in a.batches:
        ids = rng.integers(0, BENCH_CFG["vocab"], size=(batch, PREFILL + a.steps)).astype(np.int64)
        ref = None
        rows = []
        for name, setting in SETTINGS.items():
            r, logits = run_setting(path, a.device, batch, a.steps, setting, ids, trace=bool(a.plot))
            if ref is None:
                ref = logits
            diffs = [float(np.abs(x - y).max()) for x, y in zip(logits, ref)]
            r["max_abs_diff_vs_off"] = max(diffs)
            r["identical"] = all(np.array_equal(x, y) for x, y in zip(logits, ref))
            results["runs"][f"b{batch}/{name}"] = r
            rows.append([name, r["allocations"], r["allocated_MB"], r["alloc_ms"], r["peak_MB"], r["live_set_MB"],
                         r["peak_MB"] / r["live_set_MB"], r["step_ms"], r["moved_KB_per_step"],
                         r["predictions_used"], r["max_abs_diff_vs_off"]])
        print_table(f"decode {a.steps} steps, batch {batch}, {a.device}",
                    ["setting", "allocs", "alloc MB", "alloc ms", "peak MB", "live MB", "peak/live", "step ms",
                     "moved KB/step", "pred. used", "max |diff|"], rows)
    if a.plot:
        plot(results, a.plot)
    for r in results["runs"].values():
        r.pop("memory_trace", None) if not a.json else None
    write_json(a.json, results)
    return 0


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, r in results["runs"].items():
        if key.startswith("b1/") and r["memory_trace"]:
            ax.plot(np.array(r["memory_trace"]) / 2**20, label=key[3:])
    ax.set_xlabel("decode step")
    ax.set_ylabel("engine bytes held after the step (MiB)")
    ax.set_title(f"Llama-style decoder, batch 1, {results['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
