"""MatMul/Gemm/Einsum, Conv/ConvTranspose, pools, normalizations, softmax: each over a sequence of
shapes through one session, against onnxruntime and the onnx reference evaluator."""

import numpy as np
import onnx
import pytest

import dynashape

from .harness import check_op, compare, make_model, rand, run_sequence

RNG = np.random.default_rng(1)


def w(*shape, dtype=np.float32):
    return rand(shape, dtype, RNG)


# linalg --------------------------------------------------------------------------------------
def test_matmul_2d_and_batched():
    check_op("MatMul", [[(2, 3), (3, 4)], [(5, 3), (3, 1)], [(2, 4, 3), (3, 5)], [(2, 3), (3, 4)],
                        [(3, 1, 2, 6), (4, 6, 2)]], opset=13)


def test_matmul_1d():
    # the rank changes along the sequence: the model declares inputs of unknown rank
    check_op("MatMul", [[(3,), (3, 4)], [(2, 5), (5,)], [(4,), (4,)], [(2, 2, 3), (3,)], [(3,), (3, 4)]])


def test_matmul_integer_types():
    check_op("MatMul", [[(2, 3), (3, 4)], [(5, 3), (3, 2)], [(1, 2, 3), (3, 5)], [(2, 3), (3, 4)], [(4, 7), (7, 1)]],
             dtypes=[np.int64, np.int64])


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5, "beta": 2.0},
                                   {"transA": 1, "transB": 1, "alpha": -1.5}])
def test_gemm_c_broadcast(attrs):
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)

    def ab(m, k, n):
        return [(k, m) if ta else (m, k), (n, k) if tb else (k, n)]
    seq = [ab(2, 3, 4) + [(4,)], ab(5, 3, 4) + [(1, 4)], ab(3, 2, 4) + [(3, 4)], ab(2, 3, 4) + [(4,)],
           ab(1, 6, 4) + [(1,)]]
    check_op("Gemm", seq, attrs, opset=13, const_inputs=None)


def test_gemm_without_c_and_const_weight():
    check_op("Gemm", [[(2, 3), (4, 3)], [(5, 3), (4, 3)], [(1, 3), (4, 3)], [(2, 3), (4, 3)], [(7, 3), (4, 3)]],
             {"transB": 1, "alpha": 2.0}, opset=13, const_inputs={1: w(4, 3)})


def test_gemm_const_c():
    check_op("Gemm", [[(2, 3), (3, 4), (4,)], [(6, 3), (3, 4), (4,)], [(1, 3), (3, 4), (4,)],
                      [(2, 3), (3, 4), (4,)], [(3, 3), (3, 4), (4,)]], opset=11,
             const_inputs={1: w(3, 4), 2: w(4)})


@pytest.mark.parametrize("eq, seq", [
    ("bij,bjk->bik", [[(2, 3, 4), (2, 4, 5)], [(1, 2, 2), (1, 2, 3)], [(3, 1, 4), (3, 4, 2)],
                      [(2, 3, 4), (2, 4, 5)], [(4, 2, 3), (4, 3, 1)]]),
    ("...ij,...jk", [[(2, 3, 4), (2, 4, 5)], [(3, 4), (4, 2)], [(2, 1, 2, 3), (2, 3, 3, 1)],
                     [(2, 3, 4), (2, 4, 5)], [(5, 5), (5, 5)]]),
    ("ij->ji", [[(2, 3)], [(4, 1)], [(5, 5)], [(2, 3)], [(1, 7)]]),
    ("i,i", [[(3,), (3,)], [(5,), (5,)], [(1,), (1,)], [(3,), (3,)], [(8,), (8,)]]),
])
def test_einsum(eq, seq):
    check_op("Einsum", seq, {"equation": eq}, opset=12)


def test_matmul_integer():
    def mk(i, shape, rng):
        if i == 0:
            return rng.integers(0, 256, size=shape).astype(np.uint8)
        if i == 1:
            return rng.integers(-128, 128, size=shape).astype(np.int8)
        if i == 2:
            return np.array(rng.integers(0, 256), dtype=np.uint8)
        return np.array(rng.integers(-128, 128), dtype=np.int8)
    check_op("MatMulInteger", [[(2, 3), (3, 4), (), ()], [(5, 3), (3, 2), (), ()], [(2, 2, 4), (4, 3), (), ()],
                               [(2, 3), (3, 4), (), ()], [(1, 6), (6, 6), (), ()]],
             opset=10, dtypes=[np.uint8, np.int8, np.uint8, np.int8], make_input=mk)


