"""Float32 products as three tensor-core products of split operands (ops/split_tf32.py,
``fp32_products=``), with bfloat16 parts (the default) and TF32 parts.

On the CPU: the splits themselves (TF32's exact, bfloat16's within 2^-17, ties to even, non-finite
values), the product's arithmetic (torch's CPU products ignore the TF32 switch, and bfloat16 parts
are multiplied as float32 there, so it is the float32 product of the parts), the weights' parts kept
and renewed, and the ops that route to it (MatMul, Gemm, Linear, MatMulAdd) against onnxruntime over
changing shapes; TF32 parts' process-wide switch, and bfloat16 parts needing none. On CUDA
(DYNASHAPE_TEST_DEVICE=cuda): the accuracy against float64 next to cuBLAS's float32 kernel, and a
background build taking its run's TF32 switches rather than the process's.
"""

import gc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.ops import split_tf32

from .harness import DEVICE


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


@pytest.fixture(params=["bf16", "tf32"])
def parts(request, monkeypatch):
    """Each test of the product's arithmetic with either kind of parts; yields the bound on its
    norm-wise error against float64 (bfloat16 parts hold x to 2^-17 of it, TF32's exactly)."""
    monkeypatch.setattr(split_tf32, "BF16", request.param == "bf16")
    yield 2e-5 if request.param == "bf16" else 1e-6


@pytest.fixture
def tf32_parts(monkeypatch):
    """TF32 parts: their products need cuBLAS's process-wide TF32 switch."""
    monkeypatch.setattr(split_tf32, "BF16", False)


def _rel(got, want) -> float:
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    return float((got - want).norm() / want.norm())


def test_the_split_is_exact_and_its_high_part_is_tf32():
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096)).astype(np.float32))
    x[:4] = torch.tensor([1e-42, -3e-41, 3.4e38, -1.0])  # subnormals, near the largest float, exact
    hi, lo = split_tf32.split(x)
    assert torch.all(_bits(hi) & 0x1FFF == 0)  # 10 mantissa bits: exact in TF32
    assert torch.equal(hi.double() + lo.double(), x.double())  # nothing lost
    # rounded to nearest: the remainder is at most half of TF32's step at x
    # (x = m * 2^e with m in [0.5, 1): 11 significant bits step by 2^(e - 11); subnormals by 2^-136)
    e = torch.frexp(x.double()).exponent.clamp(min=-125)
    step = torch.ldexp(torch.ones_like(x, dtype=torch.float64), e - 11)
    assert torch.all(lo.double().abs() <= step / 2)


def test_ties_go_to_even_and_non_finite_values_keep_their_value():
    one = torch.tensor([1.0]).view(torch.int32)
    tie_down = (one + 0x1000).view(torch.float32)  # halfway between 1 and the next TF32 (even: 1)
    tie_up = (one + 0x3000).view(torch.float32)  # halfway between odd and even steps: up to the even one
    hi, _ = split_tf32.split(torch.cat([tie_down, tie_up]))
    assert hi.view(torch.int32).tolist() == [int(one), int(one) + 0x4000]
    x = torch.tensor([float("inf"), -float("inf"), float("nan"), 2.5])
    hi, lo = split_tf32.split(x)
    assert hi[0] == float("inf") and hi[1] == -float("inf") and torch.isnan(hi[2]) and hi[3] == 2.5
    assert lo.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_the_bfloat16_split_rounds_to_nearest_and_holds_x_to_2_to_the_minus_17():
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal(4096) * 10.0 ** rng.integers(-30, 30, 4096)).astype(np.float32))
    hi, lo = split_tf32.split(x, bf16=True)
    assert hi.dtype == lo.dtype == torch.bfloat16
    assert torch.equal(hi, x.bfloat16())  # torch's rounding: to nearest, ties to even
    assert torch.equal(lo, (x - hi.float()).bfloat16())  # the remainder (exact in float32), rounded
    assert torch.all((hi.double() + lo.double() - x.double()).abs() <= x.double().abs() * 2.0 ** -17)
    tie = (torch.tensor([1.0]).view(torch.int32) + 0x8000).view(torch.float32)  # halfway: to the even 1.0
    assert split_tf32.split(tie, bf16=True)[0].item() == 1.0
    hi, lo = split_tf32.split(torch.tensor([float("inf"), -float("inf"), float("nan"), 2.5]), bf16=True)
    assert hi[0] == float("inf") and hi[1] == -float("inf") and torch.isnan(hi[2]) and hi[3] == 2.5
    assert lo.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_the_product_adds_the_parts_and_writes_where_it_is_told(parts):
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal((37, 64)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((24, 64)).astype(np.float32))  # Linear's [out, in]
    bias = torch.from_numpy(rng.standard_normal(24).astype(np.float32))
    res = torch.from_numpy(rng.standard_normal((37, 24)).astype(np.float32))
    want = x.double() @ w.double().t()
    assert _rel(split_tf32.product(x, w, True), want) < parts
    assert _rel(split_tf32.product(x, w, True, bias), want + bias.double()) < parts
    out = torch.full((37, 24), float("nan"))
    got = split_tf32.product(x, w.t().contiguous(), False, res, out)
    assert got.data_ptr() == out.data_ptr()
    assert _rel(out, want + res.double()) < parts


