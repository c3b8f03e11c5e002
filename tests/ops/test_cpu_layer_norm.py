"""Layer normalizations in one C pass bound to their constants (ops/cpu_layer_norm.py): the pass
against torch's arithmetic (float32 rounding apart: its statistics sum in other orders), the
skips it serves (same shape, broadcast over leading dims) and what it hands to the op itself
(other dtypes, rows that are not contiguous, a skip broadcast in the middle, the statistics
outputs, another axis). The ops' own tests (tests/contrib/test_transformer_ops.py, the ONNX node
tests) compare the compiled sessions that call these kernels with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP

import dynashape
from dynashape.ops import cpu_layer_norm as L
from dynashape.ops import native
from dynashape.ops.contrib_transformer import _skip_layer_norm
from dynashape.ops.norm import _layernorm
from dynashape.ops.registry import COMPUTED
from tests.native_report import needs_native
from tests.ops.harness import make_model

pytestmark = needs_native("elementwise")
TOL = {"rtol": 1e-5, "atol": 2e-5}


def _vecs(h, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(h, generator=g) for _ in range(3)]


@pytest.mark.parametrize("h", [37, 64])
@pytest.mark.parametrize("skip_shape", ["same", "no_batch", "batch1"])
def test_pass_matches_torch(h, skip_shape):
    gamma, beta, bias = _vecs(h)
    run = L.layer_norm_bound(gamma, beta, bias, 1e-5, False)
    for b, s in [(2, 3), (1, 7), (4, 1)]:
        x = torch.randn(b, s, h)
        skip = {"same": torch.randn(b, s, h), "no_batch": torch.randn(s, h), "batch1": torch.randn(1, s, h)}[skip_shape]
        y, total = run(x, skip, True, None)
        want_total = x + skip + bias
        torch.testing.assert_close(total, want_total, **TOL)
        torch.testing.assert_close(y, F.layer_norm(want_total, (h,), gamma, beta, 1e-5), **TOL)


def test_simplified_and_plain():
    gamma, beta, _ = _vecs(48, 1)
    x, skip = torch.randn(3, 5, 48), torch.randn(3, 5, 48)
    y, total = L.layer_norm_bound(gamma, None, None, 1e-6, True)(x, skip, False, None)
    assert total is None
    torch.testing.assert_close(y, F.rms_norm(x + skip, (48,), gamma, 1e-6), **TOL)
    out = torch.empty(3, 5, 48)
    y, _ = L.layer_norm_bound(gamma, beta, None, 1e-5, False)(x, None, False, out)
    assert y is out  # written into the buffer given
    torch.testing.assert_close(y, F.layer_norm(x, (48,), gamma, beta, 1e-5), **TOL)


def test_what_the_pass_does_not_serve():
    gamma, beta, bias = _vecs(16, 2)
    run = L.layer_norm_bound(gamma, beta, bias, 1e-5, False)
    x = torch.randn(2, 3, 16)
    assert run(x.double(), x.double(), False, None) is None
    assert run(x.transpose(0, 1), x.transpose(0, 1), False, None) is None  # rows not contiguous
    assert run(x, torch.randn(2, 1, 16), False, None) is None  # broadcast in the middle
    assert run(torch.randn(2, 3, 8), None, False, None) is None  # another hidden size
    assert L.layer_norm_bound(gamma.double(), None, None, 1e-5, False) is None
    assert L.layer_norm_bound(torch.randn(2, 16), None, None, 1e-5, False) is None


def test_bound_skip_layer_norm_hands_the_statistics_to_the_op():
    gamma, beta, bias = _vecs(24, 3)
    attrs = {"epsilon": 1e-5, "_n_outputs": 4, "_present": (True, True, True, True)}
    kernel = L._bind_skip_layer_norm([COMPUTED, COMPUTED, gamma, beta, bias], attrs)
    x, skip = torch.randn(2, 4, 24), torch.randn(2, 4, 24)
    got = kernel(x, skip, gamma, beta, bias)
    want = _skip_layer_norm(x, skip, gamma, beta, bias, **attrs)
    assert got[1] is not None and all(torch.equal(a, b) for a, b in zip(got, want))  # the op's own results
    attrs["_present"] = (True, False, False, True)
    kernel = L._bind_skip_layer_norm([COMPUTED, COMPUTED, gamma, beta, bias], attrs)
    before = native.counters().get("skip_ln_native_calls", 0)
    y, mean, inv, total = kernel(x, skip, gamma, beta, bias)
    assert native.counters()["skip_ln_native_calls"] == before + 1 and mean is None and inv is None
    torch.testing.assert_close(total, x + skip + bias, **TOL)
    assert L._bind_skip_layer_norm([COMPUTED, COMPUTED, COMPUTED, beta, bias], attrs) is None  # gamma computed


def test_bound_layer_norm_other_axis_goes_to_the_op():
    scale, b, _ = _vecs(6, 4)
    x = torch.randn(2, 5, 6)
    kernel = L._bind_layer_norm([COMPUTED, scale, b], {"axis": -1, "epsilon": 1e-5})
    out = torch.empty_like(x)
    assert kernel(x, scale, b, out=out) is out
    torch.testing.assert_close(out, F.layer_norm(x, (6,), scale, b, 1e-5), **TOL)
    s2, b2 = torch.randn(5, 6), torch.randn(5, 6)
    kernel = L._bind_layer_norm([COMPUTED, s2, b2], {"axis": 1, "epsilon": 1e-5})
    assert kernel is None  # a 2-D scale: not the last axis alone
    kernel = L._bind_layer_norm([COMPUTED, scale, b], {"axis": 0, "epsilon": 1e-5})
    x1 = torch.randn(6)
    out = torch.empty_like(x1)
    torch.testing.assert_close(kernel(x1, scale, b, out=out), _layernorm(x1, scale, b, axis=0, out=torch.empty(6)))


def test_a_model_runs_the_pass_and_matches_onnxruntime():
    import onnxruntime as ort
    rng = np.random.default_rng(5)
    h = 40
    consts = {1: rng.standard_normal(h).astype(np.float32), 2: rng.standard_normal(h).astype(np.float32)}
    model = make_model("LayerNormalization", 3, [TP.FLOAT] * 3, {"axis": -1, "epsilon": 1e-5}, 17, 1, consts,
                       [3, 1, 1])
    sess = dynashape.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    before = native.counters().get("skip_ln_native_calls", 0)
    for b, s in [(1, 3), (2, 9), (1, 1), (2, 9)]:
        x = rng.standard_normal((b, s, h)).astype(np.float32)
        name = sess.get_inputs()[0].name
        np.testing.assert_allclose(sess.run(None, {name: x})[0], ref.run(None, {name: x})[0], rtol=1e-4, atol=1e-5)
    assert native.counters()["skip_ln_native_calls"] >= before + 4


def test_bound_fused_norms_match_their_ops():
    from dynashape.ops import fused
    w, b, _ = _vecs(20, 6)
    x = torch.randn(3, 4, 20)
    rms = L._bind_rms_norm([COMPUTED, w], {"epsilon": 1e-6})
    torch.testing.assert_close(rms(x, w), fused._rms_norm(x, w, epsilon=1e-6), **TOL)
    ln = L._bind_fused_layer_norm([COMPUTED, w, b], {"epsilon": 1e-5})
    torch.testing.assert_close(ln(x, w, b), fused._layer_norm(x, w, b, epsilon=1e-5), **TOL)
    xd = x.double()  # another dtype: the ops themselves
    assert torch.equal(rms(xd, w.double()), fused._rms_norm(xd, w.double(), epsilon=1e-6))
    assert L._bind_rms_norm([COMPUTED, None], {}) is None
