"""InferenceSession and InferRequest: the ONNX Runtime-style entry points."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
import torch

from . import compat
from . import deciding_inputs as deciding
from .compile import Program, compile_graph
from .errors import (
    DimensionWarning,
    DynashapeError,
    ExecutionError,
    OptionsError,
    RequestBusyError,
    RunTerminatedError,
    SymbolDisagreementError,
    UnknownInputError,
    UnknownOutputError,
)
from .frontend.expose import expose
from .frontend.options import ParseOptions
from .frontend.parse import load_model_proto, parse_model, prepare_proto
from .impls.disk_cache import DiskCache
from .interpreter.network import Network
from .ir import elem_type_name
from .ir.dtypes import _PLAIN_NUMPY, HELD, to_numpy
from .memory import Engine, host_malloc
from .memory.config import MemoryConfig
from .memory.engine import _limit, _verbose_level
from .memory.staging import InputStager
from .ops import host_sync, native
from .ops.limits import MAX_LOOP_ITERATIONS
from .options import OPTION_NAMES
from .ort_module import unwrap
from .profiler import Profiler
from .runtime.bodies import BodyKernel
from .runtime.compiled import STATIC_COUNTERS, CompiledModel, CompiledRunner, deterministic_mode, for_graph, static_mode
from .runtime.decode_graph import ahead_rule, bucket_rule, decode_mode
from .runtime.feeds import FeedChecker, InputSpec, _torch_dtype
from .runtime.index_feeds import IndexFeedChecks
from .session_options import resolve as _session_options
from .shape import PartialShape

_OPTIONS = OPTION_NAMES  # every keyword option, documented in dynashape/options.py


# counters of the decided variants' runs that are this session's runs (stats())
_VARIANT_SUMMED = frozenset({"compiled_runs", "interpreter_runs", "specializations"})


def _deciders(proto, options: dict, executor: str, device) -> tuple:
    """(name, dtypes a feed may have, shape) of each input that decides an If (deciding_inputs.py);
    () where variants are off: the option, the interpreter (the reference flow runs the graph as it
    is), a device session (reading the value would wait for the device)."""
    if not options.get("decided_ifs", True) or executor != "compiled" or device.type != "cpu":
        return ()
    names = deciding.deciding_inputs(proto)
    out = []
    for i in proto.graph.input:
        if i.name in names:
            t = i.type.tensor_type
            np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
            out.append((i.name, (np_dtype, torch.from_numpy(np.zeros(0, np_dtype)).dtype),
                        tuple(d.dim_value for d in t.shape.dim)))
    return tuple(out)


def _precompile(value, static: str | None) -> bool:
    """``precompile``: 'auto' traces the likely specializations at load when static impls are on
    (CUDA by default), where a first call at a new shape should not pay a trace; True / False."""
    if value == "auto":
        return static is not None
    if isinstance(value, bool):
        return value
    raise OptionsError(f"precompile={value!r}: expected 'auto', True or False")


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{name}={value!r}: expected True or False")
    return value


class _Threads:
    """torch's intra-op thread count set for a run and restored afterwards. The count is
    process-wide: concurrent runs of sessions with different counts share whichever was set last."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self.prev = None

    def __enter__(self):
        if self.n:
            self.prev = torch.get_num_threads()
            if self.prev != self.n:
                torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.n and self.prev is not None and self.prev != self.n:
            torch.set_num_threads(self.prev)


