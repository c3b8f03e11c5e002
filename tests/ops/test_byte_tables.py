"""Byte-table lookups in one C call (ops/csrc/lut.c through ops/byte_tables.py), as torch's indexing
gives them: pairs of bytes over broadcasting shapes and strided views, single bytes, both 8-bit
types; the fallback counted. QLinearAdd / QLinearMul / QLinearSigmoid / QLinearLeakyRelu against
onnxruntime: tests/ops/test_contrib_quant*.py."""

from __future__ import annotations

import pytest
import torch

from dynashape.ops import byte_tables, native
from tests.native_report import needs_native

pytestmark = needs_native("lut")

SHAPES = [((5,), (5,)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (3, 7)), ((), (2, 2)),
          ((2, 3, 1, 5), (1, 3, 4, 1)), ((0, 3), (3,))]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
def test_pairs_are_torchs_indexing(dtype):
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, 256, (65536,), dtype=torch.uint8, generator=g).view(dtype)
    for sa, sb in SHAPES:
        a = torch.randint(0, 256, sa, dtype=torch.uint8, generator=g)
        b = torch.randint(0, 256, sb, dtype=torch.uint8, generator=g)
        wa, wb = torch.broadcast_tensors(a, b)
        want = table[(wa.to(torch.int64) << 8) | wb.to(torch.int64)]
        got = byte_tables.pairs(table, a, b)
        assert got.dtype == dtype and torch.equal(got, want), (sa, sb)
    a = torch.randint(0, 256, (6, 8), dtype=torch.uint8, generator=g).t()  # strided
    b = torch.randint(0, 256, (8, 6), dtype=torch.uint8, generator=g)[::2]
    b = b.repeat(2, 1)
    assert torch.equal(byte_tables.pairs(table, a, b), table[(a.to(torch.int64) << 8) | b.to(torch.int64)])


def test_single_and_fallback(monkeypatch):
    g = torch.Generator().manual_seed(1)
    table = torch.randint(-128, 128, (256,), dtype=torch.int8, generator=g)
    x = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=g)[:, ::2]
    assert torch.equal(byte_tables.single(table, x), table[x.to(torch.int64)])
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    before = native.counters().get("lut_torch_fallbacks", 0)
    assert byte_tables.single(table, x) is None and byte_tables.pairs(table, x, x) is None
    assert native.counters()["lut_torch_fallbacks"] == before + 2


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("axis,opset", [(-1, 13), (1, 13), (0, 13), (1, 11)])
def test_qlinear_softmax_in_c_is_the_torch_path(monkeypatch, dtype, axis, opset):
    """QLinearSoftmax (onnxruntime's exp table, in-order float32 row sum, rounding, clamp above):
    the C pass gives the torch path's bytes over changing shapes and axes."""
    from dynashape.ops import qlinear_tables
    g = torch.Generator().manual_seed(2)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    for shape in [(2, 3, 17), (1, 4, 64), (5, 1, 3), (2, 2, 130)]:
        x = torch.randint(lo, hi, shape, dtype=dtype, generator=g)
        args = (x, torch.tensor(0.07), torch.tensor(0, dtype=dtype), torch.tensor(1 / 256),
                torch.tensor(0 if dtype == torch.uint8 else -128, dtype=dtype))
        before = native.counters().get("lut_native_calls", 0)
        got = qlinear_tables._qlinear_softmax(*args, axis=axis, opset=opset)
        assert native.counters()["lut_native_calls"] == before + 1
        with monkeypatch.context() as m:
            m.setenv("DYNASHAPE_NATIVE", "0")
            want = qlinear_tables._qlinear_softmax(*args, axis=axis, opset=opset)
        assert torch.equal(got, want), shape


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("kind", ["add", "mul"])
def test_qlinear_add_mul_arithmetic_equals_their_tables(monkeypatch, dtype, kind):
    """QLinearAdd / QLinearMul by their arithmetic in C (lut.c qbinary_u8): bit for bit the 65536-entry
    tables (onnxruntime's FMA chain, the swapped form where A broadcasts along the innermost dim,
    rounding and saturation), over broadcasting shapes, strided views and random parameters,
    scales that push many values past the type's range among them."""
    from dynashape.ops import qlinear_binary
    fn = qlinear_binary._qlinear_add if kind == "add" else qlinear_binary._qlinear_mul
    g = torch.Generator().manual_seed(3)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    cases = SHAPES + [((4, 8, 16), (4, 8, 16)), ((4, 8, 1), (4, 8, 16)), ((4, 8, 16), (1, 8, 16))]
    for i, (sa, sb) in enumerate(cases * 3):
        a = torch.randint(lo, hi, sa, dtype=dtype, generator=g)
        b = torch.randint(lo, hi, sb, dtype=dtype, generator=g)
        if i == len(cases) and a.dim() >= 2:
            a = a.transpose(0, 1).contiguous().transpose(0, 1)  # strided
        s = [torch.tensor(float(torch.rand((), generator=g)) * (0.2 if i % 3 else 0.01) + 1e-3) for _ in range(3)]
        z = [torch.tensor(int(torch.randint(lo, hi, (), generator=g)), dtype=dtype) for _ in range(3)]
        args = (a, s[0], z[0], b, s[1], z[1], s[2], z[2])
        before = native.counters().get("lut_native_calls", 0)
        got = fn(*args)
        assert native.counters()["lut_native_calls"] == before + 1
        with monkeypatch.context() as m:
            m.setattr(byte_tables, "arithmetic", lambda *x: None)  # the table path (lut2_u8)
            want = fn(*args)
        assert got.dtype == want.dtype == dtype and torch.equal(got, want), (sa, sb)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.uint16, torch.int16])
