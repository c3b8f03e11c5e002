"""fused.folded_gqa: grouped-query attention with each KV head's queries folded into one sequence
equals scaled_dot_product_attention over the repeated keys and values, for every mask form the
Attention op takes (none, one row for all queries, a row per query, per head or for all heads)."""

import pytest
import torch
import torch.nn.functional as F

from dynashape.ops.fused import folded_gqa


def reference(q, k, v, mask, scale):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask,
                                          scale=scale)


@pytest.mark.parametrize("s", [1, 5])
@pytest.mark.parametrize("mask_shape", [None, (2, 1, 1, 9), (1, 1, "s", 9), (2, 6, "s", 9), (2, 6, 1, 9)])
@pytest.mark.parametrize("kind", ["additive", "bool"])
def test_folded_equals_the_repeated_heads(s, mask_shape, kind):
    g = torch.Generator().manual_seed(s + len(str(mask_shape)))
    q = torch.randn(2, 6, s, 8, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 2, 9, 8, generator=g, dtype=torch.float64), torch.randn(2, 2, 9, 4, generator=g,
                                                                                    dtype=torch.float64)
    mask = None
    if mask_shape is not None:
        shape = tuple(s if d == "s" else d for d in mask_shape)
        keep = torch.rand(shape, generator=g) > 0.3
        keep[..., 0] = True  # no row without a key
        mask = keep if kind == "bool" else torch.zeros(shape, dtype=torch.float64).masked_fill(~keep, -1e9)
    got = folded_gqa(q, k, v, mask, 0.3)
    assert got is not None and got.shape == (2, 6, s, 4)
    torch.testing.assert_close(got, reference(q, k, v, mask, 0.3), rtol=1e-12, atol=1e-12)


def test_shapes_it_does_not_serve_are_left_to_the_caller():
    q, kv = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 3, 8)
    assert folded_gqa(q, kv, kv, None, 1.0) is None  # no grouping
    assert folded_gqa(q, torch.randn(1, 3, 3, 8), torch.randn(1, 3, 3, 8), None, 1.0) is None  # 4 over 3
    assert folded_gqa(q, kv[:, :2], kv[:, :2], torch.zeros(1, 4, 2, 3, 1), 1.0) is None  # a 5-D mask