class _Precision:
    """fp32 means fp32: cuDNN convolutions use TF32 on Ampere and later unless told otherwise,
    which moves results by ~1e-3 relative. A run turns TF32 off (unless the session allows it)
    and restores the caller's global flags afterwards."""

    def __init__(self, allow_tf32: bool) -> None:
        self.allow = allow_tf32
        self.prev = None

    def __enter__(self):
        b = torch.backends
        self.prev = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
        b.cudnn.allow_tf32 = b.cuda.matmul.allow_tf32 = self.allow

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.prev


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime.NodeArg: ``shape`` holds ints for fixed dims and names or None for dynamic ones."""

    name: str
    type: str
    shape: list
    partial_shape: PartialShape | None


def _node_arg(v) -> NodeArg:
    t = f"tensor({elem_type_name(v.elem_type)})"  # onnxruntime's spelling: tensor(float)
    if v.kind != "tensor":
        t = f"{v.kind}({t})"
    shape = [] if v.shape is None else [d.min if d.is_static else (d.symbol or None) for d in v.shape]
    return NodeArg(v.name, t, shape, v.shape)


EXECUTORS = ("compiled", "interpreter")


def _executor(value) -> str:
    """``executor=``: "compiled" (generated code per specialization; the default) or
    "interpreter" (the per-node flow for every run)."""
    v = value if value is not None else "compiled"
    if v not in EXECUTORS:
        raise OptionsError(f"executor={v!r}: expected one of {list(EXECUTORS)}")
    return v


def _device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OptionsError(f"device {device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionsError(f"device {device!r} asked for, but this torch build sees no CUDA device")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise OptionsError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise OptionsError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")
    return dev


class InferenceSession:
    """Load an ONNX model (path, bytes or ModelProto) and run it with shapes that change.

    Options: ``default_dynamic_dim``, ``dynamic_dims`` (input -> list of dims) and
    ``dim_params`` (symbol -> Dimension) set the ranges of dynamic dimensions; ``verbose``
    sets the log level of the memory engine (as DYNASHAPE_VERBOSE does); ``allow_tf32`` lets
    CUDA matrix products and convolutions use TF32 (faster, ~1e-3 relative error; off by default);
    ``extra_outputs`` (value names, or "all") makes intermediate values outputs too, after the
    model's own (see dynashape.debug).
    """

    def __init__(self, model, sess_options=None, providers=None, provider_options=None,
                 device: str | torch.device | None = None, **options) -> None:
        # onnxruntime's order (model, sess_options, providers, provider_options); a device name or
        # torch.device as the second argument is dynashape's older form and still means the device
        if isinstance(sess_options, (str, torch.device)):
            if device is not None:
                raise OptionsError(f"device given twice: {sess_options!r} positionally and device={device!r}")
            device, sess_options = sess_options, None
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise OptionsError(f"unknown option(s) {unknown}; known options are {sorted(_OPTIONS)}")
        self._sess_options = sess_options if sess_options is not None else compat.SessionOptions()
        options = _session_options(sess_options, options)
        if provider_options is not None and providers is None:
            raise OptionsError("provider_options given without providers")
        if device is None and providers:
            self.device, self._providers, self._provider_options = compat.resolve_providers(providers,
                                                                                           provider_options)
        else:
            if providers:  # checked (an unknown name is an error), but device= decides
                compat.resolve_providers(providers, provider_options)
            self.device = _device(device if device is not None else "cpu")
            if self.device.type == "cuda":
                self._providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
                self._provider_options = [{"device_id": str(self.device.index)}, {}]
            else:
                self._providers, self._provider_options = ["CPUExecutionProvider"], [{}]
        self.threads = options.get("threads")
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 0):
            raise OptionsError(f"threads={self.threads!r}: expected a non-negative int (0: torch's default)")
        self._profiler = None
        if options.get("enable_profiling"):
            if options.get("executor", "interpreter") != "interpreter":
                raise OptionsError("enable_profiling times nodes in the interpreter; it cannot be combined "
                                   f"with executor={options['executor']!r}")
            options["executor"] = "interpreter"
            self._profiler = Profiler(options.get("profile_file_prefix") or "onnxruntime_profile_")
        self.executor = _executor(options.get("executor"))
        if self.device.type == "cpu" and options.get("malloc_tuning", True):
            host_malloc.tune()
        parse = ParseOptions.make(options.get("default_dynamic_dim"), options.get("dynamic_dims"),
                                  options.get("dim_params"))
        self.verbose = options.get("verbose")
        _verbose_level(self.verbose)  # a bad level is an OptionsError now, not at the first run
        _limit(options.get("device_memory_limit"))  # checked here, not when the first request is made
        self.max_buffer_bytes = _limit(options.get("max_buffer_bytes"), "max_buffer_bytes")
        self.max_loop_iterations = _limit(options.get("max_loop_iterations"), "max_loop_iterations")
        self.memory = MemoryConfig.make(options)
        self.allocator = options.get("allocator", "direct")
        self.device_memory_limit = options.get("device_memory_limit")
        self.precision = _Precision(bool(options.get("allow_tf32", False))) if self.device.type == "cuda" else None
        self._fusion = _flag(options.get("fusion", True), "fusion")
        self._parse = parse
        self._unlinked: set[str] = set()
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._default: InferRequest | None = None
        self._source = model  # read again if a dim name is unlinked (keeping the proto would double the weights)
        self._extra = options.get("extra_outputs")
        self._options = dict(options)
        self._variants: dict[frozenset, InferenceSession] = {}
        self._decided: dict[tuple, InferenceSession] = {}  # deciding inputs' values -> the model made for them
        self._decided_seen: set[tuple] = set()  # values seen once, their variant not made yet
        self._static_mode = static_mode(options.get("static_impls"), self.device)
        # deterministic: no choice may depend on when a background build finishes, or on a timing
        self._deterministic = _flag(options.get("deterministic", False), "deterministic")
        if self._deterministic:
            self._static_mode = deterministic_mode(self._static_mode, self.device)
        self._static: str | None = None  # the mode for the graph loaded (for_graph)
        _precompile(options.get("precompile", "auto"), None)  # a bad value fails now, not at load
        self._impl_cache_size = options.get("impl_cache_size")
        self._decode_graphs = decode_mode(options.get("decode_graphs"), self._static_mode, self.device)
        self._kv_bucket = bucket_rule(options.get("kv_bucket"))
        self._decode_ahead = 0 if self._deterministic else ahead_rule(options.get("decode_ahead"), self.device)
        self._load(prepare_proto(self._read()))
        self._prebuild()

    def _read(self) -> onnx.ModelProto:
        proto = load_model_proto(self._source)
        return expose(proto, self._extra) if self._extra else proto

    def _load(self, proto) -> None:
        """Parse and compile ``proto``: what a new session does, and what unlinking a dim name redoes."""
        # graph inputs that have an initializer: a feed may override it (the ONNX spec, onnxruntime)
        self._overridable = ({i.name for i in proto.graph.input} & {t.name for t in proto.graph.initializer})
        self._meta = compat.ModelMetadata(proto)
        self._deciders = _deciders(proto, self._options, self.executor, self.device)
        self._decider_names = frozenset(d[0] for d in self._deciders)
        fusion = bool(self._fusion) and self.executor == "compiled"  # the interpreter runs the graph as it is
        self.program: Program = compile_graph(parse_model(proto, self._parse), fusion=fusion, device=self.device.type)
        g = self.program.graph
        self._specs = [InputSpec.of(v) for v in g.inputs]
        self._check_feeds = FeedChecker(self._specs, self.device, self.max_buffer_bytes)
        # CUDA: indices fed from the host are checked before the copy (a device assert would
        # poison the process's CUDA context)
        self._check_index_feeds = IndexFeedChecks(g) if self.device.type == "cuda" else None
        self._inputs = [_node_arg(v) for v in g.inputs]
        self._outputs = [_node_arg(v) for v in g.outputs]
        # the specializations of the generated code, shared by the requests (and one per body)
        run_graph = self.program.fused if self.program.fused is not None else g
        self._static, static_after = for_graph(self._static_mode, run_graph)
        if self._deterministic:  # a CPU decoder's "decoders" became async: built in the call that asks
            self._static = deterministic_mode(self._static, self.device)
        self.compiled = (CompiledModel(run_graph, self.device, inplace_concat=self.memory.inplace_concat,
                                       static=self._static, impl_cache_size=self._impl_cache_size,
                                       decode_graphs=self._decode_graphs, kv_bucket=self._kv_bucket,
                                       decode_ahead=self._decode_ahead, static_after=static_after)
                         if self.executor == "compiled" else None)
        cache_dir = self._options.get("cache_dir") or os.environ.get("DYNASHAPE_CACHE_DIR")
        if self.compiled is not None and cache_dir:
            self.compiled.disk_cache = DiskCache(cache_dir, proto, self.device)
            self.compiled.disk_cache.load()
        # (a CPU decoder's static impls come after its first calls: nothing is traced at load)
        if self.compiled is not None and _precompile(self._options.get("precompile", "auto"),
                                                     None if static_after else self._static):
            # the specializations that shapes to come will most likely need (every dynamic dim at a
            # generic value, each at 1, all at 1), traced now: a first call at a new shape then
            # finds its generated code ready
            self.compiled.precompile(representative_shapes(self._specs))
        self._bodies: dict[int, CompiledModel] = {}
        self._bodies_lock = threading.Lock()

    def reshape(self, shapes: dict) -> None:
        """OpenVINO's ``model.reshape``: new declared shapes for inputs (``PartialShape``s, lists of
        dims, or text like ``"[1..8,3,224,224]"``); the model is parsed and compiled again for
        them, requests made before see the new shapes at their next run."""
        dims = dict(self._parse.dynamic_dims)
        for name, shape in shapes.items():
            dims[name] = list(PartialShape(shape) if isinstance(shape, str) else shape)
        parse = ParseOptions.make(self._parse.default_dynamic_dim, dims, self._parse.dim_params, reshape=True)
        with self._reload_lock:
            old = self._parse
            self._parse = parse
            try:
                self._load(prepare_proto(self._read()))
            except Exception:
                self._parse = old
                raise

    def _unlink(self, err: SymbolDisagreementError) -> None:
        """Feeds gave two axes of one dim name different sizes. onnxruntime runs them, and so do
        we: the name stops linking the axes (the model is parsed again without it, since shapes
        were inferred and folded assuming the axes equal), with one warning per name. A name the
        user pinned with dim_params is a promise about the feeds: breaking it is an error."""
        if err.symbol in self._parse.dim_params:
            raise SymbolDisagreementError(f"{err}, which dim_params pins; they must agree", err.symbol) from None
        if err.symbol in self._unlinked:  # another request unlinked it already
            return
        warnings.warn(f"{err}: the model names them alike, the feeds disagree; running them as "
                      f"independent dimensions", DimensionWarning, stacklevel=4)
        self._unlinked.add(err.symbol)
        proto = onnx.ModelProto()
        proto.CopyFrom(self._read())  # never edit the caller's ModelProto
        for vi in proto.graph.input:
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param in self._unlinked:
                    d.ClearField("dim_param")
        self._load(prepare_proto(proto))

    def _prebuild(self) -> None:
        """MIGraphX's static submodules: with static impls on, every combination of the optimal
        values that ``Dimension(..., optimals=...)`` gives the inputs is run once at load, building
        the static impls of its regions, so that a call with one of those shapes replays them
        (``select_module``: the impl cache finds the one whose symbols equal the call's); any other
        shape runs the dynamic impl."""
        if self.compiled is None or self._static is None:
            return
        # the largest first: the arena is planned for it once, and the others fit in it (a re-plan
        # would move the buffers that the impls built before it read)
        shapes = sorted(optimal_shapes(self._specs), key=lambda c: -sum(_numel(s) for s in c))
        if not shapes:
            return
        req = self._default = InferRequest(self)
        req.runner.prebuild = True
        try:
            for combo in shapes:
                req.run(None, {spec.name: _sample(spec, shape, self.device) for spec, shape in zip(self._specs, combo)})
            self.compiled.context.wait()
        finally:
            req.runner.prebuild = False
        req._stats["optimal_shapes_prebuilt"] += len(shapes)

    def _with_inputs(self, names: frozenset) -> InferenceSession:
        """This model with the initializers ``names`` read from the feeds instead (a session of its
        own, made on the first call that overrides them)."""
        with self._reload_lock:
            sess = self._variants.get(names)
            if sess is None:
                proto = onnx.ModelProto()
                proto.CopyFrom(self._read())
                kept = [t for t in proto.graph.initializer if t.name not in names]
                del proto.graph.initializer[:]
                proto.graph.initializer.extend(kept)
                sess = self._variants[names] = InferenceSession(proto, self._sess_options, device=self.device,
                                                                **self._options)
                sess._profiler = self._profiler  # one profile for the session and its variants
            return sess

    def _decided_variant(self, feeds: dict, counts: Counter) -> InferenceSession | None:
        """The model made for the feeds' values of the deciding inputs (deciding_inputs.py); None
        where the general model serves (counted). The session's first values get theirs at once (a
        first call compiles anyway); later values at their second call, the first running the
        general model, whose If compiled both branches: a value seen once costs no model compile."""
        key = []
        for name, dtype, shape in self._deciders:
            x = feeds.get(name)
            v = None
            if x is not None and getattr(x, "dtype", None) in dtype and tuple(getattr(x, "shape", ())) == shape:
                v = deciding.value_of(x)
            if v is None:  # missing, or not what the input takes: the general run says what is wrong
                counts["decided_if_general"] += 1
                return None
            key.append(v)
        k = tuple(key)
        sess = self._decided.get(k)
        if sess is not None:
            return sess
        with self._reload_lock:
            sess = self._decided.get(k)
            if sess is None:
                if len(self._decided) >= deciding.MAX_VALUES:
                    counts["decided_if_refused"] += 1
                    return None
                if self._decided and k not in self._decided_seen:
                    self._decided_seen.add(k)
                    counts["decided_if_first_sight"] += 1
                    return None
                values = {d[0]: v for d, v in zip(self._deciders, k)}
                sess = InferenceSession(deciding.pinned(load_model_proto(self._source), values), self._sess_options,
                                        device=self.device, **self._options)
                sess._profiler = self._profiler
                self._decided[k] = sess
            return sess

    def body_model(self, graph) -> CompiledModel:
        """The compiled form of a control-flow body: its outer-scope reads are extra inputs."""
        with self._bodies_lock:  # not the run lock: a run holding it compiles its bodies
            m = self._bodies.get(id(graph))
            if m is None:
                m = self._bodies[id(graph)] = CompiledModel(graph, self.device, list(graph.inputs) + list(graph.outer),
                                                            self.memory.inplace_concat)
            return m

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def create_infer_request(self) -> InferRequest:
        """A request with its own buffers and shape state; use one per thread."""
        return InferRequest(self)

    def run(self, output_names, input_feed=None, run_options=None, *, feeds=None) -> list:
        """Run with ``input_feed`` (name -> numpy array or torch tensor; ``feeds=`` is the older
        keyword); outputs follow the feeds' kind. ``run_options``: a RunOptions (terminate)."""
        input_feed = _feed_arg(input_feed, feeds)
        with self._lock:
            if self._default is None:
                self._default = InferRequest(self)
            return self._default.run(output_names, input_feed, run_options)

    def run_async(self, output_names, input_feed, callback, user_data, run_options=None) -> None:
        """onnxruntime's run_async: runs on a thread, then calls ``callback(results, user_data,
        err)`` with ``err`` "" on success (results None and the error's text otherwise)."""
        def work():
            try:
                res = self.run(output_names, input_feed, run_options)
            except Exception as e:  # handed to the callback, as onnxruntime does
                callback(None, user_data, f"{type(e).__name__}: {e}")
                return
            callback(res, user_data, "")
        threading.Thread(target=work, name="dynashape-run-async", daemon=True).start()

    def get_modelmeta(self) -> compat.ModelMetadata:
        return self._meta

    def get_providers(self) -> list[str]:
        return list(self._providers)

    def get_provider_options(self) -> dict:
        return {p: dict(o) for p, o in zip(self._providers, self._provider_options)}

    def get_session_options(self):
        return self._sess_options

    def end_profiling(self) -> str:
        """Write the profile (dynashape.profiler) and return its path; "" when profiling is off."""
        return "" if self._profiler is None else self._profiler.end()

    def io_binding(self) -> compat.IOBinding:
        return compat.IOBinding(self)

    def run_with_iobinding(self, iobinding: compat.IOBinding, run_options=None) -> None:
        iobinding._run(run_options)

    def _run_bound(self, output_names, feeds, run_options, bound: dict) -> list:
        """A run whose outputs in ``bound`` (name -> tensor) are written straight into those
        tensors where the kernel that makes them can (io_binding's zero-copy outputs)."""
        with self._lock:
            if self._default is None:
                self._default = InferRequest(self)
            runner = self._default.runner
            if runner is not None:
                runner.bound = bound
            try:
                return self._default.run(output_names, feeds, run_options)
            finally:
                if runner is not None:
                    runner.bound = {}

    def stats(self) -> dict:
        return {} if self._default is None else self._default.stats()

    def memory_stats(self) -> dict:
        """Memory counters of the default request (see InferRequest.memory_stats)."""
        with self._lock:
            if self._default is None:
                self._default = InferRequest(self)
            return self._default.memory_stats()


