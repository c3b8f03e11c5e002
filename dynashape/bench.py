"""`dynashape bench`: latency, throughput, first call per shape and peak memory of a model over a shape
or a cycled sequence of shapes, optionally side by side with onnxruntime and openvino on the same feeds.

Each runtime is timed alone: the others' sessions are deleted and collected first. Per distinct shape,
the first call is timed and reported on its own, then ``warmup`` more calls are made; the timed loop
cycles the shape sequence. Ctrl-C stops the loop and reports (and saves) what was measured.

``--random-shapes`` instead draws a new shape set for every call within ranges (random_shapes.py) and
counts every call from the first, with no warm-up: the total, percentiles and the worst call of a
stream of sizes never seen before, which the cycled mode leaves out of its statistics.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass, field

import numpy as np

from . import random_shapes
from .cli_common import (
    UsageExit,
    _console,
    _parse_dims,
    _parse_shapes,
    _table,
    check_names,
    dynamic_dims_option,
    load_checked,
    random_feeds,
)

RUNTIMES = ("onnxruntime", "openvino", "torch-eager")
TORCH_EAGER_NOTE = "torch-eager needs the torch module; not available for an ONNX file alone"


@dataclass
class Result:
    runtime: str
    status: str = "ok"
    note: str = ""
    load_ms: float = 0.0
    first_call_ms: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)  # (shape key, ms, memory bytes or None)
    peak_bytes: int | None = None
    cuda_max_memory_allocated: int | None = None
    wall_s: float = 0.0
    interrupted: bool = False

    def summary(self) -> dict:
        ms = np.asarray([c[1] for c in self.calls], dtype=np.float64)
        out = {"status": self.status, "note": self.note, "load_ms": self.load_ms, "calls": len(ms),
               "first_call_ms": self.first_call_ms, "peak_bytes": self.peak_bytes,
               "cuda_max_memory_allocated": self.cuda_max_memory_allocated, "interrupted": self.interrupted}
        if len(ms):
            out["latency_ms"] = {"min": float(ms.min()), "p50": float(np.percentile(ms, 50)),
                                 "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)),
                                 "max": float(ms.max()), "mean": float(ms.mean())}
            out["throughput_per_s"] = float(len(ms) / (ms.sum() / 1e3))
            out["total_ms"] = float(ms.sum())
            worst = int(ms.argmax())
            out["worst_call"] = {"index": worst, "shape": self.calls[worst][0], "ms": float(ms[worst])}
            per: dict[str, list] = {}
            for key, v, _ in self.calls:
                per.setdefault(key, []).append(v)
            out["per_shape_p50_ms"] = {k: float(np.median(v)) for k, v in per.items()}
        out["per_call"] = [{"shape": k, "ms": v, **({"memory_bytes": m} if m is not None else {})}
                           for k, v, m in self.calls]
        return out


def shape_key(shapes: dict) -> str:
    return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in sorted(shapes.items()))


def parse_shapes_file(path: str) -> list[dict]:
    """JSON: a list of {name: dims} (dims a list of ints or "1x3" text), or {"shapes": [...]};
    text: one shape set per line, ``name=DIMS`` items separated by spaces, ';' or ','-free, '#' comments."""
    try:
        text = open(path).read()
    except OSError as e:
        raise UsageExit(f"dynashape: cannot read --shapes-file {path!r}: {e}") from e
    sets: list[dict] = []
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if data is not None:
        if isinstance(data, dict):
            data = data.get("shapes", data.get("sequence"))
        if not isinstance(data, list) or not all(isinstance(s, dict) for s in data):
            raise UsageExit(f"dynashape: --shapes-file {path!r}: expected a JSON list of {{name: dims}}")
        for s in data:
            one = {}
            for k, v in s.items():
                if isinstance(v, str):
                    one[k] = _parse_dims(v)
                elif isinstance(v, list) and all(isinstance(d, int) and d >= 0 for d in v):
                    one[k] = tuple(v)
                else:
                    raise UsageExit(f"dynashape: --shapes-file {path!r}: bad dims {v!r} for {k!r}")
            sets.append(one)
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                sets.append(_parse_shapes(line.replace(";", " ").split()))
    if not sets:
        raise UsageExit(f"dynashape: --shapes-file {path!r} lists no shapes")
    return sets


def _timed_call(run, feeds) -> float:
    """One call, in seconds (tests replace this to simulate Ctrl-C)."""
    t0 = time.perf_counter()
    run(feeds)
    return time.perf_counter() - t0


def _make_runtime(name: str, args, dd):
    """(run(feeds), session object, memory probe or None) for one runtime; raises _Skip when unavailable."""
    if name == "dynashape":
        from . import InferenceSession
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        sess = InferenceSession(args.model, device=args.device, **({"dynamic_dims": dd} if dd else {}))
        return (lambda feeds: sess.run(None, feeds)), sess
    if name == "onnxruntime":
        ort = _optional("onnxruntime")
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads or 0
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CUDAExecutionProvider"] if str(args.device).startswith("cuda") else ["CPUExecutionProvider"]
        if providers[0] not in ort.get_available_providers():
            raise _Skip(f"onnxruntime has no {providers[0]}")
        sess = ort.InferenceSession(str(args.model), so, providers=providers)
        return (lambda feeds: sess.run(None, feeds)), sess
    if name == "openvino":
        ov = _optional("openvino")
        core = ov.Core()
        # f32 unless asked: OpenVINO's CPU plugin computes in bf16 by default on CPUs with AMX or
        # AVX-512 BF16 (this project's Xeon has both), which no other runtime here does
        cfg = {"INFERENCE_PRECISION_HINT": getattr(args, "ov_precision", None) or "f32"}
        if args.threads:
            cfg["INFERENCE_NUM_THREADS"] = args.threads
        compiled = core.compile_model(str(args.model), "CPU", cfg)
        req = compiled.create_infer_request()
        return (lambda feeds: req.infer(feeds)), (core, compiled, req)
    if name == "torch-eager":
        return _torch_eager(args)
    raise UsageExit(f"dynashape: --compare: unknown runtime {name!r}; choose from {list(RUNTIMES)}")


def _optional(module: str):
    """A runtime's package, or _Skip when it is not installed (the comparison goes on without it)."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise _Skip(f"{module} is not installed") from e


