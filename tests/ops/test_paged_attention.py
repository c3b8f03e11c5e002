"""PagedAttention (ops/paged_attention.py) and the pass that puts it in a decoder (compile/paged_kv.py).

The op's two forms (the torch one on the CPU, the Triton decode kernel on CUDA) against the paged
engine's reference (paged/attention.py: each conversation's positions gathered from its blocks, one
scaled_dot_product_attention per conversation), over sequences of steps whose rows, lengths and
chunk sizes change, with fresh random keys and values each time; padding rows and padding
positions must never write a conversation's blocks."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import dynashape as ds
from dynashape.compile.pipeline import compile_graph
from dynashape.errors import ShapeError
from dynashape.frontend.parse import ParseOptions, parse_model
from dynashape.ops import paged_attention as pa
from dynashape.paged.attention import paged_attention, write_kv
from dynashape.paged.blocks import BlockPool
from tests.helpers import run_interpreted
from tests.models import llama

CFG = {**llama.TINY, "mask_input": True, "position_ids": True}


def _step(pool, rng, lengths: dict, new: dict, heads: int, device, dtype=torch.float32):
    """Conversations grown by ``new[key]`` positions after ``lengths[key]``: the batched inputs of the op
    (rows padded to ``len(new) + 1``, chunks to the longest plus one) and the reference's packed ones."""
    kvh, d = pool.k.shape[3], pool.k.shape[4]
    keys = list(new)
    b, s = len(keys) + 1, max(new.values()) + 1  # a padding row and a padding position at least
    q = torch.randn(b, heads, s, d, device=device, dtype=dtype)
    k_new = torch.randn(b, kvh, s, d, device=device, dtype=dtype)
    v_new = torch.randn(b, kvh, s, d, device=device, dtype=dtype)
    slots = np.full((b, s), pool.scratch_slot, dtype=np.int64)
    starts, lens = np.zeros(b, np.int64), np.ones(b, np.int64)
    for i, key in enumerate(keys):
        slots[i, :new[key]] = pool.grow(key, new[key])
        starts[i], lens[i] = lengths.get(key, 0), lengths.get(key, 0) + new[key]
        lengths[key] = int(lens[i])
    width = int(max(len(pool.tables[k].blocks) for k in keys)) + int(rng.integers(0, 3))  # wider than needed
    tables = np.full((b, width), pool.scratch_slot // pool.block_size, dtype=np.int64)
    for i, key in enumerate(keys):
        tables[i, :len(pool.tables[key].blocks)] = pool.tables[key].blocks
    t = {n: torch.from_numpy(a).to(device) for n, a in (("tables", tables), ("starts", starts), ("lens", lens),
                                                        ("slots", slots))}
    return keys, q, k_new, v_new, t


def _reference(pool, keys, new, q, k_new, v_new, t, layer: int, scale: float):
    """The engine's reference: the real positions written, then attention per conversation."""
    qs, ks, vs, slots = [], [], [], []
    for i, key in enumerate(keys):
        n = new[key]
        qs.append(q[i, :, :n].transpose(0, 1))
        ks.append(k_new[i, :, :n].transpose(0, 1))
        vs.append(v_new[i, :, :n].transpose(0, 1))
        slots.append(t["slots"][i, :n])
    write_kv(pool, layer, torch.cat(slots), torch.cat(ks), torch.cat(vs))
    out = paged_attention(torch.cat(qs), pool, layer, keys, [new[k] for k in keys], scale)
    return out


def _pool(device, dtype=torch.float32, layers=2, kvh=2, d=16, block=4, blocks=64):
    return BlockPool(blocks, block, layers, kvh, d, dtype, device)


@pytest.mark.parametrize("heads", [2, 4])  # 4 query heads over 2 KV heads: grouped-query attention
def test_torch_form_matches_the_reference_over_a_sequence_of_steps(heads, monkeypatch):
    monkeypatch.setattr(pa, "triton", None)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    ours, ref = _pool("cpu"), _pool("cpu")
    lengths: dict = {}
    steps = [{"a": 5, "b": 9}, {"a": 1, "b": 1}, {"a": 1, "b": 3, "c": 7}, {"a": 1, "c": 1}, {"b": 1, "c": 1, "d": 2}]
    for new in steps:
        keys, q, k, v, t = _step(ours, rng, lengths, new, heads, "cpu")
        for key in new:  # the reference pool takes the same blocks
            ref.grow(key, new[key])
        out = pa._paged_attention(q, k, v, ours.k[1], ours.v[1], t["tables"], t["starts"], t["lens"], t["slots"],
                                  scale=0.25)
        want = _reference(ref, keys, new, q, k, v, t, 1, 0.25)
        start = 0
        for i, key in enumerate(keys):
            n = new[key]
            torch.testing.assert_close(out[i, :, :n].transpose(0, 1), want[start:start + n], atol=2e-6, rtol=1e-5)
            start += n
        # what the op wrote is what the reference wrote: the padding went to the scratch slot only
        real = ours.k[1].reshape(-1, 2, 16)[: ours.scratch_slot]
        torch.testing.assert_close(real, ref.k[1].reshape(-1, 2, 16)[: ref.scratch_slot], atol=0, rtol=0)
        assert torch.isfinite(out).all()  # padding rows and positions too: they see positions of their own


def test_shape_errors_name_the_op():
    q = torch.randn(1, 3, 1, 16)
    pool = _pool("cpu")
    t = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(ShapeError, match="PagedAttention"):
        pa.attend(q, pool.k[0], pool.v[0], t, t[:, 0], t[:, 0] + 1, 1.0)


@pytest.mark.parametrize("kvh", [4, 2])
def test_rows_packed_along_one_batch_row_attend_as_the_same_rows_batched(kvh):
    # decode rows (one query) and prompt chunks (several) of different lengths packed one after another
    # along the tokens of a batch of one (qstarts: where each row's start), against the rows batched
    torch.manual_seed(1)
    heads, d, bs = 4, 16, 4
    pk, pv = torch.randn(41, bs, kvh, d), torch.randn(41, bs, kvh, d)
    tables = torch.stack([torch.randperm(40)[:8] for _ in range(4)])
    starts = torch.tensor([12, 0, 29, 3])
    lens = starts + torch.tensor([1, 7, 1, 3])
    q = torch.randn(4, heads, 7, d)
    want = pa.attend(q, pk, pv, tables, starts, lens, 0.25)
    qp, qstarts = _pack(q, lens - starts, 2)
    got = pa.attend(qp, pk, pv, tables, starts, lens, 0.25, qstarts)
    assert got.shape == (1, heads, qp.shape[2], d)
    for i in range(4):
        n, at = int(lens[i] - starts[i]), int(qstarts[i])
        torch.testing.assert_close(got[0, :, at:at + n], want[i, :, :n], atol=1e-6, rtol=1e-5)
    assert not got[0, :, -2:].any()
    with pytest.raises(ShapeError, match="packed rows need a batch of one"):
        pa.attend(q[:2], pk, pv, tables, starts, lens, 0.25)


def test_the_pass_rewrites_every_layer_and_the_session_takes_the_pool():
    path = str(llama.model_path(CFG))
    plain = ds.InferenceSession(path)
    paged = ds.InferenceSession(path, paged_kv=True)
    names = [i.name for i in paged.get_inputs()]
    assert {"paged.tables", "paged.starts", "paged.lens", "paged.slots"} <= set(names)
    assert {f"past_{kv}_{i}.pool" for kv in ("key", "value") for i in range(CFG["layers"])} <= set(names)
    assert sum(n.op_type == "PagedAttention" for n in paged.program.fused.nodes) == CFG["layers"]
    assert not any(n.op_type == "Attention" for n in paged.program.fused.nodes)
    # the LM head over each row's last new position only (paged.last): one row of logits a row
    assert paged.program.fused.paged_last == 1 and "paged.last" in names
    assert paged.program.graph.paged_kv_refused is None
    assert "paged.tables" not in [i.name for i in plain.get_inputs()]
    assert plain.program.graph.paged_kv_refused == "the session's paged_kv is off"


def test_the_lm_head_is_picked_before_cuda_s_fused_norm_and_product():
    # CUDA's fuse_norm_linear makes the final RMSNorm and the LM head one RMSNormLinear: the rows are
    # picked before it (the norm is each position's own); compiled for CUDA here, no GPU needed
    proto = onnx.load(str(llama.model_path(CFG)))
    fused = compile_graph(parse_model(proto, ParseOptions()), device="cuda", paged_kv=True).fused
    head = next(o for o in fused.outputs if o.name == "logits").producer
    assert fused.paged_last == 1 and head.op_type == "RMSNormLinear"
    assert head.inputs[0].producer.op_type == "PagedLast"


def test_a_graph_without_attention_over_a_past_is_left_as_it_is():
    path = str(llama.model_path({**CFG}))  # a decoder, with fusion off: no fused attention to rewrite
    s = ds.InferenceSession(path, paged_kv=True, fusion=False)
    assert s.program.graph.paged_kv_refused == "fusion is off"
    assert "paged.tables" not in [i.name for i in s.get_inputs()]
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    s = ds.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                            paged_kv=True)
    assert s.program.graph.paged_kv_refused == "no attention over a past input"


