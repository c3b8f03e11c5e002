"""InferenceSession: onnxruntime's session surface (run, get_inputs, providers, io_binding,
profiling, ...) over a model loaded and compiled once, and OpenVINO's ``reshape`` and
``create_infer_request``. A session owns what its requests share: the program, the compiled
specializations, the variants made for overridden initializers or decided Ifs; each request
(request_state.py, infer_request.py) owns its buffers. The options a session reads are the table
of options.py (SessionOptions' fields and the keywords)."""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter

import onnx
import torch

from . import compat
from . import deciding_inputs as deciding
from . import session_setup as setup
from .compat import NodeArg  # noqa: F401  dynashape.api.NodeArg, as before
from .compile import Program, compile_graph
from .compile.memory_plan import kv_appends
from .errors import DimensionWarning, DynashapeError, OptionsError, SymbolDisagreementError
from .frontend.expose import expose
from .frontend.gqa_concat import gqa_as_concat
from .frontend.options import ParseOptions
from .frontend.parse import load_model_proto, parse_model, prepare_proto
from .impls.disk_cache import DiskCache, DiskCacheWarning
from .infer_request import InferRequest
from .memory import host_malloc
from .memory.config import MemoryConfig
from .memory.engine import _limit, _verbose_level
from .ops import add_layer_norm, split_tf32, tuned_conv, u8s8
from .options import OPTION_NAMES, check_flags
from .profiler import Profiler
from .request_state import feed_arg
from .run_settings import Precision, fp32_products
from .runtime.aligned import align_multiple
from .runtime.compiled import CompiledModel
from .runtime.decode_graph import ahead_rule, bucket_rule, decode_mode
from .runtime.feeds import FeedChecker, InputSpec
from .runtime.gc_pause import gc_paused
from .runtime.index_feeds import IndexFeedChecks
from .runtime.load_shapes import aligned_shapes, numel, optimal_shapes, representative_shapes, sample
from .runtime.padded_calls import pad_mode, pad_settings
from .runtime.static_mode import deterministic_mode, for_graph, static_mode
from .session_options import resolve as _session_options
from .shape import PartialShape


