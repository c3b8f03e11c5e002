"""What tf2onnx writes for a BERT's attention (g2p_id_bert): its Q / K / V projections as Gemms
without C (beta 0), the scores transposed before their Softmax, the output projection an Einsum.
``softmax_before_transpose`` takes the Softmax over the memory as it lies (the Transpose after it
a view), ``fuse_parallel_matmul`` merges the three Gemms into one product, and the Einsum runs as
one matmul (codegen/emitters.py ``_einsum``). Each model runs over changing shapes with fresh
random inputs in the compiled session, the interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compile.test_fusion import Builder, check_sequence, fused_ops, randn, spec_of

H, HEADS = 8, 2
D = H // HEADS


def _feeds(seed: int, shapes=((1, 3), (2, 5), (1, 1), (2, 5))):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, b * s, H)} for b, s in shapes]


def test_softmax_over_a_transpose_runs_before_it():
    b = Builder()
    x = b.input("x", ["n", H])
    t = b.op("Transpose", b.op("Reshape", x, b.const([-1, 2, H // 2], np.int64)), perm=[0, 2, 1])
    y = b.op("MatMul", b.op("Softmax", t, axis=-1), b.const(np.ones((2, 3), np.float32)))
    other = b.op("Softmax", b.op("Transpose", x, perm=[1, 0]), axis=0)  # another axis of the perm
    sess = check_sequence(b.model([y, other]), _feeds(1))
    ops = fused_ops(sess)
    assert ops["Softmax"] == 2 and ops["Transpose"] == 2, dict(ops)
    moved = [n for n in sess.program.fused.nodes if n.op_type == "Softmax"]
    assert all(n.inputs[0].producer is None or n.inputs[0].producer.op_type != "Transpose" for n in moved)


def test_a_transpose_read_elsewhere_stays_before_the_softmax():
    b = Builder()
    x = b.input("x", ["n", H])
    t = b.op("Transpose", x, perm=[1, 0])
    ys = [b.op("Softmax", t, axis=-1), b.op("Neg", t)]
    sess = check_sequence(b.model(ys), _feeds(2))
    sm = next(n for n in sess.program.fused.nodes if n.op_type == "Softmax")
    assert sm.inputs[0].producer.op_type == "Transpose"


def test_gemms_without_c_merge_and_the_einsum_is_one_matmul():
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", ["n", H])
    # beta 0 and no C, the weight [out, in] (transB), as tf2onnx writes the projections
    q, k = (b.op("Gemm", x, b.const(rng.standard_normal((H, H)).astype(np.float32)), beta=0.0, transB=1)
            for _ in range(2))
    heads = b.op("Reshape", b.op("Mul", q, k), b.const([-1, HEADS, D], np.int64))
    y = b.op("Einsum", heads, b.const(rng.standard_normal((HEADS, D, 3)).astype(np.float32)), equation="bcd,cde->be")
    feeds = _feeds(4)
    sess = check_sequence(b.model([y]), feeds)
    ops = fused_ops(sess)
    assert ops["Gemm"] == 0 and ops["Slice"] == 2, dict(ops)  # one product, its two halves
    src = spec_of(sess, feeds[-1]).source
    assert "torch.einsum" not in src and ".reshape(-1, 8)" in src


@pytest.mark.parametrize("equation", ["bcd,dc->bc", "bcd,be->bcde", "bcd,cde->bce"])
def test_other_einsums_keep_the_kernel(equation):
    """Shared letters that are not the trailing / leading ones in order, a batch letter in both, an
    outer product: torch.einsum's, as before."""
    rng = np.random.default_rng(5)
    shapes = {"bcd,dc->bc": (D, HEADS), "bcd,be->bcde": None, "bcd,cde->bce": (HEADS, D, 3)}
    b = Builder()
    x = b.input("x", ["n", H])
    heads = b.op("Reshape", x, b.const([-1, HEADS, D], np.int64))
    other = b.const(rng.standard_normal(shapes[equation]).astype(np.float32)) if shapes[equation] else \
        b.op("Reshape", x, b.const([-1, H], np.int64))
    y = b.op("Einsum", heads, other, equation=equation)
    feeds = _feeds(6)
    sess = check_sequence(b.model([y]), feeds)
    assert ".reshape(-1, " not in spec_of(sess, feeds[-1]).source
