"""Static impls: one region of generated code for one value of its key symbols.

``CudaGraphImpl`` (CUDA): the region's kernels captured into a CUDA graph and replayed with one
launch. Buffers of the arena are read and written in place (their addresses are fixed for the
request's arena plan, which is part of the key); live-ins that change from call to call (inputs,
results of lines outside the region, values made from symbols that are not in the key, such as
position ids made from the past length) get buffers of the impl's own, refreshed by a copy
before each replay: never constants baked into the graph. Results handed to the caller are
copied out of the graph's memory, so a caller keeping an output never sees the next replay.
A region whose kernels talk to the host (``.item()``, a synchronising kernel) cannot be
captured: ``CannotCapture``, and that signature keeps the dynamic path (counted).

``InductorImpl`` (CPU): the region traced to aten ops and compiled by inductor into C++ loops,
where it has enough element-wise work to fuse (``MIN_FUSABLE``); built in the calling thread.

``SpecializedImpl`` (any device; the CPU static impl of a region with little to fuse, or with
``DYNASHAPE_CPU_STATIC=specialized``): the region's source with the key symbols written as
literals, compiled again, so Python folds the shape arithmetic; it runs the same kernels as the
dynamic path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time

import torch

from ..errors import OptionsError
from ..ops import packed_linear, specialise, split_tf32
from ..ops.conv_act import fused_epilogues
from . import capture_guard, tuning
from .context import Courtesy, Requeue

log = logging.getLogger(__name__)


def cudnn_benchmark_limit() -> int:
    """How many of cuDNN's algorithms a static build times per convolution:
    DYNASHAPE_CUDNN_BENCHMARK_LIMIT, torch's default 10, 0 for all of them (measured: no gain)."""
    text = os.environ.get("DYNASHAPE_CUDNN_BENCHMARK_LIMIT", "10")
    if not text.isdigit():
        raise OptionsError(f"DYNASHAPE_CUDNN_BENCHMARK_LIMIT={text!r}: expected a count of algorithms (0: all)")
    return int(text)


def timed_forms() -> bool:
    """Whether builds time the forms of their products and convolutions (ops/specialise.py):
    DYNASHAPE_STATIC_FORMS, '1' (default) or '0' (the ops' own calls only, for A/B measurements)."""
    text = os.environ.get("DYNASHAPE_STATIC_FORMS", "1")
    if text not in ("0", "1"):
        raise OptionsError(f"DYNASHAPE_STATIC_FORMS={text!r}: expected '1' or '0'")
    return text == "1"


class CannotCapture(RuntimeError):
    """A region that a static impl cannot serve for this signature. ``first``: the results of
    the region's real run when the capture failed after it (the call must use them: running the
    region again could read what that run overwrote)."""

    def __init__(self, msg: str, first: tuple | None = None) -> None:
        super().__init__(msg)
        self.first = first


class SpecializedImpl:
    kind = "specialized"
    fallback: str | None = None  # why an inductor impl was wanted and could not be built

    def __init__(self, body: list[str], params: list[str], live_out: list[str], symvals: dict[str, int],
                 ns: dict, filename: str) -> None:
        lines = [f"def region({', '.join(params)}):"]
        for line in body:
            for var, val in symvals.items():
                line = re.sub(rf"(?<![\w.]){re.escape(var)}(?!\w)", str(int(val)), line)
            lines.append("    " + line)
        lines.append(f"    return ({', '.join(live_out)}{',' if len(live_out) == 1 else ''})")
        self.source = "\n".join(lines) + "\n"
        scope: dict = {}
        exec(compile(self.source, filename, "exec"), ns, scope)  # noqa: S102  our own generated source
        self.fn = scope["region"]
        self.nbytes = 0

    def __call__(self, ins: tuple):
        return self.fn(*ins)


