"""Attention of small heads in one C call (ops/csrc/attention.c through ops/cpu_attention.py): against
a float64 softmax(q k^T * scale + bias) v over changing shapes, strided heads (as a model's
transposes leave them), grouped heads, a transposed K, broadcast masks, head dims and lengths that
are no multiple of the vector width; the builds for other CPUs; rows whose scores are all masked
left to torch; calls and fallbacks counted. The contrib and fused Attention ops' comparisons with
onnxruntime (tests/ops/test_contrib_*, tests/zoo) run through it too."""

from __future__ import annotations

import pytest
import torch

from dynashape.ops import contrib_attention, cpu_attention, native
from tests.native_report import needs_native

from .harness import other_build


@pytest.fixture(autouse=True)
def every_size(monkeypatch):
    """The size limits (measured choices) off: the kernel's numbers at every size."""
    monkeypatch.setattr(cpu_attention, "MIN_WORK", 0)

pytestmark = needs_native("attention")

CASES = [  # b, nk, group, s, t, d, dv
    (1, 1, 1, 1, 1, 1, 1), (2, 2, 1, 5, 7, 16, 16), (3, 1, 4, 17, 33, 20, 9), (1, 4, 2, 64, 64, 64, 64),
    (2, 3, 1, 3, 130, 33, 40), (4, 2, 3, 31, 16, 8, 8),
]


def _inputs(g, b, nk, group, s, t, d, dv, mask, k_transposed):
    n = nk * group
    q = torch.randn(b, s, n, d, generator=g).transpose(1, 2)  # (B, N, S, D) with the heads strided
    k = (torch.randn(b, nk, d, t, generator=g).transpose(-1, -2) if k_transposed
         else torch.randn(b, t, nk, d, generator=g).transpose(1, 2))
    v = torch.randn(b, nk, t, dv, generator=g)
    bias = {"none": None, "keys": torch.randn(b, 1, 1, t, generator=g) * 3,
            "full": torch.randn(b, n, s, t, generator=g), "2d": torch.randn(s, t, generator=g)}[mask]
    return q, k, v, bias


def _reference(q, k, v, bias, scale, group):
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = q.double() @ k.transpose(-1, -2) * scale + (0 if bias is None else bias.double())
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("mask", ["none", "keys", "full", "2d"])
@pytest.mark.parametrize("k_transposed", [False, True])
def test_matches_float64_over_shapes(mask, k_transposed):
    g = torch.Generator().manual_seed(hash((mask, k_transposed)) % 1000)
    for b, nk, group, s, t, d, dv in CASES:
        q, k, v, bias = _inputs(g, b, nk, group, s, t, d, dv, mask, k_transposed)
        before = native.counters().get("attention_native_calls", 0)
        got = cpu_attention.attention(q, k, v, bias, d ** -0.5)
        assert native.counters()["attention_native_calls"] == before + 1
        assert got.shape == (b, nk * group, s, dv)
        torch.testing.assert_close(got.double(), _reference(q, k, v, bias, d ** -0.5, group), rtol=1e-5, atol=2e-6)


def test_three_dims_and_threads(monkeypatch):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(6, t, d, generator=g) for t, d in ((9, 16), (11, 16), (11, 8)))
    want = _reference(q, k, v, None, 0.3, 1)
    for min_work in (0, 1 << 62):  # threaded, one thread
        monkeypatch.setattr(cpu_attention, "_THREAD_MIN_WORK", min_work)
        torch.testing.assert_close(cpu_attention.attention(q, k, v, None, 0.3).double(), want, rtol=1e-5, atol=2e-6)


def test_what_it_leaves_to_torch(monkeypatch):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, t, 8, generator=g) for t in (3, 4, 4))
    masked = torch.zeros(1, 1, 3, 4)
    masked[0, 0, 1] = float("-inf")  # a row with every key masked: torch's kernel says what it gives
    assert cpu_attention.attention(q, k, v, masked, 0.3) is None
    assert cpu_attention.attention(q.double(), k.double(), v.double(), None, 0.3) is None
    assert cpu_attention.attention(q, k, v, masked.bool(), 0.3) is None
    # through the op: torch's result for that call
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masked, scale=0.3)
    got = contrib_attention._attend(q, k, v, masked, 0.3)
    assert torch.equal(got.isnan(), want.isnan())
    monkeypatch.setenv("DYNASHAPE_NATIVE", "0")
    before = native.counters().get("attention_torch_fallbacks", 0)
    assert cpu_attention.attention(q, k, v, None, 0.3) is None
    assert native.counters()["attention_torch_fallbacks"] == before + 1


