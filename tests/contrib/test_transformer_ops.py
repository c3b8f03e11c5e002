"""onnxruntime's transformer contrib ops (non-attention): each over a sequence of shapes in one
session (batch and sequence length change), weights as initializers, compared with onnxruntime's
CPU kernels. BiasAdd and BiasSplitGelu have only CUDA kernels there: numpy formulas check them.

onnx's shape inference knows no com.microsoft op, so the models here give their outputs' types
themselves; absent optional inputs and outputs are empty names, as the optimizer writes them.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.errors import ShapeError
from tests.ops.harness import DEVICE, compare, make_model, rand, run_sequence

MS = "com.microsoft"
H = 16
SEQ = [(2, 5), (1, 9), (3, 1), (2, 5)]  # (batch, sequence): grow, shrink, repeat
_NP = {TP.FLOAT: np.float32, TP.FLOAT16: np.float16, TP.DOUBLE: np.float64, TP.INT32: np.int32}
# half results: onnxruntime rounds at other points (its float16 GELUs run the schema's function
# body op by op in float16), so a unit or two in the last place
HALF_TOL = {"rtol": 5e-3, "atol": 5e-3}


def _model(op_type, in_types, out_types, attrs=None, consts=None, domain=MS, opset=17, ranks=None):
    """One node; ``in_types[i]`` None leaves input i out (an empty name), ``out_types[k]`` None
    leaves output k out; inputs in ``consts`` are initializers."""
    consts = consts or {}
    types = [t or TP.FLOAT for t in in_types]
    ranks = ranks or [1] * len(in_types)
    model = make_model(op_type, len(in_types), types, attrs, opset, len(out_types), consts, ranks, domain=domain)
    g = model.graph
    node = g.node[0]
    for i, t in enumerate(in_types):
        if t is None:
            node.input[i] = ""
    keep = [vi for vi in g.input if not (vi.name.startswith("in") and in_types[int(vi.name[2:])] is None)]
    del g.input[:]
    g.input.extend(keep)
    outs = []
    for k, t in enumerate(out_types):
        if t is None:
            node.output[k] = ""
        else:
            outs.append(helper.make_tensor_value_info(f"out{k}", t, None))
    del g.output[:]
    g.output.extend(outs)
    return model


def _feeds(model, values):
    names = {vi.name for vi in model.graph.input}
    return {f"in{i}": v for i, v in enumerate(values) if f"in{i}" in names}


EXECUTORS = ("compiled", "interpreter")


def _check(model, feeds_seq, tol=None, executors=EXECUTORS):
    """Compare with onnxruntime under each executor (the interpreter calls the shape functions
    at every change of shape, the compiled runtime traces them symbolically)."""
    for executor in executors:
        run_sequence(model, feeds_seq, ("ort",), **(tol or {}), executor=executor)


# SkipLayerNormalization ---------------------------------------------------------------------
@pytest.mark.parametrize("case", ["full", "bare", "sum_only", "skip_batch1", "skip_no_batch", "tokens"])
def test_skip_layer_norm(case):
    rng = np.random.default_rng(1)
    gamma, beta, bias = rand(H, rng=rng), rand(H, rng=rng), rand(H, rng=rng)
    F_ = TP.FLOAT
    if case == "full":  # beta and bias, every output
        ins, outs, consts = [F_] * 5, [F_] * 4, {2: gamma, 3: beta, 4: bias}
    elif case == "bare":  # input, skip, gamma
        ins, outs, consts = [F_] * 3, [F_], {2: gamma}
    elif case == "sum_only":  # no beta; the sum output without the statistics
        ins, outs, consts = [F_, F_, F_, None, F_], [F_, None, None, F_], {2: gamma, 4: bias}
    else:
        ins, outs, consts = [F_] * 4, [F_, F_, F_], {2: gamma, 3: beta}
    x_shape = {"tokens": lambda b, s: (b * s, H)}.get(case, lambda b, s: (b, s, H))
    skip_shape = {"skip_batch1": lambda b, s: (1, s, H), "skip_no_batch": lambda b, s: (s, H)}.get(case, x_shape)
    model = _model("SkipLayerNormalization", ins, outs, {"epsilon": 1e-5}, consts,
                   ranks=[len(x_shape(1, 1)), len(skip_shape(1, 1)), 1, 1, 1])
    feeds = [_feeds(model, [rand(x_shape(b, s), rng=rng), rand(skip_shape(b, s), rng=rng)]) for b, s in SEQ]
    _check(model, feeds)


def test_skip_layer_norm_without_statistics_outputs():
    """The graph reads the output and the sum, not mean / inv_std (GPT-2 as onnxruntime's optimizer
    writes it): resolve_ops gives the kernel ``_present``, so the statistics are not computed even
    when no out= buffers say which outputs exist (a contrib op's outputs have no known dtype)."""
    import torch

    from dynashape.ops import contrib_transformer as CT
    rng = np.random.default_rng(3)
    gamma, beta = rand(H, rng=rng), rand(H, rng=rng)
    model = _model("SkipLayerNormalization", [TP.FLOAT] * 4, [TP.FLOAT, None, None, TP.FLOAT], {"epsilon": 1e-5},
                   {2: gamma, 3: beta}, ranks=[3, 3, 1, 1])
    sess = dynashape.InferenceSession(model, device=DEVICE)
    node = next(n for n in sess.program.fused.nodes if n.op_type == "SkipLayerNormalization")
    assert node.attrs["_present"] == (True, False, False, True)
    x, skip = torch.randn(2, 3, H), torch.randn(2, 3, H)
    y, mean, inv, total = CT._skip_layer_norm(x, skip, torch.from_numpy(gamma), torch.from_numpy(beta),
                                              epsilon=1e-5, _n_outputs=4, _present=node.attrs["_present"])
    assert mean is None and inv is None and torch.equal(total, x + skip)
    want = torch.nn.functional.layer_norm(x + skip, (H,), torch.from_numpy(gamma), torch.from_numpy(beta), 1e-5)
    assert torch.equal(y, want)


def test_skip_layer_norm_half():
    rng = np.random.default_rng(2)
    w = [rand(H, np.float16, rng) for _ in range(3)]
    model = _model("SkipLayerNormalization", [TP.FLOAT16] * 5, [TP.FLOAT16, TP.FLOAT, TP.FLOAT, TP.FLOAT16],
                   None, {2: w[0], 3: w[1], 4: w[2]}, ranks=[3, 3, 1, 1, 1])
    feeds = [_feeds(model, [rand((b, s, H), np.float16, rng), rand((b, s, H), np.float16, rng)]) for b, s in SEQ]
    _check(model, feeds, {"rtol": 2e-3, "atol": 2e-3})


def test_skip_layer_norm_constant_skip():
    # a skip initializer of (seq, hidden) broadcast over a changing batch; float16 (onnxruntime
    # converts such a skip to float32 once, at load)
    rng = np.random.default_rng(3)
    skip, gamma, beta = rand((5, H), np.float16, rng), rand(H, np.float16, rng), rand(H, np.float16, rng)
    model = _model("SkipLayerNormalization", [TP.FLOAT16] * 4, [TP.FLOAT16, None, None, TP.FLOAT16], None,
                   {1: skip, 2: gamma, 3: beta}, ranks=[3, 2, 1, 1])
    feeds = [_feeds(model, [rand((b, 5, H), np.float16, rng)]) for b in (2, 1, 4, 2)]
    _check(model, feeds, {"rtol": 2e-3, "atol": 2e-3})


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_norm(dtype, with_bias):
    rng = np.random.default_rng(4)
    npt = _NP[dtype]
    consts = {2: rand(H, npt, rng)}
    ins = [dtype] * 3
    if with_bias:
        consts[3] = rand(H, npt, rng)
        ins.append(dtype)
    model = _model("SkipSimplifiedLayerNormalization", ins, [dtype, TP.FLOAT, TP.FLOAT, dtype], None, consts,
                   ranks=[3, 3, 1, 1])
    feeds = [_feeds(model, [rand((b, s, H), npt, rng), rand((b, s, H), npt, rng)]) for b, s in SEQ]
    _check(model, feeds, {"rtol": 2e-3, "atol": 2e-3} if dtype == TP.FLOAT16 else None)


@pytest.mark.parametrize("op_type", ["SkipSimplifiedLayerNormalization", "SkipLayerNormalization"])
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_skip_norms_as_the_model_builder_writes_them(op_type, dtype):
    # the output and the sum, no statistics, no bias: on CUDA one Triton kernel writes both
    # (add_layer_norm.skip_norm), the sum kept in float32 for the norm as onnxruntime does
    rng = np.random.default_rng(6)
    npt = _NP[dtype]
    consts = {2: rand(H, npt, rng)} if op_type.startswith("SkipSimplified") else {2: rand(H, npt, rng),
                                                                                  3: rand(H, npt, rng)}
    model = _model(op_type, [dtype] * (2 + len(consts)), [dtype, None, None, dtype], {"epsilon": 1e-6}, consts,
                   ranks=[3, 3, 1, 1])
    feeds = [_feeds(model, [rand((b, s, H), npt, rng), rand((b, s, H), npt, rng)]) for b, s in SEQ]
    _check(model, feeds, {"rtol": 2e-3, "atol": 2e-3} if dtype == TP.FLOAT16 else None)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_skip_layer_norm_bad_shapes(executor):
    rng = np.random.default_rng(5)
    model = _model("SkipLayerNormalization", [TP.FLOAT] * 3, [TP.FLOAT], None, {2: rand(H, rng=rng)},
                   ranks=[3, 3, 1])
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    sess.run(None, {"in0": rand((2, 5, H), rng=rng), "in1": rand((1, 5, H), rng=rng)})
    with pytest.raises(ShapeError, match="skip must have shape"):
        sess.run(None, {"in0": rand((3, 5, H), rng=rng), "in1": rand((2, 5, H), rng=rng)})
    with pytest.raises(ShapeError, match=r"gamma must have shape \(8,\)"):
        sess.run(None, {"in0": rand((3, 5, 8), rng=rng), "in1": rand((3, 5, 8), rng=rng)})


# SimplifiedLayerNormalization, LayerNormalization before opset 17 (ONNX domain) --------------
@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16, TP.DOUBLE])
@pytest.mark.parametrize("inv_std", [False, True])
def test_simplified_layer_norm(dtype, inv_std):
    rng = np.random.default_rng(6)
    npt = _NP[dtype]
    model = _model("SimplifiedLayerNormalization", [dtype, dtype], [dtype] + [TP.FLOAT] * inv_std,
                   {"epsilon": 1e-6}, {1: rand(H, npt, rng)}, domain="", opset=14, ranks=[3, 1])
    feeds = [_feeds(model, [rand((b, s, H), npt, rng)]) for b, s in SEQ]
    _check(model, feeds, {"rtol": 2e-3, "atol": 2e-3} if dtype == TP.FLOAT16 else None)