class InferRequest:
    """Per-request state: the compiled runner (arena, views, buffers) over the session's
    specializations, and the interpreter Network, made when something needs it."""

    def __init__(self, session: InferenceSession) -> None:
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
        self._input_names = [v.name for v in session.program.graph.inputs]
        self._host_session = session.device.type == "cpu"
        self._out_index = {a.name: i for i, a in enumerate(session._outputs)}
        self._busy = getattr(self, "_busy", None) or threading.Lock()  # kept when re-made after a re-parse
        self._tensors: dict = getattr(self, "_tensors", {})
        self._results: dict = {}
        self._job: threading.Thread | None = None
        self._error: BaseException | None = None
        self._callback = getattr(self, "_callback", None)

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
            return self._run_checked(output_names, _feed_arg(input_feed, feeds), run_options)
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
        try:
            threads = s.threads if s.compiled is None else s.compiled.run_threads(s.threads)
            # a feed that requires grad must not trip the kernels' out= (no_grad: ~2 us a run otherwise)
            grad = not numpy_mode and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors.values())
            if not grad and not threads and self.session.precision is None:
                outs = self._run(tensors, hand_out=not numpy_mode)  # the usual run: no context to enter
            else:
                with torch.no_grad() if grad else contextlib.nullcontext(), _Threads(threads):
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
        if not numpy_mode:
            return [outs[i] for i in idx]
        # the graph's output types name what a held tensor stands for (an int8 tensor of an INT4)
        g_outs = self.session.program.graph.outputs
        return [_to_numpy(outs[i], g_outs[i].elem_type) for i in idx]

    # ---- OpenVINO's request API -----------------------------------------------------------------
    def set_tensor(self, name: str, value) -> None:
        """Set an input for the next ``infer()`` / ``start_async()`` without feeds."""
        if name not in self._input_names and name not in self.session._overridable:
            raise UnknownInputError(name, list(self._input_names))
        self._tensors[name] = value

    def get_tensor(self, name: str):
        """An input set with ``set_tensor``, or an output of the last ``infer``."""
        if name in self._tensors:
            return self._tensors[name]
        if name in self._results:
            return self._results[name]
        raise UnknownOutputError(name, list(self._input_names) + list(self._out_index))

    def infer(self, feeds=None) -> dict:
        """Run with ``feeds`` (or the tensors set with ``set_tensor``); outputs by name."""
        names = [a.name for a in self.session._outputs]
        self._results = dict(zip(names, self.run(names, self._tensors if feeds is None else feeds)))
        return self._results

    def start_async(self, feeds=None, userdata=None) -> None:
        """Run on a worker thread; ``wait()`` for it. The request is busy until it finishes."""
        if self._job is not None and self._job.is_alive():
            raise RequestBusyError("this request is still running its last start_async(); wait() for it first")
        self._error = None
        feeds = dict(self._tensors) if feeds is None else feeds

        def work():
            try:
                self.infer(feeds)
            except BaseException as e:  # noqa: BLE001  re-raised by wait()
                self._error = e
            if self._callback is not None:
                self._callback(self, userdata)
        self._job = threading.Thread(target=work, daemon=True)
        self._job.start()

    def wait(self) -> None:
        """Block until the last ``start_async`` finished; raise its error, if any."""
        if self._job is not None:
            self._job.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def wait_for(self, timeout_ms: int) -> bool:
        """True when the last ``start_async`` finished within ``timeout_ms``."""
        if self._job is None:
            return True
        self._job.join(timeout_ms / 1000)
        return not self._job.is_alive()

    def set_callback(self, callback) -> None:
        """``callback(request, userdata)`` after each ``start_async`` (its worker thread)."""
        self._callback = callback

    @property
    def results(self) -> dict:
        return dict(self._results)

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
        out = {**self._counters(), **self.engine.stats(), **native.counters(), **host_sync.counters()}
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
            specs = self.session.compiled.specs
            out["regions"] = sum(len(s.regions) for s in specs)
            out["region_kernels"] = sum(rc.region.kernels for s in specs for rc in s.regions)
            out["kernel_lines"] = sum(s.kernel_items for s in specs)
            out["specializations"] = len(self.session.compiled.specs)
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
                "arena_bytes": arena, "arena_plans": net["arena_plans"], "arena_grows": net["arena_grows"]}


