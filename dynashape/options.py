"""The one table of what a user may set: every field of ``dynashape.SessionOptions`` (dynashape's
own, which are also ``InferenceSession`` keywords, and onnxruntime's), each with its type, default
(per device where it differs), what it does and what it costs; and every environment variable the
package reads, with who it is for. docs/options.md is generated from here
(scripts/gen_options_doc.py); tests/test_options_table.py holds the table to the code.

A field's ``expect`` is what SessionOptions checks when the field is set (an OptionsError naming
the field and what was expected). A keyword of ``InferenceSession`` is checked at session
creation: a True/False one here (nothing later would notice "no" standing for False), the others
where they are used, which also take the spellings of their environment variables ("on", "0").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, NamedTuple

from .errors import OptionsError
from .ort_enums import ExecutionMode, ExecutionOrder, GraphOptimizationLevel


class Expect(NamedTuple):
    """What a field takes: ``what`` in words (the error says it), ``ok`` the test."""

    what: str
    ok: Callable[[Any], bool]


def _choice(*values) -> Expect:
    return Expect("one of " + ", ".join(repr(v) for v in values), lambda v: isinstance(v, (str, bool)) and v in values)


BOOL = Expect("True or False", lambda v: isinstance(v, bool))
STR = Expect("a string", lambda v: isinstance(v, str))


def _int(low: int, none: bool = False, what: str = "") -> Expect:
    text = what or f"an int >= {low}" + (" or None" if none else "")
    return Expect(text, lambda v: (none and v is None) or (_is_int(v) and v >= low))


def _digits(v) -> bool:
    return isinstance(v, str) and v.isdigit()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # True is an int to Python, not to a field


def _names(v) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v)


def _enum(kind) -> Expect:
    names = ", ".join(f"{kind.__name__}.{m.name}" for m in kind)
    return Expect(f"one of {names} (or its int)", lambda v: _is_int(v) and v in {int(m) for m in kind})


def _opt(default: Any, doc: str, expect: Expect, cost: str = "", env: str | None = None,
         devices: dict | None = None) -> Any:
    """A field: ``doc`` what it does, ``cost`` what it costs (time, memory, accuracy), ``env``
    the variable with which an operator overrides the default of a deployed program, ``devices``
    the default per device where it differs. A dict default is made fresh for each object."""
    meta = {"doc": doc, "expect": expect, "cost": cost, "env": env, "devices": devices or {}}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def _is_dim(v) -> bool:
    return v is None or isinstance(v, (int, str, tuple, list)) or hasattr(v, "is_static")


@dataclass(frozen=True)
class Options:
    """dynashape's fields: the keywords of ``InferenceSession`` and fields of SessionOptions."""

    # ---- shapes (docs/architecture.md "Shapes", frontend/options.py) ----
    default_dynamic_dim: Any = _opt(
        None, "Dimension for every axis the model leaves symbolic or unnamed.",
        Expect("a Dimension, an int, a (min, max) pair, text like '1..8', or None", _is_dim),
        "none; a narrower range lets buffers and buckets be planned smaller.")
    dynamic_dims: dict | None = _opt(
        None, "input name -> list of dims (int, None, (min, max), Dimension, '1..8'): per-axis ranges; may "
              "widen the model's fixed sizes' ranges.",
        Expect("a dict of input name -> list of dims, or None", lambda v: v is None or isinstance(v, dict)),
        "none.")
    dim_params: dict | None = _opt(
        None, "dim name (dim_param) -> Dimension: the range of every axis that carries that name; feeds that "
              "break it are an error.",
        Expect("a dict of dim name -> Dimension, or None", lambda v: v is None or isinstance(v, dict)),
        "none.")
    # ---- execution ----
    executor: str = _opt(
        "compiled", "'compiled' (generated code, the default) or 'interpreter' (the per-node flow, the "
                    "reference).", _choice("compiled", "interpreter"),
        "'interpreter' runs every node through the per-node flow: several times slower per call.")
    fusion: bool = _opt(
        True, "rewrite exported patterns (attention, norms, GELU/SiLU, Linear, Conv+BN, quantized chains) into "
              "single kernels.", BOOL,
        "off: more kernels per call (slower); results differ in the last bits from the fused ones.")
    paged_kv: bool = _opt(
        False, "a decoder's attention over its past inputs reads a paged KV pool fed as inputs instead "
               "(compile/paged_kv.py; the paged engine sets it): the session takes <past>.pool and paged.* inputs "
               "and writes each run's new keys and values into the pool.", BOOL,
        "the feeds change: pasts of length 0, the pools, block tables, lengths and slots.")
    gqa_as_concat: bool = _opt(
        False, "onnxruntime's GroupQueryAttention (the model builder's decoders) written out as exporters write "
               "attention, Concat(past, new) for the presents (frontend/gqa_concat.py; dynashape.generate sets "
               "it on CUDA): the decode steps then run as whole-step CUDA graphs.", BOOL,
        "padded rows follow HF's convention (left padding, masked by attention_mask), not the op's (each row's "
        "tokens first); unpadded rows compute the same.")
    decided_ifs: bool = _opt(
        True, "an If computed from a scalar input (a sample rate) decided per value seen: the model with that "
              "input made a constant, the If folded (deciding_inputs.py; small models, a few values).", BOOL,
        "a model compiled per value seen (at most a few), on its second call.", devices={"cuda": "not used"})
    allow_tf32: bool = _opt(
        False, "CUDA: let matrix products and convolutions use TF32.", BOOL,
        "on: faster products, ~1e-3 relative error.", devices={"cpu": "not used"})
    fp32_products: str = _opt(
        "auto", "CUDA, TF32 off: how float32 products by a weight (MatMul, Gemm, Linear, MatMulAdd) run. 'split': "
                "each operand split into a bfloat16 part and a remainder, three bfloat16 tensor-core products "
                "summed in float32 (~3e-6 relative, cuBLAS's float32 kernel 2-8e-7: ops/split_tf32.py); "
                "'auto': split where it is "
                "faster (on the dynamic path products of >= 4096 rows, or >= 2048 rows and N >= 2K; a static impl's "
                "build times it against the plain product); 'ieee': cuBLAS's float32 kernel always.",
        _choice("auto", "split", "ieee"),
        "split: two bfloat16 copies of each split weight kept beside it, three where K <= 1024 (one call "
        "over the parts: fewer launches; memory_stats' split_tf32_weight_bytes); "
        "BERT-base's products at 12,288 rows 0.32-0.37x the time; the error 4-15x cuBLAS float32's (3.1-3.3e-6 "
        "against 2-8e-7 relative), TF32's is 3e-4.", devices={"cpu": "not used"})
    threads: int | None = _opt(
        None, "torch CPU threads during a run (restored afterwards; process-wide).", _int(0, none=True),
        "none; more threads than free cores slows a busy machine (docs/usage.md).")
    malloc_tuning: bool = _opt(
        True, "CPU: tune glibc malloc thresholds so large buffers are not returned to the OS between runs "
              "(process-wide).", BOOL,
        "the process keeps freed large blocks (higher resident memory); off: page faults on every run.",
        "DYNASHAPE_MALLOC_TUNING", {"cuda": "not used"})
    extra_outputs: Any = _opt(
        None, "value names (or 'all') made outputs too, after the model's own (debugging).",
        Expect("'all', a list of value names, or None",
               lambda v: v is None or v == "all" or _names(v)),
        "every named value kept alive to the end of a run: more memory, fewer fusions.")
    static_impls: str = _opt(
        "auto", "'auto' (the device's default), 'async' (regions whose key comes back get a static impl: a CUDA "
                "graph, or on CPU a region compiled by inductor, built in the background), 'sync' (built in the "
                "call that asks) or 'off'.", _choice("auto", "async", "sync", "off"),
        "builds: on CUDA a capture and the timing of the forms (ms per region, off the calling thread); "
        "on CPU seconds of compiling per region (a compile process); device memory for each graph.",
        "DYNASHAPE_STATIC_IMPLS",
        {"cuda": "async", "cpu": "async for a decoder that appends to a KV cache after its first 256 calls "
                                 "(DYNASHAPE_CPU_DECODE_STATIC), else off"})
    cache_dir: Any = _opt(
        None, "folder of the disk cache (OpenVINO's CACHE_DIR): the forms CUDA static impl builds timed fastest, "
              "and the input shapes (batch buckets) calls built for, kept per model, device and torch version; "
              "a second CUDA process builds those shapes at load with those forms, so its first calls replay "
              "graphs; a bad file is ignored with a warning.",
        Expect("a folder (str or path), or None",
               lambda v: v is None or isinstance(v, str) or hasattr(v, "__fspath__")),
        "a small file per model in the folder; at load, reading it and a build per cached shape (CUDA; "
        "ResNet-50's 7 batch buckets on an H200: load 1.3 -> 2.6 s).", "DYNASHAPE_CACHE_DIR")
    deterministic: bool = _opt(
        False, "bit-reproducible runs (the same feeds give the same bits every run): on CPU static impls are "
               "built in the call that asks for them ('async' becomes 'sync'), so the call at which one replaces "
               "the dynamic path is fixed, not timing; on CUDA static impls are off (their builds keep the kernels "
               "timed fastest), and so decode graphs unless decode_graphs='on'; decode_ahead is off.", BOOL,
        "CPU: the call that builds waits for its build; CUDA: no graphs (every call launches its kernels).")
    impl_cache_size: int = _opt(
        300, "static impls kept (LRU); 0 keeps all.", _int(0, none=True),
        "each impl holds its graph's or compiled region's memory; a smaller cache rebuilds more often.",
        "DYNASHAPE_IMPL_CACHE")
    decode_graphs: Any = _opt(
        "auto", "whole decode steps (KV appends + attention over KV storages of a bucketed capacity) as one "
                "static impl, replayed every step: 'auto', 'on' (CPU too, no graph) or 'off'.",
        _choice("auto", "on", "off"),
        "KV storages of the bucket's capacity (up to kv_bucket positions more than the sequence holds); a "
        "capture per bucket.", devices={"cuda": "on with static impls", "cpu": "off"})
    kv_bucket: Any = _opt(
        "256", "capacity of those KV storages for a length n: the next multiple of an int (a multiple of 16), "
               "'pow2' or 'openvino' (n + 128 + n % 64, rounded up to 16).",
        Expect("a positive multiple of 16 (int or digits), 'pow2' or 'openvino'",
               lambda v: v in ("pow2", "openvino") or ((_digits(v) or _is_int(v)) and int(v) > 0 and int(v) % 16 == 0)),
        "larger: fewer captures, more spare KV memory; smaller: the reverse.", "DYNASHAPE_KV_BUCKET")
    decode_ahead: Any = _opt(
        "auto", "positions before the end of a KV bucket at which the next bucket's graph is built on a "
                "background thread while the current one serves; 'off': built in the call that passes the end.",
        Expect("'auto', 'off' or a number of positions >= 0",
               lambda v: v in ("auto", "off") or _digits(v) or (_is_int(v) and v >= 0)),
        "a thread capturing beside the calls; while it captures, torch.cuda.synchronize() and empty_cache() "
        "elsewhere in the process wait for it (CUDA forbids them during a capture).",
        devices={"cuda": "64", "cpu": "off"})
    fc_align: int = _opt(
        0, "OpenVINO's FC fake alignment: static impls of a region that works row by row along the batch (a "
           "decode step's projections) keyed by the batch rounded up to this multiple (up to 64), so one impl "
           "serves several batch sizes; 0: off. Used only where static impls are on (runtime/aligned.py, "
           "benchmarks/aligned.py).",
        Expect("an int from 0 (off) to 64", lambda v: _is_int(v) and 0 <= v <= 64),  # aligned.MAX_ALIGNED
        "fewer builds and less graph memory (decoder, batch 1-8, H200: 328 -> 181 builds, 54.5 -> 43.5 MiB), a "
        "slower step (5% on CUDA, 14% on CPU: padded rows computed, a copy per replay).", "DYNASHAPE_FC_ALIGN")
    pad_inputs: Any = _opt(
        "auto", "calls padded with zeros to a bucket of their dynamic axes (the next power of two) and their "
                "outputs cut back, where the model is proven to ignore the padding (compile/pad_proof.py: an "
                "encoder under its attention mask); a random (batch, seq) per call then replays a handful of "
                "graphs: 'auto' (on CUDA with static impls and a cache_dir: the next process builds the buckets "
                "at load; a first process builds them beside its calls, where they landed too late to pay in 150 "
                "back-to-back calls), 'on', 'off'.", _choice("auto", "on", "off"),
        "padded rows computed (up to 2x the work per padded axis; calls above DYNASHAPE_PAD_MAX_ELEMENTS are not "
        "padded); a graph per bucket, built on the worker beside the calls.", "DYNASHAPE_PAD_INPUTS",
        devices={"cuda": "on with static impls and a cache_dir", "cpu": "off"})
    precompile: Any = _opt(
        "auto", "trace the likely specializations at load (every dynamic dim generic, each at 1, all at 1) so a "
                "first call at a new shape skips the trace; where the model refuses those shapes, the same with "
                "the sides of images (dims past the second axis) at multiples of 32.", _choice("auto", True, False),
        "load time (CPU, tiny BERT: load 55 -> 389 ms, first calls 87/67 -> 6/6 ms; the generic one only, "
        "YOLOv8n: load 142 -> 215 ms, first call at 608x640 171 -> 88 ms).",
        devices={"cuda": "on", "cpu": "the generic specialization only, none for a decoder fed its past (all "
                                       "where static impls are)"})
    # ---- integer products ----
    u8s8_saturate: Any = _opt(
        None, "uint8 x int8 products (MatMulInteger, QLinearMatMul, the quantized com.microsoft ops): True "
              "saturates pair sums to int16 as onnxruntime does on x86 CPUs without VNNI, bit for bit; 'auto' does "
              "what this CPU's onnxruntime does (a one-product probe, once a process); False: the exact product "
              "the spec defines; None: the process's setting (ops.linalg.set_u8s8_saturation, else the "
              "variable's, else False). Holds for this session's runs only.",
        Expect("'auto', True, False or None", lambda v: v is None or isinstance(v, bool) or v == "auto"),
        "saturating: those products leave the native 8-bit kernels for an emulation (several times slower); "
        "'auto': one onnxruntime session at creation, once a process.", "DYNASHAPE_U8S8_SATURATE")
    # ---- memory (docs/memory.md) ----
    allocator: Any = _opt(
        "direct", "'direct' (driver allocations), 'torch' (torch's caching allocator) or an object following "
                  "memory/allocators.py.",
        Expect("'direct', 'torch' or an allocator object",
               lambda v: v in ("direct", "torch") or not isinstance(v, str)),
        "'torch': the caching allocator keeps freed blocks (more memory held, fewer driver calls).")
    device_memory_limit: int | None = _opt(
        None, "bytes of device memory the session may hold (device buffers beyond it go to host memory).",
        _int(1, none=True, what="a positive number of bytes, or None"),
        "buffers past the limit live in host memory: slower to reach from the device.")
    memory_pool: bool = _opt(
        True, "interpreter: reuse buffers whose lifetimes do not overlap.", BOOL,
        "off: an allocation per node output (more memory, more allocator calls).")
    memory_deps: str = _opt(
        "in_order", "interpreter: how buffer lifetimes are computed ('in_order' or 'out_of_order').",
        _choice("in_order", "out_of_order"), "'out_of_order': a longer analysis at load, more reuse.")
    preallocation: Any = _opt(
        None, "ShapePredictor settings 'iters max_bytes max_count growth' (e.g. '10 16384 2 1.1'); '0 0 0 1.0' "
              "turns it off.",
        Expect("a string 'iters max_bytes max_count growth', a dict of those fields, or None",
               lambda v: v is None or isinstance(v, (str, dict)) or hasattr(v, "enabled")),
        "buffers grown ahead hold up to growth x their size.", "DYNASHAPE_MEM_PREALLOCATION_OPTIONS")
    inplace_concat: bool = _opt(
        True, "producers write into their slot of a Concat's buffer; a KV cache grows in place.", BOOL,
        "spare KV room (kv_growth); off: the whole past copied at every step.")
    kv_growth: str = _opt(
        "geometric", "spare room of in-place KV storages: 'geometric' (a quarter of the length, at least 128) or "
                     "'openvino' (128 + i % 64).", _choice("geometric", "openvino"),
        "'geometric': up to ~25% spare memory, O(log n) grows; 'openvino': a grow every ~128 steps.")
    verbose: int | None = _opt(
        None, "log level of the memory engine and static impls (0, 1, 2).", _int(0, none=True, what="0, 1, 2 or None"),
        "a log line per allocation (2) or per static-impl decision (1).", "DYNASHAPE_VERBOSE")
    # ---- limits (docs/reliability.md) ----
    max_buffer_bytes: int | None = _opt(
        None, "refuse (MemoryLimitError) any buffer larger than this, and any feed whose copy would be; default: "
              "what the machine holds.", _int(1, none=True, what="a positive number of bytes, or None"), "none.")
    max_loop_iterations: int | None = _opt(
        None, "stop a Loop after this many iterations (LimitExceededError).",
        _int(1, none=True, what="a positive int, or None"), "none.")
    # ---- profiling: onnxruntime's fields of the same names ----
    enable_profiling: bool = _opt(
        False, "record a chrome trace per node; end_profiling() writes it (onnxruntime's field too).", BOOL,
        "runs use the per-node flow (the interpreter): several times slower.")
    profile_file_prefix: str = _opt(
        "onnxruntime_profile_", "file name prefix of end_profiling()'s trace (onnxruntime's field too).", STR,
        "none.")


