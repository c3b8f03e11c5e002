"""Byte-table lookups in one C call (ops/csrc/lut.c through ops/byte_tables.py), as torch's indexing
gives them: pairs of bytes over broadcasting shapes and strided views, single bytes, both 8-bit
types; the fallback counted. QLinearAdd / QLinearMul / QLinearSigmoid / QLinearLeakyRelu against
onnxruntime: tests/ops/test_contrib_quant*.py."""

from __future__ import annotations

import pytest
import torch

from dynashape.ops import byte_tables, native

pytestmark = pytest.mark.skipif(native.library("lut") is None, reason=f"no native build: {native.why('lut')}")

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