def test_dequantize_linear_in_c_is_the_torch_path(monkeypatch, dtype):
    """DequantizeLinear of one scale and zero point in one C pass (lut.c dequant_small): float32(x -
    zp) * scale bit for bit as the torch steps, strided inputs, an out buffer, tiny scales."""
    from dynashape.ops import quant
    g = torch.Generator().manual_seed(4)
    lo, hi = (0, 65536) if dtype == torch.uint16 else (torch.iinfo(dtype).min, torch.iinfo(dtype).max + 1)
    for shape, sc in [((5,), 0.0123), ((3, 40, 17), 3.7e-5), ((2, 8, 9), 1e-30), ((0, 4), 0.5)]:
        x = torch.randint(lo, hi, shape, dtype=torch.int64, generator=g).to(dtype)
        s = torch.tensor(sc)
        z = torch.tensor(int(torch.randint(lo, hi, (), generator=g))).to(dtype)
        for v in (x, x[..., ::2]):
            got, want = _c_and_torch(monkeypatch, quant._dequantize, v, s, z)
            assert got.dtype == want.dtype == torch.float32 and torch.equal(got, want)
        out = torch.empty(shape)
        assert quant._dequantize(x, s, z, out=out) is out and torch.equal(out, quant._dequantize(x, s, z))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
def test_quantize_linear_in_c_is_the_torch_path(monkeypatch, dtype):
    """QuantizeLinear of one scale and zero point in one C pass (lut.c quant_small): division,
    rounding half to even (ties made on purpose), zero point and saturation as the torch steps."""
    from dynashape.ops import quant
    g = torch.Generator().manual_seed(5)
    lo, hi = (0, 256) if dtype == torch.uint8 else (-128, 128)
    for shape, sc in [((5,), 0.0123), ((3, 40, 17), 0.5), ((2, 8, 9), 1e-3), ((0, 4), 0.5)]:
        s = torch.tensor(sc)
        x = torch.randn(shape, generator=g) * 200 * sc  # past the type's range too
        x.view(-1)[: x.numel() // 2] = (torch.randint(-300, 300, (x.numel() // 2,), generator=g) + 0.5) * sc  # ties
        z = torch.tensor(int(torch.randint(lo, hi, (), generator=g)), dtype=dtype)
        for v in (x, x[..., ::2]):
            got, want = _c_and_torch(monkeypatch, quant._quantize, v, s, z)
            assert got.dtype == want.dtype == dtype and torch.equal(got, want)


def test_channels_last_activations_keep_their_layout(monkeypatch):
    """A CNN's channels-last activations through the C passes (QLinearAdd with and without a
    broadcast operand, DequantizeLinear, QuantizeLinear, FakeQuant): the torch path's values, and the
    result channels-last too (an NCHW result would make the next convolution reorder it)."""
    from dynashape.ops import fused_quant, qlinear_binary, quant
    g = torch.Generator().manual_seed(6)
    cl = torch.channels_last
    a = torch.randint(0, 256, (2, 8, 5, 6), dtype=torch.uint8, generator=g).contiguous(memory_format=cl)
    b = torch.randint(0, 256, (2, 8, 5, 6), dtype=torch.uint8, generator=g).contiguous(memory_format=cl)
    c = torch.randint(0, 256, (1, 8, 1, 1), dtype=torch.uint8, generator=g)
    x = torch.randn(2, 8, 5, 6, generator=g).contiguous(memory_format=cl)
    s, z = torch.tensor(0.02), torch.tensor(128, dtype=torch.uint8)
    cases = [(qlinear_binary._qlinear_add, (a, s, z, b, s, z, s, z)),
             (qlinear_binary._qlinear_add, (a, s, z, c, s, z, s, z)),
             (qlinear_binary._qlinear_mul, (a, s, z, c, s, z, s, z)), (quant._dequantize, (a, s, z)),
             (quant._quantize, (x, s, z)), (fused_quant._fake_quant, (x, s, z))]
    for fn, args in cases:
        got = fn(*args)
        with monkeypatch.context() as m:
            m.setenv("DYNASHAPE_NATIVE", "0")
            want = fn(*args)
        assert torch.equal(got, want), fn.__name__
        assert got.is_contiguous(memory_format=cl) and not got.is_contiguous(), fn.__name__


def _c_and_torch(monkeypatch, fn, *args):
    """fn(*args) through its C pass (counted once) and through its torch path."""
    before = native.counters().get("lut_native_calls", 0)
    got = fn(*args)
    assert native.counters()["lut_native_calls"] == before + 1
    with monkeypatch.context() as m:
        m.setenv("DYNASHAPE_NATIVE", "0")
        want = fn(*args)
    return got, want
