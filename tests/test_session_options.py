"""Every field of dynashape.SessionOptions, set on the object (not as a keyword), changes what the
session does or shows: one check per field, and a test that no field of the table is without
one. onnxruntime's fields that the table says have no effect are exactly those without a check.
(The fields' deeper behaviour is tested where it lives: tests/impls, tests/memory, ...)"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import dynashape
from dynashape.errors import InputShapeError, MemoryLimitError
from dynashape.options import OPTION_NAMES, ORT_FIELDS
from tests.helpers import add_chain

EFFECTS = {}


def effect(*names):
    def register(fn):
        for name in names:
            EFFECTS[name] = fn
        return fn
    return register


def session(model=None, **fields):
    so = dynashape.SessionOptions()
    for name, value in fields.items():
        setattr(so, name, value)
    return dynashape.InferenceSession(add_chain(2) if model is None else model, so)


def feeds(n: int = 3) -> dict:
    return {"x": np.ones((n, 4), np.float32), "b": np.full((1, 4), 0.5, np.float32)}


def linear_model():
    """y = x @ W + B: the Linear fusion's pattern."""
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "W")
    bias = numpy_helper.from_array(np.ones(5, np.float32), "B")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 5])], [w, bias])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# ---- shapes
@effect("default_dynamic_dim")
def _default_dynamic_dim(tmp_path):
    sess = session(add_chain(2, shape=(None, 4)), default_dynamic_dim=dynashape.Dimension(1, 4))
    assert sess.get_inputs()[0].partial_shape[0].max == 4
    with pytest.raises(InputShapeError):
        sess.run(None, feeds(5))


@effect("dynamic_dims")
def _dynamic_dims(tmp_path):
    sess = session(dynamic_dims={"x": [dynashape.Dimension(1, 2), 4]})
    assert sess.get_inputs()[0].partial_shape[0].max == 2
    with pytest.raises(InputShapeError):
        sess.run(None, feeds(3))


@effect("dim_params", "free_dimension_overrides_by_name")
def _dim_params(tmp_path):
    sess = session(dim_params={"N": dynashape.Dimension(1, 2)})
    with pytest.raises(InputShapeError):
        sess.run(None, feeds(3))
    so = dynashape.SessionOptions()
    so.add_free_dimension_override_by_name("N", 3)
    assert dynashape.InferenceSession(add_chain(2), so).get_inputs()[0].partial_shape[0].max == 3


# ---- execution
@effect("executor")
def _executor(tmp_path):
    for executor, specializations in (("interpreter", None), ("compiled", 1)):  # the interpreter generates no code
        sess = session(executor=executor)
        sess.run(None, feeds())
        assert sess.stats().get("specializations") == specializations


@effect("fusion", "graph_optimization_level")
def _fusion(tmp_path):
    assert [n.op_type for n in session(linear_model()).program.fused.nodes] == ["Linear"]
    assert session(linear_model(), fusion=False).program.fused is None
    off = dynashape.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert session(linear_model(), graph_optimization_level=off).program.fused is None


@effect("paged_kv")
def _paged_kv(tmp_path):
    from tests.models import llama
    path = str(llama.model_path({**llama.TINY, "mask_input": True, "position_ids": True}))
    assert "paged.tables" in [i.name for i in session(path, paged_kv=True).get_inputs()]
    assert "paged.tables" not in [i.name for i in session(path).get_inputs()]


@effect("gqa_as_concat")
def _gqa_as_concat(tmp_path):
    from tests.compile.test_gqa_concat import _decoder
    ops = {n.op_type for n in session(_decoder(), gqa_as_concat=True).program.graph.nodes}
    assert "GroupQueryAttention" not in ops and "Concat" in ops
    assert "GroupQueryAttention" in {n.op_type for n in session(_decoder()).program.graph.nodes}


@effect("decided_ifs")
def _decided_ifs(tmp_path):
    from tests.test_decided_ifs import _model
    assert session(_model())._deciders and session(_model(), decided_ifs=False)._deciders == ()


@effect("allow_tf32")
def _allow_tf32(tmp_path):
    assert session(allow_tf32=True).precision is None  # CPU: no TF32 to allow
    from dynashape.run_settings import Precision  # what a CUDA session enters around each run
    before = torch.backends.cuda.matmul.allow_tf32
    with Precision(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with Precision(False):
        assert not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before
    if torch.cuda.is_available():
        assert dynashape.InferenceSession(add_chain(2), dynashape.SessionOptions(allow_tf32=True),
                                          device="cuda").precision.allow


@effect("fp32_products")
def _fp32_products(tmp_path):
    from dynashape.ops import split_tf32
    from dynashape.run_settings import Precision, fp32_products
    assert fp32_products(None) == "auto" and fp32_products("ieee") == "ieee"
    with Precision(False, "split"):  # what a CUDA session's runs set (tests/ops/test_split_tf32.py runs it)
        assert split_tf32.MODE.get() == "split"
    assert split_tf32.MODE.get() == "ieee"
    with pytest.raises(dynashape.errors.OptionsError, match="fp32_products"):
        session(fp32_products="fp16")
    if torch.cuda.is_available():
        assert dynashape.InferenceSession(add_chain(2), dynashape.SessionOptions(fp32_products="ieee"),
                                          device="cuda").precision.products == "ieee"


@effect("threads", "intra_op_num_threads")
def _threads(tmp_path, monkeypatch):
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n)))
    before = torch.get_num_threads()
    sess = session(threads=1)
    sess.run(None, feeds())
    assert sess.threads == 1 and torch.get_num_threads() == before
    assert before == 1 or seen == [1, before]
    assert session(intra_op_num_threads=2).threads == 2