@pytest.mark.parametrize("axis, scale_shape", [(-2, (5, H)), (1, (1, H)), (-1, (1, 1, H)), (2, (1, 5, 1))])
def test_simplified_layer_norm_axis_and_broadcast_scale(axis, scale_shape):
    # onnxruntime takes any scale that broadcasts to the input (without enlarging it)
    rng = np.random.default_rng(7)
    model = _model("SimplifiedLayerNormalization", [TP.FLOAT, TP.FLOAT], [TP.FLOAT, TP.FLOAT], {"axis": axis},
                   {1: rand(scale_shape, rng=rng)}, domain="", ranks=[3, 1])
    feeds = [_feeds(model, [rand((b, 5, H), rng=rng)]) for b in (2, 1, 3, 2)]
    _check(model, feeds)


@pytest.mark.parametrize("n_out", [1, 3])
def test_layer_norm_before_opset_17(n_out):
    rng = np.random.default_rng(8)
    model = _model("LayerNormalization", [TP.FLOAT] * 3, [TP.FLOAT] * n_out, {"epsilon": 1e-12},
                   {1: rand(H, rng=rng), 2: rand(H, rng=rng)}, domain="", opset=13, ranks=[3, 1, 1])
    feeds = [_feeds(model, [rand((b, s, H), rng=rng)]) for b, s in SEQ]
    _check(model, feeds)


