"""The forms a static impl may compute an op in (ops/specialise.py, tuned_gemm.py, tuned_conv.py)
and the choice between them.

On CPU (CI): every form computes what the op computes (products: bias, residual, both, none,
both weight layouts, into a given output; convolutions: 1x1 and 3x3, strides, padding, bias,
residual, ReLU, one image and several), the tuner is asked once per key and its choice kept, a
tuner that cannot time (inside a capture) leaves the key untuned. On the device
(DYNASHAPE_TEST_DEVICE=cuda): a static impl's build times the forms of its products and
convolutions, the choices are recorded, and the static impl's results equal the dynamic path's.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.ops import specialise
from dynashape.ops import tuned_conv as tc
from dynashape.ops import tuned_gemm as tg


@pytest.fixture(autouse=True)
def _fresh_choices():
    specialise.forget()
    yield
    specialise.forget()


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
    with specialise.specialised(tuner):
        assert specialise.active()
        y1 = tg.product(x, w, True, b)
        y2 = tg.product(torch.randn(4, 6), w, True, b)  # same key: no second timing
        tg.product(torch.randn(2, 6), w, True, b)  # other rows: another key
    assert not specialise.active()
    assert len(asked) == 2 and asked[0][:4] == ("gemm", 4, 3, 6) and asked[1][:4] == ("gemm", 2, 3, 6)
    assert set(specialise.choices().values()) == {"c_bias"}
    torch.testing.assert_close(y1, x @ w.t() + b)
    assert y2.shape == (4, 3)


def _conv_key(batch: int) -> tuple:
    return ("conv", (batch, 64, 56, 56), (256, 64, 1, 1), (1, 1), (0, 0), torch.float32, True, True, False,
            False, False, 0)


def test_a_convolution_timed_at_one_batch_serves_batches_near_it():
    """A region's batch buckets differ only in the batch: their convolutions take the form timed
    at the nearest batch within SIBLING_SPAN, provisionally (not timed, not saved, fixed once
    taken); farther batches are timed, and a merged form never serves one image."""
    asked = []

    def tuner(key, runs):
        asked.append(key[1][0])
        return len(runs) - 1  # the last form: "gemm_merged", or "gemm" for one image
    forms = ("cudnn", "gemm", "gemm_merged")
    with specialise.specialised(tuner):
        assert specialise.choose(_conv_key(8), forms, lambda f: None) == "gemm_merged"
        assert specialise.choose(_conv_key(24), forms, lambda f: None) == "gemm_merged"  # 3x: from 8
        assert specialise.choose(_conv_key(4), forms, lambda f: None) == "gemm_merged"
        assert specialise.choose(_conv_key(1), forms[:2], lambda f: None) == "gemm"  # timed: 8 is 8x away
        assert specialise.choose(_conv_key(2), forms, lambda f: None) == "gemm"  # nearest timed: 1
        assert specialise.choose(_conv_key(64), forms, lambda f: None) == "gemm_merged"  # timed (24 untimed)
        other = ("conv", (8, 64, 28, 28), *_conv_key(8)[2:])
        specialise.choose(other, forms, lambda f: None)  # another spatial size: its own timing
    assert asked == [8, 1, 64, 8]
    assert set(specialise.choices()) == {_conv_key(8), _conv_key(1), _conv_key(64), other}
    assert specialise.STATS["sibling_forms"] >= 3


def test_a_tuner_that_cannot_time_leaves_the_key_untuned():
    x, w, b = torch.randn(4, 6), torch.randn(3, 6), torch.randn(3)
    with specialise.specialised(lambda key, runs: None):
        y = tg.product(x, w, True, b)
    assert specialise.choices() == {}
    torch.testing.assert_close(y, x @ w.t() + b)


def test_an_untimed_build_takes_the_split_from_its_rows(monkeypatch):
    """A graph built with nothing timed (a bucket's first graph) takes the split product from
    ``SPLIT_PRIOR_ROWS`` rows where the session allows it, the product's own call below."""
    taken = []
    monkeypatch.setattr(tg.split_tf32, "eligible", lambda x, w: True)
    monkeypatch.setattr(tg.split_tf32, "product", lambda x2, w, w_out_in, c, out: taken.append(x2.shape[0])
                        or x2 @ (w.t() if w_out_in else w) + c)
    w, b = torch.randn(3, 6), torch.randn(3)
    with specialise.specialised(specialise.untimed):
        for m in (tg.SPLIT_PRIOR_ROWS - 1, tg.SPLIT_PRIOR_ROWS):
            x = torch.randn(m, 6)
            torch.testing.assert_close(tg.product(x, w, True, b), x @ w.t() + b)
    assert taken == [tg.SPLIT_PRIOR_ROWS]
    assert specialise.choices() == {}  # untuned: a tuned rebuild times them


def test_a_plain_product_is_not_timed():
    def tuner(key, runs):
        raise AssertionError("a product without an epilogue has one form")
    with specialise.specialised(tuner):
        x, w = torch.randn(4, 6), torch.randn(6, 3)
        torch.testing.assert_close(tg.product(x, w, False), x @ w)


def test_ops_outside_a_build_or_on_cpu_keep_their_own_call():
    x, w = torch.randn(2, 4), torch.randn(3, 4)
    xc, wc = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert not tg.serves(x, w) and not tc.serves(xc, wc, 1, (1, 1))  # no build
    with specialise.specialised(lambda key, runs: 0):
        assert not tg.serves(x, w) and not tc.serves(xc, wc, 1, (1, 1))  # CPU tensors: the ops' own call


CONVS = [  # (batch, in, out, kernel, stride, padding, size)
    (1, 6, 5, 1, 1, 0, 7), (3, 6, 5, 1, 1, 0, 7), (2, 6, 5, 1, 2, 0, 8), (1, 4, 6, 3, 1, 1, 9),
    (3, 4, 6, 3, 2, 1, 9), (2, 3, 4, 3, 1, 0, 6), (2, 5, 3, 5, 2, 2, 11),
]


@pytest.mark.parametrize("case", CONVS)
@pytest.mark.parametrize("bias,relu,residual", [(True, False, False), (False, True, False), (True, True, True)])
def test_every_conv_form_computes_the_convolution(case, bias, relu, residual):
    n, cin, cout, k, st, pad, size = case
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, cin, size, size, generator=g)
    w = torch.randn(cout, cin, k, k, generator=g)
    b = torch.randn(cout, generator=g) if bias else None
    ref = F.conv2d(x.double(), w.double(), b.double() if bias else None, st, pad)
    z = torch.randn(ref.shape, generator=g) if residual else None
    if residual:
        ref = ref + z.double()
    if relu:
        ref = ref.relu()
    fs = tc.forms(x, w, (st, st), (pad, pad))
    assert fs[0] == "cudnn" and len(fs) >= 2
    assert ("gemm" in fs) == (k == 1 and pad == 0) and (any(f.endswith("_merged") for f in fs)) == (n > 1)
    assert not any(f.endswith("_split") for f in fs)  # CPU tensors: split products are CUDA's
    # the split forms' logic (their bfloat16 parts' products in float32 on the CPU)
    fs += tuple(f + "_split" for f in fs if f.startswith(("gemm", "unfold")))
    for form in fs:
        y = tc._run(form, x, w, b, (st, st), (pad, pad), relu, z.clone() if z is not None else None,
                    lambda: tc._epilogue(F.conv2d(x, w, b, st, pad), z.clone() if z is not None else None, relu))
        assert y.shape == ref.shape and y.is_contiguous(), form
        torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4, msg=form)