# conv ----------------------------------------------------------------------------------------
CONV2D_SEQ = [[(1, 2, 5, 5)], [(2, 2, 7, 6)], [(1, 2, 4, 9)], [(1, 2, 5, 5)], [(3, 2, 6, 6)]]


@pytest.mark.parametrize("attrs", [
    {},
    {"pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"pads": [0, 1, 2, 1], "dilations": [2, 1]},          # asymmetric pads
    {"auto_pad": "SAME_UPPER", "strides": [2, 1]},
    {"auto_pad": "SAME_LOWER", "strides": [2, 2]},  # onnxruntime refuses SAME with dilations
    {"auto_pad": "VALID", "strides": [1, 2]},
])
def test_conv2d(attrs):
    check_op("Conv", [s + [(3, 2, 3, 3), (3,)] for s in CONV2D_SEQ], attrs, opset=11,
             const_inputs={1: w(3, 2, 3, 3), 2: w(3)})


def test_conv2d_group_no_bias():
    seq = [[(1, 4, 5, 5)], [(2, 4, 3, 6)], [(1, 4, 8, 4)], [(1, 4, 5, 5)], [(2, 4, 6, 6)]]
    check_op("Conv", [s + [(6, 2, 3, 3)] for s in seq], {"group": 2, "pads": [1, 0, 1, 0]}, opset=11,
             const_inputs={1: w(6, 2, 3, 3)})


def test_conv1d_and_3d():
    seq1 = [[(1, 2, 7)], [(3, 2, 5)], [(2, 2, 9)], [(1, 2, 7)], [(1, 2, 4)]]
    check_op("Conv", [s + [(4, 2, 3)] for s in seq1], {"pads": [2, 0], "strides": [2]}, opset=11,
             const_inputs={1: w(4, 2, 3)})
    seq3 = [[(1, 2, 4, 4, 4)], [(2, 2, 3, 5, 4)], [(1, 2, 5, 3, 3)], [(1, 2, 4, 4, 4)], [(1, 2, 2, 2, 2)]]
    check_op("Conv", [s + [(2, 2, 2, 2, 2)] for s in seq3], {"pads": [1, 0, 1, 0, 1, 0]}, opset=11,
             const_inputs={1: w(2, 2, 2, 2, 2)})


@pytest.mark.parametrize("attrs", [
    {},
    {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    {"strides": [2, 1], "pads": [0, 1, 1, 0], "dilations": [1, 2]},     # asymmetric pads
    {"strides": [2, 2], "group": 2},
    {"strides": [3, 2], "output_padding": [2, 1]},
])
def test_conv_transpose2d(attrs):
    cin, cout = 4, 3
    g = attrs.get("group", 1)
    seq = [[(1, cin, 3, 3)], [(2, cin, 4, 2)], [(1, cin, 2, 5)], [(1, cin, 3, 3)], [(3, cin, 1, 1)]]
    # onnx's reference evaluator fails on group > 1 (a reshape error): onnxruntime only there
    check_op("ConvTranspose", [s + [(cin, cout, 3, 3), (cout * g,)] for s in seq], attrs, opset=11,
             const_inputs={1: w(cin, cout, 3, 3), 2: w(cout * g)}, references=("ort", "ref") if g == 1 else ("ort",))


def test_conv_transpose_output_shape_and_auto_pad():
    seq = [[(1, 2, 3, 3)], [(2, 2, 4, 4)], [(1, 2, 3, 3)], [(1, 2, 5, 2)], [(2, 2, 2, 2)]]
    # SAME_UPPER / SAME_LOWER: output = input * stride
    for pad in ("SAME_UPPER", "SAME_LOWER"):
        check_op("ConvTranspose", [s + [(2, 3, 3, 3)] for s in seq], {"strides": [2, 2], "auto_pad": pad},
                 opset=11, const_inputs={1: w(2, 3, 3, 3)})
    # explicit output_shape: onnx's reference evaluator fails on it (col2im shape check)
    seq1 = [[(1, 2, 3)], [(2, 2, 3)], [(1, 2, 3)], [(3, 2, 3)], [(1, 2, 3)]]
    for shape in ([6], [4], [8]):
        check_op("ConvTranspose", [s + [(2, 3, 3)] for s in seq1], {"strides": [2], "output_shape": shape},
                 opset=11, const_inputs={1: w(2, 3, 3)}, references=("ort",))


# pools ---------------------------------------------------------------------------------------
POOL_SEQ = [[(1, 2, 6, 6)], [(2, 3, 7, 5)], [(1, 1, 4, 9)], [(1, 2, 6, 6)], [(2, 2, 8, 8)]]


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "pads": [0, 2, 1, 0]},                           # asymmetric / > k//2
    {"kernel_shape": [2, 2], "dilations": [2, 1], "strides": [1, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
])
def test_maxpool_with_indices(attrs):
    # onnx's reference evaluator computes wrong Indices (it flattens with the wrong plane size),
    # and wrong Y with asymmetric pads or SAME_LOWER: Indices against onnxruntime only
    check_op("MaxPool", POOL_SEQ, attrs, opset=12, n_outputs=2, references=("ort",))
    asym = attrs.get("auto_pad") == "SAME_LOWER" or attrs.get("pads", [0])[:2] != attrs.get("pads", [0])[2:]
    check_op("MaxPool", POOL_SEQ, attrs, opset=12, references=("ort",) if asym else ("ort", "ref"))


def test_maxpool_storage_order_and_y_only():
    check_op("MaxPool", POOL_SEQ, {"kernel_shape": [2, 2], "strides": [2, 1], "storage_order": 1}, opset=12,
             n_outputs=2, references=("ort",))  # reference Indices are wrong, see above
    check_op("MaxPool", POOL_SEQ, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, opset=12)


def test_maxpool_1d_3d_int8():
    check_op("MaxPool", [[(1, 2, 7)], [(2, 1, 5)], [(1, 3, 9)], [(1, 2, 7)], [(1, 1, 3)]],
             {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, opset=12, n_outputs=2,
             references=("ort",))  # reference Indices are wrong, see above
    check_op("MaxPool", [[(1, 1, 4, 4, 4)], [(2, 1, 3, 5, 4)], [(1, 2, 5, 3, 3)], [(1, 1, 4, 4, 4)],
                         [(1, 1, 2, 2, 2)]], {"kernel_shape": [2, 2, 2]}, opset=12, n_outputs=2, references=("ort",))

    def mk(i, shape, rng):
        return rng.integers(-128, 128, size=shape).astype(np.int8)
    # onnx's reference evaluator pads integers with NaN and fails: onnxruntime only
    check_op("MaxPool", POOL_SEQ, {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}, opset=12, dtypes=[np.int8],
             make_input=mk, references=("ort",))


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "pads": [0, 2, 1, 0]},
    {"kernel_shape": [3, 3], "pads": [0, 2, 1, 0], "count_include_pad": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
])
def test_averagepool(attrs):
    check_op("AveragePool", POOL_SEQ, attrs, opset=11)


