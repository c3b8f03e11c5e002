"""The compile pipeline: a plain list of named passes, each timed and dumpable."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from ..ir import Graph
from ..ir.copy import copy_graph
from .channels_last import channels_last_pass
from .common_subexpressions import eliminate_common_subexpressions
from .contrib_types import contrib_types
from .cpu_packed_linear import cpu_packed_linear
from .dead_nodes import remove_dead_nodes
from .drop_repeated_fake_quant import drop_repeated_fake_quant
from .flush_subnormal_weights import flush_subnormal_weights
from .fold_conv_add import fold_conv_add
from .fold_conv_bn import fold_conv_bn
from .fold_conv_input_affine import fold_conv_input_affine
from .fold_conv_scale import fold_conv_scale
from .fuse_activations import fuse_gelu, fuse_hard_activations, fuse_silu
from .fuse_add_layer_norm import fuse_add_layer_norm
from .fuse_attention import fuse_attention
from .fuse_conv_activation import fuse_conv_activation
from .fuse_conv_relu import fuse_conv_relu
from .fuse_dynamic_quant import fuse_dynamic_quant
from .fuse_gather_dequant import fuse_gather_dequant
from .fuse_linear import fuse_linear
from .fuse_norms import fuse_layer_norm, fuse_rms_norm
from .fuse_parallel_matmul import fuse_parallel_matmul
from .fuse_qdq import fuse_qdq
from .fuse_residual import fuse_gated_matmul_add, fuse_matmul_add, fuse_norm_linear, fuse_silu_mul
from .fuse_rotary import fuse_rotary
from .fuse_squeeze_excite import fuse_squeeze_excite
from .hoist_loop_invariants import hoist_loop_invariants
from .inline_if import inline_constant_if
from .linear_layout import linear_layout_pass
from .paged_kv import paged_kv as paged_kv_pass
from .program import Program
from .propagate import propagate
from .resolve_ops import resolve_ops
from .shape_subgraphs import mark_shape_subgraphs
from .skip_identities import skip_identities
from .softmax_before_transpose import softmax_before_transpose

log = logging.getLogger(__name__)

PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("resolve_ops", resolve_ops),
    ("contrib_types", contrib_types),  # before propagate, whose values then have their dtypes
    ("propagate", propagate),  # shape inference + constant folding in one forward walk
    ("inline_constant_if", inline_constant_if),
    ("remove_dead_nodes", remove_dead_nodes),
    ("mark_shape_subgraphs", mark_shape_subgraphs),
]


# Fusion: exported patterns -> single kernels, for the generated code. The interpreter runs the
# graph as it was (the reference the fused graph is tested against).
FUSION_PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("skip_identities", skip_identities),  # first: an Identity between two nodes hides their pattern
    ("hoist_loop_invariants", hoist_loop_invariants),  # before the patterns: a hoisted chain fuses where it lands
    ("fuse_dynamic_quant", fuse_dynamic_quant),  # before fuse_linear, which would take the Mul + Add tail
    ("fuse_qdq", fuse_qdq),
    ("fuse_gather_dequant", fuse_gather_dequant),  # after fuse_qdq, which takes Q -> DQ pairs
    ("drop_repeated_fake_quant", drop_repeated_fake_quant),
    ("fold_conv_scale", fold_conv_scale),  # first: the Add after the Mul then folds as the bias
    ("fold_conv_add", fold_conv_add),  # before fold_conv_bn: a BatchNormalization after the Add folds too
    ("fold_conv_bn", fold_conv_bn),
    ("fuse_attention", fuse_attention),
    ("softmax_before_transpose", softmax_before_transpose),  # after: only softmaxes left unfused
    ("fuse_layer_norm", fuse_layer_norm),  # first: its inner d / sqrt(mean(d^2) + eps) looks like an RMSNorm
    ("fuse_rms_norm", fuse_rms_norm),
    ("fuse_gelu", fuse_gelu),
    ("fuse_silu", fuse_silu),
    ("fuse_hard_activations", fuse_hard_activations),
    # after the activations: GELU's 0.5 * x * (...) would lose its 0.5 to the convolution after it
    ("fold_conv_input_affine", fold_conv_input_affine),
    ("fuse_rotary", fuse_rotary),
    ("fuse_linear", fuse_linear),
    ("fuse_parallel_matmul", fuse_parallel_matmul),
    # last: the patterns above were written against the exporters' graphs as they are; what they
    # leave repeated (per-layer masks and position ranges) is computed once
    ("eliminate_common_subexpressions", eliminate_common_subexpressions),
    ("remove_dead_nodes", remove_dead_nodes),
]


def _run(passes, graph: Graph, timings: dict, dump_after: set[str] | None) -> Graph:
    for name, fn in passes:
        t0 = time.perf_counter()
        graph = fn(graph)
        timings[name] = time.perf_counter() - t0
        log.debug("pass %s: %.2f ms, %d nodes", name, timings[name] * 1e3, len(graph.nodes))
        if dump_after and name in dump_after:
            log.info("after %s:\n%s", name, Program(graph, timings))
    return graph



# The residual fusions pay where kernels are launched (an H100 decode step: 2-6% faster, 3 kernels
# fewer per decoder layer); on CPU the tiny decoder's step was 3-4% slower with them (addmm and the
# two-op SiluMul against the separate calls into arena buffers): CUDA only.
RESIDUAL_FUSION_DEVICES = ("cuda",)
# hoist_loop_invariants: measured and tested on CPU sessions (SLANet 604 -> 488 ms); on CUDA checked
# by benchmarks/loop_hoist_cuda_check.py on an H200 (2026-11-29: flat and nested Loops over changing
# shapes and trip counts within 1.8e-7 of onnxruntime, the body's product and its readers hoisted)
HOIST_DEVICES = ("cpu", "cuda")
# cuDNN's fused convolution epilogues (ops/conv_act.py); on CPU the op would be the same two kernels.
# DYNASHAPE_FUSE_CONV_RELU=0 / 1 forces the pass off / on (to measure it)
CONV_RELU_DEVICES = ("cuda",)


def device_passes(device: str) -> list[tuple[str, Callable[[Graph], Graph]]]:
    """Fusion passes whose choice depends on the device (measured there): after the others."""
    residual = [("fuse_silu_mul", fuse_silu_mul), ("fuse_matmul_add", fuse_matmul_add),
                ("fuse_gated_matmul_add", fuse_gated_matmul_add), ("fuse_norm_linear", fuse_norm_linear),
                ("fuse_add_layer_norm", fuse_add_layer_norm)]
    if str(device).split(":")[0] not in RESIDUAL_FUSION_DEVICES:
        residual = []
    conv_on = os.environ.get("DYNASHAPE_FUSE_CONV_RELU", "1" if str(device).split(":")[0] in CONV_RELU_DEVICES else "0")
    conv = [("fuse_conv_relu", fuse_conv_relu)] if conv_on != "0" else []
    cpu = str(device).split(":")[0] == "cpu"
    # subnormal weights as zero on the CPU (after every fold that scales a weight): x86 cores take an assist
    # per subnormal operand; GPUs do not
    packed = [("flush_subnormal_weights", flush_subnormal_weights), ("cpu_packed_linear", cpu_packed_linear)] \
        if cpu else []
    # oneDNN's convolution with its activation as a post-op (CPU); DYNASHAPE_FUSE_CONV_ACT=0 turns it off
    if cpu and os.environ.get("DYNASHAPE_FUSE_CONV_ACT", "1") != "0":
        conv = [*conv, ("fuse_conv_activation", fuse_conv_activation),
                ("fuse_squeeze_excite", fuse_squeeze_excite)]  # after: it reads the ConvAct nodes
    return [("linear_layout", linear_layout_pass(device)), *residual, *packed, ("remove_dead_nodes", remove_dead_nodes),
            ("channels_last", channels_last_pass(device)), *conv]


def compile_graph(graph: Graph, dump_after: set[str] | None = None, fusion: bool = True,
                  device: str = "cpu", paged_kv: bool = False) -> Program:
    """``paged_kv``: attention over past inputs rewritten to read a paged KV pool (paged_kv.py; the
    paged engine's sessions): the inputs it adds are the unfused graph's too (the feeds' checks)."""
    timings: dict[str, float] = {}
    graph = _run(PASSES, graph, timings, dump_after)
    _compile_subgraphs_tail(graph)
    fused = None
    if fusion:
        passes = [p for p in FUSION_PASSES if p[0] != "hoist_loop_invariants"
                  or str(device).split(":")[0] in HOIST_DEVICES] + device_passes(device)
        if paged_kv:
            passes = passes + [("paged_kv", paged_kv_pass), ("remove_dead_nodes", remove_dead_nodes)]
        fused = _run(passes, copy_graph(graph), timings, dump_after)
        fused.rebuild_users()
        if paged_kv:
            known = {v.name for v in graph.inputs}
            graph.inputs += [v for v in fused.inputs if v.name not in known]
    graph.paged_kv_refused = getattr(fused, "paged_kv_refused", "fusion is off") if paged_kv \
        else "the session's paged_kv is off"
    return Program(graph, timings, fused)


def _compile_subgraphs_tail(graph: Graph) -> None:
    for node in graph.nodes:
        for sub in node.subgraphs.values():
            mark_shape_subgraphs(sub)
            _compile_subgraphs_tail(sub)
