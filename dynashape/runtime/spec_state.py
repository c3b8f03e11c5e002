"""A request's state for one specialization (``SpecState``): the signature it is at, the group
builds kept per symbol values, the arena's offsets and views, and the static impl (or none) of
each region for its key.

``enter`` is the network-wide form of the per-node flow when the signature changed: update_shape
(the shape program, evaluated inside the groups), update_impl (the group builds, found or made),
realloc_if_needed (the arena, grown ahead as the ShapePredictor says a symbol grows). ``static``
is update_impl for one region: its static impl when built, else the dynamic lines serve and the
build is queued when the key comes back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref

import torch

from ..codegen import SpecCode
from ..compile.arena import plan_offsets
from ..errors import ShapeError
from ..impls import CannotCapture, static_builder
from ..impls.context import courtesy_on, retune_policy
from ..impls.static import cpu_kind
from ..ops import split_tf32
from ..ops.limits import check_output_sizes, shape_failure
from ..shape import expr as E
from .aligned import MAX_ALIGNED, PLAN_TOKENS, AlignedImpl, PaddedViews, padded_at, rows, token_room
from .decode_graph import DecodeGraphs

log = logging.getLogger(__name__)

# builds kept per group: a batch size or length that comes back finds its views (a decoder
# without a KV cache, or the masks of one with it, meets every length of a generation again in the
# next one); the tensors a build owns (masks, positions made from shapes; views of the arena own
# nothing) are held within a byte budget, the last build always
GROUP_CACHE = 64
GROUP_CACHE_BYTES = 16 << 20
SEEN_KEYS = 4096  # region keys seen once, remembered: a key is built when it comes back
SIZED_MEMO_ELEMENTS = 64  # size-deciding inputs up to this many values are remembered (``sized``)


class SpecState:
    """A request's state for one specialization: the current signature, the group builds, the
    arena offsets and typed views. ``run`` of the generated code reads ``sig``, ``cur``, and calls
    ``enter`` / ``out``. ``runner``: the request's CompiledRunner (``runner.py``), which makes it."""

    def __init__(self, spec: SpecCode, runner) -> None:
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
        self.sized_seen: dict = {}  # sized node -> the shapes and values its sizes were last checked for
        # graphs replaced by their tuned rebuild, kept until this request's stream is past their
        # last replay (``_retire``): a graph's private memory freed earlier could be handed to the
        # next capture while a replay still ran on it
        self.swapped: list = []
        self.retiring: list = []
        self.swap_lock = threading.Lock()
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
                        want = max(v, min(self._top(i), MAX_ALIGNED))
                    caps[i] = max(caps[i], runner.model.padded(kind, want) or v)
        # room for token regions' buckets of batch * seq as rows [T, 1] (codegen/tokens.py), only
        # where they are bucketed: a region may qualify with the buckets off
        for i, j in spec.token_positions if runner.model.token_buckets else ():
            if self.caps is None:  # a token plan holds the range's top at once (as a batch bucket's: no re-plan
                # drops the graphs built) up to PLAN_TOKENS rows: batch 64, then the sequence within the rest
                caps[i] = max(caps[i], min(self._top(i), MAX_ALIGNED))
                caps[j] = max(caps[j], min(self._top(j), PLAN_TOKENS // caps[i]))
            caps[j] = token_room(caps[i], caps[j], runner.model.padded)
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

    def _top(self, i: int) -> int:
        """The declared top of signature symbol ``i`` (its range's upper end)."""
        return int(self.spec.trace.env.ranges.get(self.spec.sig_symbols[i], (0, 0))[1])

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

    def ready(self, values: dict) -> bool:
        """Whether every region has its static impl (or its refusal) for these symbol values: a
        padded call's bucket whose graphs landed (runtime/padded_calls.py)."""
        impls = self.runner.model.impls
        for r, rc in enumerate(self.spec.regions):
            syms = sorted(rc.region.syms)
            if rc.align is not None or any(x not in values for x in syms):
                return False
            key = tuple(values[x] for x in syms)
            if impls.peek((self.token, r, key)) is None and (r, key) not in self.refused:
                return False
        return True

    # ---- update_impl for a region: its static impl, or None for the dynamic one ---------------
    def static(self, r: int, key: tuple, ins: tuple):
        """Live-outs of region ``r`` from its static impl for ``key``, or None: the generated
        code then runs the region's lines (the dynamic impl), and the static impl is built when
        the key comes back (or at once while prebuilding)."""
        model = self.runner.model
        rc = self.spec.regions[r]
        al = rc.align
        padded = None if al is None else model.padded(al.kind, rows(al, key))
        if padded is not None and (self.caps is None or rows(al, self.caps, sig=True) < padded):
            padded = None  # no room planned for the padded rows (a plan made before alignment was on)
        if padded is not None:  # one impl for the bucket of values up to ``padded`` (aligned.py)
            key = (*padded_at(al, key, padded), "aligned")
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
        eager = (padded is not None and al.kind in ("conv", "tokens")) or self.runner.padded_call
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
        self._note_shape(padded, al)
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
            if detach:
                self._submit_detached(k, build)
            else:  # inline: CUDA captures in the call (sync, prebuilding; see impls/context.py)
                model.context.submit(k, *self._weak(build, detach), inline=model.device.type == "cuda")
        else:
            # the padded views are stable for the impl: refreshed only what passes through
            refresh = [f and m is None and not c for f, m, c in zip(reg.refresh, al.members, al.carries_in)]
            try:
                views = PaddedViews(self, padded_at(al, self.sig, padded, sig=True))
            except RuntimeError as e:  # a view of the group past the arena at the padded signature
                self._built(k, CannotCapture(f"no padded views: {e}"), 0.0)
                return None

            ns = self.spec.namespace  # (not ``self``: a background job holds this state weakly)


            tokens = al.kind == "tokens"

            def build(*how):  # one impl for the bucket of values up to ``padded`` (aligned.py)
                # a token region's products split in Triton on the worker (split_tf32.flag_free_builds)
                with split_tf32.flag_free_builds() if tokens else contextlib.nullcontext():
                    return AlignedImpl(lambda sins: static_builder(model.device, rc.fn, rc.body, reg.live_in,
                                                                   reg.live_out, rc.symvars, key[:-1], sins, refresh,
                                                                   reg.results, ns, name, detach=detach)(*how),
                                       al, views, ins, padded, detached=detach)
            if detach:
                self._submit_detached(k, build)
            else:  # inline: CUDA captures in the call, and a CPU trace, which needs the padded views
                model.context.submit(k, *self._weak(build, detach), inline=True)
        if not self.runner.prebuild:  # (a build at load is the load's time, not a call's)
            self.stats["build_wait_s"] += time.perf_counter() - t0  # what this call spent on the build
        impl = model.impls.get(k)  # built in this thread (sync, or a CUDA capture): serve with it
        if impl is not None:
            return self._replay(impl, ins)
        return self.orphans.pop(k, None)  # a capture that failed after the region ran for real

    def _submit_detached(self, k: tuple, build) -> None:
        """A CUDA build off the calling thread, in two: the region's first graph with nothing timed
        (each op the form kept for its key, else its own call), queued first; then, if that left
        keys untimed, a tuned rebuild at a lower priority that replaces it (``_rebuilt``) and gives
        way to any first graph queued meanwhile (impls/context.py ``Requeue``). At a
        random batch on every call the first graphs of a ResNet's buckets then land within tens of
        calls instead of hundreds (impls/static.py ``detached``)."""
        first: list = []
        ctx, impls = self.runner.model.context, self.runner.model.impls  # (not ``self``: held weakly)
        idle_only = retune_policy() == "idle"
        busy = ctx.calls_running if courtesy_on() else None

        def quick():
            impl = build(False, None, busy)
            first.append(impl)
            return impl

        def tuned():
            if not first or not getattr(first[0], "untuned", 0):
                raise Unneeded("the first graph took forms timed before")
            if impls.peek(k) is not first[0]:
                raise Unneeded("the first graph is no longer served")
            return build(True, ctx.may_tune(idle_only), busy)  # (or Requeue: it waits behind first graphs)
        ctx.submit(k, *self._weak(quick, True))
        ctx.submit((*k, "tuned"), *self._weak(tuned, True, "_rebuilt"), priority=1)

    def _rebuilt(self, k: tuple, result, seconds: float) -> None:
        """The tuned rebuild of ``k[:-1]``: it replaces the first graph, which is retired."""
        k = k[:-1]
        if isinstance(result, Unneeded):
            return
        if isinstance(result, Exception):  # the first graph keeps serving
            self.stats["static_retune_failed"] += 1
            log.info("a tuned rebuild of region %s failed; its first graph serves: %s", k[1], result)
            return
        stats = self.stats
        stats["static_builds_tuned"] += 1
        stats["static_build_time_s"] += seconds
        for phase, t in getattr(result, "phases", {}).items():
            stats[f"static_build_{phase}_s"] += t
        impls = self.runner.model.impls
        old = impls.peek(k)
        if k[0] != self.token or old is None:
            return  # re-planned or evicted meanwhile: nobody asks for this key now
        stats["static_bytes"] += result.nbytes - old.nbytes
        with self.swap_lock:
            impls.put(k, result)
            self.swapped.append(old)
        self._save_forms()

    def _retire(self) -> None:
        """Graphs replaced by a rebuild are freed once this request's stream is past their last
        replay (an event recorded now, after this call's replay, follows every replay this request
        queued before: its calls come one at a time)."""
        with self.swap_lock:
            olds, self.swapped = self.swapped, []
        if olds and self.runner.model.device.type != "cuda":
            return  # (no graphs: nothing runs behind the host)
        if olds:
            ev = torch.cuda.Event()
            ev.record()
            self.retiring.append((ev, olds))
        self.retiring = [(ev, o) for ev, o in self.retiring if not ev.query()]

    def _weak(self, build, detach: bool, report: str = "_built") -> tuple:
        """``build`` and ``_built`` for the context's queue. A background build (``detach``)
        holds this state weakly: a session deleted while its builds wait is collected, and its
        builds that have not started yet are dropped."""
        if not detach:
            return build, getattr(self, report)
        me = weakref.ref(self)

        def job():
            if me() is None:
                raise Abandoned("the session that asked for it is gone")
            return build()

        def done(k, result, seconds):
            st = me()
            if st is not None:
                getattr(st, report)(k, result, seconds)
        return job, done

    def _replay(self, impl, ins: tuple):
        try:
            out = impl(ins)
        except Exception:  # noqa: BLE001  the dynamic lines run it again and name the failing node
            self.stats["static_errors_rerun"] += 1
            return None
        finally:
            if self.swapped or self.retiring:  # after the replay: it may have been of a graph just swapped out
                self._retire()
        if out is None:
            self.stats["static_guard_fails"] += 1
            return None
        self.stats["static_hits"] += 1
        return out

    def _built(self, k: tuple, result, seconds: float) -> None:
        """The compilation context's answer for key ``k``: an impl, or why there is none."""
        token, r, key = k
        stats = self.stats
        if isinstance(result, Exception) and token != self.token:
            # the plan moved while it was built (a larger shape re-planned the arena): its addresses
            # are gone, which can be why it failed; a later call at this key builds it again
            stats["static_stale_failures"] += 1
            self.runner.model.refusals.append(f"region {r} of {self.spec.filename} for {key}: a build over a "
                                              f"replaced plan failed ({result}); built again when asked")
            return
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
        self._save_forms()
        if self.runner.engine.verbose >= 2:
            print(f"dynashape.impls: built {result.kind} for region {r} {key} in {seconds * 1e3:.1f} ms", flush=True)

    def _note_shape(self, padded: int | None, al) -> None:
        """The disk cache keeps this call's input shapes (the bucket's, for a bucketed region)
        for the next process to build at load (impls/disk_cache.py)."""
        cache, shapes = self.runner.model.disk_cache, self.runner.last_shapes
        if cache is None or self.runner.prebuild or shapes is None or any(s is None for s in shapes):
            return
        combo = [list(s) for s in shapes]
        if padded is not None:
            for d in self.spec.trace.input_dims:
                if d.symbol == al.symbol:
                    combo[d.input][d.axis] = padded
                elif d.symbol == al.symbol2:  # a token bucket's rows as [T, 1]
                    combo[d.input][d.axis] = 1
        cache.note_shape(tuple(tuple(int(x) for x in s) for s in combo))

    def _save_forms(self) -> None:
        if self.runner.model.disk_cache is not None:  # the forms this build timed, for the next process
            try:
                self.runner.model.disk_cache.save()
            except OSError as e:  # a full or read-only disk costs the cache, not the call
                log.warning("dynashape: cannot write the disk cache: %s", e)

    # ---- a break point whose sizes come from data ---------------------------------------------
    def sized(self, k: int, kernel, args: tuple):
        """Run ``kernel`` after its shape function, on the values of ``args``, said its outputs'
        sizes are sane (ops/limits.py)."""
        node, dtypes = self.spec.sized_nodes[k]
        od = node.opdef
        shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args]
        values = [a.cpu() if i in od.shape_deps and isinstance(a, torch.Tensor) else None for i, a in enumerate(args)]
        # the same shapes and size-deciding values as this node's last call (a Loop body's Range
        # and Tile, every iteration): the sizes were checked then; the shape function (~20-30 us of
        # Python) is not run again
        key = (tuple(shapes), tuple(None if v is None else tuple(v.reshape(-1).tolist()) for v in values)) \
            if all(v is None or v.numel() <= SIZED_MEMO_ELEMENTS for v in values) else None
        if key is not None and self.sized_seen.get(k) == key:
            return kernel(*args)
        try:
            inferred = od.infer(shapes, values, **node.attrs)
            outs = [None if s is None else tuple(map(int, s)) for s in inferred[:len(dtypes)]]
        except Exception as e:  # noqa: BLE001  what a shape function raises on absurd values
            raise shape_failure(e, node.op_type) from e
        check_output_sizes(node.op_type, outs, dtypes, self.runner.engine)
        if key is not None:
            self.sized_seen[k] = key
        return kernel(*args)

    # ---- buffers the generated code asks for -------------------------------------------------
    def out(self, k: int, shape: tuple) -> torch.Tensor:
        name, dtype = self.out_meta[k]
        return self.runner.output_buffer(name, dtype, shape)


class Abandoned(RuntimeError):
    """A background build whose session was deleted before it started."""


class Unneeded(RuntimeError):
    """A tuned rebuild with nothing to tune, or whose first graph serves no more."""