def test_a_weights_parts_are_kept_renewed_when_written_and_dropped_with_it(parts):
    w = torch.randn(32, 16)  # Linear's [out, in]: parts [2 * in, out]
    gc.collect()  # parts of earlier tests' weights dropped now, not during this test (an H200 run: 0 == 6912)
    base = split_tf32.held_bytes()
    cat = split_tf32.parts(w, True)
    hi, lo = split_tf32.split(w, split_tf32.BF16)
    assert torch.equal(cat[:16], hi.t()) and torch.equal(cat[16:], lo.t())
    assert split_tf32.parts(w, True) is cat  # made once
    assert split_tf32.held_bytes() == base + 2 * w.numel() * hi.element_size()
    flat = split_tf32.parts(w, False)  # the same tensor read as [K, N]: its own parts
    assert torch.equal(flat[:32], hi) and torch.equal(flat[32:], lo)
    w.mul_(3.0)  # update_weights writing in place: the parts follow
    cat2 = split_tf32.parts(w, True)
    assert cat2 is not cat and _rel(cat2[:16].double() + cat2[16:].double(), w.t()) < parts
    del w, cat, cat2, flat
    gc.collect()
    assert split_tf32.held_bytes() == base


def test_a_product_of_small_k_is_one_call_over_three_parts(monkeypatch, parts):
    w = torch.randn(24, 64)  # Linear's [out, in], K 64 <= ONE_CALL_K: parts [hi; lo; hi] over K
    x = torch.randn(13, 64)
    hi, lo = split_tf32.split(w, split_tf32.BF16)
    three = split_tf32.parts(w, True, True)
    assert three.shape == (192, 24)
    assert torch.equal(three[:64], hi.t()) and torch.equal(three[64:128], lo.t()) and torch.equal(three[128:], hi.t())
    flat = split_tf32.parts(w.t().contiguous(), False, True)  # [K, N] read the same way
    assert torch.equal(flat[:64], hi.t()) and torch.equal(flat[128:], hi.t())
    calls = []
    monkeypatch.setattr(split_tf32, "addmm", lambda *a, **k: calls.append(a[1].shape) or torch.addmm(*(
        [a[0]] if a[0] is not None else [torch.zeros(())]), a[1], a[2]))
    got = split_tf32.product(x, w, True)
    assert calls == [(13, 192)]  # [x_lo | x_hi | x_hi]: one product
    assert _rel(got, x.double() @ w.double().t()) < parts
    monkeypatch.setattr(split_tf32, "ONE_CALL_K", 0)  # the two-part form: the small terms, then the large one
    calls.clear()
    assert _rel(split_tf32.product(x, w, True), x.double() @ w.double().t()) < parts
    assert calls == [(13, 128), (13, 64)]  # [x_lo | x_hi] @ [w_hi; w_lo], then x_hi @ w_hi added on