def test_averagepool_dilations_opset19():
    check_op("AveragePool", POOL_SEQ, {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 1, 0]},
             opset=19)


def test_lppool():
    check_op("LpPool", POOL_SEQ, {"kernel_shape": [2, 2], "p": 2, "strides": [2, 2]}, opset=11)
    check_op("LpPool", POOL_SEQ, {"kernel_shape": [3, 3], "p": 1, "pads": [1, 1, 1, 1]}, opset=11)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op):
    # onnx's reference evaluator has no GlobalLpPool, and its GlobalMaxPool drops a dim of 3-D
    # inputs: onnxruntime only for those two
    check_op(op, [[(1, 2, 4, 4)], [(2, 3, 5)], [(1, 1, 2, 3, 4)], [(1, 2, 4, 4)], [(3, 2, 1, 7)]],
             references=("ort", "ref") if op == "GlobalAveragePool" else ("ort",))
    if op == "GlobalMaxPool":
        check_op(op, [[(1, 2, 4, 4)], [(2, 3, 5, 1)], [(1, 1, 2, 3)], [(1, 2, 4, 4)], [(3, 2, 1, 7)]])


# normalizations ------------------------------------------------------------------------------
NCHW_SEQ = [[(2, 3, 4, 4)], [(1, 3, 5, 2)], [(4, 3, 1, 1)], [(2, 3, 4, 4)], [(1, 3, 6)]]