def test_split_conv_forms_are_offered_where_split_products_are(monkeypatch):
    """The ``_split`` forms follow the product forms where ``split_tf32.eligible`` holds (a CUDA
    session whose fp32_products allows split products): 1x1 as gemm, others as unfold."""
    from dynashape.ops import split_tf32
    monkeypatch.setattr(split_tf32, "eligible", lambda x, w: True)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # (torch's default is True; a run's is its own)
    x1, w1 = torch.randn(2, 6, 7, 7), torch.randn(5, 6, 1, 1)
    assert tc.forms(x1, w1, (1, 1), (0, 0)) == ("cudnn", "gemm", "gemm_merged", "gemm_split", "gemm_merged_split")
    x3, w3 = torch.randn(1, 4, 9, 9), torch.randn(6, 4, 3, 3)
    assert tc.forms(x3, w3, (2, 2), (1, 1)) == ("cudnn", "unfold", "unfold_split")
    monkeypatch.setattr(split_tf32, "BF16", False)  # TF32 parts would need the process-wide switch
    assert not any(f.endswith("_split") for f in tc.forms(x1, w1, (1, 1), (0, 0)))


def test_a_weights_parts_are_made_once_and_remade_after_a_write():
    """The conv weight's bfloat16 parts (``split_tf32.parts`` over [N, C, kh, kw] read as [N, K])
    are kept per weight, and made again when the weight is written in place."""
    from dynashape.ops import split_tf32
    w = torch.randn(5, 3, 3, 3)
    a = split_tf32.parts(w, True, True)
    assert split_tf32.parts(w, True, True) is a and a.shape == (81, 5)
    hi, lo = a[:27].t().float(), a[27:54].t().float()
    torch.testing.assert_close(hi + lo, w.reshape(5, 27), rtol=2 ** -15, atol=0)
    with torch.no_grad():
        w.mul_(2)
    assert split_tf32.parts(w, True, True) is not a