class InferenceSession:
    """Load an ONNX model (path, bytes or ModelProto) and run it with shapes that change.

    ``sess_options``: a SessionOptions (onnxruntime's fields and dynashape's); ``**options``:
    dynashape's fields as keywords, which win over the SessionOptions' (every field, its default
    per device and its cost: dynashape/options.py, docs/options.md). The device comes from
    ``device=`` or, as in onnxruntime, from the first available of ``providers``.
    """

    def __init__(self, model, sess_options=None, providers=None, provider_options=None,
                 device: str | torch.device | None = None, **options) -> None:
        # onnxruntime's order (model, sess_options, providers, provider_options); a device name or
        # torch.device as the second argument is dynashape's older form and still means the device
        if isinstance(sess_options, (str, torch.device)):
            if device is not None:
                raise OptionsError(f"device given twice: {sess_options!r} positionally and device={device!r}")
            device, sess_options = sess_options, None
        unknown = sorted(set(options) - OPTION_NAMES)
        if unknown:
            raise OptionsError(f"unknown option(s) {unknown}; known options are {sorted(OPTION_NAMES)} "
                               f"(docs/options.md)")
        check_flags(options)
        self._sess_options = sess_options if sess_options is not None else compat.SessionOptions()
        options = _session_options(sess_options, options)
        self.device, self._providers, self._provider_options = setup.placement(device, providers, provider_options)
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
        self.executor = setup.executor(options.get("executor"))
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
        products = fp32_products(options.get("fp32_products"))
        self.precision = Precision(bool(options.get("allow_tf32", False)), products) \
            if self.device.type == "cuda" else None
        if self.precision is not None and products != "ieee":
            split_tf32.warm(self.device)  # its kernel compiled at load, not in the first call that splits
        self._fusion = setup.flag(options.get("fusion", True), "fusion")
        self._paged_kv = setup.flag(options.get("paged_kv", False), "paged_kv")
        self._gqa_as_concat = setup.flag(options.get("gqa_as_concat", False), "gqa_as_concat")
        self.gqa_as_concat: str | None = None  # what the option did: 'rewritten', or why not (None: off)
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
        self._deterministic = setup.flag(options.get("deterministic", False), "deterministic")
        if self._deterministic:
            self._static_mode = deterministic_mode(self._static_mode, self.device)
        self._static: str | None = None  # the mode for the graph loaded (for_graph)
        setup.precompile_wanted(options.get("precompile", "auto"), None)  # a bad value fails now, not at load
        self._impl_cache_size = options.get("impl_cache_size")
        self._decode_graphs = decode_mode(options.get("decode_graphs"), self._static_mode, self.device)
        self._kv_bucket = bucket_rule(options.get("kv_bucket"))
        self._decode_ahead = 0 if self._deterministic else ahead_rule(options.get("decode_ahead"), self.device)
        self._fc_align = align_multiple(options.get("fc_align"))
        # calls padded to a bucket of their dynamic axes where the padding is proven not to reach the
        # outputs (runtime/padded_calls.py): their shapes come back, so their graphs do
        self._cache_dir = options.get("cache_dir") or os.environ.get("DYNASHAPE_CACHE_DIR")
        self._pad_inputs = pad_mode(options.get("pad_inputs"), self.device, self._static_mode, self._cache_dir)
        if self._pad_inputs:
            pad_settings()  # a bad DYNASHAPE_PAD_* is an OptionsError now, not at the first call
        # the session's integer products (None: the process's setting); its runs set it (request_state.py),
        # and so does the load, whose folding of constants and builds may compute products
        self.u8s8_saturate = u8s8.session_setting(options.get("u8s8_saturate"))
        with u8s8.saturation(self.u8s8_saturate), gc_paused(collect_after=True):
            self._load(prepare_proto(self._read()))
            self._prebuild()

    def _read(self) -> onnx.ModelProto:
        proto = load_model_proto(self._source)
        if self._gqa_as_concat:
            proto, why = gqa_as_concat(proto)
            self.gqa_as_concat = why or "rewritten"
        return expose(proto, self._extra) if self._extra else proto

    def _load(self, proto) -> None:
        """Parse and compile ``proto``: what a new session does, and what unlinking a dim name redoes."""
        # graph inputs that have an initializer: a feed may override it (the ONNX spec, onnxruntime)
        self._overridable = ({i.name for i in proto.graph.input} & {t.name for t in proto.graph.initializer})
        self._meta = compat.ModelMetadata(proto)
        self._deciders = setup.deciders(proto, self._options, self.executor, self.device)
        self._decider_names = frozenset(d[0] for d in self._deciders)
        fusion = bool(self._fusion) and self.executor == "compiled"  # the interpreter runs the graph as it is
        self.program: Program = compile_graph(parse_model(proto, self._parse), fusion=fusion, device=self.device.type,
                                             paged_kv=self._paged_kv)
        g = self.program.graph
        self._specs = [InputSpec.of(v) for v in g.inputs]
        self._check_feeds = FeedChecker(self._specs, self.device, self.max_buffer_bytes)
        # CUDA: indices fed from the host are checked before the copy (a device assert would
        # poison the process's CUDA context)
        self._check_index_feeds = IndexFeedChecks(g) if self.device.type == "cuda" else None
        self._inputs = [compat.node_arg(v) for v in g.inputs]
        self._outputs = [compat.node_arg(v) for v in g.outputs]
        # the specializations of the generated code, shared by the requests (and one per body)
        run_graph = self.program.fused if self.program.fused is not None else g
        self._static, static_after = for_graph(self._static_mode, run_graph)
        if self._deterministic:  # a CPU decoder's "decoders" became async: built in the call that asks
            self._static = deterministic_mode(self._static, self.device)
        self.compiled = (CompiledModel(run_graph, self.device, inplace_concat=self.memory.inplace_concat,
                                       static=self._static, impl_cache_size=self._impl_cache_size,
                                       decode_graphs=self._decode_graphs, kv_bucket=self._kv_bucket,
                                       decode_ahead=self._decode_ahead, static_after=static_after,
                                       fc_align=self._fc_align)
                         if self.executor == "compiled" else None)
        if self.compiled is not None and self._static is not None and self.device.type == "cuda" \
                and tuned_conv.priors_on():
            # the Triton kernels its first graphs' convolutions may take (tuned_conv.guess), compiled now
            tuned_conv.warm(self.device, run_graph)
        if self.compiled is not None and self.device.type == "cuda":
            add_layer_norm.warm(self.device, run_graph)  # its norms' kernel forms compiled now
            if self.precision is not None and self.precision.products != "ieee":
                split_tf32.warm_products(self.device, run_graph)  # and its split products' cuBLAS kernels
        if self.compiled is not None and self._cache_dir:
            self.compiled.disk_cache = DiskCache(self._cache_dir, proto, self.device)
            self.compiled.disk_cache.load()
        # (a CPU decoder's static impls come after its first calls: nothing is traced at load)
        mode = setup.precompile_wanted(self._options.get("precompile", "auto"), None if static_after else self._static)
        if self.compiled is not None and mode is not None:
            # the specializations that shapes to come will most likely need (every dynamic dim at a
            # generic value, each at 1, all at 1; "generic": the first only), traced now: a first
            # call at a new shape then finds its generated code ready. Where the model refuses them
            # all (a detector's image sides must be multiples of its stride), the same with image
            # sides at multiples of 32
            shapes = representative_shapes(self._specs)
            aligned = aligned_shapes(self._specs, shapes)
            if mode == "generic":
                shapes, aligned = shapes[:1], aligned[:1]
                if _decoder(g):  # a prompt (no past) and one-token steps come first, not the generic shape:
                    shapes = aligned = []  # the trace would be load time spent for nothing (0.4 s, ~110M Llama)
            self.compiled.precompile(shapes, retry=aligned)
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
                with u8s8.saturation(self.u8s8_saturate):
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
        with u8s8.saturation(self.u8s8_saturate):
            self._load(prepare_proto(proto))

    def _prebuild(self) -> None:
        """MIGraphX's static submodules: with static impls on, every combination of the optimal
        values that ``Dimension(..., optimals=...)`` gives the inputs is run once at load, building
        the static impls of its regions, so that a call with one of those shapes replays them
        (``select_module``: the impl cache finds the one whose symbols equal the call's); any other
        shape runs the dynamic impl."""
        if self.compiled is None or self._static is None:
            return
        optimal = optimal_shapes(self._specs)
        # on CUDA, the shapes an earlier process's calls built for (the disk cache): its graphs
        # then serve this process's first calls (a capture each, the forms read from the cache)
        cache = self.compiled.disk_cache
        cached = [c for c in (cache.shapes if cache is not None and self.device.type == "cuda" else ())
                  if c not in optimal and len(c) == len(self._specs)]
        # the largest first: the arena is planned for it once, and the others fit in it (a re-plan
        # would move the buffers that the impls built before it read)
        shapes = sorted(optimal + cached, key=lambda c: -sum(numel(s) for s in c))
        if not shapes:
            return
        req = self._default = InferRequest(self)
        req.runner.prebuild = True
        built = 0
        try:
            for combo in shapes:
                feeds = {spec.name: sample(spec, shape, self.device) for spec, shape in zip(self._specs, combo)}
                if combo in optimal:
                    req.run(None, feeds)
                    continue
                try:  # a file's shape is a hint: one this model refuses costs a warning, not the load
                    req.run(None, feeds)
                    built += 1
                except (DynashapeError, RuntimeError) as e:  # (RuntimeError: out of device memory)
                    warnings.warn(f"dynashape: the cached shape {combo} was not built at load: {e}",
                                  DiskCacheWarning, stacklevel=3)
            self.compiled.context.wait()
        finally:
            req.runner.prebuild = False
        req._stats["optimal_shapes_prebuilt"] += len(shapes) - len(cached)
        req._stats["disk_cache_shapes_prebuilt"] += built

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

    def get_inputs(self) -> list[compat.NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[compat.NodeArg]:
        return list(self._outputs)

    def create_infer_request(self) -> InferRequest:
        """A request with its own buffers and shape state; use one per thread."""
        return InferRequest(self)

    def run(self, output_names, input_feed=None, run_options=None, *, feeds=None) -> list:
        """Run with ``input_feed`` (name -> numpy array or torch tensor; ``feeds=`` is the older
        keyword); outputs follow the feeds' kind. ``run_options``: a RunOptions (terminate)."""
        input_feed = feed_arg(input_feed, feeds)
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


def _decoder(graph) -> bool:
    """A decoder fed its KV cache: a Concat of a graph input into an output (kv_appends), or an input
    named as the exporters name a past (``past_key_values.*``, ``past_key``, onnxruntime-genai's)."""
    return kv_appends(graph) > 0 or any("past" in v.name.lower() for v in graph.inputs)