def test_rows_are_split_in_place_of_a_wider_matrix(parts):
    x = torch.randn(5, 7)
    hi, lo = split_tf32.split(x, split_tf32.BF16)
    cat = split_tf32.split_rows(x)
    assert torch.equal(cat[:, :7], lo) and torch.equal(cat[:, 7:], hi)


def test_the_large_product_is_added_in_pieces_along_k(parts):
    x, w = torch.randn(9, 2100), torch.randn(2100, 6)  # K 2100: three pieces of 700 (CHUNK 1024)
    assert _rel(split_tf32.product(x, w, False), x.double() @ w.double()) < parts


def _products_model() -> onnx.ModelProto:
    """x @ W1 + b (Linear), then @ W2 + residual (MatMulAdd), a Gemm with transB, a bare MatMul."""
    rng = np.random.default_rng(2)
    init = [onnx.numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) / 4, n)
            for n, s in (("w1", (16, 16)), ("b1", (16,)), ("w2", (16, 16)), ("w3", (12, 16)), ("b3", (12,)),
                         ("w4", (12, 8)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["h1"]),
             helper.make_node("MatMul", ["h1", "w2"], ["m2"]), helper.make_node("Add", ["m2", "x"], ["h2"]),
             helper.make_node("Gemm", ["h2", "w3", "b3"], ["h3"], transB=1),
             helper.make_node("MatMul", ["h3", "w4"], ["y"])]
    g = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 8])], init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("mode", ["split", "auto", "ieee"])
def test_the_ops_route_their_products_by_the_runs_setting(monkeypatch, mode):
    """On the CPU no product is eligible (no TF32 there): the test lets CPU tensors be, so that the
    routing of each op is what is checked, the CUDA test below checks the real thing."""
    monkeypatch.setattr(split_tf32, "eligible", lambda x, w: split_tf32.MODE.get() != "ieee"
                        and x.dtype == torch.float32 and w.dtype == torch.float32)
    model = _products_model()
    sess = dynashape.InferenceSession(model.SerializeToString(), static_impls="off")
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    token = split_tf32.MODE.set(mode)
    try:
        before = split_tf32.PRODUCTS[0]
        for n in (5, 1, 33, 7, 64):
            x = rng.standard_normal((n, 16)).astype(np.float32)
            # four products in a row: bfloat16 parts' ~3e-6 each, norm-wise
            assert _rel(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]) < 3e-5
        used = split_tf32.PRODUCTS[0] - before
    finally:
        split_tf32.MODE.reset(token)
    # "split": every product of every call; "auto": none of these small ones; "ieee": none
    assert used == (4 * 5 if mode == "split" else 0), used
    assert sess.stats()["split_tf32_products"] == split_tf32.PRODUCTS[0]


def test_auto_splits_large_products_only():
    token = split_tf32.MODE.set("auto")
    try:
        # (rows, N, K)
        assert not split_tf32.worth(1024, 3072, 768) and not split_tf32.worth(3072, 768, 768)
        assert not split_tf32.worth(3072, 768, 3072) and split_tf32.worth(3072, 2304, 768)
        assert split_tf32.worth(4096, 768, 768)
    finally:
        split_tf32.MODE.reset(token)