def test_a_recorded_weight_gets_its_parts_again():
    """What ``split_tf32.recording`` hands back is what ``parts`` takes again (impls/static.py makes the
    real weights' parts from it before a capture)."""
    from dynashape.ops import split_tf32
    w = torch.randn(4, 6)
    with split_tf32.recording() as made:
        split_tf32.parts(w, True, True)
    (wid, *how), = made
    assert wid == id(w) and split_tf32.parts(w, *how) is split_tf32.parts(w, True, True)


@pytest.mark.parametrize("k,stride,pad", [((3, 3), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)), ((5, 5), (1, 1), (2, 2)),
                                          ((3, 2), (2, 1), (0, 1))])
def test_windows_are_unfolds_windows(k, stride, pad):
    x = torch.randn(3, 4, 11, 9)
    ref = F.unfold(x, k, padding=pad, stride=stride)
    assert torch.equal(tc.windows(x, k, stride, pad), ref)
    assert torch.equal(tc.windows(x, k, stride, pad, merged=True), ref.transpose(0, 1).reshape(ref.shape[1], -1))


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize("bias,residual,relu", [(True, False, False), (False, False, True), (True, True, True),
                                                (False, True, False), (False, False, False)])
def test_the_epilogue_in_one_pass_equals_the_torch_ops(device, merged, bias, residual, relu):
    from dynashape.ops.conv_epilogue import bias_add_relu
    g = torch.Generator().manual_seed(5)
    n, c, length = 3, 70, 1500  # several row blocks and column blocks of the kernel
    if merged:  # the side-by-side product's [c, n, l] read as [n, c, l]
        y = torch.randn(c, n, length, generator=g).to(device).transpose(0, 1)
    else:
        y = torch.randn(n, c, length, generator=g).to(device)
    y[0, 0, :3] = torch.tensor([float("nan"), -0.0, float("-inf")])
    b = torch.randn(c, generator=g).to(device) if bias else None
    z = torch.randn(n, c, length, generator=g).to(device) if residual else None
    ref = y.clone()
    if bias:
        ref = ref + b.view(1, -1, 1)
    if residual:
        ref = ref + z
    if relu:
        ref = ref.relu()
    out = bias_add_relu(y, b, z, relu)
    assert out.is_contiguous()
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    if not merged:  # in place
        assert bias_add_relu(y, b, z, relu, out=y) is y
        torch.testing.assert_close(y, ref, rtol=0, atol=0, equal_nan=True)


def test_a_conv_without_a_build_is_torchs():
    x, w, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    torch.testing.assert_close(tc.conv2d_op(x, w, b, (1, 1), (1, 1), (1, 1), 1), F.conv2d(x, w, b, 1, 1))


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


def _sessions(model, device):
    """A session whose static impls time their forms, and one on the dynamic path only."""
    if not device.startswith("cuda"):
        pytest.skip("the forms are timed in CUDA graphs: DYNASHAPE_TEST_DEVICE=cuda")
    return (dynashape.InferenceSession(model, device=device, static_impls="sync"),
            dynashape.InferenceSession(model, device=device, static_impls="off"))


