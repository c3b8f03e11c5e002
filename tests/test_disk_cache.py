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
from dynashape.impls.disk_cache import DiskCache, DiskCacheWarning
from dynashape.ops import specialise

from .impls.test_conv_buckets import cnn

KEY = ("conv", (4, 3, 12, 12), (8, 3, 3, 3), (1, 1), (1, 1), torch.float32, True, False, False, False, False, 0)


@pytest.fixture(autouse=True)
def _fresh_choices():
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