# EmbedLayerNormalization --------------------------------------------------------------------
VOCAB, POSITIONS, SEGMENTS = 30, 12, 2


def _embed_model(rng, segments=True, mask=True, position_ids=False, outputs=(TP.FLOAT, TP.INT32, TP.FLOAT)):
    I32, F_ = TP.INT32, TP.FLOAT
    ins = [I32, I32 if segments else None, F_, F_, F_ if segments else None, F_, F_]
    if mask or position_ids:
        ins.append(I32 if mask else None)
    if position_ids:
        ins.append(I32)
    consts = {2: rand((VOCAB, H), rng=rng), 3: rand((POSITIONS, H), rng=rng), 5: rand(H, rng=rng),
              6: rand(H, rng=rng)}
    if segments:
        consts[4] = rand((SEGMENTS, H), rng=rng)
    return _model("EmbedLayerNormalization", ins, list(outputs), {"epsilon": 1e-12}, consts, ranks=[2] * len(ins))


def _embed_feeds(model, rng, b, s, position_ids_batch=None):
    ids = rng.integers(0, VOCAB, (b, s)).astype(np.int32)
    seg = rng.integers(0, SEGMENTS, (b, s)).astype(np.int32)
    mask = rng.integers(0, 2, (b, s)).astype(np.int32)
    mask[0, 0] = 2  # counts for nothing: onnxruntime counts the ones
    vals = [ids, seg, None, None, None, None, None, mask]
    if position_ids_batch is not None:
        vals.append(rng.integers(0, POSITIONS, (position_ids_batch or b, s)).astype(np.int32))
    return _feeds(model, vals)