# Measured on this project's 2-core CPU (docs/benchmarks.md): a compiled region's call costs
# ~10-20 us of wrapper before its kernels, a torch op on the dynamic path 1.5-3 us; regions of the
# tiny decoder (14 and 11 lines, 10-30 fusable ops) ran 2.1-2.5x faster compiled, regions of
# 2-4 ops (small LSTM models) slower. Below this many fusable ops the region keeps the
# specialised Python source.
MIN_FUSABLE = 8
_FREE = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "slice", "select",
         "as_strided", "unsqueeze", "squeeze", "alias", "detach", "split", "split_with_sizes", "unbind",
         "narrow", "empty", "empty_strided", "clone", "copy_", "_to_copy", "lift_fresh_copy"}
_EXTERN = {"mm", "bmm", "addmm", "matmul", "convolution", "_convolution", "baddbmm", "linear",
           "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
           "scaled_dot_product_attention", "lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer",
           "index_select", "embedding", "index", "gather", "scatter", "sort", "topk", "cat"}


class TooLittleToFuse(RuntimeError):
    """A region an inductor impl would not speed up: the specialised source serves it."""


def fusable_ops(gm) -> int:
    """The ops of a traced region that inductor fuses into loops: element-wise and reductions
    (not views, copies, nor the library calls it keeps: products, convolutions, RNNs, gathers)."""
    n = 0
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(getattr(node.target, "_overloadpacket", None), "__name__", str(node.target))
        if name not in _FREE and name not in _EXTERN:
            n += 1
    return n


class InductorImpl:
    """CPU: the region's lines for one key traced to aten ops (``make_fx`` over fake tensors:
    metadata only, so the build never reads or writes the arena the calls use) and compiled by
    inductor into C++ kernels (element-wise chains fused into one loop, matrix products and
    convolutions calling the libraries torch calls). The live-ins' sizes, strides and aliasing
    (arena views of one block) are those of the key's arena plan, part of the key; the compiled
    code asserts the sizes and strides, and a call whose non-tensor live-ins differ from the
    build's takes the dynamic path. Writes into arena buffers stay writes into them.

    Two steps. The constructor traces, in the calling thread (FX tracing keeps module-level
    state: a trace on another thread broke a torch.compile running meanwhile in the
    application's thread), and runs AOT autograd's part of inductor there (functionalization,
    and the merging of live-ins that alias one block into one base, which keeps a write through
    one arena view ordered before a later read through another); ``compile()`` then lowers,
    generates and compiles the C++ in the compile process (compile_process.py) and may run on
    the compilation context's worker: the serving thread keeps running meanwhile."""

    kind = "inductor"

    def __init__(self, fn, symvals: tuple, ins: tuple) -> None:
        import torch._inductor  # noqa: F401  (the compiler; imported at the first CPU build)
        from torch._inductor.compile_fx import compile_fx
        from torch.fx.experimental.proxy_tensor import make_fx
        self.tensor_pos = [i for i, x in enumerate(ins) if isinstance(x, torch.Tensor)]
        self.consts = {i: x for i, x in enumerate(ins) if not isinstance(x, torch.Tensor)}
        n = len(ins)

        def region(*tensors):
            args = [None] * n
            for i, t in zip(self.tensor_pos, tensors):
                args[i] = t
            for i, c in self.consts.items():
                args[i] = c
            return tuple(fn(*symvals, *args))
        tensors = [ins[i] for i in self.tensor_pos]
        # the weights are constants of the generated code: real tensors, kept as graph constants
        before = packed_linear.traced_packable
        gm = make_fx(region, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)
        if packed_linear.traced_packable != before:
            raise TooLittleToFuse("products by packed weights (oneDNN's, kept by the specialised source, beat "
                                  "the product inductor would call)")
        fusable = fusable_ops(gm)
        if fusable < MIN_FUSABLE:
            raise TooLittleToFuse(f"{fusable} element-wise or reduction ops (an inductor region pays off from "
                                  f"{MIN_FUSABLE})")
        self.inner = _Deferred()
        self.fn = compile_fx(gm, tensors, inner_compile=self.inner.record)
        if self.inner.gm is None:
            raise RuntimeError("inductor compiled the region without its inner compiler")
        self.nbytes = 0

    def compile(self) -> InductorImpl:
        """The C++ of the traced region, compiled in the compile process and loaded here."""
        from .compile_process import process
        self.inner.fn = process().compile(self.inner.request, self.inner.gm)
        self.inner.gm = self.inner.request = None
        return self

    def __call__(self, ins: tuple):
        for i, c in self.consts.items():
            if ins[i] is not c and ins[i] != c:
                return None  # a value the build took as a constant: the dynamic path serves
        return tuple(self.fn(*[ins[i] for i in self.tensor_pos]))


