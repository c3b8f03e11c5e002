"""ops/csrc/elementwise.c's tanh (onnxruntime's, ort_math.h; torch's CPU tanh is ~8x slower than
onnxruntime's): accuracy against float64 over the whole range and the special values, a session
over changing shapes against onnxruntime bit for bit, and its calls and fallbacks counted. Its FakeQuant (a
QDQ pair in one pass): bit for bit the four torch calls. Its RMSNorm (the fused op's CPU kernel):
within float32 rounding of F.rms_norm, and the other CPU builds the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import elementwise, fused, native
from tests.native_report import needs_native

from .harness import other_build

pytestmark = needs_native("elementwise")


@pytest.mark.parametrize("scale", [1e-30, 1e-6, 1e-2, 0.3, 0.55, 1.0, 4.0, 40.0])
def test_tanh_within_a_few_ulp(scale):
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(0)) * scale
    y = elementwise.tanh(x)
    want = torch.tanh(x.double())
    rel = ((y.double() - want).abs() / want.abs().clamp_min(1e-300)).max().item()
    assert rel <= 3 * torch.finfo(torch.float32).eps, rel


def test_tanh_special_values_and_out():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 0.55, -0.55, 9.0, 88.0, 1e30, -1e30])
    x = x.repeat(1 << 11)  # above the size that takes the C kernel
    out = torch.empty_like(x)
    y = elementwise.tanh(x, out=out)
    assert y is out
    head = y[:11]
    assert torch.equal(torch.signbit(head), torch.signbit(x[:11]))  # tanh(-0) = -0
    assert head[2] == 1 and head[3] == -1 and torch.isnan(head[4])
    assert torch.equal(head[[0, 1, 9, 10]], torch.tensor([0.0, -0.0, 1.0, -1.0]))


def test_tanh_in_a_session_matches_onnxruntime_and_is_counted(monkeypatch):
    import onnxruntime as ort
    g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "T", 64])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess, ref = dynashape.InferenceSession(model), ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    before = native.counters().get("ort_tanh_native_calls", 0)
    shapes = [(2, 300, 64), (1, 3, 64), (4, 128, 64), (2, 300, 64)]
    for shp in shapes:
        x = (rng.standard_normal(shp) * 1.5).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    assert native.counters()["ort_tanh_native_calls"] == before + 4  # every size: the bits are onnxruntime's
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")  # the same formula in torch ops
    fb = native.counters().get("ort_tanh_torch_fallbacks", 0)
    x = rng.standard_normal((4, 128, 64)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    assert native.counters()["ort_tanh_torch_fallbacks"] == fb + 1


def test_a_trace_gets_torchs_tanh():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(1 << 16)
        y = elementwise.tanh(x)  # a C kernel cannot run on fake tensors: torch's is traced
    assert y.shape == x.shape


def test_tanh_into_an_out_of_another_shape_is_torchs():
    x = torch.randn(1 << 15)
    out = torch.empty(1 << 16)  # not x's shape: torch's tanh resizes it; the C kernel would not
    with pytest.warns(UserWarning, match="resized"):
        y = elementwise.tanh(x, out=out)
    assert y.shape == x.shape and torch.allclose(y, torch.tanh(x))


@pytest.mark.parametrize("n", [1, 7, 1000, 1 << 17])
@pytest.mark.parametrize("zdtype", [torch.uint8, torch.int8])
def test_fake_quant_in_c_is_the_torch_path_bit_for_bit(monkeypatch, n, zdtype):
    """Division, round half to even, clamp to the type's range less the zero point, product: the
    C pass gives the torch calls' numbers exactly, ties (x / s = k + 0.5), saturation and NaN
    included; a strided x and an out of another shape too."""
    from dynashape.ops import fused_quant
    g = torch.Generator().manual_seed(n)
    lo, hi = (0, 255) if zdtype == torch.uint8 else (-128, 127)
    for trial in range(6):
        s = torch.tensor(float(torch.rand((), generator=g)) * 0.1 + 1e-4)
        x = torch.randn(2 * n, generator=g)[::2] * (300 * float(s) if trial % 2 else 1.0)  # strided; saturating
        x[: n // 3] = (torch.randint(-200, 200, (n // 3,), generator=g) + 0.5) * s  # ties
        if trial == 3:
            x[n // 2] = float("nan")
        z = torch.tensor(int(torch.randint(lo, hi + 1, (), generator=g)), dtype=zdtype)
        before = native.counters().get("fake_quant_native_calls", 0)
        got = fused_quant._fake_quant(x, s, z, lo=lo, hi=hi, out=torch.empty(3) if trial == 5 else None)
        assert native.counters()["fake_quant_native_calls"] == before + 1
        with monkeypatch.context() as m:
            m.setenv("DYNASHAPE_NATIVE", "0")
            want = fused_quant._fake_quant(x, s, z, lo=lo, hi=hi)
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)) and got.isnan().sum() == want.isnan().sum()


RMS_SHAPES = [(1, 64), (3, 12, 64), (2, 5, 1), (7, 33), (4, 16), (2, 3, 130), (0, 8)]


@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm_in_c_against_float64(with_weight):
    g = torch.Generator().manual_seed(1)
    for shape in RMS_SHAPES:
        x = torch.randn(shape, generator=g) * 3
        w = torch.randn(shape[-1], generator=g) if with_weight else None
        before = native.counters().get("rms_norm_native_calls", 0)
        y = fused._rms_norm(x, w, epsilon=1e-6)
        assert native.counters()["rms_norm_native_calls"] == before + 1
        xd = x.double()
        want = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 if w is None else w.double())
        torch.testing.assert_close(y.double(), want, rtol=4e-7, atol=1e-7)
        torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (shape[-1],), w, 1e-6), rtol=1e-6, atol=1e-7)


def test_rms_norm_leaves_the_rest_to_torch():
    x = torch.randn(4, 8)
    for args in ((x.double(), None), (x.t(), None), (x, torch.randn(8).double()), (x, torch.randn(7))):
        assert fused._rms_norm_native(args[0], args[1], 1e-5) is None
    t = torch.randn(2, 3, 8).transpose(0, 1)  # not contiguous: torch's, same numbers
    torch.testing.assert_close(fused._rms_norm(t, None), torch.nn.functional.rms_norm(t, (8,), None, 1e-5))


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_rms_norm_other_cpu_builds(monkeypatch, tmp_path, arch):
    fn = other_build("elementwise", "rms_norm_f32", native.function("elementwise", "rms_norm_f32", "ppiidpi"),
                     arch, tmp_path)
    g = torch.Generator().manual_seed(2)
    for shape in RMS_SHAPES[:-1]:
        x, w = torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
        here = fused._rms_norm(x, w)
        monkeypatch.setattr(native, "function", lambda *a, **k: fn)
        other = fused._rms_norm(x, w)
        monkeypatch.undo()
        torch.testing.assert_close(other, here, rtol=1e-6, atol=1e-7)


def _embed_case(g, b, s, h, vocab=50, npos=40, nseg=3, seg=True, dtype=torch.int32):
    ids = torch.randint(0, vocab, (b, s), generator=g, dtype=dtype)
    seg_ids = torch.randint(0, nseg, (b, s), generator=g, dtype=dtype) if seg else None
    word, pos = torch.randn(vocab, h, generator=g), torch.randn(npos, h, generator=g)
    segt = torch.randn(nseg, h, generator=g) if seg else None
    return ids, seg_ids, word, pos, segt, torch.randn(h, generator=g), torch.randn(h, generator=g)


@pytest.mark.parametrize("seg", [False, True])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_embed_layer_norm_in_c_against_torch(seg, dtype):
    """EmbedLayerNormalization's C pass against the torch path (gathers, adds, layer_norm) within
    float32 rounding, the embedding sum output too, over shapes and hidden sizes no multiple of 16."""
    from dynashape.ops import contrib_transformer as CT
    g = torch.Generator().manual_seed(4)
    for b, s, h in [(1, 16, 64), (4, 7, 33), (2, 40, 128), (3, 1, 5)]:
        ids, seg_ids, word, pos, segt, gamma, beta = _embed_case(g, b, s, h, seg=seg, dtype=dtype)
        got = CT._embed_ln_native(ids, seg_ids, word, pos, segt, gamma, beta, 1e-12, True)
        assert got is not None
        e = word[ids] + pos[:s] + (segt[seg_ids] if seg else 0)
        want = torch.nn.functional.layer_norm(e, (h,), gamma, beta, 1e-12)
        torch.testing.assert_close(got[0], want, rtol=2e-5, atol=2e-5)
        assert torch.equal(got[1], e)


def test_embed_layer_norm_leaves_bad_ids_and_other_inputs_to_torch():
    from dynashape.ops import contrib_transformer as CT
    g = torch.Generator().manual_seed(5)
    ids, seg_ids, word, pos, segt, gamma, beta = _embed_case(g, 2, 6, 16)
    bad = ids.clone()
    bad[1, 2] = 50  # outside the table: the torch path raises onnxruntime's error
    assert CT._embed_ln_native(bad, seg_ids, word, pos, segt, gamma, beta, 1e-12, False) is None
    with pytest.raises(IndexError):
        CT._embed_layer_norm(bad, seg_ids, word, pos, segt, gamma, beta, _n_outputs=1)
    assert CT._embed_ln_native(ids, seg_ids, word.double(), pos, segt, gamma, beta, 1e-12, False) is None
    assert CT._embed_ln_native(ids, None, word, pos, segt, gamma, beta, 1e-12, False) is None  # row 0: torch's
    long = torch.zeros(1, 41, dtype=torch.int32)  # longer than the position table: torch's error
    assert CT._embed_ln_native(long, None, word, pos, None, gamma, beta, 1e-12, False) is None


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_embed_layer_norm_other_cpu_builds(monkeypatch, tmp_path, arch):
    from dynashape.ops import contrib_transformer as CT
    like = native.function("elementwise", "embed_ln_f32", "ppiiiipipipippdppi")
    fn = other_build("elementwise", "embed_ln_f32", like, arch, tmp_path)
    g = torch.Generator().manual_seed(6)
    args = _embed_case(g, 2, 9, 48)
    here = CT._embed_ln_native(*args, 1e-12, True)
    monkeypatch.setattr(native, "function", lambda *a, **k: fn)
    other = CT._embed_ln_native(*args, 1e-12, True)
    monkeypatch.undo()
    torch.testing.assert_close(other[0], here[0], rtol=1e-6, atol=1e-6)