INTERPRETED = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
from dynashape.ops import paged_attention as pa
from tests.helpers import run_interpreted
torch.manual_seed(0)
for b, heads, kvh, d, bs, s in [(3, 12, 4, 64, 16, 1), (3, 12, 4, 64, 16, 37), (2, 4, 2, 16, 4, 9),
                                (2, 2, 2, 16, 4, 5)]:
    pk = torch.randn(61, bs, kvh, d)
    pv = torch.randn_like(pk)
    tables = torch.stack([torch.randperm(60)[:10] for _ in range(b)])
    starts = torch.minimum(torch.tensor([0, 5, 100][:b]), torch.tensor(10 * bs - s - 1))
    lens = starts + torch.tensor([s, max(1, s - 3), s][:b])  # a chunk with padding positions
    q = torch.randn(b, heads, s, d)
    want = pa._torch(q, pk, pv, tables, starts, lens, 0.125)
    got = pa.attend(q, pk, pv, tables, starts, lens, 0.125)
    for i in range(b):
        n = int(lens[i] - starts[i])
        torch.testing.assert_close(got[i, :, :n], want[i, :, :n], atol=2e-6, rtol=1e-5)
    if s == 1:  # the decode kernel's other forms: a 16-row dot (many query heads a KV head), other tiles
        for bn, small in ((64, False), (32, True), (256, True)):
            other = pa._triton(q, pk, pv, tables, lens, 0.125, block_n=bn, small=small)
            torch.testing.assert_close(other, want, atol=2e-6, rtol=1e-5)
    if s > 1:  # the same rows packed along the tokens of a batch of one (three tokens of no row at the end)
        qp, qstarts = _pack(q, lens - starts, 3)
        packed = pa.attend(qp, pk, pv, tables, starts, lens, 0.125, qstarts)
        for i in range(b):
            n, at = int(lens[i] - starts[i]), int(qstarts[i])
            torch.testing.assert_close(packed[0, :, at:at + n], want[i, :, :n], atol=2e-6, rtol=1e-5)
        assert not packed[0, :, -3:].any()
