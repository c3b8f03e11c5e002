"""`dynashape bench --random-shapes` (bench.py main_new_shapes, random_shapes.py): every call at a
shape set drawn new within the ranges, every call counted from the first (no warm-up), the same
shapes and inputs for every runtime compared; the JSON's totals and worst call; its usage errors."""

import json

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from dynashape import bench
from dynashape.cli import cli, main


@pytest.fixture
def conv_model(tmp_path):
    """A 3x3 convolution and a ReLU over [n, 3, h, w], all three dims dynamic."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 4, "h", "w"])], [w])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


def _record(monkeypatch):
    """Every timed call's runtime-independent record: (shape, a checksum of its input)."""
    calls = []
    real = bench._timed_call

    def timed(run, feeds):
        x = feeds["x"]
        calls.append((x.shape, float(np.abs(x).sum())))
        return real(run, feeds)
    monkeypatch.setattr(bench, "_timed_call", timed)
    return calls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_every_call_is_a_new_shape_and_counted(conv_model, tmp_path, monkeypatch, device):
    calls = _record(monkeypatch)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["bench", conv_model, "--random-shapes", "x=1..3x3x8..40x8..40", "--step", "4",
                                 "--calls", "10", "--seed", "5", "--device", device, "--json", str(out),
                                 "--no-progress"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert len(calls) == 10  # no first-call or warm-up calls beside the counted ones
    shapes = [c[0] for c in calls]
    assert len(set(shapes)) == 10
    for n, c, h, w in shapes:
        assert 1 <= n <= 3 and c == 3 and h in range(8, 41, 4) and w in range(8, 41, 4)
    assert all(total > 0 for _, total in calls)  # fresh random data, not zeros
    doc = json.loads(out.read_text())
    d = doc["runtimes"]["dynashape"]
    assert doc["mode"] == "random-shapes" and doc["device"] == device and d["calls"] == 10 and len(d["per_call"]) == 10
    assert doc["shape_sequence"] == [f"x={'x'.join(map(str, s))}" for s in shapes]
    assert [c["shape"] for c in d["per_call"]] == doc["shape_sequence"]
    ms = [c["ms"] for c in d["per_call"]]
    assert d["total_ms"] == pytest.approx(sum(ms))
    assert d["worst_call"]["ms"] == max(ms) and d["worst_call"]["shape"] == doc["shape_sequence"][ms.index(max(ms))]
    assert d["latency_ms"]["p50"] <= d["latency_ms"]["p90"] <= d["latency_ms"]["p99"] <= d["latency_ms"]["max"]
    assert "every call at a new shape" in r.output and d["worst_call"]["shape"] in r.output


def test_the_compared_runtime_gets_the_same_shapes_and_inputs(conv_model, monkeypatch, tmp_path):
    pytest.importorskip("onnxruntime")
    calls = _record(monkeypatch)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["bench", conv_model, "--random-shapes", "x=1x3x8..64x8..64", "--calls", "6",
                                 "--compare", "onnxruntime", "--threads", "1", "--json", str(out), "--no-progress"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert len(calls) == 12 and calls[:6] == calls[6:]
    doc = json.loads(out.read_text())
    for rt in ("dynashape", "onnxruntime"):
        assert doc["runtimes"][rt]["calls"] == 6 and doc["runtimes"][rt]["total_ms"] > 0


def test_named_dims_are_shared_between_inputs(tmp_path, monkeypatch):
    """Two inputs of one [b, s] shape: b and s drawn once per call, both inputs get them."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    vi = [helper.make_tensor_value_info(n, TP.FLOAT, ["B", "S"]) for n in ("a", "b")]
    g = helper.make_graph(nodes, "g", vi, [helper.make_tensor_value_info("y", TP.FLOAT, ["B", "S"])])
    path = tmp_path / "add.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    seen = []
    real = bench._timed_call
    monkeypatch.setattr(bench, "_timed_call", lambda run, feeds: seen.append((feeds["a"].shape, feeds["b"].shape))
                        or real(run, feeds))
    r = CliRunner().invoke(cli, ["bench", str(path), "--random-shapes", "a=b:1..4xs:2..9", "--random-shapes", "b=bxs",
                                 "--calls", "8", "--no-progress"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert len(seen) == 8 and all(a == b for a, b in seen) and len({a for a, _ in seen}) == 8


@pytest.mark.parametrize("args,message", [
    (["--random-shapes", "x=1..2x3x8x8", "--calls", "3"], "2 distinct shape set(s)"),
    (["--random-shapes", "x=1x3x8..9x8", "--runs", "3"], "--calls gives the number of calls"),
    (["--random-shapes", "x=1x3x8..nx8"], "bad dim"),
    (["--random-shapes", "x=1x3xhx8"], "refers to 'h'"),
    (["--random-shapes", "y=1x3x8..16x8"], "--random-shapes"),
])
def test_usage_errors(conv_model, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        rc = main(["bench", conv_model, *args, "--no-progress"])
        raise SystemExit(rc)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err
