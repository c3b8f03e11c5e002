"""The decode step's attention over KV storages (ops/kv_attention.py): every query sees the
first ``length + n_new`` keys and nothing beyond, whatever the storage holds there; on CUDA the
Triton kernels (split over blocks of keys) against the same attention in plain torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynashape.ops import kv_attention as ka
from tests.helpers import run_interpreted


def _reference(q, k, v, total, scale):
    g = q.shape[1] // k.shape[1]
    kk = k[:, :, :total].repeat_interleave(g, dim=1).float()
    vv = v[:, :, :total].repeat_interleave(g, dim=1).float()
    return F.scaled_dot_product_attention(q.float(), kk, vv, scale=scale)


def _case(device, dtype, b, h, kvh, s, cap, past, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g).to(device, dtype)
    k = torch.randn(b, kvh, cap, d, generator=g).to(device, dtype)
    v = torch.randn(b, kvh, cap, d, generator=g).to(device, dtype)
    total = past + s
    k[:, :, total:] = 1e4  # large and finite beyond the length: must get a weight of exactly 0
    v[:, :, total:] = -1e4
    length = torch.tensor([past], device=device)
    valid = torch.arange(cap, device=device)[None, :] < total
    neg = torch.zeros((1, 1, 1, cap), dtype=dtype, device=device).masked_fill_(~valid.view(1, 1, 1, cap),
                                                                                float("-inf"))
    return q, k, v, length, neg, total


CASES = [(1, 12, 4, 1, 256, 16), (2, 8, 8, 1, 64, 0), (3, 12, 4, 2, 128, 100), (1, 4, 1, 1, 64, 63),
         (2, 16, 2, 4, 320, 200), (10, 12, 4, 1, 128, 90)]  # the last: 40 KV heads' rows, one warp a program


@pytest.mark.parametrize("b,h,kvh,s,cap,past", CASES)
def test_torch_form_sees_only_the_keys_written(b, h, kvh, s, cap, past, monkeypatch):
    monkeypatch.setattr(ka, "triton", None)
    q, k, v, length, neg, total = _case("cpu", torch.float32, b, h, kvh, s, cap, past)
    out = ka.kv_attention(q, k, v, length, s, neg, 0.125)
    torch.testing.assert_close(out, _reference(q, k, v, total, 0.125), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("iters", [None, 1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,h,kvh,s,cap,past", CASES)
def test_triton_kernels_match(b, h, kvh, s, cap, past, dtype, iters, monkeypatch):
    if not torch.cuda.is_available() or ka.triton is None:
        pytest.skip("the Triton kernels need CUDA and triton")
    monkeypatch.setattr(ka, "ITERS", iters)  # blocks a program (None: the rule's); 8: no combine here
    q, k, v, length, neg, total = _case("cuda", dtype, b, h, kvh, s, cap, past)
    out = ka.kv_attention(q, k, v, length, s, neg, 0.125)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), _reference(q, k, v, total, 0.125), **tol)
    # the same kernels replayed from a CUDA graph at another length read the length from the device
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = ka.kv_attention(q, k, v, length, s, neg, 0.125)
    shorter = max(0, past - 7)
    length.fill_(shorter)
    neg.zero_()[..., shorter + s:] = float("-inf")
    k[:, :, shorter + s:] = 1e4
    graph.replay()
    torch.testing.assert_close(res.float(), _reference(q, k, v, shorter + s, 0.125), **tol)


def _masked_case(device, dtype, b, h, kvh, s, cap, past, kind, seed=1):
    """A case with a key mask over the capacity (as an attention_mask input makes it): random
    keys hidden per batch row and, for an [b, 1, s, cap] mask, per query; garbage beyond."""
    q, k, v, length, neg, total = _case(device, dtype, b, h, kvh, s, cap, past, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    seen = torch.rand(b, 1, s, cap, generator=g) > 0.3
    seen[..., total - 1] = True  # every query sees one key at least
    seen[..., total:] = torch.rand(b, 1, s, cap - total, generator=g) > 0.5  # beyond the length: ignored
    seen = seen.to(device)
    if kind == "add":
        mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, torch.finfo(dtype).min)
    else:
        mask = seen if kind == "keep" else ~seen
    g_ = h // kvh
    kk = k[:, :, :total].repeat_interleave(g_, dim=1).float()
    vv = v[:, :, :total].repeat_interleave(g_, dim=1).float()
    ref = F.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=seen[..., :total], scale=0.125)
    return q, k, v, length, neg, mask, ref


MASKED_CASES = [(2, 12, 4, 1, 64, 20), (3, 8, 8, 1, 128, 100), (2, 4, 2, 3, 64, 30)]


@pytest.mark.parametrize("kind", ["add", "keep", "drop"])
@pytest.mark.parametrize("b,h,kvh,s,cap,past", MASKED_CASES)
def test_a_key_mask_is_applied_and_ignored_beyond_the_length(b, h, kvh, s, cap, past, kind, monkeypatch):
    monkeypatch.setattr(ka, "triton", None)
    q, k, v, length, neg, mask, ref = _masked_case("cpu", torch.float32, b, h, kvh, s, cap, past, kind)
    out = ka.kv_attention(q, k, v, length, s, neg, 0.125, mask, kind)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind", ["add", "keep"])
@pytest.mark.parametrize("b,h,kvh,s,cap,past", MASKED_CASES)
def test_triton_kernels_apply_a_key_mask(b, h, kvh, s, cap, past, kind, dtype):
    if not torch.cuda.is_available() or ka.triton is None:
        pytest.skip("the Triton kernels need CUDA and triton")
    q, k, v, length, neg, mask, ref = _masked_case("cuda", dtype, b, h, kvh, s, cap, past, kind)
    out = ka.kv_attention(q, k, v, length, s, neg, 0.125, mask, kind)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.float(), ref, **tol)


@pytest.mark.parametrize("b,h,kvh,s,cap,past", CASES[:3])
def test_triton_dot_form_matches_too(b, h, kvh, s, cap, past, monkeypatch):
    """Few query rows take sums over d (SMALL_ROWS); the 16-row dot form, which more rows take, on them too."""
    if not torch.cuda.is_available() or ka.triton is None:
        pytest.skip("the Triton kernels need CUDA and triton")
    monkeypatch.setattr(ka, "SMALL_ROWS", 0)
    q, k, v, length, neg, total = _case("cuda", torch.float32, b, h, kvh, s, cap, past)
    out = ka.kv_attention(q, k, v, length, s, neg, 0.125)
    torch.testing.assert_close(out, _reference(q, k, v, total, 0.125), atol=2e-5, rtol=1e-4)


INTERPRETED = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from dynashape.ops import kv_attention as ka
from tests.helpers import run_interpreted
from tests.ops.test_kv_attention import CASES, MASKED_CASES, _case, _masked_case, _reference
# blocks a program: one (a combine over the splits), three (a running softmax, splits of uneven use),
# eight (one program per KV head at these capacities: the output written directly, no combine)
for b, h, kvh, s, cap, past in CASES:
    for small, iters in ((0, 1), (8, 1), (8, 3), (0, 8), (8, 8)):
        ka.SMALL_ROWS, ka.ITERS = small, iters
        q, k, v, length, neg, total = _case("cpu", torch.float32, b, h, kvh, s, cap, past)
        out = ka.kv_attention(q, k, v, length, s, neg, 0.125)
        torch.testing.assert_close(out, _reference(q, k, v, total, 0.125), atol=2e-5, rtol=1e-4)
for b, h, kvh, s, cap, past in MASKED_CASES:
    for iters in (1, 8):
        ka.ITERS = iters
        q, k, v, length, neg, mask, ref = _masked_case("cpu", torch.float32, b, h, kvh, s, cap, past, "add")
        torch.testing.assert_close(ka.kv_attention(q, k, v, length, s, neg, 0.125, mask, "add"), ref, atol=2e-5,
                                   rtol=1e-4)
print("ok")
"""


def test_triton_kernels_interpreted_on_the_cpu_match_the_reference():
    run_interpreted(INTERPRETED)
