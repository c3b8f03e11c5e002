"""Timing helpers shared by the benchmark scripts: interleaved rounds, medians, a rich table."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def interleaved(engines: dict[str, Callable[[], object]], calls: int, rounds: int, warmup: int = 3) -> dict:
    """Median seconds per call of each engine; engines alternate round by round so that machine
    noise hits them alike (they are measured side by side, in one process)."""
    for f in engines.values():
        for _ in range(warmup):
            f()
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, f in engines.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            samples[name].append((time.perf_counter() - t0) / calls)
    return {k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)} for k, v in samples.items()}


def cpu_args(doc: str):
    """The CPU micro-benchmarks' arguments (--threads, --json), torch's thread count set from them."""
    import argparse

    import torch
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c != columns[0] else "left")
    for r in rows:
        t.add_row(*[f"{x:.3g}" if isinstance(x, float) else str(x) for x in r])
    # a log (not a terminal) gets the whole table, not columns cut to 80 characters
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def write_json(path: str | None, data: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)


def gpu_header() -> dict:
    """What a GPU results file says of its run: the device's name, torch's version, the date."""
    import torch
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def sync(dev) -> None:
    """Wait for the device's queued work (timings of CUDA calls end here)."""
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def gone() -> None:
    """Free what the last runtime left (its session deleted by the caller) before the next is timed."""
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cuda_event_ms(f: Callable, sets: tuple | list = ((),), reps: int = 25, warmup: int = 3) -> float:
    """Median device time of ``f(*args)`` in ms by CUDA events, the argument sets rotated (inputs
    that fit in the cache would otherwise time the cache)."""
    import torch
    for i in range(warmup):
        f(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ts = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f(*sets[i % len(sets)])
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def replay_us(graph, reps: int = 20) -> float:
    """Device time of one replay of a captured CUDA graph, in microseconds (one replay first)."""
    import torch
    graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    return 1e3 * a.elapsed_time(b) / reps


def graph_us(fn: Callable, calls: int = 1, reps: int = 20, warmup: int = 3) -> float:
    """Device time of one call of ``fn()`` in microseconds, without launch overhead: ``calls`` calls
    captured in one CUDA graph (after ``warmup`` on a side stream, as capture wants), replayed."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return replay_us(graph, reps) / calls


def ring_graph_us(fns: list, calls: int | None = None, reps: int = 5) -> float:
    """Wall time of one call in microseconds: ``calls`` calls (default one of each) of ``fns`` taken in
    turn (a ring of operands, so that each call reads its own weights from memory, as the layers of a
    step do) captured in one CUDA graph, the least over 5 rounds of ``reps`` replays."""
    import torch
    calls = calls or len(fns)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / (reps * calls))
    return best * 1e6


def rel_err(got, ref) -> float:
    """||got - ref|| / ||ref|| in float64 (``ref`` float64 already, or made so)."""
    return float((got.double() - ref.double()).norm() / ref.double().norm())


def dynashape_bench(name: str, model, args: list[str]) -> dict:
    """``dynashape bench MODEL ARGS --json ... --no-progress`` in a process of its own (the runtimes'
    thread pools die with it); its table printed, its JSON document returned."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "dynashape", "bench", str(model), *args, "--json", str(out), "--no-progress"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        print(proc.stdout, flush=True)
        return json.loads(out.read_text())
