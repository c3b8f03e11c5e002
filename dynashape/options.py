"""Every keyword option of ``InferenceSession``, in one place: its type, default, environment
variable (where one exists) and what it does. ``InferenceSession`` accepts exactly these names
(anything else is an OptionsError listing them); ``dynashape.options.describe()`` prints them.

The values are checked where they are used, at session creation (an OptionsError naming the
option); this table is their documentation and the list the session checks names against.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _opt(default: Any, doc: str, env: str | None = None) -> Any:
    return field(default=default, metadata={"doc": doc, "env": env})


@dataclass(frozen=True)
class Options:
    # ---- shapes (docs/architecture.md "Shapes", frontend/options.py) ----
    default_dynamic_dim: Any = _opt(None, "Dimension for every axis the model leaves symbolic or unnamed.")
    dynamic_dims: dict | None = _opt(None, "input name -> list of dims (int, None, (min, max), Dimension, "
                                           "'1..8'): per-axis ranges; may widen the model's fixed sizes' ranges.")
    dim_params: dict | None = _opt(None, "dim name (dim_param) -> Dimension: the range of every axis that "
                                         "carries that name; feeds that break it are an error.")
    # ---- execution ----
    executor: str = _opt("compiled", "'compiled' (generated code, the default) or 'interpreter' (the per-node "
                                     "flow, the reference).", "DYNASHAPE_EXECUTOR")
    fusion: bool = _opt(True, "rewrite exported patterns (attention, norms, GELU/SiLU, Linear, Conv+BN, "
                              "quantized chains) into single kernels.", "DYNASHAPE_FUSION")
    decided_ifs: bool = _opt(True, "an If computed from a scalar input (a sample rate) decided per value seen: "
                                   "the model with that input made a constant, the If folded (deciding_inputs.py; "
                                   "small models, a few values).")
    allow_tf32: bool = _opt(False, "CUDA: let matrix products and convolutions use TF32 (faster, ~1e-3 relative).")
    threads: int | None = _opt(None, "torch CPU threads during a run (restored afterwards; process-wide).")
    malloc_tuning: bool = _opt(True, "CPU: tune glibc malloc thresholds so large buffers are not returned to "
                                     "the OS between runs (process-wide; DYNASHAPE_MALLOC_TUNING=0 keeps every "
                                     "session from tuning them).", "DYNASHAPE_MALLOC_TUNING")
    extra_outputs: Any = _opt(None, "value names (or 'all') made outputs too, after the model's own (debugging).")
    static_impls: str = _opt("auto", "'auto' (CUDA graphs of regions on CUDA, their products and convolutions "
                                     "in the forms timed fastest; on CPU async for a decoder that appends to a "
                                     "KV cache, DYNASHAPE_CPU_DECODE_STATIC=0 turns that off, else off), 'async', "
                                     "'sync' (on CPU: regions compiled by inductor, DYNASHAPE_CPU_STATIC) or 'off'.",
                             "DYNASHAPE_STATIC_IMPLS")
    cache_dir: Any = _opt(None, "folder of the disk cache (OpenVINO's CACHE_DIR): the forms CUDA static impl "
                                "builds timed fastest, kept per model, device and torch version, so that a "
                                "second process's builds skip the timing; a bad file is ignored with a warning.",
                          "DYNASHAPE_CACHE_DIR")
    deterministic: bool = _opt(False, "bit-reproducible runs (the same feeds give the same bits every run): on "
                                      "CPU static impls are built in the call that asks for them ('async' "
                                      "becomes 'sync'), so the call at which one replaces the dynamic path is "
                                      "fixed, not timing; on CUDA static impls are off (their builds keep the "
                                      "kernels timed fastest), and so decode graphs unless decode_graphs='on'; "
                                      "decode_ahead is off.")
    impl_cache_size: int = _opt(300, "static impls kept (LRU); 0 keeps all.", "DYNASHAPE_IMPL_CACHE")
    decode_graphs: Any = _opt("auto", "whole decode steps (KV appends + attention over KV storages of a "
                                      "bucketed capacity) as one static impl, replayed every step: 'auto' (with "
                                      "static impls on CUDA), 'on' (CPU too, no graph) or 'off'.",
                              "DYNASHAPE_DECODE_GRAPHS")
    kv_bucket: Any = _opt("256", "capacity of those KV storages for a length n: the next multiple of an int "
                                 "(a multiple of 16), 'pow2' or 'openvino' (n + 128 + n % 64, rounded up to 16).",
                          "DYNASHAPE_KV_BUCKET")
    decode_ahead: Any = _opt("auto", "positions before the end of a KV bucket at which the next bucket's graph "
                                     "is built on a background thread while the current one serves; 'auto': 64 "
                                     "on CUDA, off elsewhere; 'off': built in the call that passes the end. While "
                                     "the thread captures, torch.cuda.synchronize() and empty_cache() elsewhere in "
                                     "the process wait for it (CUDA forbids them during a capture).",
                             "DYNASHAPE_DECODE_AHEAD")
    precompile: Any = _opt("auto", "trace the likely specializations at load (every dynamic dim generic, each "
                                   "at 1, all at 1) so a first call at a new shape skips the trace; 'auto': "
                                   "when static impls are on (measured on CPU, tiny BERT: load 55 -> 389 ms, "
                                   "first calls 87/67 -> 6/6 ms).")
    # ---- memory (docs/memory.md) ----
    allocator: Any = _opt("direct", "'direct' (driver allocations), 'torch' (torch's caching allocator) or an "
                                    "object following memory/allocators.py.")
    device_memory_limit: int | None = _opt(None, "bytes of device memory the session may hold (device buffers "
                                                 "beyond it go to host memory).")
    memory_pool: bool = _opt(True, "interpreter: reuse buffers whose lifetimes do not overlap.")
    memory_deps: str = _opt("in_order", "interpreter: how buffer lifetimes are computed ('in_order' or "
                                        "'out_of_order').")
    preallocation: Any = _opt(None, "ShapePredictor settings 'iters max_bytes max_count growth' "
                                    "(e.g. '10 16384 2 1.1'); '0 0 0 1.0' turns it off.",
                              "DYNASHAPE_MEM_PREALLOCATION_OPTIONS")
    inplace_concat: bool = _opt(True, "producers write into their slot of a Concat's buffer; a KV cache grows "
                                      "in place.")
    kv_growth: str = _opt("geometric", "spare room of in-place KV storages: 'geometric' or 'openvino' "
                                       "(128 + i % 64).")
    verbose: int | None = _opt(None, "log level of the memory engine and static impls (0, 1, 2).",
                               "DYNASHAPE_VERBOSE")
    # ---- limits (docs/reliability.md) ----
    max_buffer_bytes: int | None = _opt(None, "refuse (MemoryLimitError) any buffer larger than this, and any "
                                              "feed whose copy would be; default: what the machine holds.")
    max_loop_iterations: int | None = _opt(None, "stop a Loop after this many iterations (LimitExceededError).")
    # ---- onnxruntime's SessionOptions, as keywords (dynashape.compat) ----
    enable_profiling: bool = _opt(False, "record a chrome trace per node (runs use the per-node flow); "
                                         "end_profiling() writes it.")
    profile_file_prefix: str = _opt("onnxruntime_profile_", "file name prefix of end_profiling()'s trace.")


OPTION_NAMES = frozenset(f.name for f in fields(Options))

# The environment variables the package reads that no option above names: switches for
# measurements and debugging, and where to find things. tests/test_options_table.py checks that
# these and the options' variables are exactly the ones the code reads.
ENVIRONMENT: dict[str, str] = {
    # ---- debugging ----
    "DYNASHAPE_TRACEBACK": "'1': the CLI raises an unexpected error with its traceback instead of one line.",
    "DYNASHAPE_DUMP_CODE": "a directory where each specialization's generated code is written, or '1' "
                           "(also '-', 'stderr') to log it.",
    # ---- execution ----
    "DYNASHAPE_MAX_SPECIALIZATIONS": "specializations a compiled session generates code for (default 16); "
                                     "calls beyond run the interpreter.",
    "DYNASHAPE_CPU_DECODE_STATIC": "calls a CPU decoder session makes before static_impls='auto' builds its "
                                   "static impls (default 256; 0: never).",
    "DYNASHAPE_CONV_BUCKETS": "'1' (default) CUDA static impls of convolutional regions keyed by batch "
                              "buckets (1, 2, 4, 8, then multiples of 8: one graph serves every batch of its "
                              "bucket); '0': one per batch value.",
    "DYNASHAPE_CPU_STATIC": "what a CPU static impl is: 'inductor' (default: the region compiled to C++) or "
                            "'specialized' (its source with the key as literals).",
    "DYNASHAPE_STATIC_FORMS": "'1' (default): static builds time the forms of products and convolutions and "
                              "keep the fastest; '0': the ops' own calls only (A/B measurements).",
    "DYNASHAPE_CUDNN_BENCHMARK_LIMIT": "cuDNN algorithms a static build times per convolution (default 10; "
                                       "0: all).",
    "DYNASHAPE_FC_ALIGN": "a multiple (0-64, default 0: off) that a region working row by row along the batch "
                          "rounds its batch up to, so one static impl serves several batch sizes.",
    "DYNASHAPE_STEP_FUSIONS": "'0' turns off the fusions inside a whole decode step (A/B measurements).",
    "DYNASHAPE_FUSE_CONV_RELU": "'1' / '0' forces the Conv+Relu fusion on / off (default: on on CUDA, where "
                                "it was measured faster, off elsewhere).",
    "DYNASHAPE_FUSE_CONV_ACT": "'0' turns off oneDNN convolutions with their activation as a post-op (CPU).",
    "DYNASHAPE_CHANNELS_LAST": "'1' / '0' forces the channels-last layout pass on / off (default: by device "
                               "and dtype).",
    "DYNASHAPE_CPU_PACKED_WEIGHTS": "'1' / '0' / 'auto' (default: on except on Intel CPUs): products by large "
                                    "constant fp32 weights through oneDNN with the weight packed once.",
    "DYNASHAPE_U8S8_SATURATE": "'1': 8-bit products saturate pair sums to int16 as onnxruntime does on x86 "
                               "CPUs without VNNI (default '0': the exact product the spec defines; read at "
                               "import).",
    # ---- native kernels (ops/native.py) ----
    "DYNASHAPE_NATIVE": "'0' (also 'off', 'false', 'no'): torch's kernels instead of the C ones.",
    "DYNASHAPE_CACHE": "directory of built C kernels' cache (default $XDG_CACHE_HOME/dynashape).",
    "XDG_CACHE_HOME": "the standard cache root, under which dynashape/native holds built C kernels "
                      "(default ~/.cache).",
    "CC": "the C compiler that builds the native kernels (default: cc, gcc or clang on PATH).",
    # ---- the CLI ----
    "COLUMNS": "the width of the CLI's tables written to a file or pipe (rich reads it; unset: 200 columns).",
}


def describe() -> str:
    """One line per option: name, default, environment variable, what it does; then one per
    environment variable that no option names."""
    lines = []
    for f in fields(Options):
        env = f" [{f.metadata['env']}]" if f.metadata.get("env") else ""
        lines.append(f"{f.name} = {f.default!r}{env}: {f.metadata['doc']}")
    lines.append("environment variables of no option:")
    lines += [f"{name}: {doc}" for name, doc in ENVIRONMENT.items()]
    return "\n".join(lines)