@effect("malloc_tuning")
def _malloc_tuning(tmp_path, monkeypatch):
    from dynashape.memory import host_malloc
    calls = []
    monkeypatch.setattr(host_malloc, "tune", lambda: calls.append(1))
    session(malloc_tuning=False)
    assert calls == []
    session()
    assert calls == [1]


@effect("extra_outputs")
def _extra_outputs(tmp_path):
    sess = session(extra_outputs=["t0"])
    assert [a.name for a in sess.get_outputs()] == ["y", "t0"]
    np.testing.assert_allclose(sess.run(None, feeds())[1], np.full((3, 4), 1.5))


@effect("static_impls")
def _static_impls(tmp_path):
    for mode in ("sync", "off"):
        sess = session(static_impls=mode)
        sess.run(None, feeds())
        assert sess.stats()["static_impls"] == mode


@effect("cache_dir")
def _cache_dir(tmp_path):
    assert session(cache_dir=str(tmp_path)).compiled.disk_cache is not None
    assert session().compiled.disk_cache is None


@effect("deterministic", "use_deterministic_compute")
def _deterministic(tmp_path):
    assert session(static_impls="async")._static_mode == "async"
    assert session(static_impls="async", deterministic=True)._static_mode == "sync"  # built at a fixed call
    assert session(static_impls="async", use_deterministic_compute=True)._static_mode == "sync"


@effect("impl_cache_size")
def _impl_cache_size(tmp_path):
    sess = session(impl_cache_size=7)
    sess.run(None, feeds())
    assert sess.stats()["impl_cache_capacity"] == 7


@effect("decode_graphs")
def _decode_graphs(tmp_path):
    assert session()._decode_graphs is False and session(decode_graphs="on")._decode_graphs is True


@effect("kv_bucket")
def _kv_bucket(tmp_path):
    assert session()._kv_bucket(17) == 256 and session(kv_bucket="pow2")._kv_bucket(17) == 32


@effect("decode_ahead")
def _decode_ahead(tmp_path):
    assert session()._decode_ahead == 0 and session(decode_ahead=4)._decode_ahead == 4


@effect("fc_align")
def _fc_align(tmp_path, monkeypatch):
    monkeypatch.delenv("DYNASHAPE_FC_ALIGN", raising=False)
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")  # no compile process for a check at creation
    assert session(static_impls="sync").compiled.padded("fc", 3) is None
    assert session(static_impls="sync", fc_align=4).compiled.padded("fc", 3) == 4  # batches 1-4: one impl
    assert session(static_impls="off", fc_align=4).compiled.padded("fc", 3) is None  # no static impls to align


@effect("pad_inputs")
def _pad_inputs(tmp_path, monkeypatch):
    monkeypatch.delenv("DYNASHAPE_PAD_INPUTS", raising=False)
    sess = session(pad_inputs="on")  # an Add chain: its rows are proven apart, padded to a bucket
    out = sess.run(None, feeds(3))[0]
    assert out.shape == (3, 4) and sess.stats()["padded_calls"] == 1
    np.testing.assert_allclose(out, session().run(None, feeds(3))[0])
    plain = session()
    plain.run(None, feeds(3))
    assert plain.stats()["compiled_runs"] == 1 and "padded_calls" not in plain.stats()  # 'auto' on CPU: off


@effect("precompile")
def _precompile(tmp_path):
    assert "specializations_precompiled" not in session(precompile=False).compiled.stats
    assert session(precompile=True).compiled.stats["specializations_precompiled"] >= 1