def test_a_run_sets_the_products_setting_and_a_background_build_takes_its_switches():
    """Precision (run_settings.py) sets, for its thread, fp32_products and the TF32 switches a build
    it queues applies on the compile worker (split_tf32.run_flags); the worker restores the
    process's switches afterwards. torch's own default lets cuDNN use TF32."""
    import contextvars

    from dynashape.run_settings import Precision

    b = torch.backends
    prev = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
    b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = True, False
    seen = []
    try:
        with Precision(False, "split"):
            assert split_tf32.MODE.get() == "split" and not b.cudnn.allow_tf32
            queued = contextvars.copy_context()  # what CompilationContext.submit carries to the worker
        assert split_tf32.MODE.get() == "ieee" and b.cudnn.allow_tf32  # the run's end restores

        def build():
            with split_tf32.run_flags():
                seen.append((b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32, split_tf32.MODE.get()))
        queued.run(build)
        assert seen == [(False, False, "split")]
        assert b.cudnn.allow_tf32 and not b.cuda.matmul.allow_tf32  # the process's again
        with split_tf32.run_flags():  # no run queued this: the process's switches untouched
            assert b.cudnn.allow_tf32
        # a run that ends while its build still captures: the build keeps its switches until it ends
        run = Precision(False, "auto")
        run.__enter__()
        build = split_tf32.switches(False)
        build.__enter__()
        run.__exit__(None, None, None)
        assert not b.cudnn.allow_tf32
        build.__exit__(None, None, None)
        assert b.cudnn.allow_tf32 and not b.cuda.matmul.allow_tf32
    finally:
        b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32 = prev


def test_a_product_splits_only_as_the_one_run_inside_and_a_run_waits_for_its_launches(tf32_parts):
    """cuBLAS's TF32 switch is process-wide: a split product turns it on, so it runs only while its
    run is the one run or build inside; a run that begins meanwhile waits for its launches."""
    import threading
    import time

    from dynashape.run_settings import Precision

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    skipped, products = split_tf32.SKIPPED[0], split_tf32.PRODUCTS[0]
    with Precision(False, "split"):
        split_tf32.product(x, w, False)
        assert split_tf32.PRODUCTS[0] == products + 1
        with split_tf32.building():  # a compile worker's build: cuBLAS's float32 product meanwhile
            np.testing.assert_allclose(split_tf32.product(x, w, False), x @ w, rtol=1e-5, atol=1e-5)
        assert split_tf32.PRODUCTS[0] == products + 1 and split_tf32.SKIPPED[0] == skipped + 1
        assert split_tf32._open()  # a product's launches in flight ...
        entered, release = [], threading.Event()

        def other_run():
            with Precision(False, "auto"):
                entered.append(1)
                release.wait(5)
        other = threading.Thread(target=other_run)
        other.start()
        time.sleep(0.2)
        assert not entered  # ... hold another run's start
        split_tf32._close()
        for _ in range(500):
            if entered:
                break
            time.sleep(0.01)
        assert entered
        release.set()
        other.join(5)
    # every run out: no holder left (one left over once made the next test's restore wrong)
    assert split_tf32._HOLDERS[0] == 0


def test_bfloat16_parts_need_no_switch_so_builds_split_beside_runs(monkeypatch):
    """bfloat16 products read no TF32 switch: a build on the compile worker splits too (with TF32
    parts it took cuBLAS's float32 product), and a run splits while a build is inside, untouched."""
    from dynashape.run_settings import Precision

    monkeypatch.setattr(split_tf32, "BF16", True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # eligible reads only this of CUDA
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    skipped, products = split_tf32.SKIPPED[0], split_tf32.PRODUCTS[0]
    with Precision(False, "split"):
        with split_tf32.building():
            assert split_tf32.eligible(x, w)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: False))
        with split_tf32.building():  # a build inside: this run still splits, switching nothing
            prev = torch.backends.cuda.matmul.allow_tf32
            assert _rel(split_tf32.product(x, w, False), x.double() @ w.double()) < 2e-5
            assert torch.backends.cuda.matmul.allow_tf32 == prev
    assert split_tf32.PRODUCTS[0] == products + 1 and split_tf32.SKIPPED[0] == skipped
    assert split_tf32._HOLDERS[0] == 0 and split_tf32._OPEN[0] == 0


def test_the_products_warmed_at_load_are_the_graphs_by_their_layouts():
    from dynashape.compile.pipeline import compile_graph
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model, prepare_proto
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["b", 8])
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (8, 5)), ("w2", (3, 5)), ("w3", (3, 7)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]),  # [K, N] = [8, 5]
             helper.make_node("Gemm", ["a", "w2"], ["c"], transB=1),  # [N, K] = [3, 5]
             helper.make_node("MatMul", ["c", "w3"], ["y"])]  # [3, 7]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    for device in ("cpu", "cuda"):  # (fused differently: MatMul stays, or becomes Linear)
        graph = compile_graph(parse_model(prepare_proto(m), ParseOptions()), device=device).fused
        assert sorted(set(split_tf32._product_shapes(graph))) == [(3, 7), (5, 3), (8, 5)], device
    split_tf32.warm_products(torch.device("cpu"), graph)  # nothing to do off CUDA