def _pos(i, shape, rng):
    return rng.uniform(0.5, 2.0, size=shape).astype(np.float32) if i == 4 else None


def test_batchnorm_inference():
    c = 3
    consts = {1: w(c), 2: w(c), 3: w(c), 4: rand((c,), np.float32, RNG, 0.5, 2.0)}
    for opset in (9, 15):
        # onnx's reference evaluator runs opset 9 in training mode (it takes the momentum default
        # as a request to train): onnxruntime only there
        check_op("BatchNormalization", [s + [(c,)] * 4 for s in NCHW_SEQ], {"epsilon": 1e-3}, opset=opset,
                 const_inputs=consts, references=("ort",) if opset == 9 else ("ort", "ref"))


def test_batchnorm_training_outputs():
    c = 3
    consts = {1: w(c), 2: w(c), 3: w(c), 4: rand((c,), np.float32, RNG, 0.5, 2.0)}
    check_op("BatchNormalization", [s + [(c,)] * 4 for s in NCHW_SEQ], {"training_mode": 1, "momentum": 0.8},
             opset=15, const_inputs=consts, n_outputs=3, rtol=1e-4, atol=1e-4)


def test_instancenorm():
    check_op("InstanceNormalization", [s + [(3,), (3,)] for s in NCHW_SEQ], {"epsilon": 1e-4}, opset=6,
             const_inputs={1: w(3), 2: w(3)}, atol=1e-4)


@pytest.mark.parametrize("axis, n_out", [(-1, 1), (-1, 3), (1, 3)])
def test_layernorm(axis, n_out):
    seq = [[(2, 3, 4)], [(1, 5, 4)], [(3, 1, 4)], [(2, 3, 4)], [(4, 2, 4)]]
    norm = (4,) if axis == -1 else (5, 4)
    if axis == 1:
        seq = [[(2, 5, 4)], [(1, 5, 4)], [(3, 5, 4)], [(2, 5, 4)], [(6, 5, 4)]]
    check_op("LayerNormalization", [s + [norm, norm] for s in seq], {"axis": axis}, opset=17, n_outputs=n_out,
             const_inputs={1: w(*norm), 2: w(*norm)}, atol=1e-4)


def test_layernorm_no_bias_broadcast_scale():
    seq = [[(2, 3, 4)], [(1, 5, 4)], [(3, 1, 4)], [(2, 3, 4)], [(4, 2, 4)]]
    check_op("LayerNormalization", [s + [(1,)] for s in seq], {"epsilon": 1e-3}, opset=17,
             const_inputs={1: w(1)}, atol=1e-4)


def _typed_model(op, n_in, attrs, opset, const_inputs, ranks):
    """make_model, with the float output type set where ONNX's inference leaves it undefined
    (GroupNormalization), which onnxruntime refuses to load."""
    model = make_model(op, n_in, [onnx.TensorProto.FLOAT] * n_in, attrs, opset, const_inputs=const_inputs,
                       ranks=ranks)
    for o in model.graph.output:
        o.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return model


@pytest.mark.parametrize("opset", [18, 21])
def test_groupnorm(opset):
    # opset 18: scale and bias per group; opset 21: per channel
    n = 2 if opset == 18 else 4
    consts = {1: w(n), 2: w(n)}
    model = _typed_model("GroupNormalization", 3, {"num_groups": 2, "epsilon": 1e-3}, opset, consts, [4, 1, 1])
    feeds = [{"in0": rand(s, rng=RNG)} for s in [(2, 4, 3, 3), (1, 4, 5, 1), (3, 4, 2, 2), (2, 4, 3, 3),
                                                  (1, 4, 6, 1)]]
    run_sequence(model, feeds, atol=1e-4)


def test_rmsnorm():
    seq = [[(2, 3, 4)], [(1, 5, 4)], [(3, 1, 4)], [(2, 3, 4)], [(4, 2, 4)]]
    check_op("RMSNormalization", [s + [(4,)] for s in seq], {"epsilon": 1e-4}, opset=23,
             const_inputs={1: w(4)}, atol=1e-4)


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size):
    # onnx's reference LRN loops over the batch instead of the channels: onnxruntime only
    check_op("LRN", [[(2, 5, 3, 3)], [(1, 6, 2, 4)], [(1, 3, 1, 1)], [(2, 5, 3, 3)], [(3, 7, 2, 1)]],
             {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}, opset=13, references=("ort",))


