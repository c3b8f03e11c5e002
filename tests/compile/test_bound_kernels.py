"""Kernels bound to their node's constants (ops/registry.py ``binder``): the generated CPU runner
calls a kernel that read, checked and prepared a node's constant scales, zero points and B once.

Each bound op here runs a model whose parameters are initializers over changing shapes in the
compiled session (bound: counted in ``bound_kernels``) and in the interpreter (the registered
kernel, the reference): the results are the same bit for bit. Where a parameter is computed the
node keeps its registered kernel; a bound kernel hands what it does not serve (another dtype,
layouts past those it keeps) to the op itself, which raises the op's own typed errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.errors import ShapeError
from dynashape.ops import byte_tables, fused_quant, qgemm, qlinear_binary
from dynashape.ops.integer_gemm import prepared_b
from dynashape.ops.registry import COMPUTED
from tests.native_report import needs_native
from tests.ops.harness import make_model

MS = "com.microsoft"
pytestmark = needs_native("qgemm", "lut")


def _q(rng, shape, dt=np.uint8):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dt)


def _s(rng, shape=()):
    return np.asarray(rng.uniform(0.002, 0.05, size=shape), np.float32)


def _same_as_interpreter(model, feeds_seq, *, bound: bool = True):
    """Compiled (bound kernels) and interpreter sessions give identical outputs over the sequence."""
    comp = dynashape.InferenceSession(model)
    ref = dynashape.InferenceSession(model, executor="interpreter")
    for feeds in feeds_seq:
        for g, w in zip(comp.run(None, feeds), ref.run(None, feeds)):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    assert (comp.compiled.stats["bound_kernels"] > 0) == bound
    return comp


def _one_node(op_type, in_types, consts, ranks, out_type, domain=MS, names=None):
    m = make_model(op_type, len(in_types), in_types, None, 17, 1, consts, ranks, domain=domain)
    g = m.graph
    del g.output[:]
    g.output.extend([helper.make_tensor_value_info("out0", out_type, None)])
    return m


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_binary_bound_over_layouts(op_type, dt):
    rng = np.random.default_rng(1)
    et = TP.UINT8 if dt == np.uint8 else TP.INT8
    consts = {1: _s(rng), 2: _q(rng, (), dt), 4: _s(rng), 5: _q(rng, (), dt), 6: _s(rng), 7: _q(rng, (), dt)}
    m = _one_node(op_type, [et, TP.FLOAT, et] * 2 + [TP.FLOAT, et], consts, [3, 0, 0, 3, 0, 0, 0, 0], et)
    shapes = [((2, 5, 8), (2, 5, 8)), ((1, 1, 8), (3, 4, 8)), ((2, 5, 8), (1, 1, 8)), ((3, 1, 1), (3, 7, 2)),
              ((2, 5, 8), (2, 5, 8))]  # same layout, broadcasts either way, the swapped span, back again
    _same_as_interpreter(m, [{"in0": _q(rng, a, dt), "in3": _q(rng, b, dt)} for a, b in shapes])


def test_qlinear_binary_bound_keeps_a_channels_last_layout_and_refers_the_rest():
    rng = np.random.default_rng(2)
    p = [torch.tensor(v) for v in (_s(rng), _q(rng, ()), _s(rng), _q(rng, ()), _s(rng), _q(rng, ()))]
    kernel = qlinear_binary._bind_binary("add", qlinear_binary._qlinear_add, [COMPUTED, *p[:2], COMPUTED, *p[2:]])
    a = torch.from_numpy(_q(rng, (2, 8, 5, 6))).contiguous(memory_format=torch.channels_last)
    b = torch.from_numpy(_q(rng, (1, 8, 1, 1)))
    got = kernel(a, p[0], p[1], b, *p[2:])
    want = qlinear_binary._qlinear_add(a, p[0], p[1], b, *p[2:])
    assert torch.equal(got, want) and got.stride() == want.stride()
    assert got.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ShapeError, match="QLinearAdd"):  # int8 B with a uint8 A: the op's own error
        kernel(a, p[0], p[1], b.view(torch.int8), *p[2:])
    for i in range(qlinear_binary._BOUND_LAYOUTS + 3):  # layouts past those kept: the op itself, same numbers
        x, y = torch.from_numpy(_q(rng, (i + 1, 3))), torch.from_numpy(_q(rng, (3,)))
        assert torch.equal(kernel(x, p[0], p[1], y, *p[2:]), qlinear_binary._qlinear_add(x, p[0], p[1], y, *p[2:]))


def test_computed_parameters_keep_the_registered_kernel():
    rng = np.random.default_rng(3)
    m = _one_node("QLinearAdd", [TP.UINT8, TP.FLOAT, TP.UINT8] * 2 + [TP.FLOAT, TP.UINT8], {},
                  [2, 0, 0, 2, 0, 0, 0, 0], TP.UINT8)
    feeds = [{"in0": _q(rng, (3, 4)), "in1": _s(rng), "in2": _q(rng, ()), "in3": _q(rng, (3, 4)), "in4": _s(rng),
              "in5": _q(rng, ()), "in6": _s(rng), "in7": _q(rng, ())} for _ in range(2)]
    _same_as_interpreter(m, feeds, bound=False)


@pytest.mark.parametrize("b_dt", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
def test_qlinear_matmul_bound(b_dt, per_column):
    rng = np.random.default_rng(4)
    k, n = 24, 10
    bshape = (n,) if per_column else ()
    b = rng.integers(-64, 64, (k, n)).astype(b_dt) if b_dt == np.int8 else _q(rng, (k, n))
    consts = {1: _s(rng), 2: _q(rng, ()), 3: b, 4: _s(rng, bshape), 5: _q(rng, bshape, b_dt), 6: _s(rng),
              7: _q(rng, ())}
    bt = TP.UINT8 if b_dt == np.uint8 else TP.INT8
    m = _one_node("QLinearMatMul", [TP.UINT8, TP.FLOAT, TP.UINT8, bt, TP.FLOAT, bt, TP.FLOAT, TP.UINT8], consts,
                  [3, 0, 0, 2, len(bshape), len(bshape), 0, 0], TP.UINT8, domain="")
    _same_as_interpreter(m, [{"in0": _q(rng, (bb, r, k))} for bb, r in [(2, 3), (1, 9), (4, 1), (2, 3)]])


@pytest.mark.parametrize("op_type", ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_contrib_products_bound(op_type, with_bias):
    rng = np.random.default_rng(5)
    k, n = 20, 7
    b, bs, bz = rng.integers(-64, 64, (k, n)).astype(np.int8), _s(rng, (n,)), _q(rng, (n,), np.int8)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    if op_type == "DynamicQuantizeMatMul":
        consts = {1: b, 2: bs, 3: bz, **({4: bias} if with_bias else {})}
        types = [TP.FLOAT, TP.INT8, TP.FLOAT, TP.INT8] + ([TP.FLOAT] if with_bias else [])
        ranks = [3, 2, 1, 1, 1][:len(types)]
        feeds = [{"in0": rng.uniform(-2, 3, (bb, r, k)).astype(np.float32)} for bb, r in [(2, 3), (1, 6), (3, 1)]]
    else:
        consts = {1: b, 3: bs, 5: bz, **({6: bias} if with_bias else {})}
        types = [TP.UINT8, TP.INT8, TP.FLOAT, TP.FLOAT, TP.UINT8, TP.INT8] + ([TP.FLOAT] if with_bias else [])
        ranks = [3, 2, 0, 1, 0, 1, 1][:len(types)]
        feeds = [{"in0": _q(rng, (bb, r, k)), "in2": _s(rng), "in4": _q(rng, ())} for bb, r in [(2, 3), (1, 6)]]
    m = _one_node(op_type, types, consts, ranks, TP.FLOAT)
    _same_as_interpreter(m, feeds)


def test_fake_quant_bound_through_a_qdq_pair():
    """QuantizeLinear -> DequantizeLinear of one constant scale and zero point: fuse_qdq's FakeQuant,
    bound; a channels-last input goes to the op itself (its dense_pair), same numbers."""
    rng = np.random.default_rng(6)
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["a", "b"])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    inits = [numpy_helper.from_array(np.array(0.037, np.float32), "s"),
             numpy_helper.from_array(np.array(131, np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Neg", ["d"], ["y"])]  # (a pair whose result is a graph output is not fused)
    m = helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)],
                          ir_version=8)
    _same_as_interpreter(m, [{"x": rng.uniform(-6, 6, s).astype(np.float32)} for s in [(3, 5), (1, 40), (7, 2)]])
    s, z = torch.tensor(0.037), torch.tensor(131, dtype=torch.uint8)
    kernel = fused_quant._bind_fake_quant([COMPUTED, s, z], {"lo": 0, "hi": 255})
    t = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last) * 4
    assert torch.equal(kernel(t, s, z), fused_quant._fake_quant(t, s, z))


@pytest.mark.parametrize("zp_dt", [np.uint8, np.int8, None])
def test_quantize_and_dequantize_bound_to_one_scale(zp_dt):
    """QuantizeLinear and DequantizeLinear apart (no pair to fuse: one quantizes an input, the
    other dequantizes another) with one constant scale and zero point: their numbers read once at
    the bind, the C passes as the ops', bit for bit; an int32 input to DequantizeLinear goes to the
    op itself."""
    rng = np.random.default_rng(8)
    q_dt = np.int8 if zp_dt == np.int8 else np.uint8
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s")]
    q_in, d_in = ["x", "s"], ["p", "s"]
    if zp_dt is not None:
        inits.append(numpy_helper.from_array(np.array(3, zp_dt), "z"))
        q_in.append("z")
        d_in.append("z")
    nodes = [helper.make_node("QuantizeLinear", q_in, ["q"]), helper.make_node("DequantizeLinear", d_in, ["y"])]
    qt = TP.INT8 if q_dt == np.int8 else TP.UINT8
    g = helper.make_graph(nodes, "qd", [helper.make_tensor_value_info("x", TP.FLOAT, ["a", 2]),
                                        helper.make_tensor_value_info("p", qt, ["b", 3])],
                          [helper.make_tensor_value_info("q", qt, None),
                           helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    info = np.iinfo(q_dt)
    feeds = [{"x": rng.uniform(-6, 6, (n, 2)).astype(np.float32),
              "p": rng.integers(info.min, info.max + 1, (n + 1, 3)).astype(q_dt)} for n in (3, 1, 8)]
    comp = _same_as_interpreter(m, feeds)
    assert comp.compiled.stats["bound_kernels"] == 2
    from dynashape.ops import quant
    s = torch.tensor(0.05)
    z = None if zp_dt is None else torch.from_numpy(np.array(3, zp_dt))
    x32 = torch.arange(-4, 5, dtype=torch.int32)
    assert torch.equal(quant._bind_dequantize([COMPUTED, s, z], {})(x32, s, z), quant._dequantize(x32, s, z))
    x = torch.randn(4, 6) * 3
    assert torch.equal(quant._bind_quantize([COMPUTED, s, z], {})(x, s, z), quant._quantize(x, s, z))


@pytest.mark.parametrize("kind", ["u8", "dynamic"])
def test_qgemm_bind_is_product(kind):
    """qgemm.bind's function and qgemm.product give the same bits (its constant half and its call)."""
    rng = np.random.default_rng(7)
    b = torch.from_numpy(rng.integers(-64, 64, (32, 70)).astype(np.int8))
    prep, scale, bias = prepared_b(b, None), torch.from_numpy(_s(rng, (70,))), torch.randn(70)
    run = qgemm.bind(prep, b_scale=scale, bias=bias)
    for shape in [(5, 32), (2, 3, 32), (1, 32)]:
        if kind == "u8":
            a, k, kw = torch.from_numpy(_q(rng, shape)), qgemm.A_U8, {"a_scale": 0.02, "a_zp": 7}
        else:
            a, k, kw = torch.randn(shape), qgemm.A_DYNAMIC, {}
        want = qgemm.product(a, k, prep, b_scale=scale, bias=bias, **kw)
        got = run(a, k, kw.get("a_scale", 1.0), kw.get("a_zp", 0))
        assert torch.equal(got, want)
    assert run(torch.randn(3, 31), qgemm.A_DYNAMIC) is None  # another K: not served, the caller's op decides


def test_binary_walk_of_layouts():
    a, b = torch.zeros(2, 3, 4, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8)
    dims, sa, sb, shape, strides = byte_tables.binary_walk(a, b)
    assert list(dims) == [2, 3, 4] and list(sb) == [0, 0, 1] and shape == (2, 3, 4) and strides == (12, 4, 1)
    dims, sa, sb, shape, strides = byte_tables.binary_walk(a, a)
    assert list(dims) == [24] and list(sa) == list(sb) == [1]