def test_embed_layer_norm_bert():
    rng = np.random.default_rng(9)
    model = _embed_model(rng)
    _check(model, [_embed_feeds(model, rng, b, s) for b, s in SEQ])


def test_embed_layer_norm_distilbert():
    # no segment ids nor segment table; mask_index only
    rng = np.random.default_rng(10)
    model = _embed_model(rng, segments=False, outputs=(TP.FLOAT, TP.INT32))
    _check(model, [_embed_feeds(model, rng, b, s) for b, s in SEQ])


@pytest.mark.parametrize("broadcast", [False, True])
def test_embed_layer_norm_position_ids(broadcast):
    rng = np.random.default_rng(11)
    model = _embed_model(rng, mask=False, position_ids=True, outputs=(TP.FLOAT, None, TP.FLOAT))
    _check(model, [_embed_feeds(model, rng, b, s, 1 if broadcast else 0) for b, s in SEQ])


def test_embed_layer_norm_without_mask():
    # mask_index is zeros when no mask is given
    rng = np.random.default_rng(12)
    model = _embed_model(rng, mask=False, outputs=(TP.FLOAT, TP.INT32))
    _check(model, [_embed_feeds(model, rng, b, s) for b, s in SEQ])


@pytest.mark.parametrize("segments", [False, True])
def test_embed_layer_norm_bound_to_its_tables(segments):
    """Constant tables: the compiled CPU runner binds the op to them (the C embedding pass, tables
    checked once) and gives the interpreter's outputs bit for bit, the sum output too."""
    rng = np.random.default_rng(14)
    outs = (TP.FLOAT, TP.INT32, TP.FLOAT) if segments else (TP.FLOAT, TP.INT32)
    model = _embed_model(rng, segments=segments, outputs=outs)
    comp = dynashape.InferenceSession(model, device=DEVICE)
    ref = dynashape.InferenceSession(model, device=DEVICE, executor="interpreter")
    for b, s in SEQ:
        feeds = _embed_feeds(model, rng, b, s)
        for g, w in zip(comp.run(None, feeds), ref.run(None, feeds)):
            np.testing.assert_array_equal(g, w)
    if DEVICE == "cpu":
        assert comp.compiled.stats["bound_kernels"] >= 1


@pytest.mark.parametrize("executor", EXECUTORS)
def test_embed_layer_norm_bad_ids(executor):
    rng = np.random.default_rng(13)
    model = _embed_model(rng, outputs=(TP.FLOAT,))
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    feeds = _embed_feeds(model, rng, 2, 5)
    feeds["in0"][1, 2] = VOCAB
    with pytest.raises(Exception, match="out of range"):
        sess.run(None, feeds)
    with pytest.raises(Exception, match="exceeds the 12 rows"):
        sess.run(None, _embed_feeds(model, rng, 1, POSITIONS + 1))


# GELUs --------------------------------------------------------------------------------------
SHAPES = [(b, s, H) for b, s in SEQ]


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16, TP.DOUBLE])
@pytest.mark.parametrize("op_type, n_in, attrs", [
    ("Gelu", 1, None), ("FastGelu", 1, None), ("FastGelu", 2, None), ("BiasGelu", 2, None),
    ("QuickGelu", 1, None), ("QuickGelu", 1, {"alpha": -0.7}),
])
def test_gelus(op_type, n_in, attrs, dtype):
    if dtype == TP.DOUBLE and op_type in ("Gelu", "BiasGelu"):
        pytest.skip("onnxruntime has no float64 Erf / BiasGelu on the CPU")
    rng = np.random.default_rng(14)
    npt = _NP[dtype]
    consts = {1: rand(H, npt, rng)} if n_in == 2 else None
    model = _model(op_type, [dtype] * n_in, [dtype], attrs, consts, ranks=[3, 1])
    feeds = [_feeds(model, [rand(s, npt, rng, -5.0, 5.0)]) for s in SHAPES]
    _check(model, feeds, HALF_TOL if dtype == TP.FLOAT16 else None)


