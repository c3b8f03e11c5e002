"""The forms of a product a static impl may take (ops/tuned_gemm.py) and the choice between them.

On CPU (CI): every form computes the product the op computes (bias, residual, both, none; both
weight layouts; into a given output), the tuner is asked once per key and its choice kept, a
tuner that cannot time (inside a capture) leaves the key untuned. On the device
(DYNASHAPE_TEST_DEVICE=cuda): a static impl's build times the forms for its products, the choices
are recorded, and the static impl's results equal the dynamic path's.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import tuned_gemm as tg


@pytest.fixture(autouse=True)
def _fresh_choices():
    tg.forget()
    yield
    tg.forget()


def _reference(x, w, out_in, bias, residual):
    y = x.double() @ (w.double().t() if out_in else w.double())
    if bias is not None:
        y = y + bias.double()
    if residual is not None:
        y = y + residual.double()
    return y


@pytest.mark.parametrize("out_in,bias,residual,into", list(itertools.product([True, False], repeat=4)))
def test_every_form_computes_the_product(out_in, bias, residual, into):
    g = torch.Generator().manual_seed(7)
    m, n, k = 5, 12, 9
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) if out_in else torch.randn(k, n, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    r = torch.randn(m, n, generator=g) if residual else None
    ref = _reference(x, w, out_in, b, r)
    for form in tg.forms(b, r):
        out = torch.full((m, n), float("nan")) if into else None
        y = tg._run(form, x, w, out_in, b, r, out)
        if into:
            assert y.data_ptr() == out.data_ptr(), form
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5, msg=form)


def test_forms_offered_per_epilogue():
    b, r = torch.zeros(3), torch.zeros(2, 3)
    assert tg.forms(None, None) == ("epilogue",)
    assert tg.forms(None, r) == ("epilogue", "then_add")
    assert tg.forms(b, None) == tg.FORMS and tg.forms(b, r) == tg.FORMS


def test_the_tuner_is_asked_once_per_key_and_its_choice_kept():
    asked = []

    def tuner(key, runs):
        asked.append(key)
        for run in runs:  # every form runs as the real tuner runs it
            run()
        return tg.FORMS.index("c_bias")
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    with tg.specialised(tuner):
        assert tg.active()
        y1 = tg.product(x, w, True, b)
        y2 = tg.product(torch.randn(4, 6), w, True, b)  # same key: no second timing
        tg.product(torch.randn(2, 6), w, True, b)  # other rows: another key
    assert not tg.active()
    assert len(asked) == 2 and asked[0][:3] == (4, 3, 6) and asked[1][:3] == (2, 3, 6)
    assert set(tg.choices().values()) == {"c_bias"}
    torch.testing.assert_close(y1, x @ w.t() + b)
    assert y2.shape == (4, 3)


def test_a_tuner_that_cannot_time_leaves_the_key_untuned():
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    with tg.specialised(lambda key, runs: None):
        y = tg.product(x, w, True, b)
    assert tg.choices() == {}
    torch.testing.assert_close(y, x @ w.t() + b)


def test_a_plain_product_is_not_timed():
    def tuner(key, runs):
        raise AssertionError("a product without an epilogue has one form")
    with tg.specialised(tuner):
        x, w = torch.randn(4, 6), torch.randn(6, 3)
        torch.testing.assert_close(tg.product(x, w, False), x @ w)


def test_products_outside_a_build_or_on_cpu_keep_the_ops_call():
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    assert not tg.serves(x, w)  # no build
    with tg.specialised(lambda key, runs: 0):
        assert not tg.serves(x, w)  # a CPU tensor: the ops' own call


# ---- on the device ------------------------------------------------------------------------------
def _transformer_block() -> onnx.ModelProto:
    """Linear with bias (MatMul + Add), a GELU-ish tanh, a second Linear and a residual Add, and
    an ONNX Gemm with a bias: the products of a BERT layer at a small size."""
    rng = np.random.default_rng(3)

    def init(name, *shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) / 4).astype(np.float32), name)
    inits = [init("W1", 32, 96), init("b1", 96), init("W2", 96, 32), init("b2", 32), init("W3", 10, 32),
             init("b3", 10)]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Tanh", ["hb"], ["t"]), helper.make_node("MatMul", ["t", "W2"], ["z"]),
             helper.make_node("Add", ["z", "b2"], ["zb"]), helper.make_node("Add", ["zb", "x"], ["y"]),
             helper.make_node("Reshape", ["y", "flat"], ["y2"]),
             helper.make_node("Gemm", ["y2", "W3", "b3"], ["g"], transB=1)]
    flat = onnx.numpy_helper.from_array(np.array([-1, 32], dtype=np.int64), "flat")
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "S", 32])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "S", 32]),
                           helper.make_tensor_value_info("g", TP.FLOAT, [None, 10])],
                          initializer=inits + [flat])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_static_impls_time_their_products_and_agree_with_the_dynamic_path(device):
    if not device.startswith("cuda"):
        pytest.skip("the forms are timed in CUDA graphs: DYNASHAPE_TEST_DEVICE=cuda")
    model = _transformer_block()
    tuned = dynashape.InferenceSession(model, device=device, static_impls="sync")
    dynamic = dynashape.InferenceSession(model, device=device, static_impls="off")
    shapes = [(1, 16), (4, 64), (1, 16), (4, 64), (1, 16)]
    for i, (n, s) in enumerate(shapes):
        x = torch.randn(n, s, 32, device=device, generator=torch.Generator(device=device).manual_seed(i))
        a, b = tuned.run(None, {"x": x}), dynamic.run(None, {"x": x})
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)
    assert tuned.stats()["static_builds"] >= 2 and tuned.stats()["static_hits"] >= 1
    keys = tg.choices()
    rows = {k[0] for k in keys}
    assert {16, 256} <= rows, keys  # each shape's products were timed in its build
    assert all(v in tg.FORMS for v in keys.values())
    assert tg.STATS["tuned"] >= len(keys)
