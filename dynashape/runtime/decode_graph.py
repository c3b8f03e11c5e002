"""Whole-step decode: one static impl per (other symbols, capacity bucket), replayed every step.

The specialization's ``step`` function (``codegen/step_graph.py``) writes this step's keys and
values into KV storages of capacity ``C`` at the device position ``P`` and runs attention over
the whole storage with a mask built from ``P``. Nothing in it depends on the past length as a
host number, so one CUDA graph serves every step until ``past + new`` passes ``C``; then the
next bucket gets new storages (the past copied over once) and a graph of its own, built in the
call that passes the end (~20 ms for a 12-layer model on an H100) unless it was built ahead:
``decode_ahead=N`` (on CUDA by default N=64) builds it N positions before the end on a
background thread while the current graph keeps serving: its kernels have all run before, so
the thread only records them; the step that passes the end copies the past over and replays it
(waiting for the thread if it is late, counted). With it on, a graph built in the call is also
captured on that thread (the call waits): all captures then share one cuBLAS handle and
workspace (32 MB on an H100) instead of one per thread. CUDA forbids a device-wide synchronize
anywhere in the process while a stream captures: ``torch.cuda.synchronize()`` and
``empty_cache()`` wait for the capture to end meanwhile (impls/capture_guard.py).

The caller's ``present_*`` outputs are views of the storages with the current length (no copy).
A step is served here only when each fed past is exactly the last step's present (a decode loop
feeding its presents back), or the storages are ours alone (the first step after a prefill, a
new conversation once the caller dropped the old presents, numpy mode): then the past is copied
in. Anything else, such as a beam search's reordered past while the caller still holds views of
the storage, falls out to the dynamic path, counted (``decode_graph_fallbacks``); the storage is
left to the caller and the next step starts a new one (after ``MAX_RETIRES`` in a row, the path
pauses for ``PAUSE_RUNS`` runs). On CPU (opt-in) the step function runs as it is: the same
logic, no graph.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..errors import OptionsError
from ..impls import CannotCapture
from ..impls.static import CudaGraphImpl
from .bound_step import BoundStep

MAX_RETIRES = 4  # storages given up in a row per key before the whole-step path pauses (beam search)
PAUSE_RUNS = 64  # how many runs it then leaves to the dynamic path before it tries again
AUTO_AHEAD = 64  # decode_ahead="auto" on CUDA: on an H100 the thread had every graph ready in time


def decode_mode(option, static: str | None, device: torch.device) -> bool:
    """``decode_graphs``: 'auto' (on with static impls on CUDA), 'on' (also on CPU: the logic
    without a graph) or 'off'."""
    value = option if option is not None else "auto"
    text = str(value).lower()
    if text == "auto":
        return static is not None and device.type == "cuda"
    if text in ("1", "true", "on"):
        return True
    if text in ("0", "false", "off", "none"):
        return False
    raise OptionsError(f"decode_graphs={value!r}: expected 'auto', 'on' or 'off'")


def bucket_rule(option):
    """``kv_bucket``: the capacity for a length ``n``: a multiple of an int (default 256; a
    multiple of 16, so that the attention kernels read aligned rows of the mask), 'pow2' (the
    next power of two, at least 16) or 'openvino' (n + 128 + n % 64, OpenVINO's growth of its KV
    buffers, rounded up to 16: a new bucket every ~128 steps)."""
    value = option if option is not None else os.environ.get("DYNASHAPE_KV_BUCKET", "256")
    text = str(value).lower()
    if text == "pow2":
        return lambda n: max(16, 1 << max(0, n - 1).bit_length())
    if text == "openvino":  # rounded up to 16: the attention kernels read aligned rows of the mask
        return lambda n: -(-(n + 128 + n % 64) // 16) * 16
    try:
        step = int(text)
    except ValueError:
        step = 0
    if step <= 0 or step % 16:
        raise OptionsError(f"kv_bucket={value!r}: expected a positive int, 'pow2' or 'openvino'")
    return lambda n: max(step, math.ceil(n / step) * step)


def ahead_rule(option, device: torch.device | None = None) -> int:
    """``decode_ahead``: how many positions before the end of a bucket the next one's graph is
    built on a background thread (0: in the call that passes the end); 'auto': 64 on CUDA, where
    it hides the ~20 ms capture at each bucket change (benchmarks/decode_ahead.py), 0 elsewhere
    (nothing is captured there)."""
    value = option if option is not None else "auto"
    text = str(value).lower()
    if text == "auto":
        return AUTO_AHEAD if device is not None and device.type == "cuda" else 0
    if text in ("off", "none", "false"):
        return 0
    return nonnegative(text, f"decode_ahead={value!r}: expected 'auto', a number of positions >= 0 or 'off'")


def nonnegative(text: str, message: str) -> int:
    """``text`` as an int >= 0, or an OptionsError saying ``message``."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise OptionsError(message)
    return n