def _torch_eager(args):
    """The torch module the ONNX file came from (``--torch-module MODULE:FACTORY``), run eagerly
    under no_grad on the same feeds, in the model's input order; outputs copied to the host, as the
    other runtimes hand back numpy arrays."""
    spec = getattr(args, "torch_module", None)
    if not spec:
        raise _Skip(TORCH_EAGER_NOTE + " (give it with --torch-module MODULE:FACTORY)")
    import importlib

    import onnx
    import torch
    mod_name, _, factory = spec.partition(":")
    try:
        module = getattr(importlib.import_module(mod_name), factory or "build")()
    except (ImportError, AttributeError) as e:
        raise UsageExit(f"dynashape: --torch-module {spec!r}: {type(e).__name__}: {e}") from e
    dev = torch.device(args.device or "cpu")
    if isinstance(module, torch.nn.Module):
        module = module.to(dev).eval()
    proto = onnx.load(str(args.model), load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in inits]

    def run(feeds):
        with torch.no_grad():
            out = module(*[torch.as_tensor(feeds[n]).to(dev) for n in names])
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [o.cpu() for o in outs if isinstance(o, torch.Tensor)]
    return run, module


class _Skip(Exception):
    pass


def _each_runtime(names: list[str], args, con, bench) -> list:
    """``bench(name, progress)`` for each runtime in turn, under one progress bar; stops after a
    run interrupted by the user (what was measured so far is kept)."""
    results: list[Result] = []
    progress = None
    if not getattr(args, "no_progress", False):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), transient=True, console=con)
    try:
        if progress is not None:
            progress.start()
        for name in names:
            r = bench(name, progress)
            results.append(r)
            if r.interrupted:
                con.print("[yellow]interrupted: the numbers below are what was measured so far[/yellow]")
                break
    finally:
        if progress is not None:
            progress.stop()
    return results


def _start(name: str, args, dd):
    """A runtime made and timed: (its Result, run, session, whether CUDA memory is tracked, a
    memory probe or None); run is None where the runtime is skipped (the Result says why)."""
    res = Result(name)
    t0 = time.perf_counter()
    try:
        run, sess = _make_runtime(name, args, dd)
    except _Skip as e:
        res.status, res.note = "skipped", str(e)
        return res, None, None, False, None
    res.load_ms = (time.perf_counter() - t0) * 1e3
    cuda = str(args.device).startswith("cuda") and name == "dynashape"
    if cuda:
        import torch
        torch.cuda.reset_peak_memory_stats()
    mem = (lambda s=sess: s.memory_stats().get("current_bytes")) if name == "dynashape" else None
    return res, run, sess, cuda, mem