def test_static_impls_time_their_products_and_agree_with_the_dynamic_path(device):
    tuned, dynamic = _sessions(_transformer_block(), device)
    shapes = [(1, 16), (4, 64), (1, 16), (4, 64), (1, 16)]
    for i, (n, s) in enumerate(shapes):
        x = torch.randn(n, s, 32, device=device, generator=torch.Generator(device=device).manual_seed(i))
        a, b = tuned.run(None, {"x": x}), dynamic.run(None, {"x": x})
        for u, v in zip(a, b):  # (a split product, fp32_products="auto", is float32's accuracy in norm)
            assert float((u - v).norm() / v.norm()) < 1e-5
            torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-4)
    assert tuned.stats()["static_builds"] >= 2 and tuned.stats()["static_hits"] >= 1
    keys = specialise.choices()
    rows = {k[1] for k in keys if k[0] == "gemm"}
    assert {16, 256} <= rows, keys  # each shape's products were timed in its build
    assert all(v in tg.FORMS + ("split",) for v in keys.values()), keys  # split TF32 products (fp32_products)
    assert specialise.STATS["tuned"] >= len(keys)


def _conv_block() -> onnx.ModelProto:
    """Conv -> Relu, a 1x1 Conv -> Add(residual) -> Relu, a strided 3x3 Conv: a ResNet block."""
    rng = np.random.default_rng(5)

    def init(name, *shape):
        return onnx.numpy_helper.from_array((rng.standard_normal(shape) / 4).astype(np.float32), name)
    inits = [init("W1", 16, 16, 3, 3), init("b1", 16), init("W2", 16, 16, 1, 1), init("b2", 16),
             init("W3", 8, 16, 3, 3)]
    nodes = [helper.make_node("Conv", ["x", "W1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "b2"], ["c2"]),
             helper.make_node("Add", ["c2", "x"], ["a"]), helper.make_node("Relu", ["a"], ["r2"]),
             helper.make_node("Conv", ["r2", "W3"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 16, 14, 14])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 8, 7, 7])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_static_impls_time_their_convolutions_and_agree_with_the_dynamic_path(device):
    tuned, dynamic = _sessions(_conv_block(), device)
    siblings = specialise.STATS["sibling_forms"]
    for i, n in enumerate([1, 5, 1, 5, 1, 3, 3]):  # (a batch is built for at its second sight)
        x = torch.randn(n, 16, 14, 14, device=device, generator=torch.Generator(device=device).manual_seed(i))
        torch.testing.assert_close(tuned.run(None, {"x": x})[0], dynamic.run(None, {"x": x})[0], rtol=1e-4,
                                   atol=1e-4)
    assert tuned.stats()["static_builds"] >= 2 and tuned.stats()["static_hits"] >= 1
    convs = {k: v for k, v in specialise.choices().items() if k[0] == "conv"}
    timed = {k[1][0] for k in convs}
    assert len(timed) == 2 and 1 in timed, convs  # 1 and 5 (or its bucket): more than 4x apart, both timed
    assert specialise.STATS["sibling_forms"] > siblings, (convs, tuned.stats())  # 3 took the forms timed near it
    assert len(convs) >= 6 and all(v in tc.FORMS for v in convs.values())


def test_an_untimed_build_counts_its_defaults_and_a_pinned_key_keeps_its_first_form():
    """A background build's warm run and its capture take one form per key (``pinning``): a form
    another thread keeps for the key in between does not reach the capture; an untimed build
    (``untimed``) counts the keys it left to their own call, which a tuned rebuild times."""
    forms = ("cudnn", "gemm", "gemm_merged")
    key = _conv_key(16)
    with specialise.specialised(specialise.untimed), specialise.counting_defaults() as left, specialise.pinning():
        assert specialise.choose(key, forms, lambda f: None) == "cudnn"  # the warm run
        specialise.remember({key: "gemm_merged"})  # another session's worker timed it meanwhile
        assert specialise.choose(key, forms, lambda f: None) == "cudnn"  # the capture: what the warm run took
    assert left[0] == 1
    with specialise.specialised(specialise.untimed):  # a later build finds the kept form
        assert specialise.choose(key, forms, lambda f: None) == "gemm_merged"


def test_an_untimed_build_takes_the_ops_prior_and_still_leaves_the_key_to_a_tuned_rebuild():
    forms = ("cudnn", "gemm", "gemm_merged")
    key = _conv_key(16)
    before = specialise.STATS["prior_conv_gemm_merged"]
    with specialise.specialised(specialise.untimed), specialise.counting_defaults() as left:
        assert specialise.choose(key, forms, lambda f: None, prior="gemm_merged") == "gemm_merged"
        assert specialise.choose(_conv_key(1), forms, lambda f: None, prior="winograd") == "cudnn"  # not a form here
    assert left[0] == 2 and specialise.choices() == {}  # both untuned: a tuned rebuild times them
    assert specialise.STATS["prior_conv_gemm_merged"] == before + 1
    with specialise.specialised(lambda k, runs: 1):  # a timed build keeps what it timed, not the prior
        assert specialise.choose(key, forms, lambda f: None, prior="gemm_merged") == "gemm"


@pytest.mark.parametrize("x_shape,w_shape,stride,form", [
    ((16, 512, 7, 7), (512, 512, 3, 3), (1, 1), "winograd"),
    ((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), "winograd"),
    ((8, 2048, 7, 7), (512, 2048, 1, 1), (1, 1), "gemm_merged"),
    ((4, 2048, 7, 7), (512, 2048, 1, 1), (1, 1), "gemm"),  # below batch 8: a product per image
    ((16, 256, 56, 56), (64, 256, 1, 1), (1, 1), "gemm"),  # many positions: a product per image
    ((1, 512, 14, 14), (512, 512, 3, 3), (2, 2), "unfold"),
    ((16, 256, 28, 28), (256, 256, 3, 3), (2, 2), "unfold_merged"),
    ((16, 128, 56, 56), (128, 128, 3, 3), (2, 2), "cudnn"),
    ((4, 256, 28, 28), (256, 256, 3, 3), (2, 2), "cudnn"),
    ((2, 3, 224, 224), (64, 3, 7, 7), (2, 2), None),  # not measured: the op's own call
])
def test_the_convolution_prior_follows_the_h200_measurements(x_shape, w_shape, stride, form):
    assert tc.rule(x_shape, w_shape, stride) == form


@pytest.mark.parametrize("x_shape,w_shape,stride,form", [
    ((8, 512, 28, 28), (128, 512, 1, 1), (1, 1), "gemm_split"),
    ((16, 1024, 14, 14), (256, 1024, 1, 1), (1, 1), "gemm_merged_split"),
    ((32, 2048, 7, 7), (512, 2048, 1, 1), (1, 1), "gemm_merged_split"),
    ((16, 256, 28, 28), (256, 256, 3, 3), (2, 2), "unfold_merged_split"),
    ((16, 256, 56, 56), (64, 256, 1, 1), (1, 1), "gemm"),  # 56x56: the float32 product per image
    ((16, 128, 56, 56), (128, 128, 3, 3), (2, 2), "cudnn"),
    ((16, 256, 14, 14), (256, 256, 3, 3), (1, 1), "winograd"),
    ((4, 2048, 7, 7), (512, 2048, 1, 1), (1, 1), "gemm"),  # below batch 8
])
def test_the_prior_takes_split_forms_where_they_won(x_shape, w_shape, stride, form):
    assert tc.rule(x_shape, w_shape, stride, split=True) == form


def _conv_net() -> onnx.ModelProto:
    """The convolutions a ResNet block holds: 3x3 stride 1 with a bias then ReLU, 3x3 stride 1 plus
    a residual then ReLU, 3x3 stride 2, 1x1, and a 3x3 one of two groups."""
    rng = np.random.default_rng(5)

    def init(name, *shape):
        return onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
    inits = [init("w1", 4, 4, 3, 3), init("b1", 4), init("w2", 4, 4, 3, 3), init("b2", 4), init("w3", 4, 4, 3, 3),
             init("w4", 4, 4, 1, 1), init("w5", 4, 2, 3, 3)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["a2"]), helper.make_node("Relu", ["a2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["c3", "w4"], ["c4"]),
             helper.make_node("Conv", ["c4", "w5"], ["y"], pads=[1, 1, 1, 1], group=2)]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4, 4, 4])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_kernels_a_cuda_graph_may_take_are_read_from_its_convolutions(monkeypatch):
    from dynashape.compile import compile_graph
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model
    monkeypatch.setenv("DYNASHAPE_FUSE_CONV_RELU", "1")  # as on CUDA
    program = compile_graph(parse_model(_conv_net(), ParseOptions()), fusion=True, device="cuda")
    # (has a bias, a residual, a ReLU): the grouped one takes no timed form; the stride-2 and 1x1
    # ones take no Winograd
    every, three = tc.epilogues(program.fused)
    assert three == {(True, False, True), (True, True, True)}
    assert every == three | {(False, False, False)}