def test_a_bad_setting_is_refused_by_name():
    model = _products_model().SerializeToString()
    with pytest.raises(dynashape.errors.OptionsError, match="fp32_products"):
        dynashape.InferenceSession(model, fp32_products="fast")


# ---- CUDA ------------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not DEVICE.startswith("cuda"), reason="DYNASHAPE_TEST_DEVICE=cuda runs it")


@cuda
@pytest.mark.parametrize("m,k,n", [(4096, 768, 3072), (3000, 3072, 768), (257, 100, 33)])
def test_within_a_few_times_cublas_float32s_error(m, k, n, parts):
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(m, k, device=DEVICE)
    w = torch.randn(n, k, device=DEVICE) / k ** 0.5
    want = x.double() @ w.double().t()
    token = split_tf32.MODE.set("split")
    try:
        got = split_tf32.product(x, w, True)
    finally:
        split_tf32.MODE.reset(token)
    err = float((got.double() - want).norm() / want.norm())
    ieee = float(((x @ w.t()).double() - want).norm() / want.norm())
    assert not torch.backends.cuda.matmul.allow_tf32  # the switch restored
    # TF32 parts, pieces of K <= 1024: ~2e-6 at any K (cuBLAS float32 3-7e-7; one TF32 product of
    # the parts over K = 3072: 6e-6, TF32 itself 3e-4); bfloat16 parts 3.1-3.3e-6 at K 256-4096
    assert err <= max(8 * ieee, 3e-6 if parts < 1e-5 else 6e-6), (err, ieee)


@cuda
@pytest.mark.parametrize("m,k,n,addend", [(4097, 2304, 768, "bias"), (3000, 768, 3072, "rows"), (257, 100, 33, None),
                                          (64, 3072, 768, "inplace")])