@dataclass(frozen=True)
class OrtOptions:
    """onnxruntime's SessionOptions fields (besides the profiling ones above): what each does here."""

    intra_op_num_threads: int = _opt(0, "threads= when > 0 (0: torch's default).", _int(-1), "as threads=.")
    inter_op_num_threads: int = _opt(0, "recorded, no effect: torch runs a graph's kernels in order.", _int(-1))
    log_severity_level: int = _opt(
        -1, "0 (verbose) / 1 (info): verbose=2 / 1; 2-4 (warning and up) and -1: the default, quiet.",
        Expect("an int from -1 to 4", lambda v: _is_int(v) and -1 <= v <= 4))
    log_verbosity_level: int = _opt(0, "recorded, no effect.", _int(0))
    logid: str = _opt("", "recorded, no effect.", STR)
    graph_optimization_level: int = _opt(
        GraphOptimizationLevel.ORT_ENABLE_ALL, "ORT_DISABLE_ALL: fusion=False; the other levels keep fusion on.",
        _enum(GraphOptimizationLevel), "as fusion=.")
    execution_mode: int = _opt(ExecutionMode.ORT_SEQUENTIAL, "recorded, no effect: there is no parallel executor.",
                               _enum(ExecutionMode))
    execution_order: int = _opt(ExecutionOrder.DEFAULT, "recorded, no effect.", _enum(ExecutionOrder))
    enable_cpu_mem_arena: bool = _opt(True, "recorded, no effect (the memory options are dynashape's).", BOOL)
    enable_mem_pattern: bool = _opt(True, "recorded, no effect (the memory options are dynashape's).", BOOL)
    enable_mem_reuse: bool = _opt(True, "recorded, no effect (the memory options are dynashape's).", BOOL)
    use_deterministic_compute: bool = _opt(False, "True: deterministic=True.", BOOL, "as deterministic=.")
    use_per_session_threads: bool = _opt(True, "recorded, no effect.", BOOL)
    optimized_model_filepath: str = _opt("", "recorded, no effect: nothing is written.", STR)
    free_dimension_overrides_by_name: dict = _opt(
        {}, "what add_free_dimension_override_by_name(name, v) set: dim_params={name: Dimension(v, v)}.",
        Expect("a dict of dim name -> int", lambda v: isinstance(v, dict)), "as dim_params=.")
    free_dimension_overrides_by_denotation: dict = _opt(
        {}, "what add_free_dimension_override_by_denotation set: recorded, no effect (denotations are not read).",
        Expect("a dict of denotation -> int", lambda v: isinstance(v, dict)))