def _finish(res: Result, sess, cuda: bool, progress, task) -> None:
    """A runtime's memory figures into ``res`` (``sess``: dynashape's session, else None), its
    progress bar line removed."""
    if sess is not None:
        res.peak_bytes = sess.memory_stats().get("peak_bytes")
    if cuda:
        import torch
        res.cuda_max_memory_allocated = int(torch.cuda.max_memory_allocated())
    if task is not None:
        progress.remove_task(task)


def _bench_one(name: str, args, dd, sequence, keys, progress) -> Result:
    res, run, sess, cuda, mem = _start(name, args, dd)
    if run is None:
        return res
    task = None
    try:
        for i, key in enumerate(keys):  # first call and warm-up of each distinct shape
            if key in res.first_call_ms:
                continue
            try:
                res.first_call_ms[key] = _timed_call(run, sequence[i]) * 1e3
            except Exception as e:
                if name == "dynashape":
                    raise
                res.status, res.note = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                return res
            for _ in range(args.warmup):
                _timed_call(run, sequence[i])
        limit = args.runs if args.runs is not None else (None if args.time_s else 100)
        if progress is not None:
            task = progress.add_task(name, total=limit if limit is not None else args.time_s)
        start = time.perf_counter()
        i = 0
        while (limit is None or i < limit) and (not args.time_s or time.perf_counter() - start < args.time_s):
            j = i % len(sequence)
            dt = _timed_call(run, sequence[j])
            res.calls.append((keys[j], dt * 1e3, mem() if mem is not None else None))
            i += 1
            if task is not None:
                progress.update(task, completed=i if limit is not None else min(args.time_s,
                                                                                 time.perf_counter() - start))
        res.wall_s = time.perf_counter() - start
    except KeyboardInterrupt:
        res.interrupted = True
        res.note = "interrupted"
    finally:
        _finish(res, sess if name == "dynashape" else None, cuda, progress, task)
        mem = None
        del run, sess
        gc.collect()
    return res


def _bench_new_shapes(name: str, args, dd, feeds_for, keys, progress) -> Result:
    """Every call at a new shape set, each timed and counted from the first (no warm-up); the feeds
    of call i are made before it, outside its time, the same for every runtime."""
    res, run, sess, cuda, mem = _start(name, args, dd)
    if run is None:
        return res
    task = progress.add_task(name, total=len(keys)) if progress is not None else None
    start = time.perf_counter()
    try:
        for i, key in enumerate(keys):
            feeds = feeds_for(i)
            try:
                dt = _timed_call(run, feeds)
            except Exception as e:
                if name == "dynashape":
                    raise
                res.status, res.note = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                return res
            res.calls.append((key, dt * 1e3, mem() if mem is not None else None))
            if task is not None:
                progress.update(task, completed=i + 1)
    except KeyboardInterrupt:
        res.interrupted = True
        res.note = "interrupted"
    finally:
        res.wall_s = time.perf_counter() - start
        _finish(res, sess if name == "dynashape" else None, cuda, progress, task)
        mem = None
        del run, sess
        gc.collect()
    return res


def report_new_shapes(results: list[Result], con) -> None:
    """Every call counted: total, percentiles, the worst call and its shape, each runtime's total
    against the fastest one's."""
    nums = ("calls", "total", "p50", "p90", "p99", "worst", "mean", "x fastest", "load ms", "peak MB")
    t = _table("every call at a new shape, counted from the first (ms)", ("runtime", *nums, "worst shape"),
               numeric=nums)
    done = [r.summary() for r in results]
    totals = [s["total_ms"] for r, s in zip(results, done) if r.status == "ok" and "total_ms" in s]
    best = min(totals) if totals else None
    notes = []
    for r, s in zip(results, done):
        lat = s.get("latency_ms", {})
        peak = r.cuda_max_memory_allocated if r.cuda_max_memory_allocated is not None else r.peak_bytes
        total = s.get("total_ms")
        t.add_row(r.runtime, str(s["calls"]), _ms(total), *(_ms(lat.get(k)) for k in ("p50", "p90", "p99", "max")),
                  _ms(lat.get("mean")), f"{total / best:.2f}" if total is not None and best else "-",
                  f"{r.load_ms:.0f}" if r.status != "skipped" else "-",
                  f"{peak / 2**20:.1f}" if peak is not None else "-", s.get("worst_call", {}).get("shape", "-"))
        if r.note or r.status != "ok":
            notes.append(f"{r.runtime}: {r.status}{': ' + r.note if r.note else ''}")
    con.print(t)
    for n in notes:
        con.print(n, highlight=False, soft_wrap=True)


