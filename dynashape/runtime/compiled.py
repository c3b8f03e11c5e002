"""The compiled runtime: specializations of the generated code, and the request state they run on.

``CompiledModel`` (one per session and device) holds the specializations: a shape program, a
memory plan and generated code each (``codegen/spec.py``), found by their guards. A signature
that no specialization accepts is traced anew (counted: ``shape_program_traces``); past
``max_specializations`` the interpreter serves it instead (counted: ``interpreter_runs``).

``CompiledRunner`` (one per request) holds what a run needs: the arena (one block per request,
sized by the specializations' memory plans at the symbols' capacities), the views each group
built (kept per symbol values, a few per group), output buffers, KV-cache storages and the
kernels of control-flow nodes. ``SpecState.enter`` is the network-wide form of the per-node flow
when the signature changed: update_shape (the shape program, evaluated inside the groups),
update_impl (the group builds, found or made), realloc_if_needed (the arena, grown ahead as the
ShapePredictor says a symbol grows).

The request side (``CompiledRunner``, ``runner.py``; its ``SpecState`` per specialization,
``spec_state.py``) and when static impls are built (``static_mode.py``) have files of their own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import Counter, deque

import torch

from ..codegen import MemoRefused, SpecCode, build_spec, tokens
from ..compile.shape_program import trace
from ..impls import CompilationContext, ImplCache, capture_guard, compile_process
from ..impls.cache import capacity_from
from ..impls.context import courtesy_on, retune_policy
from ..impls.static import cpu_kind, cudnn_benchmark_limit, timed_forms
from ..ir import Graph, Value
from .aligned import aligned_value, conv_bucket, token_bucket
from .decode_graph import ahead_rule, bucket_rule
from .gc_pause import gc_paused

log = logging.getLogger(__name__)

MAX_SPECIALIZATIONS = 16  # guards that pin values (int() on a dim) could otherwise make one per shape


class CompiledModel:
    """The specializations of one graph on one device (shared by the session's requests)."""

    def __init__(self, graph: Graph, device: torch.device, inputs: list[Value] | None = None,
                 inplace_concat: bool = True, static: str | None = None, impl_cache_size: int | None = None,
                 decode_graphs: bool = False, kv_bucket=None, decode_ahead: int | None = None,
                 static_after: int = 0, fc_align: int = 0) -> None:
        self.graph, self.device = graph, device
        # whole decode steps over KV storages of a bucketed capacity (decode_graph.py)
        self.decode_graphs, self.kv_bucket = decode_graphs, kv_bucket or bucket_rule(None)
        self.decode_ahead = ahead_rule(None, device) if decode_ahead is None else decode_ahead
        if device.type == "cuda" and (static or decode_graphs):
            # this session captures CUDA graphs (in the call or on a thread): while one is
            # captured, torch.cuda.synchronize() / empty_cache() from any thread wait for it
            capture_guard.install()
            weakref.finalize(self, capture_guard.release)
        # static impls of the regions: the cache (LRU) and the context that builds them
        self.static = static
        # builds (and on CPU the imports and compile process they need) start after this many calls
        self.static_after, self.calls = static_after, 0
        self._prewarmed = False
        self.refusals: deque[str] = deque(maxlen=16)  # why static impls could not be built, latest last
        self.impls = ImplCache(capacity_from(impl_cache_size))
        if static and device.type == "cpu":  # the environment's choices for builds, checked now
            if cpu_kind() == "inductor" and not static_after:  # rather than in the call that builds
                self._prewarm()
        elif static:
            timed_forms()
            cudnn_benchmark_limit()
            retune_policy()
            courtesy_on()
        self.context = CompilationContext(static) if static else None
        # calls mark the context as they begin and end where builds run beside them on the worker
        # (CUDA's async builds wait or pause for the calls: impls/context.py); elsewhere nothing reads it
        self.marks_calls = static == "async" and device.type == "cuda"
        self.disk_cache = None  # impls/disk_cache.py (cache_dir=): set by the session
        self.align = fc_align if static else 0  # FC fake alignment (aligned.py; fc_align=, checked by the session)
        # convolutional regions keyed by batch buckets (aligned.py): CUDA graphs only
        self.conv_buckets = bool(static) and device.type == "cuda"
        # token regions keyed by buckets of batch * seq (codegen/tokens.py): CUDA graphs only
        cut = tokens.cuts(device)  # (a bad DYNASHAPE_TOKEN_BUCKETS is an error at creation)
        self.token_buckets = self.conv_buckets and cut
        self.inplace_concat = inplace_concat
        self.inputs = list(graph.inputs) if inputs is None else inputs
        self.specs: list[SpecCode] = []
        self.lock = threading.Lock()
        self._device_consts: dict[str, torch.Tensor] = {}
        self.stats: Counter = Counter()
        self.max_specs = int(os.environ.get("DYNASHAPE_MAX_SPECIALIZATIONS", MAX_SPECIALIZATIONS))

    def run_threads(self, n: int | None) -> int | None:
        """torch threads for a run (``n``: the session's ``threads``, None: as they are). While
        builds are queued or run on CPU, a run leaves the compile process one core: on a 2-core
        machine a decode loop's 2-thread kernels, one thread descheduled by the compiler, ran at
        300-600 steps/s through the builds, at 1 thread 1800-2700 (and 2000 without builds)."""
        if self.context is None or self.device.type != "cpu" or self.context.mode == "sync":
            # sync (and so deterministic=True): nothing builds beside the run, and the thread count,
            # which can move a kernel's rounding, must not follow how far the compile process got
            return n
        if not self.context.pending() and (not self._prewarmed or compile_process.warmed()):
            return n  # (the prewarm, too, starts the compile process, which imports torch and inductor)
        have = n or torch.get_num_threads()
        return have - 1 if have > 1 else n

    def _prewarm(self) -> None:
        self._prewarmed = True
        compile_process.prewarm()

    def padded(self, kind: str, value: int) -> int | None:
        """The value an aligned region of ``kind`` pads ``value`` to (aligned.py), None where it
        is not aligned: convolutional regions by batch buckets, FC regions by fc_align."""
        if kind == "conv":
            return conv_bucket(value) if self.conv_buckets else None
        if kind == "tokens":
            return token_bucket(value) if self.token_buckets else None
        return aligned_value(value, self.align) if self.align else None

    def trace_ready(self) -> bool:
        """Whether a build may trace now: after ``static_after`` calls, and on CPU with inductor
        once compile_process.prewarm is done (started here when the calls are made)."""
        if self.calls < self.static_after:
            return False
        if self.device.type != "cpu" or cpu_kind() != "inductor":
            return True
        if not self._prewarmed:
            self._prewarm()
        return compile_process.warmed()

    def const_device(self, v: Value) -> torch.Tensor:
        t = self._device_consts.get(v.name)
        if t is None:
            c = v.const
            t = self._device_consts[v.name] = c.to(self.device) if isinstance(c, torch.Tensor) else c
        return t

    @staticmethod
    def const_host(v: Value):
        return v.const

    def precompile(self, shapes_list: list[tuple], retry: list[tuple] = ()) -> None:
        """Trace and generate the specializations of these input shapes now, at load (as
        onnxruntime and OpenVINO compile at load): a first call at a new shape then finds its
        code ready; ``retry`` where the model refused every one of them. Not in the background: a
        trace holds the specializations' lock, and a first call waiting for it was measured slower
        than the trace it needed (BERT-base on an H100 host: 0.6 s against 0.3 s)."""
        failures = self.stats["precompile_failures"]
        self._precompile(shapes_list)
        if retry and self.stats["precompile_failures"] - failures == len(shapes_list):
            self._precompile(retry)

    def _precompile(self, shapes_list) -> None:
        for shapes in shapes_list:
            t0 = time.perf_counter()
            try:
                self.spec_for(shapes)
                self.stats["specializations_precompiled"] += 1
            except Exception:  # noqa: BLE001  a shape the model refuses: the call that brings it says why
                self.stats["precompile_failures"] += 1
            self.stats["precompile_time_s"] += time.perf_counter() - t0

    def spec_for(self, shapes: tuple) -> SpecCode | None:
        for spec in self.specs:
            if _accepts(spec, shapes):
                return spec
        with self.lock:
            for spec in self.specs:
                if _accepts(spec, shapes):
                    return spec
            if len(self.specs) >= self.max_specs:
                self.stats["specializations_refused"] += 1
                return None
            # (shape_program._memo_data says why only on the CPU; where whole-step decode functions
            # or static impls serve, their regions replay those lines, made for their keys: data)
            memo = self.device.type == "cpu" and not self.decode_graphs and self.static is None
            try:
                with gc_paused():
                    t, spec = self._traced(shapes, memo)
            except MemoRefused as e:
                if not memo:
                    raise
                # memo data's preconditions did not hold where the trace thought they did: this
                # specialization computes that data every call (counted), never fails for it
                log.info("memo data steps aside for %s: %s", self.graph.name, e)
                self.stats["memo_data_refused"] += 1
                t, spec = self._traced(shapes, False)
            self.stats["shape_program_traces"] += 1
            if t.inlined_ifs:  # Ifs whose condition this signature decides: their branch is inline code
                self.stats["ifs_decided_by_shapes"] += t.inlined_ifs
            if t.memo_data_refused:  # shape-only data of run-time dims: computed every call, not memo
                self.stats["memo_data_refused"] += t.memo_data_refused
            if spec.bound_kernels:  # kernels that read their node's constant parameters once
                self.stats["bound_kernels"] += spec.bound_kernels
            if self.specs:
                self.stats["guard_misses"] += 1
            self.specs.append(spec)
            _dump(spec)
            return spec

    def _traced(self, shapes: tuple, memo: bool):
        t = trace(self.graph, list(shapes), self.inputs, memo_data=memo)
        learnt = set(t.env.replace)
        spec = build_spec(t, self.device, self.const_device, self.const_host, self.inplace_concat)
        if t.env.replace.keys() - learnt:
            # the code's views asked what the trace had not (say seq == 1): traced again with
            # it known from the start, a Range(0, seq) is one known element, not data
            t = trace(self.graph, list(shapes), self.inputs, seed=t.env, memo_data=memo)
            spec = build_spec(t, self.device, self.const_device, self.const_host, self.inplace_concat)
        return t, spec


def _accepts(spec: SpecCode, shapes: tuple) -> bool:
    try:
        return spec.accepts(shapes)
    except ArithmeticError:
        # a guard that divides by what is 0 for these shapes (its own != 0 guard normally comes
        # first): they are not this specialization's; tracing them reports the node that fails
        return False


def _dump(spec: SpecCode) -> None:
    where = os.environ.get("DYNASHAPE_DUMP_CODE")
    if not where:
        return
    if where in ("1", "-", "stderr"):
        log.warning("generated code %s:\n%s", spec.filename, spec.source)
        return
    os.makedirs(where, exist_ok=True)
    name = spec.filename.strip("<>").replace(":", "_")
    with open(os.path.join(where, f"{name}.py"), "w") as f:
        f.write(spec.source)