def test_the_triton_tf32_product_needs_no_switch_and_adds_what_it_is_given(m, k, n, addend, tf32_parts):
    """The product a build on the compile worker takes (``_flag_free``): TF32 tensor cores without
    cuBLAS's process-wide switch, an addend as a bias, rows, or the output itself."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(m, k, device=DEVICE)
    b = torch.randn(n, k, device=DEVICE).t() / k ** 0.5  # [K, N], strided as a Linear's weight
    d = {"bias": torch.randn(n, device=DEVICE), "rows": torch.randn(m, n, device=DEVICE),
         "inplace": torch.randn(m, n, device=DEVICE), None: None}[addend]
    want = a.double() @ b.double() + (0 if d is None else d.double())
    out = d if addend == "inplace" else None
    got = split_tf32._flag_free(d, a, b, out)
    assert out is None or got is out
    tf32 = float((got.double() - want).norm() / want.norm())
    assert tf32 < 2e-3  # TF32's 10 mantissa bits
    assert not torch.backends.cuda.matmul.allow_tf32
    # and the split over it, as the worker runs it: float32's accuracy
    x = torch.randn(m, k, device=DEVICE)
    w = torch.randn(n, k, device=DEVICE) / k ** 0.5
    exact = x.double() @ w.double().t()
    token = split_tf32.MODE.set("split")
    try:
        with split_tf32.building(), split_tf32.flag_free_builds():  # a token region's build
            before = split_tf32.PRODUCTS[0]
            y = split_tf32.product(x, w, True)
            assert split_tf32.PRODUCTS[0] == before + 1  # split, not cuBLAS's float32 product
        with split_tf32.building():  # any other build: cuBLAS's float32 product
            assert not split_tf32.eligible(x, w)
    finally:
        split_tf32.MODE.reset(token)
    assert float((y.double() - exact).norm() / exact.norm()) < 1.5e-5


@cuda
def test_warming_the_products_leaves_no_parts_and_counts_no_product():
    from dynashape.compile.pipeline import compile_graph
    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model, prepare_proto
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["b", 64])
    w = numpy_helper.from_array(np.ones((64, 48), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w])
    graph = compile_graph(parse_model(prepare_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])),
                                      ParseOptions()), device="cuda").fused
    products, held = split_tf32.PRODUCTS[0], len(split_tf32._PARTS)
    split_tf32.warm_products(torch.device("cuda"), graph)
    gc.collect()
    assert split_tf32.PRODUCTS[0] == products and len(split_tf32._PARTS) == held


@cuda
def test_a_session_splits_under_its_setting_and_matches_the_float32_product():
    model = _products_model()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((20000, 16)).astype(np.float32)
    outs = {}
    for mode in ("split", "ieee"):
        sess = dynashape.InferenceSession(model.SerializeToString(), device=DEVICE, fp32_products=mode,
                                          static_impls="off")
        before = split_tf32.PRODUCTS[0]
        outs[mode] = sess.run(None, {"x": x})[0]
        assert (split_tf32.PRODUCTS[0] > before) == (mode == "split")
    assert _rel(outs["split"], outs["ieee"]) < 3e-5  # four products: bfloat16 parts' ~3e-6 each


@cuda
def test_a_background_build_takes_its_runs_tf32_switches():
    """torch lets cuDNN use TF32 by default: a capture on the compile worker took that until the
    worker applied the queuing run's switches (TF32 off): its convolutions moved by ~1e-3."""
    rng = np.random.default_rng(5)
    w = onnx.numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32) / 24, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c0"], pads=[1, 1, 1, 1])]
    for i in range(1, 4):
        nodes += [helper.make_node("Relu", [f"c{i - 1}"], [f"r{i}"]),
                  helper.make_node("Conv", [f"r{i}", "w"], [f"c{i}" if i < 3 else "y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 64, 32, 32])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    prev = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # torch's default
    try:
        sess = dynashape.InferenceSession(model.SerializeToString(), device=DEVICE, static_impls="async")
        x = rng.standard_normal((4, 64, 32, 32)).astype(np.float32)
        wt = torch.from_numpy(onnx.numpy_helper.to_array(w).copy()).double()
        want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), wt, padding=1)
        for _ in range(3):
            want = torch.nn.functional.conv2d(torch.relu(want), wt, padding=1)
        want = want.numpy()
        for _ in range(8):
            sess.run(None, {"x": x})
            sess.compiled.context.wait(60)
        got = sess.run(None, {"x": x})[0]
        st = sess.stats()
        assert st["static_hits"] >= 1, {k: v for k, v in st.items() if "static" in k or "build" in k}
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
        assert sess.compiled.context.wait(60)  # (a build the last run queued holds the switches till it ends)
        # the application's setting back (the holders in the message: a run or build that kept them)
        assert torch.backends.cudnn.allow_tf32, (split_tf32._HOLDERS, split_tf32._OPEN)
    finally:
        torch.backends.cudnn.allow_tf32 = prev


INTERPRETED = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from dynashape.ops import split_tf32 as st
x = torch.randn(7, 300) * 10.0 ** torch.randint(-20, 20, (7, 300))
x[0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 3.4e38])
for bf16 in (False, True):
    for parts, lo_first in ((2, True), (3, True), (2, False), (3, False)):
        want = st._split(x, 7, 300, parts, lo_first, bf16)  # the torch form (CPU tensors)
        got = torch.empty_like(want)
        st._split_kernel[(-(-x.numel() // 512),)](x, got, x.numel(), 300, PARTS=parts, LO_FIRST=lo_first, BF16=bf16,
                                                  BLOCK=512)
        assert torch.equal(got.float().nan_to_num(), want.float().nan_to_num()), (bf16, parts, lo_first)
print("ok")
"""


def test_the_split_kernel_interpreted_on_the_cpu_matches_the_torch_form():
    from tests.helpers import run_interpreted
    run_interpreted(INTERPRETED)