def test_gelu_other_ranks():
    rng = np.random.default_rng(15)
    model = _model("Gelu", [TP.FLOAT], [TP.FLOAT], ranks=[2])
    _check(model, [_feeds(model, [rand(s, rng=rng)]) for s in [(3, 7), (1, 2), (6, 1)]])


# BiasAdd, BiasSplitGelu (onnxruntime: CUDA only) --------------------------------------------
def _run_numpy(model, feeds_seq, formula, tol=None):
    for executor in EXECUTORS:
        sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
        for step, feeds in enumerate(feeds_seq):
            got = sess.run(None, feeds)[0]
            want = formula(feeds)
            compare(got, want, f"{executor} step {step} (input shapes {[v.shape for v in feeds.values()]})",
                    **(tol or {}))


def _erf_gelu(v: np.ndarray) -> np.ndarray:
    return v * 0.5 * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_bias_add(dtype):
    rng = np.random.default_rng(16)
    npt = _NP[dtype]
    bias = rand(H, npt, rng)
    model = _model("BiasAdd", [dtype] * 3, [dtype], None, {1: bias}, ranks=[3, 1, 3])
    feeds = [_feeds(model, [rand(s, npt, rng), None, rand(s, npt, rng)]) for s in SHAPES]
    # float16: each add rounds to float16, as the CUDA kernel's half arithmetic does
    _run_numpy(model, feeds, lambda f: ((f["in0"] + bias).astype(npt) + f["in2"]).astype(npt))


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16])
def test_bias_split_gelu(dtype):
    rng = np.random.default_rng(17)
    npt = _NP[dtype]
    bias = rand(2 * H, npt, rng)
    model = _model("BiasSplitGelu", [dtype] * 2, [dtype], None, {1: bias}, ranks=[3, 1])
    feeds = [_feeds(model, [rand((b, s, 2 * H), npt, rng)]) for b, s in SEQ]

    def formula(f):
        v = (f["in0"] + bias).astype(npt).astype(np.float64)
        return (v[..., :H] * _erf_gelu(v[..., H:])).astype(npt)
    _run_numpy(model, feeds, formula, {"rtol": 1e-3, "atol": 1e-3} if dtype == TP.FLOAT16 else None)


# FusedMatMul --------------------------------------------------------------------------------
def _stored(logical: np.ndarray, trans: int, trans_batch: int) -> np.ndarray:
    """The array whose FusedMatMul operand is ``logical``: undo trans, then transBatch."""
    x = np.swapaxes(logical, -1, -2) if trans else logical
    if trans_batch:  # the operand is x.transpose(1, ..., r-2, 0, r-1)
        r = x.ndim
        x = np.transpose(x, np.argsort(list(range(1, r - 1)) + [0, r - 1]))
    return np.ascontiguousarray(x)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("batch_a, batch_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_fused_matmul(trans_a, trans_b, batch_a, batch_b):
    rng = np.random.default_rng(18)
    attrs = {"alpha": 0.125, "transA": trans_a, "transB": trans_b, "transBatchA": batch_a, "transBatchB": batch_b}
    model = _model("FusedMatMul", [TP.FLOAT] * 2, [TP.FLOAT], attrs, ranks=[4, 4])
    feeds = []
    for b, s in SEQ:  # attention-like scores: (B, heads, S, D) @ (B, heads, D, S)
        a, k = rand((b, 2, s, 8), rng=rng), rand((b, 2, 8, s), rng=rng)
        feeds.append(_feeds(model, [_stored(a, trans_a, batch_a), _stored(k, trans_b, batch_b)]))
    _check(model, feeds)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.FLOAT16, TP.DOUBLE])
def test_fused_matmul_weight(dtype):
    # a projection: (B, S, K) times a (N, K) initializer with transB, as the graph optimizer
    # writes MatMul(x, Transpose(w)) * scale
    rng = np.random.default_rng(19)
    npt = _NP[dtype]
    model = _model("FusedMatMul", [dtype] * 2, [dtype], {"alpha": 0.5, "transB": 1}, {1: rand((6, H), npt, rng)},
                   ranks=[3, 2])
    feeds = [_feeds(model, [rand(s, npt, rng)]) for s in SHAPES]
    _check(model, feeds, {"rtol": 5e-3, "atol": 1e-2} if dtype == TP.FLOAT16 else None)


