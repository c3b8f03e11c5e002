"""`dynashape bench`, `dynashape ops` and the command's errors, version and `python -m dynashape`."""

import json
import subprocess
import sys

import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper

from dynashape import bench
from dynashape.cli import cli, main


def _model(path, batch="batch"):
    w = helper.make_tensor("w", TP.FLOAT, [8, 16], [0.01] * 128)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [batch, 8])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [batch, 16])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


@pytest.fixture
def model(tmp_path):
    return _model(tmp_path / "m.onnx")


@pytest.fixture
def shapes(tmp_path):
    p = tmp_path / "shapes.json"
    p.write_text(json.dumps([{"x": [1, 8]}, {"x": "4x8"}, {"x": [16, 8]}, {"x": [4, 8]}]))
    return str(p)


def _invoke(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_bench_shapes_file_json(model, shapes, tmp_path):
    out = tmp_path / "r.json"
    r = _invoke(["bench", model, "--shapes-file", shapes, "-n", "20", "--warmup", "1", "--json", str(out),
                 "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "p50" in r.output and "p99" in r.output and "x=16x8" in r.output
    doc = json.loads(out.read_text())
    d = doc["runtimes"]["dynashape"]
    lat = d["latency_ms"]
    assert d["calls"] == 20 and len(d["per_call"]) == 20
    assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"] and d["throughput_per_s"] > 0
    assert set(d["first_call_ms"]) == {"x=1x8", "x=4x8", "x=16x8"} and doc["distinct_shapes"][0] == "x=1x8"
    assert d["peak_bytes"] is not None and f"{lat['p50']:.3f}" in r.output


def test_bench_compare_onnxruntime(model, shapes):
    pytest.importorskip("onnxruntime")
    r = _invoke(["bench", model, "--shapes-file", shapes, "-n", "8", "--compare", "onnxruntime,torch-eager",
                 "--threads", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│ dynashape") or
            line.startswith("│ onnxruntime")]
    assert len(rows) == 2  # one row per runtime in the latency table
    assert "torch-eager needs the torch module; not available for an ONNX file" in r.output


def test_bench_time_limit(model):
    import time
    t0 = time.perf_counter()
    r = _invoke(["bench", model, "--shape", "x=2x8", "-t", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - t0 < 20 and "calls/s" in r.output


def test_bench_plot(model, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    r = _invoke(["bench", model, "--shape", "x=2x8", "-n", "5", "--plot", str(png), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_ctrl_c_prints_partial(model, tmp_path, monkeypatch, capsys):
    real, n = bench._timed_call, [0]

    def interrupted(run, feeds):
        n[0] += 1
        if n[0] > 8:
            raise KeyboardInterrupt
        return real(run, feeds)
    monkeypatch.setattr(bench, "_timed_call", interrupted)
    out = tmp_path / "r.json"
    rc = main(["bench", model, "--shape", "x=2x8", "-n", "100", "--warmup", "2", "--json", str(out),
               "--no-progress"])
    output = capsys.readouterr().out
    assert rc == 130
    assert "interrupted" in output and "p50" in output
    doc = json.loads(out.read_text())
    assert doc["interrupted"] and doc["runtimes"]["dynashape"]["calls"] == 5  # 1 first + 2 warm-up + 5


def test_dynamic_dim_widens_a_static_batch(tmp_path):
    m = _model(tmp_path / "s.onnx", batch=1)
    r = _invoke(["bench", m, "--shape", "x=4x8", "--dynamic-dim", "x=0:1:8", "-n", "3", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "x=4x8" in r.output


def test_version_and_python_m():
    r = _invoke(["--version"])
    assert r.exit_code == 0 and r.output.startswith("dynashape ")
    p = subprocess.run([sys.executable, "-m", "dynashape", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "bench" in p.stdout and "ops" in p.stdout


def _cmd(*args):
    return subprocess.run([sys.executable, "-m", "dynashape", *args], capture_output=True, text=True)


def test_errors_exit_codes_without_traceback(model, tmp_path):
    p = _cmd("bench", model, "--shape", "x")
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "NAME=DIMS" in p.stderr
    p = _cmd("run", model, "--shape", "xx=2x8")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "['x']" in p.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    p = _cmd("bench", str(bad))
    assert p.returncode == 3 and "Traceback" not in p.stderr and "InvalidModelError" in p.stderr


def test_ops_lists_the_registry():
    r = _invoke(["ops"])
    assert r.exit_code == 0 and "Conv" in r.output and "com.microsoft" in r.output
    r = _invoke(["ops", "--domain", "com.microsoft"])
    assert r.exit_code == 0 and "Attention" in r.output and "ai.onnx" not in r.output


def test_bench_compare_torch_eager_with_the_module(model, shapes, tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def build():\n"
        "    class M(torch.nn.Module):\n"
        "        def __init__(self):\n"
        "            super().__init__()\n"
        "            self.w = torch.full((8, 16), 0.01)\n"
        "        def forward(self, x):\n"
        "            return torch.relu(x @ self.w)\n"
        "    return M()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "t.json"
    r = _invoke(["bench", model, "--shapes-file", shapes, "-n", "8", "--compare", "torch-eager",
                 "--torch-module", "mymodels:build", "--json", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["runtimes"]["torch-eager"]["calls"] == 8 and doc["runtimes"]["dynashape"]["calls"] == 8


def test_openvino_computes_in_float32_unless_asked(model):
    """OpenVINO's CPU plugin defaults to bf16 on CPUs with AMX or AVX-512 BF16: the comparison asks
    for f32, as onnxruntime and dynashape compute (``--ov-precision`` changes it)."""
    from types import SimpleNamespace

    ov = pytest.importorskip("openvino")
    for asked, want in ((None, ov.Type.f32), ("bf16", ov.Type.bf16)):
        args = SimpleNamespace(model=model, threads=1, ov_precision=asked, device="cpu")
        _, (_, compiled, _) = bench._make_runtime("openvino", args, None)
        got = compiled.get_property("INFERENCE_PRECISION_HINT")
        assert got == want or (want == ov.Type.bf16 and got == ov.Type.f32), got  # (bf16 only where the CPU has it)
