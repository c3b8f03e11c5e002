"""onnxruntime as an exact reference for integer matrix products.

On x86 CPUs without VNNI (AVX2 only, as our CI and benchmark machines are), onnxruntime's u8 x s8
GEMM multiplies adjacent pairs of bytes with `vpmaddubsw`, whose 16-bit sums saturate: with
weights that use the whole int8 range, a MatMulInteger element can come out off by tens or
hundreds (onnxruntime's quantization docs advise `reduce_range` on such machines for this
reason). dynashape computes these products exactly, so comparing with onnxruntime as is would
blame us for its rounding. This rewrite replaces each MatMulInteger by the same product in
float64 (exact: every sum of int8 x uint8 products here is far below 2**53) followed by a Cast
to int32, and leaves every other node to onnxruntime. `saturating_products(model)` says whether
a model has products where the two can differ.
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto as TP
from onnx import helper


def exact_matmul_integer(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``proto`` whose main-graph MatMulInteger nodes compute exactly; and how many."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    nodes, n = [], 0
    # a zero point from data (DynamicQuantizeLinear's) is a scalar; an initializer may be per row
    sizes = {t.name: max(1, math.prod(t.dims)) for t in g.initializer}
    axes = "exact_reference__axis_minus1"
    g.initializer.append(helper.make_tensor(axes, TP.INT64, [1], [-1]))
    for node in g.node:
        if node.op_type != "MatMulInteger" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        n += 1
        a, b = node.input[0], node.input[1]
        az = node.input[2] if len(node.input) > 2 and node.input[2] else None
        bz = node.input[3] if len(node.input) > 3 and node.input[3] else None
        p = f"{node.name or node.output[0]}__exact"
        nodes.append(helper.make_node("Cast", [a], [f"{p}_a"], to=TP.DOUBLE))
        nodes.append(helper.make_node("Cast", [b], [f"{p}_b"], to=TP.DOUBLE))
        ad, bd = f"{p}_a", f"{p}_b"
        if az:
            nodes.append(helper.make_node("Cast", [az], [f"{p}_az"], to=TP.DOUBLE))
            zp = f"{p}_az"
            if sizes.get(az, 1) > 1:  # a per-row zero point (one per row of A): (M,) -> (M, 1)
                nodes.append(helper.make_node("Unsqueeze", [zp, axes], [f"{p}_azr"]))
                zp = f"{p}_azr"
            nodes.append(helper.make_node("Sub", [ad, zp], [f"{p}_a0"]))
            ad = f"{p}_a0"
        if bz:
            nodes.append(helper.make_node("Cast", [bz], [f"{p}_bz"], to=TP.DOUBLE))
            nodes.append(helper.make_node("Sub", [bd, f"{p}_bz"], [f"{p}_b0"]))
            bd = f"{p}_b0"
        nodes.append(helper.make_node("MatMul", [ad, bd], [f"{p}_y"]))
        nodes.append(helper.make_node("Cast", [f"{p}_y"], [node.output[0]], to=TP.INT32))
    del g.node[:]
    g.node.extend(nodes)
    return out, n


def saturating_products(proto: onnx.ModelProto) -> int:
    """MatMulInteger nodes of the main graph: where onnxruntime on AVX2 may saturate."""
    return sum(n.op_type == "MatMulInteger" for n in proto.graph.node)


# onnxruntime computes these through the same u8 x s8 kernel, inside the op: no rewrite can make
# them exact, so where it saturates dynashape is compared with its saturation emulated
# (dynashape.ops.linalg.set_u8s8_saturation; the exact products are tested against numpy)
SATURATING_INSIDE = {"DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention",
                     "QLinearMatMul", "QLinearConv"}


def ort_saturates() -> bool:
    """Whether this machine's onnxruntime saturates uint8 x int8 pair sums (AVX2 without VNNI)."""
    import numpy as np
    import onnxruntime as ort
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
                          [helper.make_tensor_value_info("a", TP.UINT8, [1, 2]),
                           helper.make_tensor_value_info("b", TP.INT8, [2, 1])],
                          [helper.make_tensor_value_info("y", TP.INT32, [1, 1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    y = s.run(None, {"a": np.full((1, 2), 255, np.uint8), "b": np.full((2, 1), 127, np.int8)})[0]
    return int(y[0, 0]) != 2 * 255 * 127


QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
             "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention"}


def quantized(proto: onnx.ModelProto) -> bool:
    """Whether the model quantizes activations inside the graph (its outputs then move by whole
    quantization steps when a value upstream lands on the other side of a rounding boundary)."""
    return any(n.op_type in QUANT_OPS or n.op_type.startswith("QLinear") for n in proto.graph.node)


class Reference:
    """onnxruntime as the reference: default optimizations, MatMulInteger exact. For a quantized
    model also the graph as written (ORT_DISABLE_ALL) and the default graph on two threads:
    onnxruntime's fused QLinear* kernels and its unfused graph differ by whole quantization steps,
    and so do its thread counts (DynamicQuantizeLSTM quantizes each thread's slice of the batch
    with its own scale) and its own outputs for float inputs moved by a few ulps (a value one ulp
    from a rounding boundary lands on the other side). ``run`` returns the largest of those
    distances per output, the yardstick for a quantized model (three times the largest over a
    model's calls): any float difference upstream of a quantizer, a summation order, does that."""

    FACTOR = 3

    def __init__(self, path: str, threads: int = 1) -> None:
        import onnxruntime as ort
        proto = onnx.load(path)
        self.quantized = quantized(proto)
        # compare with dynashape's emulation of onnxruntime's saturation (see SATURATING_INSIDE);
        # then onnxruntime's own MatMulInteger stays too, saturation and all
        self.emulate = any(n.op_type in SATURATING_INSIDE for n in proto.graph.node) and ort_saturates()
        if self.emulate:
            data, self.rewritten = proto.SerializeToString(), 0
        else:
            exact, self.rewritten = exact_matmul_integer(proto)
            data = exact.SerializeToString()
        full, none = ort.GraphOptimizationLevel.ORT_ENABLE_ALL, ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        variants = [(full, threads)]
        if self.quantized:
            variants += [(none, threads), (full, 2 if threads == 1 else 1)]
        self.sessions = []
        for level, n in variants:
            so = ort.SessionOptions()
            so.intra_op_num_threads = n  # no spinning pool beside torch's threads on a small machine
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.graph_optimization_level = level
            so.log_severity_level = 3
            self.sessions.append(ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]))
        self.names = [o.name for o in self.sessions[0].get_outputs()]

    def run(self, feeds: dict) -> tuple[list, list[float]]:
        want = [s.run(None, feeds) for s in self.sessions]
        if not self.quantized:
            return want[0], [0.0] * len(self.names)
        # and the float inputs moved by a few ulps: how far one rounding flip upstream carries
        want.append(self.sessions[0].run(None, {k: _nudged(v) for k, v in feeds.items()}))
        return want[0], [max(_max_abs(a, b) for b in others) for a, *others in zip(*want)]

    def close(self) -> None:
        self.sessions.clear()


def _nudged(x):
    """A float array moved by about four ulps (relative 2**-21); anything else as it is."""
    import numpy as np
    x = np.asarray(x)
    return (x * (1 + 2.0 ** -21)).astype(x.dtype) if x.dtype.kind == "f" else x


def _max_abs(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind not in "fc" or not a.size:
        return 0.0
    # finite pairs only: onnxruntime's runs disagreeing on an inf or a NaN must not make the
    # yardstick infinite (or NaN), which would let any difference through
    a, b = a.astype(np.float64), b.astype(np.float64)
    fin = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a[fin] - b[fin]).max()) if fin.any() else 0.0