class InputsOf:
    """What random_feeds reads of a session (its inputs and their specs), without the session."""

    def __init__(self, sess) -> None:
        self._inputs, self._specs = list(sess.get_inputs()), list(sess._specs)

    def get_inputs(self) -> list:
        return self._inputs


def main_new_shapes(args, dd, probe, given, compare, con) -> int:
    """--random-shapes: ``args.calls`` calls, each at a shape set drawn new within the ranges."""
    if args.shapes_file:
        raise UsageExit("dynashape: --random-shapes draws the shapes; leave out --shapes-file")
    if args.runs is not None or args.time_s is not None:
        raise UsageExit("dynashape: with --random-shapes, --calls gives the number of calls (no --runs or --time)")
    if args.calls < 1:
        raise UsageExit("dynashape: --calls must be at least 1")
    spec = random_shapes.parse(args.random_shapes, args.step)
    known = [a.name for a in probe.get_inputs()]
    check_names(spec.dims, known, "--random-shapes")
    both = sorted(set(spec.dims) & set(given))
    if both:
        raise UsageExit(f"dynashape: {both} given both by --shape and by --random-shapes")
    sets = random_shapes.draw(spec, args.calls, args.seed)
    keys = [shape_key({**given, **s}) for s in sets]

    def feeds_for(i: int) -> dict:  # fresh random data per call, the same for every runtime
        return random_feeds(probe, {**given, **sets[i]}, np.random.default_rng([args.seed, i]), args.int_high)
    con.print(f"{args.model} on {args.device}: {len(sets)} calls, each at a new shape set drawn from "
              f"{' '.join(args.random_shapes)} (step {args.step}, seed {args.seed}); every call counted",
              highlight=False)
    results = _each_runtime(["dynashape", *compare], args, con,
                            lambda name, progress: _bench_new_shapes(name, args, dd, feeds_for, keys, progress))
    interrupted = any(r.interrupted for r in results)
    report_new_shapes(results, con)
    return _conclude(args, con, results, interrupted,
                     {"mode": "random-shapes", "random_shapes": list(args.random_shapes), "step": args.step,
                      "seed": args.seed, "calls": args.calls, "shape_sequence": keys})


def _conclude(args, con, results: list, interrupted: bool, fields: dict) -> int:
    """The JSON (``--json``: the model, device, threads, ``fields``, each runtime's summary) and the
    plot (``--plot``) of a bench run; its exit status (130 when interrupted)."""
    if args.json_path:
        doc = {"model": str(args.model), "device": args.device, "threads": args.threads, **fields,
               "interrupted": interrupted, "runtimes": {r.runtime: r.summary() for r in results}}
        with open(args.json_path, "w") as f:
            json.dump(doc, f, indent=1)
        con.print(f"results written to {args.json_path}")
    if args.plot:
        plot(results, args.plot, con)
    return 130 if interrupted else 0


def _ms(v) -> str:
    return f"{v:.3f}" if v is not None else "-"