def _input_meta(t: torch.Tensor) -> dict:
    s = t.untyped_storage()
    return {"size": tuple(t.shape), "stride": tuple(t.stride()), "dtype": t.dtype, "offset": t.storage_offset(),
            "storage": s._cdata, "storage_nbytes": s.nbytes()}


class _Deferred:
    """What inductor's inner compiler hands to AOT autograd's wrappers: the functional graph and
    its inputs' metadata are recorded, the compiled function comes later (``fn``)."""

    def __init__(self) -> None:
        self.gm = None
        self.request: bytes | None = None
        self.fn = None

    def record(self, gm, example_inputs, **kwargs):
        from .compile_process import request
        out = gm.graph.find_nodes(op="output")[0]
        # the output strides inductor must keep
        out_meta = {k: out.meta[k] for k in ("user_visible_output_idxs", "original_output_strides") if k in out.meta}
        self.gm = gm
        self.request = request(gm, [_input_meta(t) for t in example_inputs], out_meta)
        return _boxed(self)


def _boxed(d: _Deferred):
    from torch._inductor.output_code import OutputCode

    class Boxed(OutputCode):  # an OutputCode: AOT autograd's wrappers call it with a list of inputs
        _boxed_call = True

        def __call__(self, inputs):
            return d.fn(inputs)

        def post_compile(self, *a, **kw):
            pass

        def prepare_for_serialization(self):
            pass

        def set_triton_bundle(self, bundle):
            pass
    return Boxed()


