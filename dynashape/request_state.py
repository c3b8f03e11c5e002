"""The state of one request over a session: its memory engine, the compiled runner (arena,
views, buffers) over the session's specializations, the interpreter Network made when something
needs it, and its counters; ``run`` checks the feeds, picks the model that serves them (a
variant for overridden initializers or decided Ifs, a re-parse for an unlinked dim name) and hands
the outputs back in the feeds' kind. InferRequest (infer_request.py) adds OpenVINO's API to it."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

import numpy as np
import torch

from .compile.flush_subnormal_weights import FLUSHED
from .errors import (
    DynashapeError,
    ExecutionError,
    OptionsError,
    RequestBusyError,
    RunTerminatedError,
    SymbolDisagreementError,
    UnknownOutputError,
)
from .impls import capture_guard
from .interpreter.network import Network
from .ir.dtypes import _PLAIN_NUMPY, HELD, to_numpy
from .memory import Engine
from .memory.staging import InputStager
from .ops import host_sync, native, split_tf32
from .ops.limits import MAX_LOOP_ITERATIONS
from .ops.u8s8 import SESSION_SATURATE
from .ort_module import unwrap
from .run_settings import Threads
from .runtime.bodies import BodyKernel
from .runtime.padded_calls import PAD_COUNTERS, InputPadding
from .runtime.runner import CompiledRunner
from .runtime.static_mode import STATIC_COUNTERS

# counters of the decided variants' runs that are this request's runs (stats())
_VARIANT_SUMMED = frozenset({"compiled_runs", "interpreter_runs", "specializations"})


class RequestState:
    """Per-request state: the compiled runner (arena, views, buffers) over the session's
    specializations, and the interpreter Network, made when something needs it; ``run`` for one
    caller at a time. Made again (``__init__``) when the session parses its model again."""

    def __init__(self, session) -> None:
        self.session = session
        self.program = session.program
        self.engine = Engine(session.device, allocator=session.allocator, verbose=session.verbose,
                             max_buffer_bytes=session.max_buffer_bytes,
                             device_memory_limit=session.device_memory_limit)
        self._network: Network | None = None
        self._stats: Counter = Counter()
        self._decided_requests: dict = {}  # a decided variant's session -> this request's request of it
        self.runner = None
        if session.compiled is not None:
            self.predictor = session.memory.make_predictor(self.engine)
            self.stage = InputStager(session.device, self.engine, self.predictor, self._stats)
            growth = session.memory.kv_growth if session.memory.inplace_concat else None
            self.runner = CompiledRunner(session.compiled, self.engine, self.predictor, self._stats, growth,
                                         make_body=self._body_kernel)
        # calls at a bucket of their dynamic axes where the model is proven to ignore the padding
        self.padding = InputPadding(session.compiled, self._stats) \
            if self.runner is not None and session._pad_inputs else None
        self._input_names = [v.name for v in session.program.graph.inputs]
        self._host_session = session.device.type == "cpu"
        self._out_index = {a.name: i for i, a in enumerate(session._outputs)}
        self._busy = getattr(self, "_busy", None) or threading.Lock()  # kept when re-made after a re-parse

    @property
    def network(self) -> Network:
        """The interpreter: the reference flow, and what runs where no specialization serves."""
        if self._network is None:
            self._network = Network(self.session.program, self.session.device, self.engine,
                                    memory=self.session.memory)
            self._network.profiler = self.session._profiler
        return self._network

    def _body_kernel(self, node) -> BodyKernel:
        s = self.session

        def runner(graph):
            return CompiledRunner(s.body_model(graph), self.engine, self.predictor, self._stats, None,
                                  make_body=self._body_kernel)

        def network(graph):
            return Network(graph, s.device, self.engine, memory=s.memory)
        return BodyKernel(node, runner, network, s.device)

    def _run(self, tensors: dict, hand_out: bool) -> list:
        if self.runner is not None:
            if self._host_session:  # the feeds are where the session runs: nothing to stage
                inputs = [tensors[n] for n in self._input_names]
            else:
                inputs = [self.stage(n, tensors[n]) for n in self._input_names]
            if self.padding is not None and not self.runner.bound:
                outs = self.padding.run(self.runner, inputs, hand_out)
            else:
                outs = self.runner.run(inputs, hand_out)
            if outs is not None:
                return outs
            self._stats["interpreter_runs"] += 1
        return self.network.run(tensors, hand_out=hand_out)

    def run(self, output_names, input_feed=None, run_options=None, *, feeds=None) -> list:
        if not self._busy.acquire(blocking=False):
            raise RequestBusyError("this request is running for another caller; use one request per thread "
                                   "(session.create_infer_request()) or an AsyncInferQueue")
        try:
            return self._run_checked(output_names, feed_arg(input_feed, feeds), run_options)
        finally:
            self._busy.release()

    def _run_checked(self, output_names, feeds, run_options) -> list:
        if run_options is not None and getattr(run_options, "terminate", False):
            raise RunTerminatedError("run refused: RunOptions.terminate is set (clear it to run)")
        s = self.session
        if s._overridable and isinstance(feeds, dict) and not s._overridable.isdisjoint(feeds):
            return s._with_inputs(frozenset(s._overridable.intersection(feeds))).run(output_names, feeds)
        if s._deciders and isinstance(feeds, dict):
            variant = s._decided_variant(feeds, self._stats)
            if variant is not None:
                self._stats["decided_if_runs"] += 1
                req = self._decided_requests.get(variant)  # this request's own: requests run in parallel
                if req is None:
                    req = self._decided_requests[variant] = variant.create_infer_request()
                feeds = {k: v for k, v in feeds.items() if k not in s._decider_names}
                return req._run_checked(output_names, feeds, run_options)  # (this request's lock held)
        if self.program is not s.program:  # the session was parsed again (a dim name unlinked, reshape)
            self.__init__(s)
        check = s._check_feeds
        if s._check_index_feeds is not None:
            s._check_index_feeds(feeds)
        try:
            tensors, numpy_mode = check(feeds)
        except SymbolDisagreementError as e:
            with s._reload_lock:
                if e.symbol in s._unlinked and check is s._check_feeds:
                    raise  # unlinked already, and still linked: not a dim_param of the inputs (no loop)
                s._unlink(e)
            self.__init__(s)
            return self._run_checked(output_names, feeds, run_options)
        idx = self._select(output_names)
        limit = MAX_LOOP_ITERATIONS.set(s.max_loop_iterations)
        saturate = SESSION_SATURATE.set(s.u8s8_saturate)  # the session's integer products (ops/u8s8.py)
        try:
            threads = s.threads if s.compiled is None else s.compiled.run_threads(s.threads)
            # a feed that requires grad must not trip the kernels' out= (no_grad: ~2 us a run otherwise)
            grad = not numpy_mode and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors.values())
            if not grad and not threads and self.session.precision is None:
                outs = self._run(tensors, hand_out=not numpy_mode)  # the usual run: no context to enter
            else:
                with torch.no_grad() if grad else contextlib.nullcontext(), Threads(threads):
                    if self.session.precision is not None:
                        with self.session.precision:
                            outs = self._run(tensors, hand_out=not numpy_mode)
                    else:
                        outs = self._run(tensors, hand_out=not numpy_mode)
        except DynashapeError:
            raise
        except Exception as e:  # what no node claims (a bug of ours): still a typed error
            raise ExecutionError(f"run failed: {type(e).__name__}: {e}") from e
        finally:
            MAX_LOOP_ITERATIONS.reset(limit)
            SESSION_SATURATE.reset(saturate)
        if not numpy_mode:
            return [outs[i] for i in idx]
        # the graph's output types name what a held tensor stands for (an int8 tensor of an INT4)
        g_outs = self.session.program.graph.outputs
        return [_to_numpy(outs[i], g_outs[i].elem_type) for i in idx]

    def bound_step(self, feeds: dict, presents: dict):
        """The decode step of the last run bound for a loop that calls it again with the next
        token (runtime/bound_step.py: the KV kept in the step's storages, no run's host work), or
        None when that run's step was not a whole-step graph's. ``feeds``: the run's feeds (device
        tensors); ``presents``: past input name -> the present the run returned for it."""
        s, runner = self.session, self.runner
        if runner is None or s._overridable or s._deciders or self.program is not s.program:
            return None
        st = runner.last_state
        return st.step.bind(self, feeds, presents) if st is not None and st.step is not None else None

    def _select(self, output_names) -> list[int]:
        if isinstance(output_names, str):  # one name, not its letters
            output_names = [output_names]
        if not output_names:
            return list(range(len(self._out_index)))
        idx = []
        for n in output_names:
            if n not in self._out_index:
                raise UnknownOutputError(n, list(self._out_index))
            idx.append(self._out_index[n])
        return idx

    def _counters(self) -> Counter:
        c = Counter(self._stats)
        if self._network is not None:
            c.update(self._network.stats)
        return c

    def stats(self) -> dict:
        # native kernels (ops/native.py) and their torch fallbacks: counts of this process
        out = {**self._counters(), **self.engine.stats(), **native.counters(), **host_sync.counters(),
               "split_tf32_products": split_tf32.PRODUCTS[0],
               "split_tf32_skipped": split_tf32.SKIPPED[0],
               "subnormal_weights_flushed": FLUSHED[0]}
        if self.session.compiled is not None:
            out.update(self.session.compiled.stats)
            for body in list(self.session._bodies.values()):  # what control-flow bodies' traces counted
                for k, n in body.stats.items():
                    out[k] = out.get(k, 0) + n
            out.update(self.session.compiled.impls.summary())
            out["static_impls"] = self.session.compiled.static or "off"
            if self.session.compiled.disk_cache is not None:
                out.update(self.session.compiled.disk_cache.stats())
            if self.session.compiled.static:
                for k in STATIC_COUNTERS:
                    out.setdefault(k, 0)
                # the application's device-wide synchronisations (torch.cuda.synchronize) that waited
                # for a background capture to end (impls/capture_guard.py), process-wide
                waited = capture_guard.waits()
                out["syncs_waited_on_capture"] = waited["waits"]
                out["sync_wait_on_capture_s"] = waited["wait_s"]
            specs = self.session.compiled.specs
            out["regions"] = sum(len(s.regions) for s in specs)
            out["region_kernels"] = sum(rc.region.kernels for s in specs for rc in s.regions)
            out["kernel_lines"] = sum(s.kernel_items for s in specs)
            out["specializations"] = len(self.session.compiled.specs)
        if self.session.gqa_as_concat is not None:
            out["gqa_as_concat"] = self.session.gqa_as_concat
        if self.padding is not None:
            for k in PAD_COUNTERS:
                out.setdefault(k, 0)
        if self.session._deciders:
            out["decided_if_variants"] = len(self.session._decided)
            for req in list(self._decided_requests.values()):  # the runs the variants made are this request's
                for k, n in req.stats().items():
                    if k in _VARIANT_SUMMED:
                        out[k] = out.get(k, 0) + n
        return out

    def memory_stats(self) -> dict:
        """allocations, frees, allocated_bytes_total, current_bytes, peak_bytes, per-type
        current/peak, alloc_time_s, reuses (buffers reused by a node or by the pool),
        predictions_made, predictions_used, concat bytes copied, arena bytes, ..."""
        net = self._counters()
        pool = self._network.pool.stats() if self._network is not None and self._network.pool is not None else {}
        pred = {}
        for p in (getattr(self, "predictor", None), self._network.predictor if self._network is not None else None):
            if p is not None:
                for k, v in p.stats().items():
                    pred[k] = pred.get(k, 0) + v
        arena = self.runner.arena.numel() if self.runner is not None and self.runner.arena is not None else 0
        return {**self.engine.stats(),
                "reuses": net["buffer_reuses"] + pool.get("reuses", 0),
                "buffer_reuses": net["buffer_reuses"], "pool_reuses": pool.get("reuses", 0),
                "pool_records": pool.get("records", 0), "pool_record_bytes": pool.get("record_bytes", 0),
                "predictions_made": pred.get("predictions_made", 0),
                "predictions_used": net["predictions_used"],
                "buffer_grows": net["buffer_grows"], "buffer_reclaims": net["buffer_reclaims"],
                "concat_bytes_copied": net["concat_bytes_copied"], "concat_past_in_place": net["concat_past_in_place"],
                "concat_inputs_in_place": net["concat_inputs_in_place"], "concat_storages": net["concat_storages"],
                "pool_grown_records": pool.get("grown_records", 0), "input_bytes_staged": net["input_bytes_staged"],
                "arena_bytes": arena, "arena_plans": net["arena_plans"], "arena_grows": net["arena_grows"],
                "split_tf32_weight_bytes": split_tf32.held_bytes()}


def feed_arg(input_feed, feeds):
    """``input_feed`` (onnxruntime's name) or ``feeds=`` (dynashape's older keyword), not both;
    OrtValues as their tensors."""
    if feeds is not None:
        if input_feed is not None:
            raise OptionsError("run: give input_feed or feeds=, not both")
        return unwrap(feeds)
    return unwrap(input_feed)  # None: the feed check says it is not a dict (InputTypeError)



def _to_numpy(x, elem_type: int = 0):
    """An output as numpy; ``elem_type`` (a sequence's element type for a list) picks the
    ml_dtypes type of a tensor that holds an INT4, FLOAT4E2M1 ... (see ir.dtypes)."""
    if type(x) is torch.Tensor and x.is_cpu and x.dtype in _PLAIN_NUMPY and elem_type not in HELD \
            and not x.requires_grad:
        return x.numpy().copy()  # the common case of the branch below, without its general calls
    if isinstance(x, torch.Tensor):
        # the network keeps its output buffers in numpy mode: a CPU tensor's numpy view would
        # change with the next run, so it is copied (a device tensor is copied by .cpu() anyway)
        return np.array(to_numpy(x, elem_type), copy=True) if x.device.type == "cpu" else to_numpy(x, elem_type)
    if isinstance(x, list):
        return [_to_numpy(t, elem_type) for t in x]
    if isinstance(x, np.ndarray) or x is None:
        return x
    return x
