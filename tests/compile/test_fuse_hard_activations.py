"""``fuse_hard_activations`` (compile/fuse_activations.py): HardSwish ``x * Clip(x + 3, 0, 6) / 6``
and HardSigmoid ``Clip(x + 3, 0, 6) / 6`` written out (PaddleOCR's exports) become one fused op.
Written as exporters write them (Add operands either way, a division by 6 or a product by 1/6,
Clip's bounds as inputs or, before opset 11, attributes); near misses must not fuse. Each model
runs over changing shapes with fresh random inputs (wide enough to reach both clip bounds) in the
fused compiled session, the interpreter and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compile.test_fusion import FUSED, Builder, check_sequence, fused_ops

SHAPES = [(1, 4, 5, 5), (2, 4, 3, 7), (3, 4, 6, 2), (1, 4, 5, 5)]


def _feeds(seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal(s) * 4).astype(np.float32)} for s in SHAPES]


def _clip(b: Builder, v: str, lo: float, hi: float, opset: int) -> str:
    if opset < 11:
        return b.op("Clip", v, min=lo, max=hi)
    return b.op("Clip", v, b.const(lo), b.const(hi))


def model(kind="swish", swap_add=False, scale="div", opset=17, add=3.0, hi=6.0, six=6.0, extra_out=None):
    b = Builder()
    x = b.input("x", ["n", 4, "h", "w"])
    three = b.const(add)
    a = b.op("Add", *((three, x) if swap_add else (x, three)))
    c = _clip(b, a, 0.0, hi, opset)
    t = b.op("Mul", x, c) if kind == "swish" else c
    y = b.op("Div", t, b.const(six)) if scale == "div" else b.op("Mul", t, b.const(1 / six))
    outs = [y] + ([{"add": a, "clip": c, "mul": t}[extra_out]] if extra_out else [])
    return b.model(outs, opset=opset)


@pytest.mark.parametrize("opset", [9, 17])
@pytest.mark.parametrize("scale", ["div", "mul"])
@pytest.mark.parametrize("swap_add", [False, True])
@pytest.mark.parametrize("kind", ["swish", "sigmoid"])
def test_hard_activations_fuse_and_agree(kind, swap_add, scale, opset):
    sess = check_sequence(model(kind, swap_add, scale, opset), _feeds(1))
    ops = fused_ops(sess)
    name = "HardSwish" if kind == "swish" else "HardSigmoid"
    assert ops[f"{FUSED}.{name}"] == 1, dict(ops)
    assert not (ops["Clip"] or ops["Add"] or ops["Div"] or ops["Mul"]), dict(ops)


@pytest.mark.parametrize("case", [{"add": 2.0}, {"hi": 5.0}, {"six": 5.0}, {"extra_out": "clip"},
                                  {"extra_out": "add"}, {"extra_out": "mul"}])
def test_near_misses_do_not_fuse(case):
    sess = check_sequence(model("swish", **case), _feeds(2))
    ops = fused_ops(sess)
    assert ops[f"{FUSED}.HardSwish"] == 0 and ops[f"{FUSED}.HardSigmoid"] == 0, dict(ops)