def _feed_arg(input_feed, feeds):
    """``input_feed`` (onnxruntime's name) or ``feeds=`` (dynashape's older keyword), not both;
    OrtValues as their tensors."""
    if feeds is not None:
        if input_feed is not None:
            raise OptionsError("run: give input_feed or feeds=, not both")
        return unwrap(feeds)
    return unwrap(input_feed)  # None: the feed check says it is not a dict (InputTypeError)


MAX_OPTIMAL_SHAPES = 32


def optimal_shapes(specs: list[InputSpec]) -> list[tuple]:
    """Input shapes at the optimal values (every combination of the symbols' optimals), or []
    when some dynamic axis has none (no full shape to build for)."""
    symbols: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        if spec.shape is None:
            return []
        for d in spec.shape:
            if d.is_static:
                continue
            if not d.optimals:
                return []
            symbols[d.symbol or f"{spec.name}:{id(d)}"] = d.optimals
    if not symbols:
        return []
    names = list(symbols)
    out = []
    for values in itertools.product(*(symbols[n] for n in names)):
        env = dict(zip(names, values))
        out.append(tuple(tuple(d.min if d.is_static else env[d.symbol or f"{spec.name}:{id(d)}"] for d in spec.shape)
                         for spec in specs))
        if len(out) >= MAX_OPTIMAL_SHAPES:
            break
    return out