@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"])
def test_other_cpu_builds(monkeypatch, tmp_path, arch):
    """The builds without AVX-512 (one row at a time, plain loops): the same sums in the same
    order per output, the row sums in another (within float32 rounding)."""
    fn = other_build("attention", "attention_f32", cpu_attention._kernel(), arch, tmp_path)
    g = torch.Generator().manual_seed(3)
    for b, nk, group, s, t, d, dv in CASES:
        q, k, v, bias = _inputs(g, b, nk, group, s, t, d, dv, "keys", False)
        here = cpu_attention.attention(q, k, v, bias, 0.25)
        monkeypatch.setattr(cpu_attention, "_kernel", lambda: fn)
        other = cpu_attention.attention(q, k, v, bias, 0.25)
        monkeypatch.undo()
        torch.testing.assert_close(other, here, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k_transposed", [False, True])
def test_key_lengths_and_merged_heads_as_the_bias(k_transposed):
    """lens (a right-padded mask_index) gives bit for bit what the (B, 1, 1, T) bias of 0 and fill
    gives, lengths of 0, inside and past T included; merged writes the heads side by side, bit for
    bit the (B, N, S, Dv) result transposed."""
    g = torch.Generator().manual_seed(4)
    for b, nk, group, s, t, d, dv in CASES:
        q, k, v, _ = _inputs(g, b, nk, group, s, t, d, dv, "none", k_transposed)
        lens = torch.randint(0, t + 2, (b,), generator=g, dtype=torch.int32)
        lens[0] = t // 2
        bias = torch.where(torch.arange(t) < lens.reshape(b, 1), 0.0, -10000.0).reshape(b, 1, 1, t)
        want = cpu_attention.attention(q, k, v, bias, 0.3)
        got = cpu_attention.attention(q, k, v, None, 0.3, lens=lens, fill=-10000.0)
        assert torch.equal(got, want)
        merged = cpu_attention.attention(q, k, v, None, 0.3, lens=lens, fill=-10000.0, merged=True)
        assert torch.equal(merged, want.transpose(1, 2).reshape(b, s, nk * group * dv))
    # not served: a bias and lengths at once, lengths of another type or count
    q, k, v, bias = _inputs(g, 2, 1, 1, 3, 4, 8, 8, "keys", False)
    for kw in ({"lens": torch.ones(2, dtype=torch.int32)}, ):
        assert cpu_attention.attention(q, k, v, bias, 0.3, **kw) is None
    assert cpu_attention.attention(q, k, v, None, 0.3, lens=torch.ones(2, dtype=torch.int64)) is None
    assert cpu_attention.attention(q, k, v, None, 0.3, lens=torch.ones(3, dtype=torch.int32)) is None


def test_core_with_lengths_where_the_kernel_does_not_serve(monkeypatch):
    """_core's lengths: the C kernel's result, and where it does not serve (here: every size sent
    to torch) the bias those lengths make, as _padding_bias builds it from the mask_index."""
    g = torch.Generator().manual_seed(5)
    q, k, v, _ = _inputs(g, 3, 2, 1, 6, 9, 8, 8, "none", False)
    lens = torch.tensor([9, 4, 0], dtype=torch.int32)
    fill = -10000.0
    bias = contrib_attention._padding_bias(lens, 3, 6, 0, 9, fill, "mask_index", dummy_ok=True)
    want = contrib_attention._core(q, k, v, bias, None, 0.3, torch.float32)
    got = contrib_attention._core(q, k, v, None, None, 0.3, torch.float32, (lens, fill))
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(cpu_attention, "MAX_WORK", 0)
    before = native.counters().get("attention_native_calls", 0)
    torch_want = contrib_attention._core(q, k, v, bias, None, 0.3, torch.float32)
    assert torch.equal(contrib_attention._core(q, k, v, None, None, 0.3, torch.float32, (lens, fill)), torch_want)
    full = torch.tensor([9, 9, 12], dtype=torch.int32)  # no key left out: the unmasked kernel
    assert torch.equal(contrib_attention._core(q, k, v, None, None, 0.3, torch.float32, (full, fill)),
                       contrib_attention._core(q, k, v, None, None, 0.3, torch.float32))
    assert native.counters().get("attention_native_calls", 0) == before  # torch's, all of them


def test_layouts_each_get_their_own_plan():
    """The C call's parameters are kept per layout (shapes, strides, dtypes, threads): the same
    shapes with other strides (a transposed view), a 3-D call and another thread count each
    give torch's numbers."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    bias = torch.randn(1, 1, 5, 5, generator=g)

    def want(q, k, v, bias):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.4)
    before = len(cpu_attention._PLANS)
    for _ in range(2):
        torch.testing.assert_close(cpu_attention.attention(q, k, v, bias, 0.4), want(q, k, v, bias))
    assert len(cpu_attention._PLANS) == before + 1  # found the second time
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # the same shape, other strides
    kt = k.transpose(2, 3).contiguous().transpose(2, 3)
    torch.testing.assert_close(cpu_attention.attention(qt, kt, v, bias, 0.4), want(q, k, v, bias))
    torch.testing.assert_close(cpu_attention.attention(q[0], k[0], v[0], None, 0.4), want(q[0], k[0], v[0], None))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.testing.assert_close(cpu_attention.attention(q, k, v, bias, 0.4), want(q, k, v, bias))
    finally:
        torch.set_num_threads(threads)
