"""Float32 attention on bfloat16 tensor cores with split operands (ops/split_attention.py): the
kernel against float64 over changing shapes, masks (broadcast, per head and row, a finite fill
whole rows, ``-inf`` whole rows), grouped heads, the heads-last layout and strided operands; in
Triton's interpreter on the CPU, compiled on a GPU; and a CUDA session's fused attention taking it
(``fp32_products="split"``) against onnxruntime over a sequence of shapes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from dynashape.ops import split_attention as sa
from dynashape.ops import split_tf32
from tests.helpers import run_interpreted

KERNEL_CASES = """
import math
def ref(q, k, v, mask, scale):
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v

gen = torch.Generator().manual_seed(0)
def randn(*shape):
    return torch.randn(*shape, generator=gen).to(DEV)

tok = split_tf32.MODE.set("split")
calls = sa.KERNEL_CALLS[0]
# (batch, heads, kv heads, queries, keys, head dim, mask, heads_last)
cases = [(2, 3, 3, 5, 7, 16, "b11l", False), (1, 4, 2, 70, 130, 32, "none", True),
         (2, 2, 2, 9, 9, 64, "bhsl", False), (1, 2, 2, 3, 65, 16, "fill", True), (3, 2, 1, 129, 64, 64, "11sl", True),
         (1, 1, 1, 1, 1, 16, "none", False)]
for b, h, hk, s, n, d, mk, heads_last in cases:
    # q as a projection's heads are: a view of [b, s, h * d] (strides not of a contiguous tensor)
    q = randn(b, s, h * d).view(b, s, h, d).transpose(1, 2) * 2
    k, v = randn(b, hk, n, d), randn(b, hk, n, d)
    mask = {"none": None, "b11l": randn(b, 1, 1, n), "bhsl": randn(b, h, s, n), "11sl": randn(1, 1, s, n),
            "fill": torch.zeros(b, 1, 1, n, device=DEV)}[mk]
    if mk == "fill":  # an exporter's padding: finfo.min, not -inf
        mask[..., n // 2:] = torch.finfo(torch.float32).min
    got = sa.attention(q, k, v, mask, 1 / math.sqrt(d), heads_last=heads_last)
    want = ref(q, k, v, mask, 1 / math.sqrt(d))
    assert got.shape == want.shape
    if heads_last:  # written as (b, s, h, d): the transpose after it is contiguous
        assert got.transpose(1, 2).is_contiguous()
    err = float((got.double() - want).norm() / want.norm())
    assert err < 2e-5, (b, h, s, n, d, mk, err)
# a row whose every key is -inf: NaN (ONNX's Softmax), the other rows as the reference
q, k, v = randn(1, 2, 4, 16), randn(1, 2, 6, 16), randn(1, 2, 6, 16)
mask = torch.zeros(1, 1, 4, 6, device=DEV)
mask[0, 0, 1] = float("-inf")
got = sa.attention(q, k, v, mask, 0.25)
assert torch.isnan(got[:, :, 1]).all() and not torch.isnan(got[:, :, [0, 2, 3]]).any()
torch.testing.assert_close(got[:, :, [0, 2, 3]].double(), ref(q, k, v, mask, 0.25)[:, :, [0, 2, 3]], rtol=1e-4,
                           atol=1e-4)
assert sa.KERNEL_CALLS[0] == calls + len(cases) + 1
# what it does not take: the caller's torch kernel serves
assert sa.attention(q.double(), k.double(), v.double(), None, 0.25) is None  # not float32
assert sa.attention(randn(1, 2, 4, 24), randn(1, 2, 6, 24), randn(1, 2, 6, 24), None, 0.25) is None  # head dim
assert sa.attention(q, k, v, mask.bool(), 0.25) is None  # a boolean mask
assert sa.attention(randn(1, 3, 4, 16), k, v, None, 0.25) is None  # heads not a multiple of the kv heads
split_tf32.MODE.reset(tok)
for mode, served in (("ieee", False), ("auto", False), ("split", True)):  # (auto: this small work is not worth it)
    t = split_tf32.MODE.set(mode)
    assert (sa.attention(q, k, v, None, 0.25) is not None) == served, mode
    split_tf32.MODE.reset(t)
"""

INTERPRETED = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from dynashape.ops import split_attention as sa, split_tf32
DEV = "cpu"
""" + KERNEL_CASES + """
print("ok")
"""


def test_the_kernel_interpreted_on_the_cpu_matches_float64():
    run_interpreted(INTERPRETED)


def test_the_cpu_takes_torchs_kernel():
    q = torch.randn(1, 2, 4, 16)
    tok = split_tf32.MODE.set("split")
    try:
        assert not sa.serves(q, q, q, None) or sa.INTERPRET
    finally:
        split_tf32.MODE.reset(tok)


cuda = pytest.mark.skipif(not torch.cuda.is_available() or sa.triton is None, reason="needs CUDA and Triton")


@cuda
def test_the_kernel_compiled_matches_float64():
    exec(KERNEL_CASES, {"torch": torch, "sa": sa, "split_tf32": split_tf32, "DEV": "cuda"})  # noqa: S102


def _attention_model(d: int = 64, heads: int = 4) -> onnx.ModelProto:
    """BERT's attention as torch.onnx writes it: scores scaled, an additive [B, 1, 1, S] mask,
    softmax, the weighted values, the heads merged."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "c"], ["sc"]),
             helper.make_node("Add", ["sc", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]),
             helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ot", "shape"], ["y"])]
    inits = [helper.make_tensor("c", f, [], [float(np.sqrt(d))]),
             helper.make_tensor("shape", TensorProto.INT64, [3], [0, 0, -1])]
    ins = [helper.make_tensor_value_info(n, f, ["b", heads, "s", d]) for n in ("q", "k", "v")]
    ins.append(helper.make_tensor_value_info("mask", f, ["b", 1, 1, "s"]))
    graph = helper.make_graph(nodes, "attention", ins, [helper.make_tensor_value_info("y", f, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@cuda
def test_a_sessions_fused_attention_takes_the_kernel_over_changing_shapes():
    import onnxruntime as ort

    import dynashape
    model = _attention_model()
    sess = dynashape.InferenceSession(model, device="cuda", static_impls="off", fp32_products="split")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    calls = sa.KERNEL_CALLS[0]
    shapes = [(2, 7), (1, 130), (3, 64), (2, 7), (4, 200)]
    for b, s in shapes:
        feeds = {n: rng.standard_normal((b, 4, s, 64)).astype(np.float32) for n in ("q", "k", "v")}
        mask = np.zeros((b, 1, 1, s), np.float32)
        mask[..., s - s // 3:] = np.finfo(np.float32).min  # right padding
        feeds["mask"] = mask
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert sa.KERNEL_CALLS[0] == calls + len(shapes)
    assert sess.stats()["split_attention_kernels"] == sa.KERNEL_CALLS[0]