def test_the_prior_names_a_form_only_once_its_kernels_are_compiled(monkeypatch):
    from dynashape.ops import conv_epilogue, winograd
    monkeypatch.setattr(tc, "_MAJOR", {None: 9})  # compute capability 9 (these tensors are on the CPU)
    monkeypatch.setattr(winograd, "_READY", set())
    monkeypatch.setattr(conv_epilogue, "_READY", set())
    monkeypatch.setattr(conv_epilogue, "triton", object())
    epi = (True, False, True)
    x, w = torch.empty(16, 64, 14, 14), torch.empty(64, 64, 3, 3)
    assert tc.guess(x, w, (1, 1), (1, 1), epi) == "cudnn"  # a build must not wait for a Triton compile
    winograd._READY.add(epi)
    assert tc.guess(x, w, (1, 1), (1, 1), epi) == "winograd"
    assert tc.guess(x, w, (1, 1), (1, 1), (True, True, True)) == "cudnn"  # another epilogue's kernel
    x1, w1 = torch.empty(16, 1024, 14, 14), torch.empty(256, 1024, 1, 1)
    assert tc.guess(x1, w1, (1, 1), (0, 0), epi) == "cudnn"
    conv_epilogue._READY.add((torch.float32, *epi, 256))  # 14x14 positions: the 256 block
    assert tc.guess(x1, w1, (1, 1), (0, 0), epi) == "gemm_merged"
    assert tc.guess(torch.empty(16, 1024, 28, 28), w1, (1, 1), (0, 0), epi) == "cudnn"  # the 1024 block
    monkeypatch.setenv("DYNASHAPE_FORM_PRIORS", "0")
    assert tc.guess(x, w, (1, 1), (1, 1), epi) is None
    monkeypatch.setattr(tc, "_MAJOR", {None: 8})
    monkeypatch.setenv("DYNASHAPE_FORM_PRIORS", "1")
    assert tc.guess(x, w, (1, 1), (1, 1), epi) is None  # measured on compute capability 9 only


