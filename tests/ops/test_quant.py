"""Quantization ops and the casts to / from the exotic element types (int4, int2, float4,
float8 with and without saturation, float8e8m0), each over a sequence of shapes in one session.

onnxruntime's python API (1.31 here) neither takes nor returns numpy arrays of the float8 /
4-bit / 2-bit types, and the reference evaluator has no DequantizeLinear before opset 19: the
cases that meet one of those compare with the other engine only, as each test's ``refs`` says.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from tests.ops.harness import DEVICE, make_model, run_sequence

BOTH, REF = ("ort", "ref"), ("ref",)
_NP = {TP.UINT8: np.uint8, TP.INT8: np.int8, TP.UINT16: np.uint16, TP.INT16: np.int16, TP.INT32: np.int32,
       TP.INT4: ml_dtypes.int4, TP.UINT4: ml_dtypes.uint4, TP.INT2: ml_dtypes.int2, TP.UINT2: ml_dtypes.uint2,
       TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, TP.FLOAT8E5M2: ml_dtypes.float8_e5m2,
       TP.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz, TP.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
       TP.FLOAT4E2M1: ml_dtypes.float4_e2m1fn, TP.FLOAT8E8M0: ml_dtypes.float8_e8m0fnu,
       TP.FLOAT: np.float32, TP.FLOAT16: np.float16}
_RANGE = {TP.UINT8: (0, 255), TP.INT8: (-128, 127), TP.UINT16: (0, 65535), TP.INT16: (-32768, 32767),
          TP.INT32: (-1000, 1000), TP.INT4: (-8, 7), TP.UINT4: (0, 15), TP.INT2: (-2, 1), TP.UINT2: (0, 3)}


def _f32(v):
    return np.array(v, np.float32)  # a 0-d array: onnxruntime takes no numpy scalars


def _ints(rng, shape, et):
    lo, hi = _RANGE[et]
    return rng.integers(lo, hi + 1, size=shape).astype(_NP[et])


def _scales(rng, shape, dtype=np.float32):
    # powers of two (exact divisions, so x / scale lands on .5 ties) mixed with arbitrary ones
    pick = rng.choice([0.25, 0.5, 1.0, 2.0, 0.037, 0.11], size=shape)
    return np.asarray(pick, dtype=dtype)


def _x(rng, shape, spread=40.0, dtype=np.float32):
    # multiples of 1/8 hit the ties of the power-of-two scales; the rest are arbitrary
    v = np.where(rng.random(shape) < 0.5, np.round(rng.uniform(-spread, spread, shape) * 8) / 8,
                 rng.uniform(-spread, spread, shape))
    return v.astype(dtype)


def _run(op_type, in_types, attrs, opset, feeds_seq, refs, n_outputs=1):
    model = make_model(op_type, len(in_types), in_types, attrs, opset, n_outputs)
    return run_sequence(model, [{f"in{i}": v for i, v in enumerate(f)} for f in feeds_seq], refs)


def _passes_out_types() -> bool:
    """Whether the runtime hands kernels the graph's output types (``_out_types``), which
    writing an INT4 / INT2 / FLOAT4 without an output_dtype attribute needs."""
    model = make_model("CastLike", 2, [TP.FLOAT, TP.INT4], None, 21)
    node = dynashape.InferenceSession(model).program.graph.nodes[0]
    return "_out_types" in node.attrs


needs_out_types = pytest.mark.skipif(not _passes_out_types(), reason="the runtime does not pass _out_types to kernels "
                                     "yet (resolve_ops change requested)")

# the shape sequences: grow, shrink, repeat
SEQ3 = [(2, 3), (4, 5), (1, 2), (2, 3)]
SEQ_AXIS1 = [(2, 3, 4), (5, 3, 2), (1, 3, 1), (2, 3, 4)]


# QuantizeLinear -----------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [10, 13, 19, 21, 23])
@pytest.mark.parametrize("zp_type", [TP.UINT8, TP.INT8])
def test_quantize_per_tensor(opset, zp_type):
    rng = np.random.default_rng(opset + zp_type)
    feeds = [(_x(rng, s), _scales(rng, ()), _ints(rng, (), zp_type)) for s in SEQ3]
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, zp_type], None, opset, feeds, BOTH)


@pytest.mark.parametrize("axis", [1, -2])
def test_quantize_per_axis(axis):
    rng = np.random.default_rng(1)
    feeds = [(_x(rng, s), _scales(rng, (3,)), _ints(rng, (3,), TP.UINT8)) for s in SEQ_AXIS1]
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, TP.UINT8], {"axis": axis}, 13, feeds, BOTH)


def test_quantize_blocked():
    rng = np.random.default_rng(2)
    # blocks of 2 along axis 1; a last block shorter than the others when the size is odd
    shapes = [((3, 4), (3, 2)), ((2, 5), (2, 3)), ((4, 1), (4, 1)), ((3, 4), (3, 2))]
    feeds = [(_x(rng, xs), _scales(rng, ss), _ints(rng, ss, TP.INT8)) for xs, ss in shapes]
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, TP.INT8], {"axis": 1, "block_size": 2}, 21, feeds, BOTH)


@pytest.mark.parametrize("zp_type", [TP.INT16, TP.UINT16])
def test_quantize_16bit(zp_type):
    rng = np.random.default_rng(3)
    feeds = [(_x(rng, s, 1e5), _scales(rng, ()), _ints(rng, (), zp_type)) for s in SEQ3]
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, zp_type], None, 21, feeds, BOTH)


@pytest.mark.parametrize("to", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2, TP.INT16])
def test_quantize_output_dtype(to):
    # no zero point: the type comes from output_dtype; onnxruntime's python API cannot return
    # int4 arrays, and lacks the 2-bit types
    rng = np.random.default_rng(4)
    feeds = [(_x(rng, s, 20.0), _scales(rng, ())) for s in SEQ3]
    opset, refs = (25, REF) if to in (TP.INT2, TP.UINT2) else (21, BOTH if to == TP.INT16 else REF)
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT], {"output_dtype": to}, opset, feeds, refs)


@needs_out_types
@pytest.mark.parametrize("zp_type", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2])
def test_quantize_subbyte_zero_point(zp_type):
    # the held int8 zero point does not say "int4": the range comes from the node's output type
    rng = np.random.default_rng(5)
    feeds = [(_x(rng, s, 20.0), _scales(rng, (s[1],)), _ints(rng, (s[1],), zp_type)) for s in SEQ3]
    opset = 25 if zp_type in (TP.INT2, TP.UINT2) else 21
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, zp_type], {"axis": 1}, opset, feeds, REF)  # ort: no int4 out


@pytest.mark.parametrize("to", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_float8(to, saturate):
    rng = np.random.default_rng(6)
    feeds = []
    for s in SEQ3:
        x = _x(rng, s, 1e5)
        x.flat[0] = np.inf
        feeds.append((x, _scales(rng, ()), np.zeros((), _NP[to])))
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, to], {"saturate": saturate}, 19, feeds, REF)


@pytest.mark.skipif(not _passes_out_types(), reason="float4 without output_dtype needs _out_types")
def test_quantize_float4_zero_point():
    # 2.52 rounds to 3 in float4; through float8e4m3fn (2.5, then a tie) it would become 2
    rng = np.random.default_rng(7)
    feeds = [(np.concatenate([[2.52], _x(rng, (s - 1,), 8.0)]).astype(np.float32), _f32(1.0),
              np.zeros((), ml_dtypes.float4_e2m1fn)) for s in (5, 9, 3, 5)]
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT, TP.FLOAT4E2M1], None, 23, feeds, REF)


def test_quantize_float4_output_dtype():
    feeds = [(np.concatenate([[2.52, 2.5, -7.0, 0.25]], axis=0).astype(np.float32), _f32(1.0))]
    rng = np.random.default_rng(8)
    feeds += [(_x(rng, (s,), 8.0), _scales(rng, ())) for s in (7, 2, 7)]
    _run("QuantizeLinear", [TP.FLOAT, TP.FLOAT], {"output_dtype": TP.FLOAT4E2M1}, 23, feeds, REF)


def test_quantize_float16_precision():
    # x / scale in float16 (the scale's type: the spec's default, the reference's too; onnxruntime
    # divides in float32, as precision=FLOAT asks)
    rng = np.random.default_rng(9)
    feeds = [(_x(rng, s, 300.0, np.float16), _scales(rng, (), np.float16), _ints(rng, (), TP.INT16)) for s in SEQ3]
    _run("QuantizeLinear", [TP.FLOAT16, TP.FLOAT16, TP.INT16], None, 23, feeds, REF)
    _run("QuantizeLinear", [TP.FLOAT16, TP.FLOAT16, TP.INT16], {"precision": TP.FLOAT}, 23, feeds, BOTH)


# DequantizeLinear ---------------------------------------------------------------------------
@pytest.mark.parametrize("x_type", [TP.UINT8, TP.INT8, TP.INT32, TP.INT16, TP.UINT16])
def test_dequantize_per_tensor(x_type):
    rng = np.random.default_rng(10 + x_type)
    opset = 19 if x_type in (TP.UINT8, TP.INT8, TP.INT32) else 21
    if x_type == TP.INT32:  # int32 has no zero point (it must be 0)
        feeds = [(_ints(rng, s, x_type), _scales(rng, ())) for s in SEQ3]
        _run("DequantizeLinear", [x_type, TP.FLOAT], None, opset, feeds, BOTH)
        return
    feeds = [(_ints(rng, s, x_type), _scales(rng, ()), _ints(rng, (), x_type)) for s in SEQ3]
    _run("DequantizeLinear", [x_type, TP.FLOAT, x_type], None, opset, feeds, BOTH)


def test_dequantize_per_axis_and_blocked():
    rng = np.random.default_rng(11)
    feeds = [(_ints(rng, s, TP.UINT8), _scales(rng, (3,)), _ints(rng, (3,), TP.UINT8)) for s in SEQ_AXIS1]
    _run("DequantizeLinear", [TP.UINT8, TP.FLOAT, TP.UINT8], {"axis": 1}, 13, feeds, ("ort",))
    _run("DequantizeLinear", [TP.UINT8, TP.FLOAT, TP.UINT8], {"axis": 1}, 19, feeds, BOTH)
    shapes = [((3, 4), (3, 2)), ((2, 5), (2, 3)), ((4, 1), (4, 1)), ((3, 4), (3, 2))]
    feeds = [(_ints(rng, xs, TP.INT8), _scales(rng, ss), _ints(rng, ss, TP.INT8)) for xs, ss in shapes]
    _run("DequantizeLinear", [TP.INT8, TP.FLOAT, TP.INT8], {"axis": 1, "block_size": 2}, 21, feeds, BOTH)


@pytest.mark.parametrize("x_type", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2])
def test_dequantize_subbyte(x_type):
    rng = np.random.default_rng(12)
    feeds = [(_ints(rng, s, x_type), _scales(rng, (s[1],)), _ints(rng, (s[1],), x_type)) for s in SEQ3]
    opset = 25 if x_type in (TP.INT2, TP.UINT2) else 21
    _run("DequantizeLinear", [x_type, TP.FLOAT, x_type], {"axis": 1}, opset, feeds, REF)


@pytest.mark.parametrize("x_type", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2, TP.FLOAT4E2M1])
def test_dequantize_small_floats(x_type):
    rng = np.random.default_rng(13)
    feeds = [(_x(rng, s, 6.0).astype(_NP[x_type]), _scales(rng, ())) for s in SEQ3]
    _run("DequantizeLinear", [x_type, TP.FLOAT], None, 23 if x_type == TP.FLOAT4E2M1 else 19, feeds, REF)


def test_dequantize_output_dtype_and_e8m0_scale():
    rng = np.random.default_rng(14)
    feeds = [(_ints(rng, s, TP.INT8), _scales(rng, (), np.float32), _ints(rng, (), TP.INT8)) for s in SEQ3]
    # reference only: onnxruntime 1.30 fails on output_dtype=FLOAT16 (tensor type mismatch; 1.31 passes)
    _run("DequantizeLinear", [TP.INT8, TP.FLOAT, TP.INT8], {"output_dtype": TP.FLOAT16}, 23, feeds, REF)
    feeds = [(_ints(rng, s, TP.INT4), _scales(rng, ()).astype(ml_dtypes.float8_e8m0fnu)) for s in SEQ3]
    _run("DequantizeLinear", [TP.INT4, TP.FLOAT8E8M0], {"output_dtype": TP.FLOAT}, 24, feeds, REF)


# DynamicQuantizeLinear ----------------------------------------------------------------------
def test_dynamic_quantize():
    rng = np.random.default_rng(15)
    feeds = [(rng.uniform(lo, hi, s).astype(np.float32),)
             for s, lo, hi in [((6,), -3, 2), ((3, 4), 1, 4), ((2, 3, 5), -4, -1), ((6,), -3, 2)]]
    _run("DynamicQuantizeLinear", [TP.FLOAT], None, 11, feeds, BOTH, n_outputs=3)


# QLinearMatMul, QLinearConv, ConvInteger ----------------------------------------------------
@pytest.mark.parametrize("qt", [TP.UINT8, TP.INT8])
@pytest.mark.parametrize("opset", [10, 21])
def test_qlinear_matmul(qt, opset):
    rng = np.random.default_rng(16)
    feeds = []
    for sa, sb in [((2, 4), (4, 3)), ((3, 5), (5, 2)), ((2, 2, 4), (2, 4, 3)), ((2, 4), (4, 3))]:
        feeds.append((_ints(rng, sa, qt), _f32(rng.uniform(0.004, 0.01)), _ints(rng, (), qt),
                      _ints(rng, sb, qt), _f32(rng.uniform(0.004, 0.01)), _ints(rng, (), qt),
                      _f32(rng.uniform(0.01, 0.05)), _ints(rng, (), qt)))
    types = [qt, TP.FLOAT, qt] * 2 + [TP.FLOAT, qt]
    _run("QLinearMatMul", types, None, opset, feeds, BOTH)


def test_qlinear_matmul_per_column_b():
    # b's scale and zero point per column (onnxruntime only: the reference broadcasts them wrongly)
    rng = np.random.default_rng(17)
    feeds = []
    for m, k, n in [(2, 4, 3), (5, 3, 3), (1, 6, 3), (2, 4, 3)]:
        feeds.append((_ints(rng, (m, k), TP.UINT8), _f32(0.007), _ints(rng, (), TP.UINT8),
                      _ints(rng, (k, n), TP.UINT8), rng.uniform(0.004, 0.01, n).astype(np.float32),
                      _ints(rng, (n,), TP.UINT8), _f32(0.03), _ints(rng, (), TP.UINT8)))
    types = [TP.UINT8, TP.FLOAT, TP.UINT8] * 2 + [TP.FLOAT, TP.UINT8]
    _run("QLinearMatMul", types, None, 10, feeds, ("ort",))


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv(per_channel):
    rng = np.random.default_rng(18)
    w = _ints(rng, (3, 2, 3, 3), TP.UINT8)
    w_scale = rng.uniform(0.002, 0.01, 3 if per_channel else ()).astype(np.float32)
    feeds = []
    for s in [(1, 2, 5, 5), (2, 2, 7, 4), (1, 2, 3, 3), (1, 2, 5, 5)]:
        feeds.append((_ints(rng, s, TP.UINT8), _f32(0.004), _ints(rng, (), TP.UINT8), w, w_scale,
                      np.zeros((), np.uint8) if per_channel else _ints(rng, (), TP.UINT8), _f32(0.05),
                      _ints(rng, (), TP.UINT8), rng.integers(-500, 500, 3).astype(np.int32)))
    types = [TP.UINT8, TP.FLOAT, TP.UINT8, TP.UINT8, TP.FLOAT, TP.UINT8, TP.FLOAT, TP.UINT8, TP.INT32]
    _run("QLinearConv", types, {"pads": [1, 0, 1, 2], "strides": [1, 2]}, 10, feeds, BOTH)


def test_conv_integer():
    rng = np.random.default_rng(19)
    feeds = []
    for s in [(1, 2, 5, 5), (2, 2, 6, 4), (1, 2, 2, 3), (1, 2, 5, 5)]:
        feeds.append((_ints(rng, s, TP.UINT8), _ints(rng, (3, 2, 2, 2), TP.UINT8), _ints(rng, (), TP.UINT8),
                      _ints(rng, (), TP.UINT8)))
    _run("ConvInteger", [TP.UINT8, TP.UINT8, TP.UINT8, TP.UINT8], {"pads": [1, 1, 0, 1]}, 10, feeds, BOTH)


# Cast / CastLike to and from the exotic types -----------------------------------------------
_SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e6, -1e6, 0.0, -0.0, 464.0, 465.0, 247.0, 248.0, 61439.0, 61440.0],
                    np.float32)


@pytest.mark.parametrize("to", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2FNUZ])
@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("src", [TP.FLOAT, TP.FLOAT16])
def test_cast_float8_saturate(to, saturate, src):
    rng = np.random.default_rng(20)
    with np.errstate(over="ignore"):  # 1e6 is inf in float16, as meant
        feeds = [(np.concatenate([_SPECIAL, _x(rng, (n,), 600.0)]).astype(_NP[src]),) for n in (3, 11, 1, 3)]
    _run("Cast", [src], {"to": to, "saturate": saturate}, 21, feeds, REF)


@pytest.mark.parametrize("to", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2])
def test_cast_to_subbyte_int(to):
    # integers beyond the range wrap around (two's complement), as float -> int truncates
    rng = np.random.default_rng(21)
    feeds = [(np.trunc(rng.uniform(-20, 20, s)).astype(np.float32),) for s in SEQ3]
    _run("Cast", [TP.FLOAT], {"to": to}, 25, feeds, REF)


@pytest.mark.parametrize("src", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2, TP.FLOAT4E2M1, TP.FLOAT8E8M0])
@pytest.mark.parametrize("to", [TP.FLOAT, TP.FLOAT16, TP.INT8])
def test_cast_from_exotic(src, to):
    rng = np.random.default_rng(22)
    if src in _RANGE:
        feeds = [(_ints(rng, s, src),) for s in SEQ3]
    else:
        feeds = [(_x(rng, s, 6.0).astype(_NP[src]) if src == TP.FLOAT4E2M1
                  else _scales(rng, s).astype(_NP[src]),) for s in SEQ3]
    _run("Cast", [src], {"to": to}, 25, feeds, REF)


def test_cast_to_float4():
    rng = np.random.default_rng(23)
    fixed = np.array([2.52, 2.5, 0.25, 0.75, 1.75, -3.5, 5.0, 7.0, -1e9, np.inf, -0.0], np.float32)
    feeds = [(np.concatenate([fixed, _x(rng, (n,), 8.0)]),) for n in (4, 9, 1, 4)]
    _run("Cast", [TP.FLOAT], {"to": TP.FLOAT4E2M1}, 23, feeds, REF)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_e8m0(round_mode, saturate):
    # positive values only: negative ones are undefined; the reference maps inf and 0 otherwise than
    # the spec's tables, so they stay out too
    rng = np.random.default_rng(24)
    fixed = np.array([0.124, 0.125, 1.1, 1.5, 1.49, 3.0, 2.0 ** 127, 1e-38], np.float32)
    feeds = [(np.concatenate([fixed, np.exp2(rng.uniform(-20, 20, n))]).astype(np.float32),) for n in (3, 8, 1, 3)]
    _run("Cast", [TP.FLOAT], {"to": TP.FLOAT8E8M0, "round_mode": round_mode, "saturate": saturate}, 24,
         feeds, REF)


def test_cast_e8m0_specials():
    # the spec's tables: saturate + up maps 0 to the smallest power and inf to the largest;
    # without saturation both are NaN (the reference differs, so this checks values directly)
    x = np.array([0.0, np.inf, 1.5 * 2.0 ** 127, 1e-39, np.nan, 0.3], np.float32)
    want = {1: [2.0 ** -127, 2.0 ** 127, 2.0 ** 127, 2.0 ** -127, np.nan, 0.5],
            0: [np.nan, np.nan, np.nan, np.nan, np.nan, 0.5]}
    for sat, w in want.items():
        model = make_model("Cast", 1, [TP.FLOAT], {"to": TP.FLOAT8E8M0, "saturate": sat}, 24)
        sess = dynashape.InferenceSession(model, device=DEVICE)
        for n in (6, 3, 6):
            got = sess.run(None, {"in0": x[:n]})[0]
            assert got.dtype == ml_dtypes.float8_e8m0fnu
            np.testing.assert_array_equal(got.astype(np.float32), np.array(w[:n], np.float32))


def _castlike_then_cast(like_type, to):
    """CastLike(x, like) -> Cast(to): the held value CastLike leaves must be the like type's."""
    nodes = [helper.make_node("CastLike", ["x", "like"], ["y"]), helper.make_node("Cast", ["y"], ["z"], to=to)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n"]),
                                       helper.make_tensor_value_info("like", like_type, [1])],
                          [helper.make_tensor_value_info("z", to, ["n"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("like_type", [TP.FLOAT, TP.FLOAT8E5M2, TP.INT8])
def test_castlike(like_type):
    rng = np.random.default_rng(25)
    like = np.ones(1, _NP[like_type])
    feeds = [(_x(rng, s, 100.0), like) for s in SEQ3]
    _run("CastLike", [TP.FLOAT, like_type], None, 21, feeds, REF if like_type == TP.FLOAT8E5M2 else BOTH)


@needs_out_types
@pytest.mark.parametrize("like_type", [TP.INT4, TP.UINT4])
def test_castlike_subbyte_held_value(like_type):
    model = _castlike_then_cast(like_type, TP.INT32)
    rng = np.random.default_rng(26)
    feeds = [{"x": np.trunc(rng.uniform(-30, 30, n)).astype(np.float32), "like": np.ones(1, _NP[like_type])}
             for n in (5, 9, 2, 5)]
    run_sequence(model, feeds, REF)


def test_exotic_input_output_roundtrip():
    # Identity on int4 / float4 / e8m0 graph inputs: the feeds' ml_dtypes come back unchanged
    for et in (TP.INT4, TP.UINT2, TP.FLOAT4E2M1, TP.FLOAT8E8M0):
        model = make_model("Identity", 1, [et], None, 25)
        rng = np.random.default_rng(27)
        feeds = [{"in0": (_ints(rng, s, et) if et in _RANGE else _scales(rng, s).astype(_NP[et]))}
                 for s in SEQ3]
        sess = dynashape.InferenceSession(model, device=DEVICE)
        for f in feeds:
            got = sess.run(None, f)[0]
            assert got.dtype == f["in0"].dtype
            np.testing.assert_array_equal(got.astype(np.float32), f["in0"].astype(np.float32))


def test_onnx_types_known():
    # every type this file feeds has an ONNX name (guards the table above against typos)
    for et in _NP:
        assert onnx.helper.tensor_dtype_to_np_dtype(et) == np.dtype(_NP[et])
