"""FC fake alignment (codegen/align.py, runtime/aligned.py): regions that work row by row along a
symbol get one static impl per bucket of its values (rounded up to DYNASHAPE_FC_ALIGN), built over
padded views of the arena; results equal the dynamic path's; everything else keeps one impl per
value. On CPU (CI) the impls are the specialised region source with the alignment turned on
by the environment; on the device the same tests run CUDA graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape import Dimension
from dynashape.errors import OptionsError
from dynashape.runtime.aligned import MAX_ALIGNED, aligned_value

from ..models import llama
from .test_static_impls import assert_same
from .test_static_impls import mlp as static_mlp


def mlp(rows: str = "") -> onnx.ModelProto:
    """The MLP of test_static_impls over x [N, 8] (the projections of a decode step, one row per
    value of N), or over [N, rows, 8]."""
    return static_mlp(dims=("N", rows) if rows else ("N",))


def feeds(n, device, seed, rows=None):
    g = torch.Generator().manual_seed(seed)
    shape = (n, 8) if rows is None else (n, rows, 8)
    return {"x": (torch.rand(*shape, generator=g) * 4 - 2).to(device)}


@pytest.fixture(autouse=True)
def _aligned(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_FC_ALIGN", "8")
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")  # builds in ms (inductor's: tests/impls/...)


def _regions(sess):
    return [rc for st in sess._default.runner.states.values() for rc in st.spec.regions]


def test_values_round_up_to_the_multiple_up_to_the_limit():
    assert [aligned_value(v, 8) for v in (1, 7, 8, 9, 64)] == [8, 8, 8, 16, 64]
    assert aligned_value(MAX_ALIGNED + 1, 8) is None and aligned_value(3, 0) is None and aligned_value(3, 1) is None


def test_one_impl_serves_every_value_of_a_bucket(device):
    shapes = [1, 3, 6, 8, 2, 7, 5, 4] * 2 + [9, 12, 9]
    ref = dynashape.InferenceSession(mlp(), device=device, static_impls="off")
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync",
                                      dynamic_dims={"x": [Dimension(1, 16), 8]})
    sess.run(None, feeds(16, device, 0))  # the arena planned for the largest first: no replans
    for i, n in enumerate(shapes):
        f = feeds(n, device, i + 1)
        assert_same([sess.run(None, f)], [ref.run(None, f)])
    (rc,) = [rc for rc in _regions(sess) if rc.align is not None]
    assert rc.align.symbol == "N"
    st = sess.stats()
    # batches 1-8 share the bucket 8, batches 9 and 12 the bucket 16: two builds, the rest hits
    assert st["static_builds"] == st["static_builds_aligned"] == 2, st
    assert st["static_hits"] >= len(shapes) - 4 and st["static_guard_fails"] == 0


def test_outputs_held_by_the_caller_are_their_real_rows_and_do_not_change(device):
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    ref = dynashape.InferenceSession(mlp(), device=device, static_impls="off")
    held = []
    for i, n in enumerate([3, 3, 5, 3, 2]):
        f = feeds(n, device, i)
        out = sess.run(None, f)
        assert out[0].shape == (n, 8)
        held.append(([o.clone() for o in out], out))
        assert_same([out], [ref.run(None, f)])
    for kept, out in held:
        assert_same([out], [kept])
    assert sess.stats()["static_builds_aligned"] >= 1


def test_a_decode_step_aligns_its_projections_along_the_batch(device):
    path = llama.model_path()
    dims = {"batch": Dimension(1, llama.MAX_BATCH), "seq": Dimension(1, llama.MAX_SEQ),
            "past": Dimension(0, llama.MAX_SEQ)}
    # the regions serve every step (whole-step decode graphs, on by default on CUDA, would replace them)
    sess = dynashape.InferenceSession(path, device=device, static_impls="sync", dim_params=dims, decode_graphs="off")
    ref = dynashape.InferenceSession(path, device=device, static_impls="off", dim_params=dims)
    rng = np.random.default_rng(0)
    batches = [4, 1, 3, 2, 4, 1, 3, 2]
    for b in batches:
        f = {"input_ids": rng.integers(0, 100, (b, 1)).astype(np.int64)}
        for name in ("past_key_0", "past_value_0", "past_key_1", "past_value_1"):
            f[name] = rng.standard_normal((b, 2, 6, 16)).astype(np.float32)
        for x, y in zip(sess.run(None, f), ref.run(None, f)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    aligned = [rc for rc in _regions(sess) if rc.align is not None]
    assert aligned and all(rc.align.symbol == "batch" for rc in aligned)
    st = sess.stats()
    # four batches, one bucket: each aligned region built once
    assert st["static_builds_aligned"] == len(aligned), st
    assert st["static_guard_fails"] == 0 and st["static_errors_rerun"] == 0


def _rows_mixed() -> onnx.ModelProto:
    """A product over a constant weight, then a sum over the batch: rows of N meet."""
    w = onnx.numpy_helper.from_array(np.ones((8, 8), np.float32), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=1),
             helper.make_node("Add", ["r", "s"], ["y"])]
    axes = onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8])], initializer=[w, axes])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _no_product() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Tanh", ["r"], ["t"]),
             helper.make_node("Sigmoid", ["t"], ["y"])]
    g = helper.make_graph(nodes, "ew", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _rows_of_another_symbol() -> onnx.ModelProto:
    """x [N, S, 8]: BERT's layout; padding N would pad N x S product rows."""
    return mlp(rows="S")