def test_a_cuda_session_compiles_its_convolutions_kernels_at_load(device):
    from dynashape.ops import conv_epilogue, winograd
    if not device.startswith("cuda") or winograd.triton is None:
        pytest.skip("Triton kernels on CUDA: DYNASHAPE_TEST_DEVICE=cuda")
    dynashape.InferenceSession(_conv_net(), device=device)
    assert {(True, False, True), (True, True, True)} <= winograd._READY
    assert all(conv_epilogue.ready(torch.float32, False, False, False, n) for n in (49, 196, 3136))
    assert all(conv_epilogue.ready(torch.float32, True, True, True, n) for n in (49, 196, 3136))


def test_timing_forms_gives_way_midway_and_leaves_nothing_queued(device):
    # a tuned rebuild's timing of one key stops before its next form once a call comes (tuning.timings)
    if not device.startswith("cuda"):
        pytest.skip("forms are timed with CUDA events: DYNASHAPE_TEST_DEVICE=cuda")
    from dynashape.impls import tuning
    from dynashape.impls.context import Requeue
    a = torch.randn(256, 256, device=device)
    ran = []

    def form(i):
        def run():
            ran.append(i)
            return a @ a
        return run
    asked = []

    def give_way():  # the first two forms are queued, then a call comes
        asked.append(1)
        return len(asked) > 3
    with pytest.raises(Requeue):
        tuning.timings([form(0), form(1), form(2)], give_way)
    assert len(asked) == 4 and set(ran) == {0, 1, 2}  # each form's first run, then the flush and two forms
    times = tuning.timings([form(0), form(1)], lambda: False)
    assert all(0 < t < float("inf") for t in times)