assert pa.COUNTS == {"paged_attention_triton": 7, "paged_attention_torch": 0}  # every call a kernel
print("ok")
"""

PACK_IMPORT = "from tests.ops.test_paged_attention import _pack\n"


def _pack(q, counts, spare):
    """Rows' first ``counts`` queries of q [B, H, S, D] one after another along the tokens of a batch of
    one, then ``spare`` tokens of no row (their output must be zeros); and where each row starts."""
    qs = [q[i, :, :int(c)] for i, c in enumerate(counts)]
    tail = q.new_zeros(q.shape[1], spare, q.shape[3]) + 7.0
    starts = torch.tensor([0] + [int(c) for c in counts][:-1]).cumsum(0)
    return torch.cat(qs + [tail], 1)[None], starts


INTERPRETED = INTERPRETED.replace("import torch\n", "import torch\n" + PACK_IMPORT, 1)


def test_triton_kernels_interpreted_on_the_cpu_match_the_torch_form():
    # the decode kernel (one query a row) and the chunks' kernel (a running softmax over the table) in
    # Triton's interpreter: their logic checked where there is no GPU (CI has no triton: skipped there;
    # with a GPU the compiled kernels are tested below, and the interpreter differs between Triton versions)
    run_interpreted(INTERPRETED, timeout=600)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_decode_kernel_matches_the_torch_form_and_replays_at_other_lengths(dtype):
    if not torch.cuda.is_available() or pa.triton is None:
        pytest.skip("the Triton kernel needs CUDA and triton")
    torch.manual_seed(0)
    b, heads, kvh, d, bs, blocks = 6, 12, 4, 64, 16, 200
    pk = torch.randn(blocks + 1, bs, kvh, d, device="cuda", dtype=dtype)
    pv = torch.randn_like(pk)
    width = 40  # up to 640 positions a row
    tables = torch.stack([torch.randperm(blocks, device="cuda")[:width] for _ in range(b)])
    lens = torch.tensor([1, 17, 64, 65, 300, 640], device="cuda")
    starts = lens - 1
    q = torch.randn(b, heads, 1, d, device="cuda", dtype=dtype)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    want = pa._torch(q, pk, pv, tables, starts, lens, 0.125)
    got = pa.attend(q, pk, pv, tables, starts, lens, 0.125)
    torch.testing.assert_close(got, want, **tol)
    graph = torch.cuda.CUDAGraph()  # a captured step reads the lengths and tables from the device
    with torch.cuda.graph(graph):
        res = pa.attend(q, pk, pv, tables, starts, lens, 0.125)
    lens.copy_(torch.tensor([3, 1, 100, 129, 7, 512], device="cuda"))
    starts.copy_(lens - 1)
    tables.copy_(tables.flip(1))
    graph.replay()
    torch.testing.assert_close(res, pa._torch(q, pk, pv, tables, starts, lens, 0.125), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_chunks_kernel_matches_the_torch_form(dtype):
    if not torch.cuda.is_available() or pa.triton is None:
        pytest.skip("the Triton kernel needs CUDA and triton")
    torch.manual_seed(1)
    b, heads, kvh, d, bs, blocks, s = 4, 12, 4, 64, 16, 200, 200
    pk = torch.randn(blocks + 1, bs, kvh, d, device="cuda", dtype=dtype)
    pv = torch.randn_like(pk)
    tables = torch.stack([torch.randperm(blocks, device="cuda")[:40] for _ in range(b)])
    starts = torch.tensor([0, 13, 256, 400], device="cuda")
    lens = starts + torch.tensor([200, 57, 130, 200], device="cuda")  # chunks padded to 200 positions
    q = torch.randn(b, heads, s, d, device="cuda", dtype=dtype)
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    want = pa._torch(q, pk, pv, tables, starts, lens, 0.125)
    got = pa.attend(q, pk, pv, tables, starts, lens, 0.125)
    for i in range(b):
        n = int(lens[i] - starts[i])
        torch.testing.assert_close(got[i, :, :n], want[i, :, :n], **tol)


def test_paged_group_query_attention_matches_the_dense_op_over_a_sequence_of_steps():
    # onnxruntime's GroupQueryAttention (our dense kernel, ops/contrib_gqa.py) per conversation against
    # the paged form over two conversations of different lengths at once: a prompt, then decode steps,
    # packed QKV, rotary at each row's own positions; fresh random inputs every step
    from dynashape.ops.contrib_gqa import _gqa

    torch.manual_seed(3)
    heads, kvh, h, bs = 4, 2, 16, 4
    cos = torch.rand(64, h // 2)
    sin = torch.rand(64, h // 2)
    pool = _pool("cpu", layers=1, kvh=kvh, d=h, block=bs, blocks=40)
    pasts = {"a": None, "b": None}
    lengths: dict = {}
    for new in ({"a": 5, "b": 9}, {"a": 1, "b": 1}, {"a": 1, "b": 1}):
        keys = list(new)
        s = max(new.values())
        qkv = torch.randn(len(keys), s, (heads + 2 * kvh) * h)
        starts = np.array([lengths.get(k, 0) for k in keys])
        slots = np.full((len(keys), s), pool.scratch_slot, dtype=np.int64)
        for i, k in enumerate(keys):
            slots[i, :new[k]] = pool.grow(k, new[k])
            lengths[k] = int(starts[i]) + new[k]
        width = max(len(pool.tables[k].blocks) for k in keys)
        tables = np.array([pool.tables[k].blocks + [0] * (width - len(pool.tables[k].blocks)) for k in keys])
        lens = starts + np.array([new[k] for k in keys])
        t = [torch.from_numpy(a) for a in (tables, starts, lens, slots)]
        y, kn, _ = pa._paged_gqa(qkv, None, None, cos, sin, pool.k[0], pool.v[0], *t, num_heads=heads,
                                 kv_num_heads=kvh, do_rotary=1)
        for i, k in enumerate(keys):
            n, p = new[k], pasts[k]
            past = p if p is not None else (torch.zeros(1, kvh, 0, h), torch.zeros(1, kvh, 0, h))
            want, pk, pv = _gqa(qkv[i:i + 1, :n], None, None, *past, torch.tensor([lengths[k] - 1]),
                                torch.tensor(lengths[k]), cos, sin, num_heads=heads, kv_num_heads=kvh, do_rotary=1)[:3]
            pasts[k] = (pk, pv)
            torch.testing.assert_close(y[i:i + 1, :n], want, atol=2e-6, rtol=1e-5)
            torch.testing.assert_close(kn[i, :, :n], pk[0, :, -n:], atol=2e-6, rtol=1e-5)  # the new keys, rotated