class _Bucket:
    """The storages of one key (the other symbols' values) and the impl over them."""

    def __init__(self, cap: int, storages: list[torch.Tensor], pads: list[torch.Tensor]) -> None:
        self.cap, self.storages, self.pads = cap, storages, pads
        self.impl = None
        self.filled = -1  # the length written along the axis (-1: nothing valid yet)
        self.handed = False  # views of the storages went to the caller
        self.template: list | None = None  # the impl's inputs: P, storages, live-ins
        self.ptrs = [s.data_ptr() for s in storages]
        self.refs = [_use_count(s) for s in storages]  # references to each storage while only we hold it
        self.strides = [s.stride() for s in storages]
        self.shapes: list = []  # of the presents last handed out
        self.future: Future | None = None  # its impl being built on the background thread


def _prefix_equal(big, small) -> bool:
    """``small`` equals the first positions of ``big`` (the same rank, no dim of ``small`` larger)."""
    if not isinstance(big, torch.Tensor) or not isinstance(small, torch.Tensor) or big.dim() != small.dim():
        return False
    for axis, (x, y) in enumerate(zip(big.shape, small.shape)):
        if y > x:
            return False
        if y < x:
            big = big.narrow(axis, 0, y)
    return big.dtype == small.dtype and torch.equal(big, small.to(big.device))


def _use_count(t: torch.Tensor) -> int:
    """How many tensors share ``t``'s memory (torch's count of references to its storage); a
    large number where torch does not say, so that the storage counts as held."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return count(t.untyped_storage()._cdata) if count is not None else 1 << 30


def _held(b: _Bucket) -> bool:
    """Whether the caller still holds a view of one of the bucket's storages."""
    return any(_use_count(s) > n for s, n in zip(b.storages, b.refs))


class _EagerStep:
    """The step function run as it is (CPU): the whole-step logic without a graph."""

    kind = "eager_step"
    nbytes = 0

    def __init__(self, fn, symvals: tuple, ins: tuple) -> None:
        self.fn, self.symvals = fn, symvals
        self.first: tuple | None = tuple(fn(*symvals, *ins))

    def __call__(self, ins: tuple):
        if self.first is not None:
            first, self.first = self.first, None
            return first
        return tuple(self.fn(*self.symvals, *ins))


