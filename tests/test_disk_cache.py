"""The disk cache (``cache_dir=``, impls/disk_cache.py): the forms timed by CUDA builds, kept per
model, device and torch version; a file that is corrupt or was written for something else is
ignored with a warning and the session works as without it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import dynashape
from dynashape.impls import disk_cache
from dynashape.impls.context import wait_all
from dynashape.impls.disk_cache import DiskCache, DiskCacheWarning
from dynashape.ops import specialise

from .impls.test_conv_buckets import cnn

KEY = ("conv", (4, 3, 12, 12), (8, 3, 3, 3), (1, 1), (1, 1), torch.float32, True, False, False, False, False, 0)


@pytest.fixture(autouse=True)
def _fresh_choices():
    wait_all(120)  # an earlier test's background builds, which keep the forms they time, are done
    saved = specialise.choices()
    specialise.forget()
    yield
    specialise.forget()
    specialise.remember(saved)


def test_forms_written_by_one_process_are_read_by_the_next(tmp_path):
    proto = cnn()
    specialise.remember({KEY: "winograd", ("gemm", (3, 8), (8, 5), torch.float16): "bias_in_c"})
    first = DiskCache(tmp_path, proto, torch.device("cpu"))
    assert first.save() and not first.save()  # nothing new: no second write
    specialise.forget()  # a new process knows nothing
    second = DiskCache(tmp_path, proto, torch.device("cpu"))
    assert second.load() == 2
    assert specialise.choices()[KEY] == "winograd"
    assert specialise.choices()[("gemm", (3, 8), (8, 5), torch.float16)] == "bias_in_c"


def test_the_file_is_per_model(tmp_path):
    a = DiskCache(tmp_path, cnn(), torch.device("cpu"))
    b = DiskCache(tmp_path, cnn(mix_rows=True), torch.device("cpu"))
    assert a.path != b.path and a.model != b.model


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": 99, "forms": []}), "[]",
                                     json.dumps({"format": 1, "model": "x", "device": "y", "forms": []})])
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning(tmp_path, content):
    proto = cnn()
    cache = DiskCache(tmp_path, proto, torch.device("cpu"))
    cache.path.write_text(content)
    with pytest.warns(DiskCacheWarning, match="ignoring the cache file"):
        assert cache.load() == 0
    assert specialise.choices() == {}
    specialise.remember({KEY: "cudnn"})
    assert cache.save()  # written anew
    specialise.forget()
    assert DiskCache(tmp_path, proto, torch.device("cpu")).load() == 1


def test_a_file_with_the_right_header_and_bad_entries_is_ignored(tmp_path):
    proto = cnn()
    cache = DiskCache(tmp_path, proto, torch.device("cpu"))
    cache.path.write_text(json.dumps({"format": 1, "model": cache.model, "device": cache.tag,
                                      "forms": [[{"tuple": ["conv", {"dtype": "relu"}]}, "cudnn"]]}))
    with pytest.warns(DiskCacheWarning):
        assert cache.load() == 0


def test_a_session_takes_the_option_and_runs_with_a_bad_file(tmp_path):
    proto = cnn()
    DiskCache(tmp_path, proto, torch.device("cpu")).path.write_text("garbage")
    with pytest.warns(DiskCacheWarning):
        sess = dynashape.InferenceSession(proto, cache_dir=str(tmp_path))
    x = np.random.default_rng(0).standard_normal((3, 3, 12, 12)).astype(np.float32)
    import onnxruntime as ort
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert sess.stats()["disk_cache_forms_loaded"] == 0


def test_the_model_hash_ignores_weight_values():
    a, b = cnn(), cnn()
    b.graph.initializer[0].float_data[:] = []
    b.graph.initializer[0].raw_data = np.ones((8, 3, 3, 3), np.float32).tobytes()
    assert disk_cache.model_hash(a) == disk_cache.model_hash(b)


@pytest.mark.skipif(not os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu").startswith("cuda"), reason="CUDA builds")
def test_a_second_process_builds_without_timing(tmp_path):
    proto = cnn()
    x = {b: torch.randn(b, 3, 12, 12, device="cuda") for b in (3, 5)}

    def builds():
        sess = dynashape.InferenceSession(proto, device="cuda", static_impls="sync", cache_dir=str(tmp_path),
                                          dynamic_dims={"x": [dynashape.Dimension(1, 32), 3, 12, 12]})
        for b in (3, 3, 5, 5, 3):
            sess.run(None, {"x": x[b]})
        return sess.stats()
    tuned = specialise.STATS["tuned"]
    first = builds()
    assert first["static_builds"] >= 1 and specialise.STATS["tuned"] > tuned
    specialise.forget()  # what a new process knows
    tuned = specialise.STATS["tuned"]
    second = builds()
    assert second["disk_cache_forms_loaded"] >= 1 and second["static_builds"] >= 1
    assert specialise.STATS["tuned"] == tuned  # every form came from the file


def test_shapes_asked_to_build_for_are_kept_bucketed_and_bounded(tmp_path):
    """A call that asks for a static impl leaves its input shapes in the cache (a bucketed
    region's: the bucket's batch), for the next process's load; a bad shapes entry makes the file
    ignored like any bad entry."""
    proto = cnn()
    sess = dynashape.InferenceSession(proto, static_impls="sync", cache_dir=str(tmp_path),
                                      dynamic_dims={"x": [dynashape.Dimension(1, 32), 3, 12, 12]})
    sess.compiled.conv_buckets = True  # the CUDA default (tests/impls/test_conv_buckets.py)
    rng = np.random.default_rng(0)
    for b in (3, 5, 13, 4):
        sess.run(None, {"x": rng.standard_normal((b, 3, 12, 12)).astype(np.float32)})
    cache = sess.compiled.disk_cache
    assert cache.shapes == [((4, 3, 12, 12),), ((8, 3, 12, 12),), ((16, 3, 12, 12),)]
    cache.save()
    again = DiskCache(tmp_path, proto, torch.device("cpu"))
    again.load()
    assert again.shapes == cache.shapes and sess.stats()["disk_cache_shapes"] == 3
    for i in range(disk_cache.MAX_SHAPES + 5):
        again.note_shape(((i + 1, 3, 12, 12),))
    assert len(again.shapes) == disk_cache.MAX_SHAPES
    data = json.loads(again.path.read_text())
    data["shapes"] = [[["x", 3]]]
    again.path.write_text(json.dumps(data))
    with pytest.warns(DiskCacheWarning):
        assert DiskCache(tmp_path, proto, torch.device("cpu")).load() == 0


@pytest.mark.skipif(not os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu").startswith("cuda"), reason="CUDA builds")
def test_a_second_process_builds_the_cached_shapes_at_load(tmp_path):
    """The shapes an earlier process built for are built at load: the next process's first call at
    each replays a graph (and a cached shape the model refuses costs a warning, not the load)."""
    proto = cnn()
    opts = dict(device="cuda", cache_dir=str(tmp_path), dynamic_dims={"x": [dynashape.Dimension(1, 32), 3, 12, 12]})
    sess = dynashape.InferenceSession(proto, **opts)
    for b in (3, 13, 3, 13):
        sess.run(None, {"x": torch.randn(b, 3, 12, 12, device="cuda")})
    sess.compiled.context.wait(60)
    shapes = list(sess.compiled.disk_cache.shapes)
    assert ((4, 3, 12, 12),) in shapes and ((16, 3, 12, 12),) in shapes
    sess.compiled.disk_cache.note_shape(((40, 3, 12, 12),))  # beyond the declared range: refused at load
    sess.compiled.disk_cache.save()
    del sess
    specialise.forget()  # what a new process knows
    with pytest.warns(DiskCacheWarning, match="not built at load"):
        second = dynashape.InferenceSession(proto, **opts)
    st = second.stats()
    assert st["disk_cache_shapes_prebuilt"] == len(shapes)
    hits = st.get("static_hits", 0)
    plain = dynashape.InferenceSession(proto, device="cuda", static_impls="off")
    for b in (3, 13):
        x = torch.randn(b, 3, 12, 12, device="cuda")
        torch.testing.assert_close(second.run(None, {"x": x})[0], plain.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert second.stats()["static_hits"] >= hits + 2