def test_fused_matmul_vectors():
    rng = np.random.default_rng(20)
    model = _model("FusedMatMul", [TP.FLOAT] * 2, [TP.FLOAT], {"alpha": 2.0, "transB": 1}, ranks=[1, 3])
    feeds = [_feeds(model, [rand(k, rng=rng), rand((b, 3, k), rng=rng)]) for b, k in [(2, 4), (1, 7), (3, 4)]]
    _check(model, feeds)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fused_matmul_trans_batch_needs_equal_ranks(executor):
    model = _model("FusedMatMul", [TP.FLOAT] * 2, [TP.FLOAT], {"transBatchA": 1}, ranks=[3, 2])
    sess = dynashape.InferenceSession(model, device=DEVICE, executor=executor)
    with pytest.raises(ShapeError, match="one rank >= 3"):
        sess.run(None, {"in0": rand((4, 2, 3)), "in1": rand((3, 5))})


# executors ----------------------------------------------------------------------------------
def _encoder_layer(rng) -> onnx.ModelProto:
    """Embedding, projection, GELU and residual norms chained as an optimized BERT layer has
    them: the intermediate values have no type from onnx's inference."""
    n = helper.make_node
    w = {"word": rand((VOCAB, H), rng=rng), "pos": rand((POSITIONS, H), rng=rng), "seg": rand((SEGMENTS, H), rng=rng),
         "g0": rand(H, rng=rng), "b0": rand(H, rng=rng), "w1": rand((H, 2 * H), rng=rng, low=-0.5, high=0.5),
         "bias1": rand(2 * H, rng=rng), "w2": rand((H, 2 * H), rng=rng, low=-0.5, high=0.5),
         "g1": rand(H, rng=rng), "b1": rand(H, rng=rng), "bias2": rand(H, rng=rng), "g2": rand(H, rng=rng)}
    nodes = [
        n("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "g0", "b0", "mask"], ["emb", "mask_index"],
          domain=MS, epsilon=1e-12),
        n("MatMul", ["emb", "w1"], ["h1"]),
        n("BiasGelu", ["h1", "bias1"], ["a1"], domain=MS),
        n("FusedMatMul", ["a1", "w2"], ["h2"], domain=MS, transB=1, alpha=0.5),
        n("SkipLayerNormalization", ["h2", "emb", "g1", "b1", "bias2"], ["ln", "", "", "res"], domain=MS),
        n("FastGelu", ["ln"], ["act"], domain=MS),
        n("SkipSimplifiedLayerNormalization", ["act", "res", "g2"], ["y"], domain=MS, epsilon=1e-6),
        n("QuickGelu", ["y"], ["z"], domain=MS),
    ]
    ins = [helper.make_tensor_value_info(k, TP.INT32, ["batch", "seq"]) for k in ("ids", "segs", "mask")]
    outs = [helper.make_tensor_value_info("z", TP.FLOAT, None), helper.make_tensor_value_info("mask_index", TP.INT32,
                                                                                            None)]
    g = helper.make_graph(nodes, "layer", ins, outs, [onnx.numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)], ir_version=8)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_encoder_layer_executors(executor):
    rng = np.random.default_rng(21)
    model = _encoder_layer(rng)
    feeds = []
    for b, s in SEQ:
        feeds.append({"ids": rng.integers(0, VOCAB, (b, s)).astype(np.int32),
                      "segs": rng.integers(0, SEGMENTS, (b, s)).astype(np.int32),
                      "mask": rng.integers(0, 2, (b, s)).astype(np.int32)})
    _check(model, feeds, {"rtol": 1e-4, "atol": 1e-4}, executors=(executor,))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_t5_style_norms_executors(executor):
    # opset 13: onnx's inference types neither norm's output (its opset has no LayerNormalization)
    rng = np.random.default_rng(22)
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "g", "b"], ["ln"], epsilon=1e-5),
             n("Gelu", ["ln"], ["a"], domain=MS),
             n("SimplifiedLayerNormalization", ["a", "g"], ["y"], epsilon=1e-6),
             n("Relu", ["y"], ["z"])]
    g = helper.make_graph(nodes, "t5", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", H])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, None)],
                          [onnx.numpy_helper.from_array(rand(H, rng=rng), k) for k in ("g", "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)],
                              ir_version=8)
    _check(model, [{"x": rand((b, s, H), rng=rng)} for b, s in SEQ], executors=(executor,))