def test_lrn_even_size():
    # onnxruntime refuses even sizes and the reference is wrong (above): check against the spec's
    # formula, window [c - floor((size-1)/2), c + ceil((size-1)/2)]
    model = make_model("LRN", 1, [onnx.TensorProto.FLOAT], {"size": 4, "alpha": 0.02, "beta": 0.7, "bias": 1.2},
                       13, ranks=[4])
    sess = dynashape.InferenceSession(model)
    for shape in [(2, 5, 3, 3), (1, 6, 2, 4), (1, 3, 1, 1), (2, 5, 3, 3), (1, 2, 2, 2)]:
        x = rand(shape, rng=RNG)
        sq = np.zeros_like(x)
        for c in range(shape[1]):
            sq[:, c] = (x[:, max(0, c - 1):c + 3] ** 2).sum(1)
        want = x / (1.2 + 0.02 / 4 * sq) ** 0.7
        compare(sess.run(None, {"in0": x})[0], want, f"LRN size 4 {shape}")


def test_mvn():
    check_op("MeanVarianceNormalization", NCHW_SEQ[:4] + [[(2, 3, 3, 5)]], opset=13, atol=1e-4)
    check_op("MeanVarianceNormalization", NCHW_SEQ, {"axes": [1, 2]}, opset=13, atol=1e-4)


def test_dropout_inference():
    seq = [[(2, 3)], [(5,)], [(1, 2, 4)], [(2, 3)], [(3, 3)]]
    check_op("Dropout", seq, opset=13)
    # the mask in inference is all True (spec, reference); onnxruntime 1.31 returns all False
    check_op("Dropout", seq, opset=13, n_outputs=2, references=("ref",))
    check_op("Dropout", seq, {"ratio": 0.3}, opset=10, n_outputs=2, references=("ref",))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dropout_training_keeps_onnxruntimes_bits(dtype):
    """The masks are random, but a value both runtimes keep must be the same bits: x / (1 - ratio)
    with 1 - ratio in the ratio's type (float32 here), as onnxruntime computes it; 1 - ratio in
    double moved float64 values by an ulp at ratio 0.1."""
    ort = pytest.importorskip("onnxruntime")
    model = make_model("Dropout", 3, [onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), onnx.TensorProto.FLOAT,
                                      onnx.TensorProto.BOOL], opset=13, n_outputs=2, ranks=[2, 0, 0])
    sess = dynashape.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape, ratio in [((64, 256), 0.1), ((3, 1000), 0.123), ((64, 256), 0.7), ((1, 5000), 0.3)]:
        feeds = {"in0": rand(shape, dtype, RNG, 0.5, 2.0), "in1": np.array(ratio, np.float32), "in2": np.array(True)}
        (y, mask), (want, want_mask) = sess.run(None, feeds), ref.run(None, feeds)
        both = mask & want_mask
        assert y.dtype == want.dtype and both.sum() > shape[0] * shape[1] * (1 - ratio) ** 2 / 2
        np.testing.assert_array_equal(y[both], want[both], err_msg=f"{dtype.__name__} ratio {ratio}")
        np.testing.assert_array_equal(y[~mask], 0)


# softmax -------------------------------------------------------------------------------------
SM_SEQ = [[(2, 3, 4)], [(1, 5, 2)], [(3, 1, 6)], [(2, 3, 4)], [(4, 2, 1)]]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset, axis", [(11, None), (11, 2), (11, -2), (13, None), (13, 0), (13, 1)])
def test_softmax_family(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}

    def mk(i, shape, rng):  # integers make ties, which Hardmax must break on the first maximum
        return rng.integers(-3, 3, size=shape).astype(np.float32) if op == "Hardmax" else None
    # onnx's reference evaluator knows only opset 13's plain axis: before 13, onnxruntime only
    check_op(op, SM_SEQ, attrs, opset=opset, make_input=mk, references=("ort", "ref") if opset >= 13 else ("ort",))
