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
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import Counter, deque

import torch

from ..codegen import MemoRefused, SpecCode, build_spec
from ..compile.arena import plan_offsets
from ..compile.memory_plan import kv_appends
from ..compile.shape_program import trace
from ..errors import DynashapeError, ExecutionError, OptionsError, ShapeError, at_node
from ..impls import (
    CannotCapture,
    CompilationContext,
    ImplCache,
    capture_guard,
    compile_process,
    static_builder,
)
from ..impls.cache import capacity_from
from ..impls.static import cpu_kind, cudnn_benchmark_limit, timed_forms
from ..ir import Graph, Value
from ..ops.limits import check_output_sizes, shape_failure
from ..shape import expr as E
from .aligned import MAX_ALIGNED, AlignedImpl, PaddedViews, align_multiple, aligned_value, conv_bucket, conv_buckets
from .decode_graph import DecodeGraphs, ahead_rule, bucket_rule, nonnegative
from .kv_append import KVAppend

log = logging.getLogger(__name__)

MAX_SPECIALIZATIONS = 16  # guards that pin values (int() on a dim) could otherwise make one per shape
KEEP_SMALL_BYTES = 1 << 20  # an output buffer this small is kept for any smaller output (output_buffer)
# builds kept per group: a batch size or length that comes back finds its views (a decoder
# without a KV cache, or the masks of one with it, meets every length of a generation again in the
# next one); the tensors a build owns (masks, positions made from shapes; views of the arena own
# nothing) are held within a byte budget, the last build always
GROUP_CACHE = 64
GROUP_CACHE_BYTES = 16 << 20
# the counters of static impls, reported (as 0 too) whenever they are on
# (static_trace_time_s: the part of CPU builds spent in the calling thread, the trace)
STATIC_COUNTERS = ("static_hits", "static_misses", "static_builds", "static_build_time_s", "static_trace_time_s",
                   "build_wait_s",
                   "static_bytes", "static_refused", "static_refused_runs", "static_guard_fails", "static_errors_rerun",
                   "static_dropped_by_replan")
SEEN_KEYS = 4096  # region keys seen once, remembered: a key is built when it comes back


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