class CudaGraphImpl:
    """See the module docstring. The call that builds it is served by the build: the region runs
    once for real on the capture stream, on the impl's own buffers (which also sets up handles,
    workspaces and cuDNN's choice of algorithm before the capture); its results are that call's
    (``first``); the capture itself executes nothing.
    Running the region twice in one call would not do: the arena reuses memory, so a region may
    overwrite what it read (a live-in that is dead after its last read), and a second run would
    read that."""

    kind = "cuda_graph"

    def __init__(self, fn, symvals: tuple, ins: tuple, refresh: list[bool], results: list[bool],
                 device: torch.device, warm: bool = True, tune: bool = True, prepared: bool = False) -> None:
        """``warm=False``: no real run before the capture (the caller knows every kernel of the
        region has run before, at other shapes); the call that built it then replays it.
        ``tune``: the region's products and convolutions take the forms timed fastest for their
        shapes (``ops/specialise.py``; only with the real run, which times them before the capture).
        ``prepared`` (with ``warm=False``): the region ran in this thread just before on scratch
        live-ins (``detached``): the capture takes the forms and fused epilogues that run chose,
        and cuDNN's benchmark switch, process-wide, stays as the application set it.
        The capture holds the process's device-wide synchronisations meanwhile (CUDA forbids
        them; capture_guard.py), and begins once those in flight are done."""
        self.ins = ins  # the arena views and constants the graph reads stay alive with it
        self.refresh_idx: list[int] = []
        self.static: list[torch.Tensor] = []
        args = list(ins)
        for i, (x, r) in enumerate(zip(ins, refresh)):
            if not r:
                continue
            if not isinstance(x, torch.Tensor):
                raise CannotCapture(f"live-in {i} is a {type(x).__name__}, not a tensor")
            s = torch.empty_like(x)
            self.refresh_idx.append(i)
            self.static.append(s)
            args[i] = s
        self.results = results
        self.nbytes = sum(s.numel() * s.element_size() for s in self.static)
        caller = torch.cuda.current_stream(device)
        side = _capture_stream(device)
        side.wait_stream(caller)
        graph = torch.cuda.CUDAGraph()
        # a static impl is for one shape: cuDNN may time its algorithms for it (the real run
        # does, the capture then finds them in cuDNN's cache: same shapes, strides, buffers)
        benchmark, limit = torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit
        if not prepared:
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.benchmark_limit = cudnn_benchmark_limit()
        try:
            # cuDNN's fused convolution epilogues too, where the real run builds their plans first
            timed = (warm or prepared) and tune and timed_forms()
            with torch.cuda.stream(side), (fused_epilogues() if warm or prepared else contextlib.nullcontext()), \
                    (specialise.specialised(tuning.fastest) if timed else contextlib.nullcontext()):
                for i, s in zip(self.refresh_idx, self.static):
                    s.copy_(ins[i])
                # this call's results, and the warm-up of the capture
                first = fn(*symvals, *args) if warm else ()
                with capture_guard.capturing(), _graph_owns_blas_workspace():
                    rng = _rng_snapshot(device)
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        outs = fn(*symvals, *args)
                    except Exception as e:
                        _abandon(graph, device, rng)
                        caller.wait_stream(side)
                        raise CannotCapture(f"{type(e).__name__}: {e}", _handed(first, caller)) from e
                    try:
                        graph.capture_end()
                    except RuntimeError as e:
                        _rng_restore(device, rng)
                        caller.wait_stream(side)
                        raise CannotCapture(f"{type(e).__name__}: {e}", _handed(first, caller)) from e
        finally:
            if not prepared:
                torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit = benchmark, limit
        caller.wait_stream(side)
        first = _handed(first, caller)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise CannotCapture("a live-out is not a tensor")
        self.first: tuple | None = tuple(first) if warm else None
        self.graph, self.outs = graph, tuple(outs)
        self.nbytes += sum(o.numel() * o.element_size() for o in self.outs)

    def __call__(self, ins: tuple):
        if self.first is not None:  # the call that built it: the region has run already
            first, self.first = self.first, None
            return first
        for i, s in zip(self.refresh_idx, self.static):
            x = ins[i]
            if x.shape != s.shape or x.dtype != s.dtype:
                return None  # a guard of the impl: the dynamic path serves (counted by the caller)
            if x.data_ptr() != s.data_ptr():
                s.copy_(x)
        self.graph.replay()
        if not any(self.results):
            return self.outs
        return tuple(o.clone() if h else o for o, h in zip(self.outs, self.results))