class DecodeGraphs:
    """``st.step`` of a SpecState whose specialization has a whole-step function."""

    def __init__(self, state) -> None:
        self.state = state
        spec = state.spec
        self.step = spec.step
        plan = self.step.plan
        self.plan = plan
        model = state.runner.model
        self.device, self.rule = model.device, model.kv_bucket
        self.stats = state.runner.stats
        syms = spec.sig_symbols
        self.kpos = [syms.index(s) for s in plan.keysyms]
        self.new_len = eval(f"lambda {', '.join(plan.keyvars) or '_'}: {plan.new_len}")  # noqa: S307  our source
        params = spec.input_locals
        self.past_pos = [params.index(k.past) for k in plan.kv]
        self.axes = [k.axis for k in plan.kv]
        self.input_slots = [(1 + len(plan.kv) + j, params.index(n)) for j, n in enumerate(plan.live_in)
                            if n in plan.inputs]
        # inputs read padded to the capacity (an attention_mask over the keys seen): (slot, input, axis)
        pads = dict(plan.padded)
        self.pad_slots = [(1 + len(plan.kv) + j, params.index(n), pads[n]) for j, n in enumerate(plan.live_in)
                          if n in pads]
        self.buckets: dict[tuple, _Bucket] = {}
        self.retired: dict[tuple, int] = {}
        self.off: dict[tuple, int | None] = {}  # key -> runs left to the dynamic path (None: for good)
        self.P = torch.zeros(1, dtype=torch.int64, device=self.device)
        # the thread that captures (the caller, or with decode_ahead the session's thread) has run
        # a step for real: its cuBLAS handle and workspace exist, later captures need no warm-up run
        self.warmed = False
        self.ahead = model.decode_ahead
        self.next: dict[tuple, _Bucket] = {}  # key -> the next bucket, its impl built ahead
        self.pool: ThreadPoolExecutor | None = None  # one thread: captures in order, one cuBLAS handle
        self.last_key: tuple | None = None  # the key whose bucket served the last run (None: no bucket did)

    def bind(self, request, feeds: dict, presents: dict) -> BoundStep | None:
        """The last run's step bound for a decode loop (bound_step.py), or None when no bucket's
        impl served it or ``presents`` (past input name -> the present the run returned for it)
        are not the bucket's storages at their length."""
        key = self.last_key
        b = self.buckets.get(key) if key is not None else None
        if b is None or b.impl is None:
            return None
        names = request._input_names
        for k, s, a in zip(self.past_pos, b.storages, self.axes):
            p = presents.get(names[k])
            if not isinstance(p, torch.Tensor) or p.data_ptr() != s.data_ptr() or p.shape[a] != b.filled:
                return None
        return BoundStep(self, key, b, request, feeds)

    # ---- a step ------------------------------------------------------------------------------
    def __call__(self, sig: tuple, inputs: tuple):
        self.last_key = None
        if self.state.runner.bound:
            # io_binding's preallocated outputs: the step serves, and the binding copies its
            # outputs in (as onnxruntime writes a bound present: the whole of it, every step)
            self.stats["decode_graph_bound_runs"] += 1
        key = tuple(sig[i] for i in self.kpos)
        if key in self.off:
            self.stats["decode_graph_off_runs"] += 1
            for dead in (self.buckets.pop(key, None), self.next.pop(key, None)):
                if dead is not None:
                    self._release(dead)
            left = self.off[key]
            if left is not None:  # a pause, not a refusal: it ends
                if left <= 1:
                    del self.off[key]
                    self.retired.pop(key, None)
                else:
                    self.off[key] = left - 1
            return None
        pasts = [inputs[i] for i in self.past_pos]
        g = int(pasts[0].shape[self.axes[0]])  # the past's length (P)
        n = self.new_len(*key) if self.kpos else self.new_len(0)
        total = g + n
        b = self.buckets.get(key)
        ours = b is not None and b.filled == g and self._ours(pasts, b)
        if b is not None and not ours and b.handed:
            if _held(b):
                # the caller fed another past (a reorder, another sequence) and still holds views
                # of the storages: they are the caller's now; the dynamic path serves this step
                self._retire(key, b, "a past that is not the last step's present, with views of the storage held")
                return None
            b.handed = False  # the caller let go of every view: the storages are ours again
        if b is not None and total > b.cap and key in self.next:
            nb = self._switch(key, b, total, pasts)
            if nb is not b:  # the past is in its storages already
                b, ours = nb, True
        if b is None or total > b.cap:
            b = self._new_bucket(key, b, total, pasts, inputs)
        elif not ours:
            self._adopt(b, pasts, g)
        if not self._fill_pads(b, inputs):
            return None
        if b.impl is None:
            outs = self._build(key, b, sig, inputs, g)
        else:
            outs = self._replay(b, inputs, g)
            if self.retired:
                self.retired.clear()  # back in a decode loop: the storages given up were not in a row
        if outs is None:
            return None
        b.filled = total
        if self.ahead and total + self.ahead >= b.cap and key not in self.next:
            self._build_ahead(key, b, sig, inputs, n)
        if self.state.runner.hand_out:
            b.handed = True
        presents = [s.narrow(a, 0, total) for s, a in zip(b.storages, self.axes)]
        b.shapes = [p.shape for p in presents]  # what the next step's pasts are when they are these
        self.last_key = key
        return tuple(presents[j] if kind == "kv" else outs[j] for kind, j in self.plan.results)

    @staticmethod
    def _ours(pasts: list, b: _Bucket) -> bool:
        """Each past is its storage's first ``filled`` positions (the presents the last step
        handed out): same start, strides and shape."""
        for p, ptr, stride, shape in zip(pasts, b.ptrs, b.strides, b.shapes):
            if not isinstance(p, torch.Tensor) or p.data_ptr() != ptr or p.shape != shape or p.stride() != stride:
                return False
        return True

    def _replay(self, b: _Bucket, inputs: tuple, g: int):
        self.P.fill_(g)  # a fill kernel with g as its argument: no copy from the host to wait for
        ins = b.template
        for pos, k in self.input_slots:
            ins[pos] = inputs[k]
        try:
            outs = b.impl(tuple(ins))
        finally:
            for pos, _ in self.input_slots:
                ins[pos] = None
        if outs is None:  # an input of another shape or dtype than the graph's
            self.stats["decode_graph_guard_fails"] += 1
            return None
        self.stats["decode_graph_replays"] += 1
        return outs

    def _fill_pads(self, b: _Bucket, inputs: tuple) -> bool:
        """Copy each padded input into its buffer (what lies beyond its length is masked by the
        attention whatever it holds); False when one does not fit the bucket's buffer."""
        for (_, k, axis), buf in zip(self.pad_slots, b.pads):
            x = inputs[k]
            shape = list(x.shape)
            shape[axis] = buf.shape[axis]
            if not isinstance(x, torch.Tensor) or x.shape[axis] > buf.shape[axis] or list(buf.shape) != shape:
                self.stats["decode_graph_guard_fails"] += 1
                return False
            buf.narrow(axis, 0, x.shape[axis]).copy_(x)
        return True

    # ---- storages ------------------------------------------------------------------------------
    def _new_bucket(self, key: tuple, old: _Bucket | None, total: int, pasts: list, inputs: tuple) -> _Bucket:
        b = self._allocate(self.rule(total), pasts, inputs)
        if old is not None:
            self._release(old)
            self.stats["decode_graph_bucket_changes"] += 1
        if key in self.next:  # built ahead for a capacity this step passed already
            self._release(self.next.pop(key))
        self.buckets[key] = b
        self._adopt(b, pasts, pasts[0].shape[self.axes[0]])
        return b

    def _allocate(self, cap: int, pasts: list, inputs: tuple) -> _Bucket:
        """Storages of capacity ``cap`` shaped like ``pasts`` and the padded inputs' buffers."""
        engine = self.state.runner.engine

        def zeros(like, axis):
            shape = list(like.shape)
            shape[axis] = cap
            # zeros: positions beyond the length stay finite, so their weight of 0 is exact
            return engine.allocate(math.prod(shape), like.dtype).view(shape).zero_()
        storages = [zeros(p, a) for p, a in zip(pasts, self.axes)]
        pads = [zeros(inputs[k], axis) for _, k, axis in self.pad_slots]
        self.stats["decode_graph_storages"] += 1
        return _Bucket(cap, storages, pads)

    def _adopt(self, b: _Bucket, pasts: list, g: int) -> None:
        """Copy the fed pasts into storages that only we hold."""
        for p, s, a in zip(pasts, b.storages, self.axes):
            if g and not (p.data_ptr() == s.data_ptr() and p.stride() == s.stride()):
                s.narrow(a, 0, g).copy_(p)
                self.stats["decode_graph_past_copies"] += 1
                self.stats["concat_bytes_copied"] += p.numel() * p.element_size()
        b.filled = g

    def _retire(self, key: tuple, b: _Bucket, why: str) -> None:
        self.stats["decode_graph_fallbacks"] += 1
        self._release(b)
        del self.buckets[key]
        if key in self.next:
            self._release(self.next.pop(key))
        self.retired[key] = self.retired.get(key, 0) + 1
        if self.retired[key] > MAX_RETIRES:
            self.off[key] = PAUSE_RUNS
            self._refuse(key, f"{why}, {self.retired[key]} times: the dynamic path serves the next "
                              f"{PAUSE_RUNS} runs of these shapes")

    def _release(self, b: _Bucket) -> None:
        if b.future is not None:  # the thread still records a graph over these storages
            b.future.exception()
            b.future = None
        engine = self.state.runner.engine
        for s in b.storages:
            engine.release(s, handed_out=b.handed)
        for s in b.pads:
            engine.release(s)
        b.storages, b.pads, b.impl, b.template = [], [], None, None

    def _refuse(self, key: tuple, why: str) -> None:
        msg = f"whole-step decode of {self.state.spec.filename} for {key}: {why}"
        self.state.runner.model.refusals.append(msg)
        self.stats["decode_graph_refused"] += 1

    # ---- building ------------------------------------------------------------------------------
    def _capacity_values(self, key: tuple, cap: int) -> dict | None:
        """The values the step reads made at the capacity (``prep``), or None (refused) when one
        is not what the model makes at the real length in its first positions, nor at a larger
        capacity in its first ``cap``, or holds a negative index (one counted from the end)."""
        st, plan = self.state, self.plan
        live = [st.cur[w[0]][w[1]] for w in (self.step.members[n] for n in plan.prep_live_in)]
        vals = self.step.prep(*key, cap, *live)
        more = self.step.prep(*key, cap + 16, *live)
        for name, v, v2 in zip(plan.cap, vals, more):
            w = self.step.members[name]
            real = st.cur[w[0]][w[1]]
            if not (_prefix_equal(v, real) and _prefix_equal(v2, v)):
                why = f"{name!r} made at the capacity differs from the model's in its first positions"
            elif not v.is_floating_point() and v.dtype != torch.bool and bool((v < 0).any()):
                why = f"{name!r} holds negative indices (counted from the end of the keys)"
            else:
                continue
            self.off[key] = None
            self._refuse(key, why)
            return None
        return dict(zip(plan.cap, vals))

    def _build(self, key: tuple, b: _Bucket, sig: tuple, inputs: tuple, g: int):
        """The impl for this bucket, built in this call; its first (real) run serves the call."""
        self._enter(sig)
        ins = self._impl_inputs(key, b, inputs)
        if ins is None:
            return None
        self.P.fill_(g)
        t0 = time.perf_counter()
        try:
            # the first build runs the step for real before capturing it (handles, workspaces,
            # kernels compiled); a later bucket's kernels are the same at another capacity
            warm = not self.warmed
            if self.ahead:  # every capture on the one thread: one cuBLAS handle and workspace
                impl = self._on_thread(lambda: self._make_impl(key, b, ins, warm=warm)).result()
            else:
                impl = self._make_impl(key, b, ins, warm=warm)
        except CannotCapture as e:
            self.off[key] = None
            self._refuse(key, f"cannot be captured: {e}")
            # the step ran for real before the capture failed: its results; a capture without that
            # run (warm=False) has none, and the dynamic path serves the step
            return e.first or None
        except Exception as e:  # noqa: BLE001  the dynamic path runs the step and names a failing node
            self.off[key] = None
            self._refuse(key, f"failed: {type(e).__name__}: {e}")
            return None
        b.impl = impl
        for pos, _ in self.input_slots:
            ins[pos] = None
        b.template = ins
        first, impl.first = impl.first, None
        if first is None:  # captured without a run: this call is its first replay
            first = self._replay(b, inputs, g)
        self.warmed = True
        self._count_build(time.perf_counter() - t0)
        return first

    def _enter(self, sig: tuple) -> None:
        """The state at ``sig``: the values of shapes the step reads (its buffers are its own)."""
        st = self.state
        if self.step.members and (st.sig != sig or st.epoch != st.runner.epoch):
            st.enter(sig)

    def _count_build(self, took: float) -> None:
        self.stats["decode_graph_builds"] += 1
        self.stats["decode_graph_build_time_s"] += took
        self.stats["decode_graph_build_max_s"] = max(self.stats["decode_graph_build_max_s"], took)

    def _impl_inputs(self, key: tuple, b: _Bucket, inputs: tuple) -> list | None:
        """The impl's inputs: P, the storages, the live-ins (values made at the capacity, the
        padded inputs' buffers, this call's inputs); None when the key is refused."""
        st = self.state
        caps = self._capacity_values(key, b.cap) if self.plan.cap else {}
        if caps is None:
            return None
        live = []
        for name in self.plan.live_in:
            where = self.step.members.get(name)
            live.append(caps[name] if name in caps else st.cur[where[0]][where[1]] if where is not None else None)
        ins = [self.P, *b.storages, *live]
        for pos, k in self.input_slots:
            ins[pos] = inputs[k]
        for (pos, _, _), buf in zip(self.pad_slots, b.pads):
            ins[pos] = buf
        return ins

    def _make_impl(self, key: tuple, b: _Bucket, ins: list, warm: bool):
        symvals = (*key, b.cap)
        if self.device.type != "cuda":
            return _EagerStep(self.step.fn, symvals, tuple(ins))
        refresh = [False] * (1 + len(b.storages)) + [n in self.plan.inputs for n in self.plan.live_in]
        # the step's products keep cuBLAS: its matrix-vector kernels read the weights at the
        # bandwidth limit already, and every bucket's graph then computes the same numbers
        return CudaGraphImpl(self.step.fn, symvals, tuple(ins), refresh,
                             [True] * sum(1 for k, _ in self.plan.results if k == "out"), self.device, warm=warm,
                             tune=False)

    def _on_thread(self, build) -> Future:
        """``build()`` on the session's capture thread, under this thread's device and current
        stream (what the build reads was made on it, its results are used on it)."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynashape-decode-capture")
        if self.device.type != "cuda":
            return self.pool.submit(build)
        device, stream = self.device, torch.cuda.current_stream(self.device)

        def run():
            with torch.cuda.device(device), torch.cuda.stream(stream):
                return build()
        return self.pool.submit(run)

    # ---- the next bucket, built ahead ------------------------------------------------------------
    def _build_ahead(self, key: tuple, b: _Bucket, sig: tuple, inputs: tuple, n: int) -> None:
        """Allocate the next bucket of ``key`` and build its impl on the background thread. Its
        inputs are made here (the state is this thread's); the thread only captures. The thread's
        first capture runs the step once for real (its own cuBLAS handle and workspace are made
        outside the capture): into the new storages, beyond anything adopted later."""
        self._enter(sig)
        cap = self.rule(b.cap + max(n, 1))
        nb = self._allocate(cap, [s.narrow(a, 0, 0) for s, a in zip(b.storages, self.axes)], inputs)
        ins = self._impl_inputs(key, nb, inputs)
        if ins is None:
            self._release(nb)
            return
        for pos, _ in self.input_slots:  # this call's inputs are not the graph's: a copy of each
            ins[pos] = ins[pos].clone()
        self.next[key] = nb
        warm, self.warmed = not self.warmed, True

        def build():
            t0 = time.perf_counter()
            impl = self._make_impl(key, nb, ins, warm=warm)
            impl.first = None  # a run of the thread's: its results are no call's
            for pos, _ in self.input_slots:
                ins[pos] = None
            return impl, ins, time.perf_counter() - t0

        nb.future = self._on_thread(build)
        self.stats["decode_graph_ahead_builds"] += 1

    def _switch(self, key: tuple, b: _Bucket, total: int, pasts: list) -> _Bucket:
        """The next bucket, its impl built ahead, takes over from ``b`` (the past copied over);
        ``b`` again (a new bucket is then made here) when it is too small or its build failed."""
        nb = self.next.pop(key)
        if total > nb.cap:
            self._release(nb)
            return b
        fut, nb.future = nb.future, None
        if not fut.done():
            t0 = time.perf_counter()
            fut.exception()
            self.stats["decode_graph_ahead_waits"] += 1
            self.stats["decode_graph_ahead_wait_s"] += time.perf_counter() - t0
        err = fut.exception()
        if err is not None:
            # a capture the thread could not finish (a device-wide synchronize elsewhere in the
            # process invalidates it): the bucket is made and built in this call instead, where
            # a capture that truly cannot be done is refused
            self._release(nb)
            self.stats["decode_graph_ahead_failures"] += 1
            self.state.runner.model.refusals.append(f"decode graph built ahead for {key}: {type(err).__name__}: {err}")
            return b
        nb.impl, nb.template, took = fut.result()
        self._count_build(took)
        self._adopt(nb, pasts, pasts[0].shape[self.axes[0]])
        self._release(b)
        self.stats["decode_graph_bucket_changes"] += 1
        self.buckets[key] = nb
        return nb