# ---- integer products
def probe_model(k: int = 128):
    """MatMulInteger of 255 (uint8) by 127 (int8, a constant) over ``k`` products: pair sums of 64770,
    exact 255 * 127 * k, 32767 * k / 2 where pair sums saturate to int16."""
    b = numpy_helper.from_array(np.full((k, 1), 127, np.int8), "B")
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "B"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TP.UINT8, ["N", k])],
                          [helper.make_tensor_value_info("y", TP.INT32, ["N", 1])], [b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@effect("u8s8_saturate")
def _u8s8_saturate(tmp_path):
    from dynashape.ops import linalg
    a = {"a": np.full((2, 128), 255, np.uint8)}
    exact, saturated = 255 * 127 * 128, 32767 * 64
    prev = linalg.set_u8s8_saturation(False)
    try:
        assert session(probe_model()).run(None, a)[0][0, 0] == exact  # None: the process's setting
        assert session(probe_model(), u8s8_saturate=True).run(None, a)[0][0, 0] == saturated
        assert linalg.u8s8_saturation() is False, "the session's setting holds for its runs only"
        linalg.set_u8s8_saturation(True)
        assert session(probe_model(), u8s8_saturate=False).run(None, a)[0][0, 0] == exact
        ort = linalg.onnxruntime_saturates()
        if ort is not None:  # 'auto': as this CPU's onnxruntime
            auto = session(probe_model(), u8s8_saturate="auto").run(None, a)[0][0, 0]
            assert auto == (saturated if ort else exact)
    finally:
        linalg.set_u8s8_saturation(prev)


# ---- memory
@effect("allocator")
def _allocator(tmp_path):
    assert session(allocator="torch").create_infer_request().engine.allocator_name == "torch"


@effect("device_memory_limit")
def _device_memory_limit(tmp_path):
    assert session(device_memory_limit=1 << 20).create_infer_request().engine.device_memory_limit == 1 << 20


@effect("memory_pool")
def _memory_pool(tmp_path):
    assert session(executor="interpreter").create_infer_request().network.pool is not None
    assert session(executor="interpreter", memory_pool=False).create_infer_request().network.pool is None


@effect("memory_deps")
def _memory_deps(tmp_path):
    assert session(memory_deps="out_of_order").memory.memory_deps == "out_of_order"


@effect("preallocation")
def _preallocation(tmp_path):
    assert session().create_infer_request().predictor is not None
    assert session(preallocation="0 0 0 1.0").create_infer_request().predictor is None


@effect("inplace_concat")
def _inplace_concat(tmp_path):
    assert session(inplace_concat=False).memory.inplace_concat is False


@effect("kv_growth")
def _kv_growth(tmp_path):
    assert session(kv_growth="openvino").memory.kv_growth == "openvino"


@effect("verbose", "log_severity_level")
def _verbose(tmp_path, monkeypatch):
    monkeypatch.delenv("DYNASHAPE_VERBOSE", raising=False)
    assert session().create_infer_request().engine.verbose == 0
    assert session(verbose=2).create_infer_request().engine.verbose == 2
    assert session(log_severity_level=1).create_infer_request().engine.verbose == 1


# ---- limits
@effect("max_buffer_bytes")
def _max_buffer_bytes(tmp_path):
    with pytest.raises(MemoryLimitError):
        session(max_buffer_bytes=64).run(None, feeds(100))


@effect("max_loop_iterations")
def _max_loop_iterations(tmp_path):
    from dynashape.errors import LimitExceededError
    # a Loop that counts to its trip count: 5 iterations, refused at a limit of 3
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                             [helper.make_tensor_value_info("i", TP.INT64, []),
                              helper.make_tensor_value_info("cond_in", TP.BOOL, []),
                              helper.make_tensor_value_info("v_in", TP.FLOAT, [1])],
                             [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
                              helper.make_tensor_value_info("v_out", TP.FLOAT, [1])],
                             [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    g = helper.make_graph([helper.make_node("Loop", ["n", "c", "v"], ["out"], body=body)], "g",
                          [helper.make_tensor_value_info("n", TP.INT64, []),
                           helper.make_tensor_value_info("c", TP.BOOL, []),
                           helper.make_tensor_value_info("v", TP.FLOAT, [1])],
                          [helper.make_tensor_value_info("out", TP.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    f = {"n": np.array(5, np.int64), "c": np.array(True), "v": np.zeros(1, np.float32)}
    assert session(m).run(None, f)[0][0] == 5
    with pytest.raises(LimitExceededError):
        session(m, max_loop_iterations=3).run(None, f)


# ---- profiling
@effect("enable_profiling", "profile_file_prefix")
def _profiling(tmp_path):
    assert session().end_profiling() == ""
    sess = session(enable_profiling=True, profile_file_prefix=str(tmp_path / "trace_"))
    sess.run(None, feeds())
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "trace_")) and (tmp_path / path).exists()


NO_EFFECT = {n for n, f in ORT_FIELDS.items() if "no effect" in f.metadata["doc"]}


def test_every_field_has_a_check_of_its_effect():
    assert set(EFFECTS) == OPTION_NAMES | (set(ORT_FIELDS) - NO_EFFECT)
    assert NO_EFFECT == {"inter_op_num_threads", "log_verbosity_level", "logid", "execution_mode", "execution_order",
                         "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "use_per_session_threads",
                         "optimized_model_filepath", "free_dimension_overrides_by_denotation"}


@pytest.mark.parametrize("check", sorted(set(EFFECTS.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__.strip("_"))
def test_the_field_set_through_session_options_has_its_effect(check, tmp_path, monkeypatch):
    if check.__code__.co_argcount == 2:
        check(tmp_path, monkeypatch)
    else:
        check(tmp_path)