def detached(fn, symvals: tuple, ins: tuple, refresh: list[bool], results: list[bool],
             device: torch.device, tune: bool = True, give_way=None, busy=None) -> CudaGraphImpl:
    """A CUDA static impl built off the calling thread while the dynamic impl serves (async
    builds; ``CompiledRunner.static``): no call waits for it. Nothing the caller owns is read
    or written before the graph's first replay: the region first runs on scratch live-ins of the
    same sizes, strides and dtypes (random floats, zero integers: indices that are always valid),
    which makes this thread's cuBLAS and cuDNN handles, compiles the Triton kernels, transforms
    the Winograd weights and times the forms of the products and convolutions (on this thread's
    side stream, while the caller's kernels run: the timings are noisier than a build in the
    call); then the region is captured over the real live-ins, which executes nothing. An arena
    given back meanwhile (a re-plan) is never touched: the impl's key names that plan, which no
    later call asks for.
    ``tune=False``: nothing is timed; an op takes the form kept for its key (timed by an earlier
    build, a sibling batch's, or the disk cache's), else its own call; ``impl.untuned`` counts the
    keys left so, which a tuned rebuild would time (runtime/spec_state.py builds a region's first
    graph so: at a random batch on every call, ResNet-50's first bucket built with every form timed
    landed after ~2.8 s of calls on an H200, ~170 calls; untimed, a bucket's build takes ~0.1 s).
    ``give_way()``: asked before each key is timed, and before each of its forms; when true the
    build stops and raises ``Requeue`` (the keys timed so far are kept, so it resumes where it
    stopped; a key stopped midway is timed again). ``busy()``: whether a call of the session is
    being launched, for which the build pauses before each torch call (context.py ``Courtesy``)."""
    tuner = tuning.fastest if tune else specialise.untimed
    if tune and give_way is not None:
        def tuner(key, runs):
            if give_way():
                raise Requeue("a first graph or a call waits")
            return tuning.fastest(key, runs, give_way)
    # the capture takes the forms the warm run took (specialise.pinning says why)
    with torch.cuda.device(device), split_tf32.run_flags(), specialise.pinning(), \
            (Courtesy(busy) if busy is not None else contextlib.nullcontext()):  # (the run's TF32 switches)
        side = _capture_stream(device)
        with torch.cuda.stream(side):
            t0 = time.perf_counter()
            scratch = tuple(_scratch(x) if isinstance(x, torch.Tensor) else x for x in ins)
            with fused_epilogues(), tuning.light(), (specialise.specialised(tuner) if timed_forms()
                                                     else contextlib.nullcontext()), \
                    split_tf32.recording() as made, specialise.counting_defaults() as defaulted:
                fn(*symvals, *scratch)
            for x, s in zip(ins, scratch):  # the real weights' TF32 parts, made here rather than in the capture
                for wid, *how in made:
                    if wid == id(s):
                        split_tf32.parts(x, *how)
            del scratch  # stream-ordered: its memory is reused on this stream after that run
            side.synchronize()  # the warm run's device work, apart from the capture's (phases below)
            t1 = time.perf_counter()
        impl = CudaGraphImpl(fn, symvals, ins, refresh, results, device, warm=False, prepared=True)
        # where a background build's time goes (stats: static_build_warm_s, static_build_capture_s)
        impl.phases = {"warm": t1 - t0, "capture": time.perf_counter() - t1}
        impl.untuned = defaulted[0]
        return impl


def _scratch(x: torch.Tensor) -> torch.Tensor:
    """A tensor of ``x``'s size, strides and dtype over memory of its own, never read from ``x``."""
    n = 1 + sum((d - 1) * st for d, st in zip(x.size(), x.stride())) if x.numel() else 0
    base = torch.empty(n, dtype=x.dtype, device=x.device)  # flat: an expanded view's strides may be 0
    if base.is_floating_point():
        base.uniform_(-1.0, 1.0)
    else:
        base.zero_()
    return base.as_strided(x.size(), x.stride())


_streams = threading.local()


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream this thread captures on, one per device: cuBLAS keeps a workspace per
    stream for the life of the process, so a new stream per capture grew the memory with every
    graph (measured on an H100: 701 MB held by torch's allocator after five decode buckets of a
    499 MB model, 567 MB with one stream)."""
    table = getattr(_streams, "by_device", None)
    if table is None:
        table = _streams.by_device = {}
    s = table.get(device)
    if s is None:
        s = table[device] = torch.cuda.Stream(device)
    return s


def _handed(first, caller) -> tuple:
    """Results made on the capture stream, handed to the caller's stream."""
    for t in first:
        if isinstance(t, torch.Tensor):
            t.record_stream(caller)
    return tuple(first)