OPTION_FIELDS = {f.name: f for f in fields(Options)}
ORT_FIELDS = {f.name: f for f in fields(OrtOptions)}
OPTION_NAMES = frozenset(OPTION_FIELDS)


def check(name: str, value) -> None:
    """An OptionsError when ``value`` is not what the field ``name`` takes."""
    f = OPTION_FIELDS.get(name) or ORT_FIELDS[name]
    expect = f.metadata["expect"]
    if not expect.ok(value):
        raise OptionsError(f"SessionOptions.{name} = {value!r}: expected {expect.what}")


def check_flags(options: dict) -> None:
    """An OptionsError for a keyword of a True/False field given anything else."""
    for name, value in options.items():
        if OPTION_FIELDS[name].metadata["expect"] is BOOL and not isinstance(value, bool):
            raise OptionsError(f"{name}={value!r}: expected True or False")


# Who an environment variable is for: an operator overriding a deployed program without a code
# change; a measurement (an A/B switch that benchmarks or tests set; not a user setting); a
# debugging aid; or the system's own variables, which dynashape honours.
ROLES = ("operator", "experiment", "debugging", "system")

# The environment variables the package reads that no field above names (a field's own variable
# is an operator's override of its default).
ENVIRONMENT: dict[str, tuple[str, str]] = {
    # ---- debugging ----
    "DYNASHAPE_TRACEBACK": ("debugging", "'1': the CLI raises an unexpected error with its traceback instead of "
                                         "one line."),
    "DYNASHAPE_DUMP_CODE": ("debugging", "a directory where each specialization's generated code is written, or "
                                         "'1' (also '-', 'stderr') to log it."),
    # ---- execution ----
    "DYNASHAPE_MAX_SPECIALIZATIONS": ("operator", "specializations a compiled session generates code for "
                                                  "(default 16); calls beyond run the interpreter."),
    "DYNASHAPE_CPU_DECODE_STATIC": ("operator", "calls a CPU decoder session makes before static_impls='auto' "
                                                "builds its static impls (default 256; 0: never)."),
    "DYNASHAPE_NATIVE": ("operator", "'0' (also 'off', 'false', 'no'): torch's kernels instead of the C ones."),
    "DYNASHAPE_CACHE": ("operator", "directory of built C kernels' cache (default $XDG_CACHE_HOME/dynashape)."),
    # ---- measurements (benchmarks/ and tests set them) ----
    "DYNASHAPE_PAD_BUCKETS": ("experiment", "buckets of padded calls (runtime/padded_calls.py): 'pow2' (default) or "
                                            "'half' (also 1.5x between powers of two)."),
    "DYNASHAPE_PAD_MAX_ELEMENTS": ("experiment", "the largest product of a padded call's padded axes (default 8192: "
                                                 "BERT-base's calls above are bound by their kernels)."),
    "DYNASHAPE_TOKEN_BUCKETS": ("experiment", "token regions of transformers (codegen/tokens.py): '0' (default: off, "
                                              "measured slower), 'auto' (on CUDA) or '1' (any device, as the CPU "
                                              "tests run them)."),
    "DYNASHAPE_CPU_STATIC": ("experiment", "what a CPU static impl is: 'inductor' (default: the region compiled to "
                                           "C++) or 'specialized' (its source with the key as literals; builds in "
                                           "ms, which the tests use)."),
    "DYNASHAPE_STATIC_FORMS": ("experiment", "'1' (default): static builds time the forms of products and "
                                             "convolutions and keep the fastest; '0': the ops' own calls only."),
    "DYNASHAPE_FORM_PRIORS": ("experiment", "'1' (default): a build that times nothing (a region's first graph) "
                                            "takes each convolution's form from a rule measured on the H200 "
                                            "(ops/tuned_conv.py guess); '0': the ops' own calls."),
    "DYNASHAPE_RETUNE": ("experiment", "when a CUDA region's tuned rebuild times its forms: 'idle' (default: "
                                       "only while the calls pause, giving way before each key once a call comes) "
                                       "or 'beside' (while they run; measured slower, impls/context.py)."),
    "DYNASHAPE_CONV_SPLIT": ("experiment", "'1' (default): a CUDA static build times each float32 convolution's "
                                           "product forms as split bfloat16 products too, where fp32_products "
                                           "allows (ops/tuned_conv.py); '0': not (A/B runs)."),
    "DYNASHAPE_LOAD_COLLECT": ("operator", "objects a session's load made from which it ends with a full garbage "
                                           "collection (runtime/gc_pause.py; default 20000, '0': never): without "
                                           "it a call soon after paid a scan of the whole process."),
    "DYNASHAPE_BUILD_COURTESY": ("experiment", "'1' (default): a CUDA background build pauses before each torch "
                                               "call while a call of its session is launched (impls/context.py "
                                               "Courtesy); '0': they share the interpreter (measured slower)."),
    "DYNASHAPE_CUDNN_BENCHMARK_LIMIT": ("experiment", "cuDNN algorithms a static build times per convolution "
                                                      "(default 10; 0: all)."),
    "DYNASHAPE_SPLIT_PARTS": ("experiment", "'bf16' (default): a split product's parts in bfloat16, three "
                                            "bfloat16 tensor-core products with float32 output; 'tf32': TF32 "
                                            "parts (ops/split_tf32.py)."),
    "DYNASHAPE_SPLIT_ONE_CALL_K": ("experiment", "K up to which a split TF32 product (fp32_products) is one "
                                                 "TF32 call over three parts (default 1024; 0: never, the "
                                                 "two-part form with its pieces along K)."),
    "DYNASHAPE_STEP_FUSIONS": ("experiment", "'0' turns off the fusions inside a whole decode step "
                                             "(benchmarks/decode_fusions.py)."),
    "DYNASHAPE_FUSE_CONV_RELU": ("experiment", "'1' / '0' forces the Conv+Relu fusion on / off (default: on on "
                                               "CUDA, where it was measured faster, off elsewhere)."),
    "DYNASHAPE_FUSE_CONV_ACT": ("experiment", "'0' turns off oneDNN convolutions with their activation as a "
                                              "post-op (CPU)."),
    "DYNASHAPE_CHANNELS_LAST": ("experiment", "'1' / '0' forces the channels-last layout pass on / off (default: "
                                              "by device and dtype)."),
    "DYNASHAPE_CPU_PACKED_WEIGHTS": ("experiment", "'1' / '0' / 'auto' (default: on except on Intel CPUs): "
                                                   "products by large constant fp32 weights through oneDNN with the "
                                                   "weight packed once."),
    "DYNASHAPE_NBITS_PACKED": ("operator", "'1': MatMulNBits with 4-bit weights and float16/bfloat16 A on CUDA "
                                           "reads the packed weight (a quarter of the dequantized copy's memory; "
                                           "slower on large layers today, benchmarks/nbits_cuda.py)."),
    "DYNASHAPE_NBITS_ROWS": ("operator", "'0': MatMulNBits on CUDA over a decode step's few rows (at most 8) takes "
                                         "the dequantized copy and a product rather than one Triton kernel reading "
                                         "the packed weight (ops/nbits_triton.py rows; for A/B measurements)."),
    # ---- the system's ----
    "XDG_CACHE_HOME": ("system", "the standard cache root, under which dynashape/native holds built C kernels "
                                 "(default ~/.cache)."),
    "TRITON_INTERPRET": ("system", "Triton's own: '1' runs its kernels on the CPU in its interpreter; the paged "
                                   "attention's kernels then serve CPU tensors too (their tests without a GPU)."),
    "CC": ("system", "the C compiler that builds the native kernels (default: cc, gcc or clang on PATH)."),
    "COLUMNS": ("system", "the width of the CLI's tables written to a file or pipe (rich reads it; unset: 200 "
                          "columns)."),
}


def default_of(f):
    """A field's default value (a fresh dict where the default is one)."""
    return f.default_factory() if f.default is MISSING else f.default


def device_defaults(f) -> str:
    """A field's default per device, where it differs, in words."""
    return "; ".join(f"{dev}: {text}" for dev, text in f.metadata["devices"].items())


def describe() -> str:
    """One line per field: name, default, environment variable, what it does; then one per
    environment variable that no field names."""
    lines = []
    for f in list(OPTION_FIELDS.values()) + list(ORT_FIELDS.values()):
        env = f" [{f.metadata['env']}]" if f.metadata.get("env") else ""
        per = f" ({device_defaults(f)})" if f.metadata["devices"] else ""
        lines.append(f"{f.name} = {default_of(f)!r}{per}{env}: {f.metadata['doc']}")
    lines.append("environment variables of no field:")
    lines += [f"{name} ({role}): {doc}" for name, (role, doc) in ENVIRONMENT.items()]
    return "\n".join(lines)
