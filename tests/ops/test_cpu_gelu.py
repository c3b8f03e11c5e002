"""FastGelu in one C pass bound to its constant bias (ops/cpu_gelu.py): against torch's tanh GELU
of x + bias (float32 rounding and the C tanh's ~2 ulp apart), and what goes to the op itself.
tests/contrib/test_transformer_ops.py compares the compiled sessions with onnxruntime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynashape.ops import cpu_gelu, native
from dynashape.ops.contrib_transformer import _fast_gelu
from dynashape.ops.registry import COMPUTED
from tests.native_report import needs_native

pytestmark = needs_native("elementwise")


@pytest.mark.parametrize("with_bias", [True, False])
def test_pass_matches_torch(with_bias):
    g = torch.Generator().manual_seed(0)
    bias = torch.randn(40, generator=g) if with_bias else None
    kernel = cpu_gelu._bind_fast_gelu([COMPUTED, bias], {})
    for shape in [(1, 1, 40), (3, 7, 40), (2, 40)]:
        x = torch.randn(shape, generator=g) * 3
        want = F.gelu(x + bias if with_bias else x, approximate="tanh")
        before = native.counters().get("gelu_native_calls", 0)
        torch.testing.assert_close(kernel(x, bias), want, rtol=1e-5, atol=1e-6)
        assert native.counters()["gelu_native_calls"] == before + 1
        out = torch.empty(shape)
        assert kernel(x, bias, out=out) is out


def test_what_the_pass_does_not_serve():
    bias = torch.randn(8)
    kernel = cpu_gelu._bind_fast_gelu([COMPUTED, bias], {})
    x = torch.randn(4, 8, dtype=torch.float64)
    assert torch.equal(kernel(x, bias.double()), _fast_gelu(x, bias.double()))
    xt = torch.randn(8, 4).t()  # rows not contiguous
    torch.testing.assert_close(kernel(xt, bias), F.gelu(xt + bias, approximate="tanh"))
    assert cpu_gelu._bind_fast_gelu([COMPUTED, COMPUTED], {}) is None