@contextlib.contextmanager
def _graph_owns_blas_workspace():
    """Around a capture: cuBLAS's workspaces forgotten before and after it, so that the
    captured products get a workspace from the graph's own memory, which lives with the graph.
    Without this they use the workspace cuBLAS keeps per stream in torch's ordinary memory, and
    whoever clears those workspaces (torch.compile's CUDA graphs do, before and after each
    recording) frees memory the graph still writes at every replay: measured on an H200, a
    ResNet-50 session beside torch.compile(mode="reduce-overhead") then failed in a later cuDNN
    convolution (CUDNN_STATUS_EXECUTION_FAILED) once its static impls had products in them."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()


def _abandon(graph, device: torch.device, rng) -> None:
    """End a capture that failed half way (the stream must leave capture mode)."""
    try:
        graph.capture_end()
    except RuntimeError:
        _rng_restore(device, rng)


def _rng_snapshot(device: torch.device):
    """A copy of the device's default generator state, taken before a capture: capture_begin marks
    that state as the graph's, and a capture_end that fails (an invalidated capture) raises before
    it hands it back, which left every later random op on the device failing ("Offset increment
    outside graph capture encountered unexpectedly"; found on the device after a capture a QDQ
    model's int16 FakeQuant refused)."""
    if not torch.cuda.is_available():
        return None
    try:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        gen = torch.cuda.default_generators[idx]
        return gen, gen.clone_state()
    except (AttributeError, RuntimeError, IndexError):  # an older torch without graph-safe states
        return None


def _rng_restore(device: torch.device, rng) -> None:
    """After a failed capture_end: the generator takes the state copied before the capture (what
    the capture consumed is gone with it), so random numbers work again."""
    if rng is None:
        return
    gen, state = rng
    try:
        gen.graphsafe_set_state(state)
    except (AttributeError, RuntimeError):
        pass


def static_builder(device: torch.device, fn, body: list[str], params: list[str], live_out: list[str],
                   symvars: list[str], symvals: tuple, ins: tuple, refresh: list[bool], results: list[bool],
                   ns: dict, filename: str, detach: bool = False):
    """What builds the static impl of a region for the key ``symvals`` (values of ``symvars``)
    from the live-ins ``ins`` of the call that asked: a function of no arguments. The part of a
    build that must run in the calling thread is done before this returns (an inductor build's
    trace); the rest (its compilation, a specialised source) may run on the compilation
    context's worker. A CUDA capture is all in the returned function, which the caller runs
    inline (impls/context.py says why), unless ``detach``: then it is ``detached``, built on the
    worker."""
    if device.type == "cuda":
        if detach:
            return lambda tune=True, give_way=None, busy=None: detached(fn, symvals, ins, refresh, results, device,
                                                                        tune, give_way, busy)
        return lambda: CudaGraphImpl(fn, symvals, ins, refresh, results, device)

    def specialized(why: str | None = None):
        impl = SpecializedImpl(body, params, live_out, dict(zip(symvars, symvals)), ns, filename)
        impl.fallback = why
        return impl
    if cpu_kind() != "inductor":
        return specialized
    try:
        traced = InductorImpl(fn, symvals, ins)
    except TooLittleToFuse:
        return specialized
    except Exception as e:  # noqa: BLE001  an op inductor refuses: counted, logged
        return lambda err=e: _fell_back(specialized, err)  # (``e`` is unbound after the block)

    def compiled():
        try:
            return traced.compile()
        except Exception as e:  # noqa: BLE001  no compiler here, a region inductor cannot lower: counted, logged
            return _fell_back(specialized, e)
    return compiled


def _fell_back(specialized, e: Exception):
    why = f"{type(e).__name__}: {e}"
    log.info("inductor could not compile a region (%s); its specialised source serves", why[:300])
    return specialized(why)


def build_static(*args, **kwargs):
    """The static impl itself, built now in this thread (``static_builder``'s arguments)."""
    return static_builder(*args, **kwargs)()


def cpu_kind() -> str:
    """What a static impl is on CPU: ``"inductor"`` (the region compiled to C++ by inductor) or
    ``"specialized"`` (its source with the key as literals). DYNASHAPE_CPU_STATIC chooses."""
    kind = os.environ.get("DYNASHAPE_CPU_STATIC", "inductor").lower()
    if kind not in ("inductor", "specialized"):
        raise OptionsError(f"DYNASHAPE_CPU_STATIC={kind!r}: expected 'inductor' or 'specialized'")
    return kind
