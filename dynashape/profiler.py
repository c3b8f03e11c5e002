"""Per-node profiling in onnxruntime's trace format (``SessionOptions.enable_profiling``).

A profiled session runs every call through the interpreter (the per-node flow of
dynashape/interpreter/: update_shape -> update_impl -> ... -> execute, one ``PrimitiveInst.step``
per node) and not the generated code, which has no node boundaries to time: profiled timings are
those of the per-node flow, not of the default compiled executor. Each step is timed with
``time.perf_counter_ns``; on CUDA the device is synchronized before and after the step so that the
time covers the node's kernels. ``end_profiling()`` writes the events as a JSON list of chrome
trace events (``"ph": "X"``, ``"cat": "Node"``, ``"name"``: the node name, ``"args": {"op_name":
op type}``, ``"ts"``/``"dur"`` in microseconds), as onnxruntime writes its profile files, to
``<profile_file_prefix>_<YYYY-MM-DD_HH-MM-SS>.json``, and returns the path.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time

import torch


class Profiler:
    """Collects one event per node step; shared by the requests of a session (thread-safe)."""

    def __init__(self, prefix: str = "onnxruntime_profile_") -> None:
        self.prefix = prefix
        self.events: list[dict] = []
        self._start = time.perf_counter_ns()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def step(self, inst, vals: list) -> None:
        """Run ``inst.step(vals)`` and record how long it took."""
        cuda = inst.net.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(inst.net.device)
        t0 = time.perf_counter_ns()
        inst.step(vals)
        if cuda:
            torch.cuda.synchronize(inst.net.device)
        t1 = time.perf_counter_ns()
        # whole microseconds as onnxruntime writes them, at least 1: a node that ran took time
        ev = {"cat": "Node", "pid": self._pid, "tid": threading.get_ident(), "ph": "X",
              "ts": (t0 - self._start) // 1000, "dur": max(1, (t1 - t0) // 1000),
              "name": inst.name, "args": {"op_name": inst.op_type}}
        with self._lock:
            self.events.append(ev)

    def end(self) -> str:
        """Write the events recorded so far and return the file's path; recording goes on in a
        fresh list (onnxruntime stops; a later end_profiling there returns "")."""
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        path = f"{self.prefix}_{stamp}.json"
        with self._lock:
            events, self.events = self.events, []
        with open(path, "w") as f:
            json.dump(events, f)
        return path
