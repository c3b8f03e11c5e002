"""Whether and when a session builds static impls of its regions (``static_impls=``), and their counters."""

from __future__ import annotations

import os

import torch

from ..compile.memory_plan import kv_appends
from ..errors import OptionsError
from .decode_graph import nonnegative

# the counters of static impls, reported (as 0 too) whenever they are on
# (static_trace_time_s: the part of CPU builds spent in the calling thread, the trace)
STATIC_COUNTERS = ("static_hits", "static_misses", "static_builds", "static_build_time_s", "static_trace_time_s",
                   "build_wait_s",
                   "static_bytes", "static_refused", "static_refused_runs", "static_guard_fails", "static_errors_rerun",
                   "static_dropped_by_replan", "static_stale_failures")


CPU_DECODE_AFTER = 256  # calls of a CPU decoder session before its static impls are built


def static_mode(option, device: torch.device) -> str | None:
    """Static impls: ``"async"`` (built in the background while the dynamic impl serves),
    ``"sync"`` (built in the call that asks), ``"decoders"`` (async for a graph that appends to a
    KV cache, after its first calls, else off: ``for_graph`` decides once the graph is loaded),
    or None (off). ``"auto"``, the default, is async on CUDA, where a replayed graph saves a
    launch per kernel, and "decoders" on CPU: there the generated code already is the straight
    line a static impl would run, and an inductor build (seconds of compiling) pays only where
    the same region keys come back call after call for long (a decode loop: 1.5-2x its dynamic
    speed), not where every call brings new shapes (the image and audio models of
    docs/benchmarks.md ran 0.9-1.6x slower with it) nor in a short run."""
    value = option if option is not None else os.environ.get("DYNASHAPE_STATIC_IMPLS", "auto")
    text = str(value).lower()
    if text == "auto":
        if device.type == "cuda":
            return "async"
        return "decoders" if cpu_decode_after() else None
    if text in ("1", "true", "on", "async"):
        return "async"
    if text == "sync":
        return "sync"
    if text in ("0", "false", "off", "none"):
        return None
    raise OptionsError(f"static_impls={value!r}: expected 'auto', 'async', 'sync' or 'off'")


def deterministic_mode(mode: str | None, device: torch.device) -> str | None:
    """``static_mode``'s choice under ``deterministic=True``. On CPU a build waited for in the call
    that asks ("sync") takes over at a call fixed by the calls made, where "async" (and "decoders",
    made async by ``for_graph``; the session turns that into "sync") let a build's finishing time
    choose it. On CUDA static impls are off: a build keeps the product and convolution forms
    (and cuDNN algorithms) timed fastest, and which one wins, with its own rounding, is timing."""
    if device.type == "cuda":
        return None
    return "sync" if mode == "async" else mode


def cpu_decode_after() -> int:
    """DYNASHAPE_CPU_DECODE_STATIC: the calls a CPU decoder session makes before "auto" builds its
    static impls (default 256: a short generation pays nothing; a long loop, seconds of imports,
    traces and compiles once, then runs faster); 0 keeps them off."""
    text = os.environ.get("DYNASHAPE_CPU_DECODE_STATIC", str(CPU_DECODE_AFTER))
    return nonnegative(text, f"DYNASHAPE_CPU_DECODE_STATIC={text!r}: expected a number of calls (0: off)")


def for_graph(mode: str | None, graph) -> tuple[str | None, int]:
    """``static_mode``'s choice for this graph, and the calls to make before building: "decoders"
    is async after ``cpu_decode_after()`` calls where the graph appends to a KV cache
    (``present = Concat(past, new)``, the past fed back by the caller), else off."""
    if mode != "decoders":
        return mode, 0
    return ("async", cpu_decode_after()) if kv_appends(graph) else (None, 0)
