"""`dynashape check`: ops supported or not, inputs and their dim names, and --compare against onnxruntime."""

import onnx
from onnx import TensorProto as TP
from onnx import helper

from dynashape import check
from dynashape.cli import main
from dynashape.demo_model import build_demo_model


def _with_foreign_op() -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Fancy", ["r"], ["y"], domain="com.example")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["?", "unk__3", "seq"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 2)],
                             ir_version=8)


def test_report_names_missing_ops_and_placeholder_dims():
    m = _with_foreign_op()
    ops = {(r.domain, r.op_type): r for r in check.op_report(m)}
    assert ops[("", "Relu")].supported and ops[("", "Relu")].opset == 17
    fancy = ops[("com.example", "Fancy")]
    assert not fancy.supported and fancy.opset == 2 and "Fancy" in fancy.detail
    (x,) = check.input_report(m)
    assert x.dims == [None, None, "seq"] and "placeholder" in x.note


def test_cli_check(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    onnx.save(_with_foreign_op(), bad)
    assert main(["check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "Fancy (com.example, opset 2)" in out and "NOT OK" in out
    good = tmp_path / "demo.onnx"
    onnx.save(build_demo_model(), good)
    assert main(["check", str(good), "--compare", "--trials", "3", "--int-high", "256"]) == 0
    out = capsys.readouterr().out
    assert out.count("match") >= 3 and "logits" in out and "NOT OK" not in out


def test_compare_reports_a_mismatch(monkeypatch):
    import dataclasses

    import torch

    from dynashape.ops import registry
    key = ("", "Relu")
    monkeypatch.setitem(registry._REGISTRY, key, [dataclasses.replace(
        v, fn=lambda x, out=None: out.copy_(torch.abs(x)) if out is not None else torch.abs(x))
        for v in registry._REGISTRY[key]])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rows = check.compare(m, trials=2)
    assert [r.status for r in rows] == ["MISMATCH", "MISMATCH"] and rows[0].errors["y"] > 0.01