_GENERIC = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def representative_shapes(specs: list[InputSpec]) -> list[tuple]:
    """Input shapes with every dynamic dim at a generic value (distinct primes within each
    range, so no two dims look equal by chance), then with each symbol at 1 in turn: the
    signatures whose guards the shape program splits on most (``batch == 1``, ``seq == 1``)."""
    dims: dict[str, object] = {}
    for spec in specs:
        if spec.shape is None:
            return []
        for a, d in enumerate(spec.shape):
            if not d.is_static:
                dims.setdefault(d.symbol or f"{spec.name}:{a}", d)
    if not dims:
        return []
    generic: dict[str, int] = {}
    for k, (name, d) in enumerate(dims.items()):
        v = _GENERIC[k % len(_GENERIC)]
        generic[name] = max(d.min, v if d.max is None else min(v, d.max))
    ones = [n for n, d in dims.items() if d.contains(1) and generic[n] != 1]
    combos = [generic] + [{**generic, n: 1} for n in ones]
    if 1 < len(ones) <= 3:  # decode at batch 1: batch and new tokens both 1
        combos.append({**generic, **dict.fromkeys(ones, 1)})

    def shape_of(spec: InputSpec, env: dict) -> tuple:
        return tuple(d.min if d.is_static else env[d.symbol or f"{spec.name}:{a}"] for a, d in enumerate(spec.shape))
    return [tuple(shape_of(spec, env) for spec in specs) for env in combos]


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _sample(spec: InputSpec, shape: tuple, device: torch.device) -> torch.Tensor:
    """A feed of this shape for building: random floats, ones for integers (a valid index or
    count in the models people run), True for booleans."""
    dt = _torch_dtype(spec.elem_type)
    if dt.is_floating_point:
        return torch.randn(shape, device=device).to(dt)
    return torch.ones(shape, dtype=dt, device=device)


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
