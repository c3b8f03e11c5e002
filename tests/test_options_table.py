"""dynashape/options.py lists every keyword option: each has a doc, its default is accepted by
InferenceSession, each environment variable it names is read by the code, and the session
accepts exactly these names."""

from __future__ import annotations

import pathlib
from dataclasses import fields

import numpy as np
import pytest

import dynashape
from dynashape.errors import OptionsError
from dynashape.options import OPTION_NAMES, Options, describe
from tests.helpers import add_chain

SOURCE = "\n".join(p.read_text() for p in pathlib.Path(dynashape.__file__).parent.rglob("*.py"))


@pytest.mark.parametrize("f", fields(Options), ids=[f.name for f in fields(Options)])
def test_each_option_is_documented_and_its_default_accepted(f):
    assert len(f.metadata["doc"]) > 20
    env = f.metadata.get("env")
    if env:
        assert f'"{env}"' in SOURCE, f"{f.name}: {env} is read nowhere"
    sess = dynashape.InferenceSession(add_chain(2), **{f.name: f.default})
    x, b = np.ones((3, 4), np.float32), np.full((1, 4), 0.5, np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "b": b})[0], x + 1.0)


def test_the_session_accepts_exactly_these_names():
    with pytest.raises(OptionsError, match="known options are"):
        dynashape.InferenceSession(add_chain(2), speed="max")
    assert "max_buffer_bytes" in OPTION_NAMES and "threads" in OPTION_NAMES
    assert all(name in describe() for name in OPTION_NAMES)


def test_precompile_traces_at_load_and_is_validated():
    from onnx import TensorProto as TP
    from onnx import helper

    g = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "S"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "S"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    lazy = dynashape.InferenceSession(m)
    assert len(lazy.compiled.specs) == 0
    eager = dynashape.InferenceSession(m, precompile=True)
    traced = eager.compiled.stats["shape_program_traces"]
    assert traced >= 1 and eager.compiled.stats["specializations_precompiled"] >= 2
    for shape in [(3, 5), (1, 4), (6, 1)]:  # served by what was traced at load: no trace at the call
        x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_allclose(eager.run(None, {"x": x})[0], x * x)
    assert eager.compiled.stats["shape_program_traces"] == traced
    with pytest.raises(OptionsError, match="precompile"):
        dynashape.InferenceSession(m, precompile="sometimes")
