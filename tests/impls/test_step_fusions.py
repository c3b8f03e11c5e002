"""``fuse_rope_append`` (codegen/step_fusions.py) and its kernel (ops/rope_append.py): the rotary
embedding of a decode step's queries and keys and the writes of its keys and values into the KV
storages, as one call; the torch form against the four separate ops on CPU, the Triton kernel
against the torch form on CUDA; the whole-step source of the Llama test decoder uses it."""

from __future__ import annotations

import pytest
import torch

from dynashape.codegen.step_fusions import fuse_rope_append
from dynashape.ops import rope_append as ra
from dynashape.ops.rotary import rotary_half_torch

LINES = [
    "q = k_RotaryHalf_1_a(tq, cos, sin)",
    "kr = k_RotaryHalf_2_b(tk, cos, sin)",
    "pk = _kv_write(KS0, 2, IDX, kr)",
    "pv = _kv_write(KS1, 2, IDX, tv)",
    "o = _kv_attn(q, KS0, KS1, P, 1, NEG, 0.125)",
    "y = torch.add(o, x)",
]
FUSED = "q, pk, pv = _rope_append(tq, tk, tv, cos, sin, KS0, KS1, 2, IDX)"


def test_the_four_lines_become_one():
    assert fuse_rope_append(LINES, ["y"]) == [FUSED] + LINES[4:]


def test_two_layers_both_fuse():
    second = [x.replace("KS0", "KS2").replace("KS1", "KS3").replace("q", "q2").replace("kr", "kr2")
              .replace("pk", "pk2").replace("pv", "pv2").replace(" o ", " o2 ").replace("o = ", "o2 = ")
              for x in LINES[:5]]
    out = fuse_rope_append(LINES[:5] + second, ["o2"])
    assert len(out) == 4 and out[0] == FUSED and out[2].startswith("q2, pk2, pv2 = _rope_append(")


@pytest.mark.parametrize("change", ["key rotated by other tables", "rotated key read elsewhere",
                                    "a line between reads a made value", "rotated query returned"])
def test_near_misses_stay(change):
    lines, results = list(LINES), ["y"]
    if change == "key rotated by other tables":
        lines[1] = "kr = k_RotaryHalf_2_b(tk, cos2, sin)"
    elif change == "rotated key read elsewhere":
        lines.append("z = torch.mul(kr, x)")
    elif change == "a line between reads a made value":
        lines.insert(2, "w = torch.neg(q)")
    else:
        results = ["y", "q"]
    assert fuse_rope_append(lines, results) == lines


def _case(device, dtype, b=2, hq=6, hk=2, n=1, d=16, cap=24, pos=5):
    g = torch.Generator(device=device).manual_seed(b * 10 + n)
    merged = torch.randn(b, n, (hq + 2 * hk) * d, generator=g, device=device, dtype=dtype)
    # q, k and v as the merged q/k/v product hands them out: views, heads moved to axis 1
    q = merged[..., :hq * d].view(b, n, hq, d).permute(0, 2, 1, 3)
    k = merged[..., hq * d:(hq + hk) * d].view(b, n, hk, d).permute(0, 2, 1, 3)
    v = merged[..., (hq + hk) * d:].view(b, n, hk, d).permute(0, 2, 1, 3)
    cos = torch.randn(1, 1, n, d, generator=g, device=device, dtype=dtype)
    sin = torch.randn(1, 1, n, d, generator=g, device=device, dtype=dtype)
    ks = torch.randn(b, hk, cap, d, generator=g, device=device, dtype=dtype)
    vs = torch.randn(b, hk, cap, d, generator=g, device=device, dtype=dtype)
    idx = torch.arange(n, device=device) + pos
    return q, k, v, cos, sin, ks, vs, idx


def _separate(q, k, v, cos, sin, ks, vs, idx):
    ks, vs = ks.clone(), vs.clone()
    ks.index_copy_(2, idx, rotary_half_torch(k, cos, sin))
    vs.index_copy_(2, idx, v)
    return rotary_half_torch(q, cos, sin), ks, vs


@pytest.mark.parametrize("n", [1, 3])
def test_torch_form_is_the_four_ops(n):
    args = _case("cpu", torch.float32, n=n)
    want = _separate(*args)
    got = ra.rope_append(*args[:5], args[5], args[6], 2, args[7])
    assert got[1] is args[5] and got[2] is args[6]  # written in place: the presents are the storages
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available() or ra.triton is None, reason="needs CUDA and Triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 4])
def test_triton_kernel_matches_torch(dtype, n):
    args = _case("cuda", dtype, n=n, d=64, cap=40, pos=17)
    assert ra._fits(args[0], args[1], args[2], args[5], args[6], 2)
    want = _separate(*args)
    got = ra.rope_append(*args[:5], args[5], args[6], 2, args[7])
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