class CompiledModel:
    """The specializations of one graph on one device (shared by the session's requests)."""

    def __init__(self, graph: Graph, device: torch.device, inputs: list[Value] | None = None,
                 inplace_concat: bool = True, static: str | None = None, impl_cache_size: int | None = None,
                 decode_graphs: bool = False, kv_bucket=None, decode_ahead: int | None = None,
                 static_after: int = 0) -> None:
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
        self.context = CompilationContext(static) if static else None
        self.disk_cache = None  # impls/disk_cache.py (cache_dir=): set by the session
        self.align = align_multiple() if static else 0  # FC fake alignment (aligned.py)
        # convolutional regions keyed by batch buckets (aligned.py): CUDA graphs only
        self.conv_buckets = bool(static) and device.type == "cuda" and conv_buckets()
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
        is not aligned: convolutional regions by batch buckets, FC regions by DYNASHAPE_FC_ALIGN."""
        if kind == "conv":
            return conv_bucket(value) if self.conv_buckets else None
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

    def precompile(self, shapes_list: list[tuple]) -> None:
        """Trace and generate the specializations of these input shapes now, at load (as
        onnxruntime and OpenVINO compile at load): a first call at a new shape then finds its
        code ready. Not in the background: a trace holds the specializations' lock, and a first
        call waiting for it was measured slower than the trace it needed (BERT-base on an H100
        host: 0.6 s against 0.3 s)."""
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


class SpecState:
    """A request's state for one specialization: the current signature, the group builds, the
    arena offsets and typed views. ``run`` of the generated code reads ``sig``, ``cur``, and calls
    ``enter`` / ``out``."""

    def __init__(self, spec: SpecCode, runner: CompiledRunner) -> None:
        self.spec, self.runner = spec, runner
        self.stats = runner.stats
        self.sig: tuple | None = None
        n = len(spec.groups)
        self.cur: list = [()] * n
        self.keys: list = [None] * n
        self.caches: list[dict] = [{} for _ in range(n)]
        self.cache_bytes = [0] * n  # per group: the bytes its cached builds own
        self.typed: list[torch.Tensor] = []
        self.off: list[int] = []
        self.epoch = -1
        self.total = 0  # bytes of the arena this specialization is planned for
        self.caps: tuple | None = None  # per signature symbol: the value the arena is planned for
        # per graph output the generated code asks a buffer for: (name, dtype), looked up once
        self.out_meta = [(v.name, spec.trace.of(v).dtype) for v in spec.output_values]
        self.kv = [runner.kv_for(node) for node in spec.kv_nodes]
        self.sub = [runner.sub_for(node) for node in spec.sub_nodes]
        # static impls: keyed by (token, region, key symbols' values); the token changes with the plan
        self.static_on = bool(spec.regions) and runner.model.static is not None
        self.version = 0
        self.token = (id(self), 0)
        self.seen: dict = {}
        self.refused: set = set()
        self.orphans: dict = {}  # key -> results of a region's real run whose capture then failed
        # the whole decode step (decode_graph.py): run's first stop when the specialization has one
        decode = runner.model.decode_graphs
        self.step = DecodeGraphs(self) if spec.step is not None and decode else None
        if decode and spec.step_refused:
            self.stats["decode_graph_specs_refused"] += 1
            runner.model.refusals.append(f"no whole-step decode for {spec.filename}: {spec.step_refused}")

    # ---- a new signature ---------------------------------------------------------------------
    def enter(self, sig: tuple) -> None:
        spec, runner = self.spec, self.runner
        if spec.arena and (self.caps is None or self.epoch != runner.epoch
                           or any(sig[i] > self.caps[i] for i in spec.size_symbols)):
            self._plan(sig)
        keys = self.keys
        for g, key_of in enumerate(spec.group_keys):
            key = key_of(sig)
            if key == keys[g]:
                continue
            cache = self.caches[g]
            hit = cache.get(key)
            if hit is None:
                runner.stats["group_builds"] += 1
                built = spec.refresh[g](self, sig)
                self._keep(g, key, built)
            else:
                built = hit[0]
                runner.stats["group_hits"] += 1
            self.keys[g] = key
            self.cur[g] = built
        self.sig = sig

    def _keep(self, g: int, key, built: tuple) -> None:
        """``built`` cached under ``key``, the oldest builds dropped beyond the count or the bytes.
        What a build owns: its tensors that are no view (the arena's views, and views of the
        masks and positions it made, have a base; a build's own masks and positions do not)."""
        own = 0
        for t in built:
            if type(t) is torch.Tensor and t._base is None:
                own += t.untyped_storage().nbytes()
        cache = self.caches[g]
        cache[key] = (built, own)
        total = self.cache_bytes[g] + own
        while len(cache) > 1 and (len(cache) > GROUP_CACHE or total > GROUP_CACHE_BYTES):
            total -= cache.pop(next(iter(cache)))[1]
        self.cache_bytes[g] = total

    def _plan(self, sig: tuple) -> None:
        """Arena offsets for the symbols at their capacity, which the ShapePredictor grows ahead
        of a symbol that grows step by step; the request's block grows as one allocation."""
        runner, spec = self.runner, self.spec
        caps = list(sig if self.caps is None else self.caps)
        for i, (v, c) in enumerate(zip(sig, caps)):
            if self.caps is None or v > c:
                step = v - self.sig[i] if self.sig is not None else 0
                caps[i] = runner.capacity(spec.sig_symbols[i], v, step)
                for kind in spec.aligned_positions.get(i, ()):  # room for the padded rows (aligned.py)
                    want = v
                    if kind == "conv":
                        # a batch bucket's plan holds the range's top bucket at once: a batch that
                        # grows later re-plans nothing, and the graphs built for this plan keep serving
                        hi = spec.trace.env.ranges.get(spec.sig_symbols[i], (0, 0))[1]
                        want = max(v, int(min(hi, MAX_ALIGNED)))
                    caps[i] = max(caps[i], runner.model.padded(kind, want) or v)
        env = dict(zip(spec.sig_symbols, caps))
        sizes = [E.evaluate(b.nbytes, env) for b in spec.arena]
        for b, n in zip(spec.arena, sizes):
            if n < 0:
                dims = dict(zip(spec.sig_symbols, sig))
                raise ShapeError(f"value {b.value.name!r} would have a negative size for input dims {dims}")
        first, last, overlaps = spec.arena_lifetimes
        offsets, total = plan_offsets(sizes, first, last, overlaps=overlaps)
        self.total = total
        block = runner.arena_block(total)
        off = [o // spec.arena_dtypes[k].itemsize for o, k in zip(offsets, spec.arena_dtype_index)]
        self.caps = tuple(caps)
        if self.epoch == runner.epoch and off == self.off:
            return  # same block, same places: the views made stay right
        self.typed = [block.view(dt) for dt in spec.arena_dtypes]
        self.off, self.epoch = off, runner.epoch
        self._new_token()
        for c in self.caches:
            c.clear()
        self.cache_bytes = [0] * len(self.caches)
        self.keys = [None] * len(self.keys)
        runner.stats["arena_plans"] += 1

    def _new_token(self) -> None:
        """The views moved: static impls built on the old ones are gone (they hold the old block)."""
        old = self.token
        self.version += 1
        self.token = (id(self), self.version)
        if self.static_on:
            dropped = self.runner.model.impls.drop(old)
            if dropped:
                self.stats["static_dropped_by_replan"] += dropped

    def static_now(self) -> bool:
        """Whether this run's regions ask for static impls: not before the model's first
        ``static_after`` calls (a CPU decoder's), when none can be built yet and the lookups
        (~8 us a region) would be all a short generation paid."""
        if not self.static_on:
            return False
        model = self.runner.model
        return model.calls > model.static_after or self.runner.prebuild

    # ---- update_impl for a region: its static impl, or None for the dynamic one ---------------
    def static(self, r: int, key: tuple, ins: tuple):
        """Live-outs of region ``r`` from its static impl for ``key``, or None: the generated
        code then runs the region's lines (the dynamic impl), and the static impl is built when
        the key comes back (or at once while prebuilding)."""
        model = self.runner.model
        rc = self.spec.regions[r]
        al = rc.align
        padded = None if al is None else model.padded(al.kind, key[al.key_pos])
        if padded is not None and (self.caps is None or self.caps[al.sig_pos] < padded):
            padded = None  # no room planned for the padded rows (a plan made before alignment was on)
        if padded is not None:  # one impl for the bucket of values up to ``padded`` (aligned.py)
            key = (*key[:al.key_pos], padded, *key[al.key_pos + 1:], "aligned")
        k = (self.token, r, key)
        impl = model.impls.get(k)
        if impl is not None:
            return self._replay(impl, ins)
        self.stats["static_misses"] += 1
        rk = (r, key)
        if rk in self.refused:
            self.stats["static_refused_runs"] += 1
            return None
        # a batch bucket is built at its first sight: buckets are few and come back by design
        # (a random batch's exact key may never), and a short burst of traffic then finds its graphs
        eager = padded is not None and al.kind == "conv"
        if rk not in self.seen and not self.runner.prebuild and not eager:
            if len(self.seen) >= SEEN_KEYS:
                self.seen.pop(next(iter(self.seen)))
            self.seen[rk] = True
            return None
        if model.context.queued(k):  # being built on the worker: the dynamic impl serves meanwhile
            return None
        if model.static == "async" and not self.runner.prebuild and (self.runner.traced or not model.trace_ready()):
            # an inductor build's trace holds this thread ~0.1-0.3 s: one per call, so that a step
            # whose regions all come back at once is not held for all of them (the next call traces
            # the next one), and none before the imports it needs are done on their thread
            return None
        reg = rc.region
        name = f"<static:{self.spec.filename}:r{r}>"
        # CUDA builds in the background (async): no call waits for a capture or the forms' timing
        detach = model.device.type == "cuda" and model.static == "async" and not self.runner.prebuild
        t0 = time.perf_counter()
        if padded is None:
            # the part bound to this thread (a trace) runs now; the rest on the worker when async
            build = static_builder(model.device, rc.fn, rc.body, reg.live_in, reg.live_out, rc.symvars, key, ins,
                                   reg.refresh, reg.results, self.spec.namespace, name, detach=detach)
            self.stats["static_trace_time_s"] += time.perf_counter() - t0
            self.runner.traced = model.device.type == "cpu" and cpu_kind() == "inductor"
            # inline: CUDA captures in the call (sync, prebuilding; see impls/context.py)
            model.context.submit(k, *self._weak(build, detach), inline=model.device.type == "cuda" and not detach)
        else:
            # the padded views are stable for the impl: refreshed only what passes through
            refresh = [f and m is None and not c for f, m, c in zip(reg.refresh, al.members, al.carries_in)]
            views = PaddedViews(self, (*self.sig[:al.sig_pos], padded, *self.sig[al.sig_pos + 1:]))

            ns = self.spec.namespace  # (not ``self``: a background job holds this state weakly)

            def build():  # one impl for the bucket of values up to ``padded`` (aligned.py)
                return AlignedImpl(lambda sins: static_builder(model.device, rc.fn, rc.body, reg.live_in,
                                                               reg.live_out, rc.symvars, key[:-1], sins, refresh,
                                                               reg.results, ns, name, detach=detach)(),
                                   al, views, ins, padded, detached=detach)
            # inline: CUDA captures in the call, and a CPU trace, which needs the padded views
            model.context.submit(k, *self._weak(build, detach), inline=not detach)
        self.stats["build_wait_s"] += time.perf_counter() - t0  # what this call spent on the build
        impl = model.impls.get(k)  # built in this thread (sync, or a CUDA capture): serve with it
        if impl is not None:
            return self._replay(impl, ins)
        return self.orphans.pop(k, None)  # a capture that failed after the region ran for real

    def _weak(self, build, detach: bool) -> tuple:
        """``build`` and ``_built`` for the context's queue. A background build (``detach``)
        holds this state weakly: a session deleted while its builds wait is collected, and its
        builds that have not started yet are dropped."""
        if not detach:
            return build, self._built
        me = weakref.ref(self)

        def job():
            if me() is None:
                raise Abandoned("the session that asked for it is gone")
            return build()

        def done(k, result, seconds):
            st = me()
            if st is not None:
                st._built(k, result, seconds)
        return job, done

    def _replay(self, impl, ins: tuple):
        try:
            out = impl(ins)
        except Exception:  # noqa: BLE001  the dynamic lines run it again and name the failing node
            self.stats["static_errors_rerun"] += 1
            return None
        if out is None:
            self.stats["static_guard_fails"] += 1
            return None
        self.stats["static_hits"] += 1
        return out

    def _built(self, k: tuple, result, seconds: float) -> None:
        """The compilation context's answer for key ``k``: an impl, or why there is none."""
        token, r, key = k
        stats = self.stats
        if isinstance(result, Exception):
            self.refused.add((r, key))
            if getattr(result, "first", None) is not None:
                self.orphans[k] = result.first
            stats["static_refused"] += 1
            kind = "cannot be captured" if isinstance(result, CannotCapture) else "failed to build"
            msg = f"region {r} of {self.spec.filename} for {key} {kind}; the dynamic impl serves it: {result}"
            self.runner.model.refusals.append(msg)
            if self.runner.engine.verbose >= 1:
                print(f"dynashape.impls: {msg}", flush=True)
            log.info(msg)
            return
        stats["static_builds"] += 1
        stats[f"static_builds_{result.kind}"] += 1  # cuda_graph, inductor or specialized
        if getattr(result, "aligned", False):
            stats["static_builds_aligned"] += 1
        if getattr(result, "fallback", None):  # inductor wanted, and it could not compile the region
            stats["static_inductor_fallbacks"] += 1
            self.runner.model.refusals.append(f"region {r} for {key}: inductor failed, specialised source: "
                                              f"{result.fallback[:200]}")
        stats["static_build_time_s"] += seconds
        for phase, t in getattr(result, "phases", {}).items():
            stats[f"static_build_{phase}_s"] += t
        stats["static_bytes"] += result.nbytes
        if token == self.token:  # else the plan moved while it was built: its addresses are gone
            self.runner.model.impls.put(k, result)
        if self.runner.model.disk_cache is not None:  # the forms this build timed, for the next process
            try:
                self.runner.model.disk_cache.save()
            except OSError as e:  # a full or read-only disk costs the cache, not the call
                log.warning("dynashape: cannot write the disk cache: %s", e)
        if self.runner.engine.verbose >= 2:
            print(f"dynashape.impls: built {result.kind} for region {r} {key} in {seconds * 1e3:.1f} ms", flush=True)

    # ---- a break point whose sizes come from data ---------------------------------------------
    def sized(self, k: int, kernel, args: tuple):
        """Run ``kernel`` after its shape function, on the values of ``args``, said its outputs'
        sizes are sane (ops/limits.py)."""
        node, dtypes = self.spec.sized_nodes[k]
        od = node.opdef
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
        values = [a.cpu() if i in od.shape_deps and isinstance(a, torch.Tensor) else None for i, a in enumerate(args)]
        try:
            inferred = od.infer(shapes, values, **node.attrs)
            outs = [None if s is None else tuple(map(int, s)) for s in inferred[:len(dtypes)]]
        except Exception as e:  # noqa: BLE001  what a shape function raises on absurd values
            raise shape_failure(e, node.op_type) from e
        check_output_sizes(node.op_type, outs, dtypes, self.runner.engine)
        return kernel(*args)

    # ---- buffers the generated code asks for -------------------------------------------------
    def out(self, k: int, shape: tuple) -> torch.Tensor:
        name, dtype = self.out_meta[k]
        return self.runner.output_buffer(name, dtype, shape)


class Abandoned(RuntimeError):
    """A background build whose session was deleted before it started."""


class CompiledRunner:
    """One request's state over a CompiledModel (see the module docstring)."""

    def __init__(self, model: CompiledModel, engine, predictor, stats: Counter, kv_growth: str | None = "geometric",
                 make_body=None) -> None:
        self.model, self.engine, self.predictor, self.stats = model, engine, predictor, stats
        self.kv_growth = kv_growth
        self.make_body = make_body  # (graph) -> callable running a control-flow body
        self.states: dict[int, SpecState] = {}
        self.last_shapes: tuple | None = None
        self.last_state: SpecState | None = None
        self.arena: torch.Tensor | None = None
        self.epoch = 0
        self.hand_out = True
        self.buffer_set = 0
        self.owned: list[torch.Tensor] = []  # this run's output buffers (torch mode: the caller's)
        self.kept: dict[tuple, tuple[torch.Tensor, int]] = {}  # (output, buffer set) -> buffer kept
        # (output, buffer set) -> (shape, dtype, view) last handed out of the kept buffer: a run of
        # the same shape takes it again (two torch calls and a loop less per output)
        self.kept_views: dict[tuple, tuple] = {}
        self._kv: dict[str, KVAppend] = {}
        self._subs: dict[str, object] = {}
        self._caps: dict[str, int] = {}
        self.prebuild = False  # build static impls at the first sight of a key (optimal values at load)
        self.traced = False  # whether this call traced a region for an inductor build (one per call)
        self.bound: dict[str, torch.Tensor] = {}  # output name -> a caller's tensor to write it into (io_binding)

    # ---- per-request objects the specializations share ----------------------------------------
    def kv_for(self, node) -> KVAppend:
        kv = self._kv.get(node.name)
        if kv is None:
            kv = self._kv[node.name] = KVAppend(node.attrs.get("axis", 0), len(self._kv), self.kv_growth,
                                                self.engine, self.stats, self.predictor, node.name)
        return kv

    def sub_for(self, node):
        k = self._subs.get(node.name)
        if k is None:
            k = self._subs[node.name] = self.make_body(node)
        return k

    def capacity(self, symbol: str, value: int, step: int = 0) -> int:
        """The value a symbol's buffers are planned for: at least ``value``, more when the
        ShapePredictor sees the symbol grow (the next few steps fit). ``step``: how much it grew
        since the last call. The predictor hears of a symbol only when it passes its capacity,
        so it never sees the steady step of a decode loop (one a call) and took ratio mode's
        10%: a re-plan, and every group's views rebuilt, each ~5 steps at a past of 50. A small
        step is that loop's: room for the predictor's ``iters`` more steps, as its iterations
        mode gives when it sees the step twice."""
        cap = value
        if self.predictor is not None:
            ok, pred = self.predictor.predict(f"symbol:{symbol}", (value,), 8, False)
            if ok and pred[0] > value:
                cap = pred[0]
                self.stats["predictions_used"] += 1
            opts = self.predictor.options
            if 0 < step <= opts.max_dim_diff and opts.iters and value + step * opts.iters > cap:
                cap = value + step * opts.iters
                self.stats["predictions_used"] += 1
        self._caps[symbol] = cap
        return cap

    def arena_block(self, nbytes: int) -> torch.Tensor:
        """The request's arena with at least ``nbytes``; a new block means new views (epoch).
        The block serves every specialization of the request: it is reclaimed (shrunk) only when
        all of them are planned for a tenth of it, so that calls alternating between two
        specializations do not trade the block back and forth."""
        nbytes = max([nbytes] + [st.total for st in self.states.values()])
        have = 0 if self.arena is None else self.arena.numel()
        if self.arena is not None and nbytes <= have and nbytes * 10 >= have:
            return self.arena
        if self.arena is not None:
            self.engine.release(self.arena)
            self.stats["arena_grows" if nbytes > have else "arena_reclaims"] += 1
        self.arena = self.engine.allocate(max(nbytes, 64), torch.uint8)
        self.epoch += 1
        for st in self.states.values():  # their views are of the old block: the next run re-enters
            st.sig = None
        return self.arena

    def output_buffer(self, name: str, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        """The buffer an output is written into: fresh when it goes to the caller (torch mode),
        else kept per output and reused while it is large enough (numpy mode)."""
        if not self.hand_out:
            last = self.kept_views.get((name, self.buffer_set))
            if last is not None and last[0] == shape and last[1] == dtype:
                self.stats["buffer_reuses"] += 1
                return last[2]
        n = 1
        for d in shape:
            if d < 0:  # dims from the shape program of these inputs (Sub of a dim going below 0)
                raise ShapeError(f"output {name!r} would have the negative shape {list(shape)}")
            n *= d
        if self.hand_out:
            pre = self.bound.get(name)
            if pre is not None and tuple(pre.shape) == tuple(shape) and pre.dtype == dtype \
                    and pre.device == self.engine.device and pre.is_contiguous():
                self.stats["outputs_written_in_place"] += 1  # io_binding's preallocated output: no copy
                return pre
            buf = self.engine.allocate_output(shape, dtype)
            self.owned.append(buf)
            return buf
        key = (name, self.buffer_set)
        kept = self.kept.get(key)
        # a buffer 10x larger than needed goes back, unless it is small (<= 1 MiB: outputs whose
        # shapes alternate, a decoder's one token and a prompt's ten, would reallocate every call)
        if kept is not None and n <= kept[1] and (n * 10 >= kept[1] or kept[1] * dtype.itemsize <= KEEP_SMALL_BYTES) \
                and kept[0].dtype == dtype:
            self.stats["buffer_reuses"] += 1
            view = kept[0][:n].view(shape)
            self.kept_views[key] = (shape, dtype, view)
            return view
        if kept is not None:
            del self.kept[key]  # gone before anything below can fail: never released twice
            self.kept_views.pop(key, None)
            self.engine.release(kept[0])
        want = n
        if self.predictor is not None:
            ok, pred = self.predictor.predict(name, shape, dtype.itemsize * 8, False)
            if ok:
                p = 1
                for d in pred:
                    p *= d
                if p > n:
                    want = p
                    self.stats["predictions_used"] += 1
        buf = self.engine.allocate(want, dtype)
        self.kept[key] = (buf, want)
        view = buf[:n].view(shape)
        self.kept_views[key] = (shape, dtype, view)
        return view

    # ---- running -------------------------------------------------------------------------------
    def state(self, shapes: tuple) -> SpecState | None:
        if shapes == self.last_shapes:
            return self.last_state
        spec = self.model.spec_for(shapes)
        if spec is None:
            return None
        st = self.states.get(id(spec))
        if st is None:
            st = self.states[id(spec)] = SpecState(spec, self)
        self.last_shapes, self.last_state = shapes, st
        return st

    def run(self, inputs: list, hand_out: bool, buffer_set: int = 0) -> list | None:
        """Outputs for ``inputs`` (in the model's input order), or None when no specialization
        serves these shapes (the caller runs the interpreter). ``buffer_set``: which of the kept
        output buffers (numpy mode, loop bodies) this run writes."""
        shapes = tuple([x.shape if isinstance(x, torch.Tensor) else None for x in inputs])
        st = self.state(shapes)
        if st is None:
            return None
        self.hand_out = hand_out
        self.buffer_set = buffer_set
        self.owned = []
        self.traced = False
        self.model.calls += 1  # (racy across requests: a threshold, not a count anyone reads exactly)
        try:
            outs = st.spec.run(st, *inputs)
        except Exception as e:
            self._forget()
            raise _named(e, st.spec) from e
        self.stats["compiled_runs"] += 1
        if st.spec.inplace_inputs:
            self.stats["concat_inputs_in_place"] += st.spec.inplace_inputs
        return self._collect(st, list(outs), inputs)

    def _collect(self, st: SpecState, outs: list, inputs: list) -> list:
        for j, action in enumerate(st.spec.outputs):
            t = outs[j]
            if isinstance(t, list):  # a sequence may hold tensors the next run overwrites
                outs[j] = [x.clone() if isinstance(x, torch.Tensor) else x for x in t]
            elif isinstance(t, torch.Tensor) and (
                    action == "clone" or (action == "check" and self._aliases(t, inputs))):
                outs[j] = t.clone()
        if self.hand_out:
            for kv in st.kv:
                kv.hand_out()
        self.owned = []
        return outs

    def _aliases(self, t: torch.Tensor, inputs: list) -> bool:
        if t._base is not None:
            return True
        ptr = t.untyped_storage().data_ptr()
        if self.arena is not None and ptr == self.arena.untyped_storage().data_ptr():
            return True
        return any(isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == ptr for x in inputs)

    def _forget(self) -> None:
        """After a failed run: nothing half-built is kept (its output buffers die with it)."""
        self.owned = []
        self.last_shapes = self.last_state = None
        for kv in self._kv.values():
            kv.pending = None

    def close(self) -> None:
        for kv in self._kv.values():
            kv.close()


def _named(e: Exception, spec: SpecCode) -> Exception:
    """The exception of a generated line as an ExecutionError naming its node."""
    tb = e.__traceback__
    node = None
    frame_locals = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == spec.filename:
            node = spec.line_nodes.get(tb.tb_lineno, node)
            frame_locals = tb.tb_frame.f_locals
        tb = tb.tb_next
    if node is None:
        return e if isinstance(e, DynashapeError) else ExecutionError(f"generated code failed: {type(e).__name__}: {e}")
    shapes = _input_shapes(node, spec, frame_locals or {})
    return at_node(e, node.name, node.op_type, f" with input shapes {shapes}")


def _input_shapes(node, spec: SpecCode, f_locals: dict) -> list:
    out = []
    for v in node.inputs:
        if v is None:
            out.append(None)
            continue
        info = spec.trace.info.get(id(v))
        dims = None if info is None else info.dims
        try:
            out.append(tuple(int(E.evaluate(d.expr if hasattr(d, "expr") else d, _symbols(spec, f_locals)))
                             for d in dims) if dims is not None else None)
        except (KeyError, TypeError):
            out.append(None)
    return out


def _symbols(spec: SpecCode, f_locals: dict) -> dict:
    env = {}
    for name, var in spec.namespace.get("__symvars__", {}).items():
        if var in f_locals:
            env[name] = f_locals[var]
    return env