@pytest.mark.parametrize("model", [_rows_mixed, _no_product, _rows_of_another_symbol])
def test_regions_that_mix_rows_or_hold_no_product_keep_one_impl_per_value(device, model):
    sess = dynashape.InferenceSession(model(), device=device, static_impls="sync")
    ref = dynashape.InferenceSession(model(), device=device, static_impls="off")
    for i, n in enumerate([3, 5, 3, 5, 3]):
        x = feeds(n, device, i, rows=4 if model is _rows_of_another_symbol else None)
        assert_same([sess.run(None, x)], [ref.run(None, x)])
    # (BERT's [N, S, 8] is aligned along its tokens, N * S, never along N: codegen/tokens.py,
    # tests/impls/test_token_buckets.py; off by default)
    assert _regions(sess) and all(rc.align is None or rc.align.kind == "tokens" for rc in _regions(sess))
    if not sess.compiled.token_buckets:
        assert sess.stats().get("static_builds_aligned", 0) == 0


def test_a_bad_alignment_setting_is_an_options_error(device, monkeypatch):
    monkeypatch.setenv("DYNASHAPE_FC_ALIGN", "eight")
    with pytest.raises(OptionsError, match="DYNASHAPE_FC_ALIGN"):
        dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    with pytest.raises(OptionsError, match="fc_align=65"):  # the option, named as given
        dynashape.InferenceSession(mlp(), device=device, static_impls="sync", fc_align=65)
    monkeypatch.setenv("DYNASHAPE_FC_ALIGN", "0")
    sess = dynashape.InferenceSession(mlp(), device=device, static_impls="sync")
    for i, n in enumerate([3, 5, 3, 5]):
        sess.run(None, feeds(n, device, i))
    assert sess.stats()["static_builds"] == 2 and sess.stats().get("static_builds_aligned", 0) == 0


def test_the_option_wins_over_the_variable(device, monkeypatch):
    # the variable (8, set above) is an operator's override of the default; a session's fc_align wins
    exact = dynashape.InferenceSession(mlp(), device=device, static_impls="sync", fc_align=0)
    monkeypatch.delenv("DYNASHAPE_FC_ALIGN")
    aligned = dynashape.InferenceSession(mlp(), device=device, static_impls="sync", fc_align=4)
    for i, n in enumerate([3, 2, 3, 2]):
        exact.run(None, feeds(n, device, i))
        aligned.run(None, feeds(n, device, i))
    assert exact.stats()["static_builds"] == 2 and exact.stats().get("static_builds_aligned", 0) == 0
    assert aligned.stats()["static_builds"] == 1 and aligned.stats()["static_builds_aligned"] == 1
