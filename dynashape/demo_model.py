"""The embedded default model: a tiny one-layer decoder with a KV cache, built deterministically.

It exercises what dynashape exists for: every decode step grows the cache by one position, so
the shapes of the attention ops change on every call. Built with onnx.helper from a seeded
generator, so it needs no download and no torch export.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

VOCAB, DIM, HEADS, FFN = 256, 64, 4, 128
HEAD_DIM = DIM // HEADS


def build_demo_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(name, *shape, scale=None):
        scale = scale or 1.0 / np.sqrt(shape[0])
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    def c(name, values, dtype=np.int64):
        return numpy_helper.from_array(np.array(values, dtype=dtype), name)

    inits = [w("emb", VOCAB, DIM, scale=1.0), w("wq", DIM, DIM), w("wk", DIM, DIM), w("wv", DIM, DIM),
             w("wo", DIM, DIM), w("w1", DIM, FFN), w("w2", FFN, DIM), w("wlm", DIM, VOCAB),
             c("heads_shape", [0, 0, HEADS, HEAD_DIM]), c("merge_shape", [0, 0, DIM]),
             c("axis2", [2]), c("one", 1), c("zero", 0), c("axis0", [0]),
             c("scale", 1.0 / np.sqrt(HEAD_DIM), np.float32), c("neg", -1e9, np.float32)]
    N = helper.make_node
    nodes = [
        N("Gather", ["emb", "input_ids"], ["x"]),
        *[n for p in ("q", "k", "v") for n in (
            N("MatMul", ["x", f"w{p}"], [f"{p}_flat"]),
            N("Reshape", [f"{p}_flat", "heads_shape"], [f"{p}_bshd"]),
            N("Transpose", [f"{p}_bshd"], [f"{p}_new"], perm=[0, 2, 1, 3]))],
        N("Concat", ["past_key", "k_new"], ["present_key"], axis=2),
        N("Concat", ["past_value", "v_new"], ["present_value"], axis=2),
        N("Transpose", ["present_key"], ["k_t"], perm=[0, 1, 3, 2]),
        N("MatMul", ["q_new", "k_t"], ["scores_raw"]),
        N("Mul", ["scores_raw", "scale"], ["scores"]),
        # causal mask: query i (absolute position past + i) may see keys 0 .. past + i
        N("Shape", ["present_key"], ["kshape"]), N("Gather", ["kshape", "axis2"], ["total"]),
        N("Shape", ["input_ids"], ["ishape"]), N("Gather", ["ishape", "one"], ["seq"]),
        N("Sub", ["total", "seq"], ["past_len"]),
        N("Squeeze", ["total", "axis0"], ["total_s"]), N("Squeeze", ["past_len", "axis0"], ["past_s"]),
        N("Range", ["past_s", "total_s", "one"], ["rows"]), N("Range", ["zero", "total_s", "one"], ["cols"]),
        N("Unsqueeze", ["rows", "one"], ["rows2"]), N("Unsqueeze", ["cols", "zero"], ["cols2"]),
        N("Less", ["rows2", "cols2"], ["masked"]),
        N("Where", ["masked", "neg", "scores"], ["scores_m"]),
        N("Softmax", ["scores_m"], ["probs"], axis=-1),
        N("MatMul", ["probs", "present_value"], ["ctx"]),
        N("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        N("Reshape", ["ctx_t", "merge_shape"], ["ctx_m"]),
        N("MatMul", ["ctx_m", "wo"], ["attn"]), N("Add", ["x", "attn"], ["h1"]),
        N("MatMul", ["h1", "w1"], ["f1"]), N("Relu", ["f1"], ["f1r"]), N("MatMul", ["f1r", "w2"], ["f2"]),
        N("Add", ["h1", "f2"], ["h2"]), N("MatMul", ["h2", "wlm"], ["logits"]),
    ]
    kv = ["batch", HEADS, "past", HEAD_DIM]
    kv_out = ["batch", HEADS, "total", HEAD_DIM]
    graph = helper.make_graph(
        nodes, "dynashape_demo_decoder",
        [helper.make_tensor_value_info("input_ids", TP.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("past_key", TP.FLOAT, kv),
         helper.make_tensor_value_info("past_value", TP.FLOAT, kv)],
        [helper.make_tensor_value_info("logits", TP.FLOAT, ["batch", "seq", VOCAB]),
         helper.make_tensor_value_info("present_key", TP.FLOAT, kv_out),
         helper.make_tensor_value_info("present_value", TP.FLOAT, kv_out)],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                             producer_name="dynashape-demo")