def report(results: list[Result], keys_order: list[str], con) -> None:
    nums = ("calls", "min", "p50", "p90", "p99", "max", "mean", "calls/s", "load ms", "peak MB")
    t = _table("latency (ms) over the timed calls", ("runtime", *nums), numeric=nums)
    notes = []
    for r in results:
        s = r.summary()
        lat = s.get("latency_ms", {})
        peak = r.cuda_max_memory_allocated if r.cuda_max_memory_allocated is not None else r.peak_bytes
        t.add_row(r.runtime, str(s["calls"]), *(_ms(lat.get(k)) for k in ("min", "p50", "p90", "p99", "max", "mean")),
                  f"{s['throughput_per_s']:.1f}" if "throughput_per_s" in s else "-",
                  f"{r.load_ms:.0f}" if r.status != "skipped" else "-",
                  f"{peak / 2**20:.1f}" if peak is not None else "-")
        if r.note or r.status != "ok":
            notes.append(f"{r.runtime}: {r.status}{': ' + r.note if r.note else ''}")
    con.print(t)
    for n in notes:
        con.print(n, highlight=False, soft_wrap=True)
    ran = [r for r in results if r.status != "skipped"]
    if ran:
        names = tuple(r.runtime for r in ran)
        t = _table("first call per distinct shape (ms, before its warm-up)", ("shape", *names), numeric=names)
        for k in keys_order:
            t.add_row(k, *(_ms(r.first_call_ms.get(k)) for r in ran))
        con.print(t)


def plot(results: list[Result], path: str, con) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        con.print("[yellow]--plot needs matplotlib: pip install matplotlib[/yellow]")
        return
    has_mem = any(c[2] is not None for r in results for c in r.calls)
    fig, axes = plt.subplots(2 if has_mem else 1, 1, figsize=(10, 7 if has_mem else 4), squeeze=False)
    ax = axes[0][0]
    for r in results:
        if r.calls:
            ax.plot([c[1] for c in r.calls], label=r.runtime, lw=0.8)
    ax.set_xlabel("call")
    ax.set_ylabel("latency (ms)")
    ax.legend()
    if has_mem:
        ax = axes[1][0]
        for r in results:
            if any(c[2] is not None for c in r.calls):
                ax.plot([(c[2] or 0) / 2**20 for c in r.calls], label=r.runtime)
        ax.set_xlabel("call")
        ax.set_ylabel("current memory (MB)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    con.print(f"plot written to {path}")


def main(args) -> int:
    from . import InferenceSession
    con = _console()
    load_checked(args.model)
    dd = dynamic_dims_option(args.model, args.dynamic_dim)
    compare = [c.strip() for c in (args.compare or "").split(",") if c.strip()]
    for c in compare:
        if c not in RUNTIMES:
            raise UsageExit(f"dynashape: --compare: unknown runtime {c!r}; choose from {list(RUNTIMES)}")
    if args.runs is not None and args.runs < 1:
        raise UsageExit("dynashape: --runs must be at least 1")
    if args.time_s is not None and args.time_s <= 0:
        raise UsageExit("dynashape: --time must be positive")
    if args.warmup < 0:
        raise UsageExit("dynashape: --warmup cannot be negative")
    probe = InferenceSession(args.model, device=args.device, **({"dynamic_dims": dd} if dd else {}))
    known = [a.name for a in probe.get_inputs()]
    given = _parse_shapes(args.shape)
    check_names(given, known, "--shape")
    if getattr(args, "random_shapes", None):
        inputs = InputsOf(probe)
        del probe  # no session but the one timed lives during a runtime's calls
        gc.collect()
        return main_new_shapes(args, dd, inputs, given, compare, con)
    shape_sets = parse_shapes_file(args.shapes_file) if args.shapes_file else [{}]
    for i, s in enumerate(shape_sets):
        check_names(s, known, f"--shapes-file entry {i}")
    rng = np.random.default_rng(args.seed)
    sequence, keys = [], []
    for s in shape_sets:  # fresh random inputs for every entry, the same for every runtime
        feeds = random_feeds(probe, {**given, **s}, rng, args.int_high)
        sequence.append(feeds)
        keys.append(shape_key({k: v.shape for k, v in feeds.items()}))
    del probe
    gc.collect()
    order = list(dict.fromkeys(keys))
    con.print(f"{args.model} on {args.device}: {len(sequence)} shape set(s) cycled, {len(order)} distinct; "
              f"warm-up {args.warmup} call(s) per shape; "
              + (f"{args.runs} calls" if args.runs else f"{args.time_s} s" if args.time_s else "100 calls"),
              highlight=False)
    results = _each_runtime(["dynashape", *compare], args, con,
                            lambda name, progress: _bench_one(name, args, dd, sequence, keys, progress))
    interrupted = any(r.interrupted for r in results)
    report(results, order, con)
    return _conclude(args, con, results, interrupted,
                     {"warmup": args.warmup, "runs": args.runs, "time_s": args.time_s, "shape_sequence": keys,
                      "distinct_shapes": order})
