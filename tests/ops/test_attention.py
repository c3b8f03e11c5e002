"""Attention family ops (dynashape/ops/attention.py) against onnxruntime and the reference evaluator,
each over a sequence of shapes in one session (grow, shrink, repeat) with fresh data per step.

onnxruntime 1.31 does not load opsets 27/28 (LinearAttention, CausalConvWithState, SwiGLU), the
ai.onnx.preview domain (FlexAttention) nor Attention-25's window attributes: those are checked
against the reference evaluator only (other exceptions say why where they are).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.ops.harness import rand, run_sequence

F32, F16, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL
NP = {F32: np.float32, F16: np.float16, I64: np.int64, BOOL: np.bool_}


def _model(op_type, inputs, n_outputs, attrs=None, opset=23, domain="", out_names=None):
    """One node; ``inputs`` lists (name, elem_type, rank) or None for an absent optional input.
    Graph inputs have dynamic dims so that one session sees every shape."""
    names = ["" if i is None else i[0] for i in inputs]
    outs = out_names or [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    g_in = [helper.make_tensor_value_info(n, t, [f"{n}_{k}" for k in range(r)]) for n, t, r in filter(None, inputs)]
    g_out = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs if o]
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], op_type.lower(), g_in, g_out), opset_imports=imports,
                              ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = list(inferred.graph.value_info) + list(inferred.graph.output)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in infos}
    for o in model.graph.output:
        o.type.tensor_type.elem_type = types.get(o.name) or TensorProto.FLOAT
    return model


def _feeds(inputs, shapes, rng, special=None):
    """Random data for each present input; ``special[name](shape, rng)`` overrides."""
    feeds = {}
    for spec, shape in zip(inputs, shapes):
        if spec is None:
            continue
        name, t, _ = spec
        make = (special or {}).get(name)
        feeds[name] = make(shape, rng) if make else rand(shape, NP[t], rng, low=-1.0, high=1.0)
    return feeds


def _check(op_type, inputs, shape_seq, n_outputs=1, attrs=None, opset=23, references=("ort", "ref"), special=None,
           domain="", out_names=None, rtol=1e-4, atol=1e-5):
    rng = np.random.default_rng(0)
    model = _model(op_type, inputs, n_outputs, attrs, opset, domain, out_names)
    feeds = [_feeds(inputs, shapes, rng, special) for shapes in shape_seq]
    return run_sequence(model, feeds, references, rtol=rtol, atol=atol)


QKV4 = [("Q", F32, 4), ("K", F32, 4), ("V", F32, 4)]
QKV3 = [("Q", F32, 3), ("K", F32, 3), ("V", F32, 3)]


# Attention ------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}, {"scale": 0.3, "softcap": 2.0}])
def test_attention_4d(attrs):
    # (B, H, S, D) with cross lengths, V head size differing from Q/K's
    seq = [[(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)],
           [(1, 3, 7, 8), (1, 3, 9, 8), (1, 3, 9, 5)],
           [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)]]
    _check("Attention", QKV4, seq, attrs=attrs)


def test_attention_3d_gqa_causal():
    seq = [[(2, 4, 32), (2, 6, 16), (2, 6, 12)],
           [(3, 5, 32), (3, 5, 16), (3, 5, 12)],
           [(1, 1, 32), (1, 9, 16), (1, 9, 12)]]
    _check("Attention", QKV3, seq, attrs={"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1})


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_past_present_qk_output(mode):
    # GQA with a KV cache, a float mask over all keys, softcap; all four outputs
    inputs = [("Q", F32, 4), ("K", F32, 4), ("V", F32, 4), ("M", F32, 2), ("PK", F32, 4), ("PV", F32, 4)]
    seq = [[(2, 4, 3, 8), (2, 2, 3, 8), (2, 2, 3, 8), (3, 5), (2, 2, 2, 8), (2, 2, 2, 8)],
           [(1, 4, 1, 8), (1, 2, 1, 8), (1, 2, 1, 8), (1, 7), (1, 2, 6, 8), (1, 2, 6, 8)],
           [(2, 4, 3, 8), (2, 2, 3, 8), (2, 2, 3, 8), (3, 5), (2, 2, 2, 8), (2, 2, 2, 8)]]
    # mode 0 is the raw QK product; the reference evaluator returns it softcapped (against the spec)
    refs = ("ort",) if mode == 0 else ("ort", "ref")
    _check("Attention", inputs, seq, n_outputs=4, attrs={"qk_matmul_output_mode": mode, "softcap": 3.0},
           references=refs)


def test_attention_bool_mask_short_and_causal():
    # the mask covers fewer keys than past + new (padded as masked); one row may mask everything
    inputs = [("Q", F32, 4), ("K", F32, 4), ("V", F32, 4), ("M", BOOL, 3), ("PK", F32, 4), ("PV", F32, 4)]
    seq = [[(2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), (2, 3, 4), (2, 2, 2, 4), (2, 2, 2, 4)],
           [(1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4), (2, 2, 5), (1, 2, 4, 4), (1, 2, 4, 4)],
           [(2, 2, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), (1, 3, 4), (2, 2, 2, 4), (2, 2, 2, 4)]]
    # onnxruntime refuses a mask shorter than past + new keys, which the spec pads as masked
    _check("Attention", inputs, seq, n_outputs=3, attrs={"is_causal": 1}, references=("ref",))


def _nonpad(shape, rng):
    return rng.integers(1, 6 + 1, size=shape).astype(np.int64)  # 1 to the 6 keys of the caches below


def test_attention_24_nonpad_causal():
    inputs = [("Q", F32, 4), ("K", F32, 4), ("V", F32, 4), None, None, None, ("L", I64, 1)]
    seq = [[(2, 4, 1, 8), (2, 2, 6, 8), (2, 2, 6, 8), None, None, None, (2,)],
           [(3, 4, 3, 8), (3, 2, 6, 8), (3, 2, 6, 8), None, None, None, (3,)],
           [(1, 4, 2, 8), (1, 2, 6, 8), (1, 2, 6, 8), None, None, None, (1,)]]
    _check("Attention", inputs, seq, attrs={"is_causal": 1}, opset=24, special={"L": _nonpad})


@pytest.mark.parametrize("window", [(2, 0), (1, 1), (-1, 0)])
def test_attention_25_window(window):
    attrs = {"left_window_size": window[0], "right_window_size": window[1]}
    seq = [[(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)],
           [(1, 3, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8)],
           [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8)]]
    # the reference only: onnxruntime 1.31 does not know the opset-25 window attributes
    _check("Attention", QKV4, seq, attrs=attrs, opset=25, references=("ref",))


def test_attention_fp16_float_mask():
    inputs = [("Q", F16, 4), ("K", F16, 4), ("V", F16, 4), ("M", F16, 4)]
    seq = [[(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), (2, 1, 4, 6)],
           [(1, 3, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8), (1, 3, 5, 5)],
           [(2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), (2, 1, 4, 6)]]
    # fp16: a couple of ulps between the three
    _check("Attention", inputs, seq, attrs={"is_causal": 1}, rtol=2e-3, atol=2e-3)


# RotaryEmbedding ------------------------------------------------------------------------------
def _positions(shape, rng):
    return rng.integers(0, 16, size=shape).astype(np.int64)  # the caches have 16 positions


@pytest.mark.parametrize("attrs", [{}, {"interleaved": 1}, {"rotary_embedding_dim": 4}])
def test_rotary_4d_positions(attrs):
    rd = attrs.get("rotary_embedding_dim", 8)
    inputs = [("X", F32, 4), ("C", F32, 2), ("S", F32, 2), ("P", I64, 2)]
    seq = [[(2, 3, 5, 8), (16, rd // 2), (16, rd // 2), (2, 5)],
           [(1, 2, 7, 8), (16, rd // 2), (16, rd // 2), (1, 7)],
           [(2, 3, 5, 8), (16, rd // 2), (16, rd // 2), (2, 5)]]
    _check("RotaryEmbedding", inputs, seq, attrs=attrs, special={"P": _positions})


def test_rotary_3d_no_positions():
    inputs = [("X", F32, 3), ("C", F32, 3), ("S", F32, 3)]
    seq = [[(2, 5, 24), (2, 5, 2), (2, 5, 2)],
           [(3, 2, 24), (3, 2, 2), (3, 2, 2)],
           [(1, 9, 24), (1, 9, 2), (1, 9, 2)]]
    _check("RotaryEmbedding", inputs, seq, attrs={"num_heads": 3, "interleaved": 1, "rotary_embedding_dim": 4})


# Swish, SwiGLU --------------------------------------------------------------------------------
def test_swish():
    _check("Swish", [("X", F32, 2)], [[(2, 3)], [(5, 7)], [(2, 3)]], attrs={"alpha": 1.7}, opset=24)


def test_swiglu():
    seq = [[(2, 3, 4)] * 2, [(1, 5, 8)] * 2, [(2, 3, 4)] * 2]
    _check("SwiGLU", [("A", F32, 3), ("B", F32, 3)], seq, attrs={"alpha": 0.8}, opset=28, references=("ref",))


# TensorScatter --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    inputs = [("C", F32, 4), ("U", F32, 4), ("W", I64, 1)]
    max_len = 8

    def write_at(shape, rng):  # linear writes must fit: at most max_len - 3 (the longest update)
        return rng.integers(0, max_len - 3 + 1 if mode == "linear" else 3 * max_len, size=shape).astype(np.int64)

    seq = [[(2, 3, max_len, 4), (2, 3, 1, 4), (2,)],
           [(3, 2, max_len, 5), (3, 2, 3, 5), (3,)],
           [(2, 3, max_len, 4), (2, 3, 1, 4), (2,)]]
    _check("TensorScatter", inputs, seq, attrs={"mode": mode}, opset=24, special={"W": write_at})


def test_tensor_scatter_axis1_no_indices():
    inputs = [("C", F32, 3), ("U", F32, 3)]
    seq = [[(2, 6, 4), (2, 2, 4)], [(1, 9, 3), (1, 9, 3)], [(2, 6, 4), (2, 2, 4)]]
    _check("TensorScatter", inputs, seq, attrs={"axis": 1}, opset=24)


# LinearAttention ------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention(rule):
    hq, hkv, dk, dv = 4, 2, 3, 5
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    inputs = [("q", F32, 3), ("k", F32, 3), ("v", F32, 3), ("s", F32, 4),
              ("g", F32, 3) if gated else None, ("b", F32, 3) if delta else None]
    seq = []
    for bsz, t in ((2, 3), (1, 6), (2, 1)):
        seq.append([(bsz, t, hq * dk), (bsz, t, hkv * dk), (bsz, t, hkv * dv), (bsz, hkv, dk, dv),
                    (bsz, t, hkv * dk if bsz == 2 else hkv), (bsz, t, hkv)])
    special = {"g": lambda s, r: r.uniform(-0.5, -0.01, s).astype(np.float32),
               "b": lambda s, r: r.uniform(0.1, 0.9, s).astype(np.float32)}
    attrs = {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule}
    _check("LinearAttention", inputs, seq, n_outputs=2, attrs=attrs, opset=27, references=("ref",), special=special)


# CausalConvWithState --------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(activation):
    inputs = [("x", F32, 3), ("w", F32, 3), ("bias", F32, 1), ("st", F32, 3)]
    seq = [[(2, 4, 5), (4, 1, 3), (4,), (2, 4, 2)],
           [(1, 6, 1), (6, 1, 4), (6,), (1, 6, 3)],
           [(2, 4, 5), (4, 1, 3), (4,), (2, 4, 2)]]
    _check("CausalConvWithState", inputs, seq, n_outputs=2, attrs={"activation": activation}, opset=27,
           references=("ref",))


# FlexAttention --------------------------------------------------------------------------------
def test_flex_attention_score_mod_gqa():
    x = helper.make_tensor_value_info("x", F32, ["b", "h", "l", "s"])
    y = helper.make_tensor_value_info("y", F32, ["b", "h", "l", "s"])
    half = helper.make_tensor("half", F32, [], [0.5])
    body = helper.make_graph([helper.make_node("Mul", ["x", "half"], ["y"])], "score_mod", [x], [y],
                             initializer=[half])
    seq = [[(2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6)],
           [(1, 4, 6, 8), (1, 2, 2, 8), (1, 2, 2, 6)],
           [(2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6)]]
    _check("FlexAttention", QKV4, seq, attrs={"score_mod": body, "scale": 0.4}, opset=26, domain="ai.onnx.preview",
           references=("ref",))  # onnxruntime does not run the ai.onnx.preview domain
