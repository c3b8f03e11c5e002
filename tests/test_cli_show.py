"""``dynashape show --code`` without --shape: the dynamic dims take typical sizes the model accepts.

A model whose convolution window is longer than 2 samples (silero-vad's STFT) rejects the first
guess (2); the command then tries longer lengths for each input's axes after its first dynamic
one, says which shapes it took, and prints the code. A model that no typical size fits gets a
usage error naming the --shape to give."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from dynashape.cli import main
from dynashape.cli_common import UsageExit


def _conv_window(window: int) -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 1, window)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], strides=[window // 2])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, [None, 1, None])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_show_code_finds_a_length_the_model_accepts(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_window(128), path)
    assert main(["show", str(path), "--code"]) == 0
    out = capsys.readouterr().out
    assert "# typical shapes: x=[2, 1, 256]" in out and "def run(" in out


def test_show_code_names_the_shape_to_give_when_nothing_fits(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_conv_window(4000), path)  # longer than every typical length
    with pytest.raises(UsageExit, match="--shape x=DIMS"):
        main(["show", str(path), "--code"])
    assert main(["show", str(path), "--code", "--shape", "x=1x1x4096"]) == 0
