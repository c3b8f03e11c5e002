"""Shape tensors known in part at compile time (compile/partial_values.py): a Reshape whose target
is computed from the input's own shape (Paddle2ONNX's ``Concat(Slice(Shape(x), 0, 2), [-1])``,
torch.onnx's ``Concat(Unsqueeze(Gather(Shape(x), 0)), [-1, C])``) gets its output's rank and the
dims the entries give, so the fusions after it apply (ocr_rec_v4's neck had 125 values of unknown
shape). Runs agree with onnxruntime and the interpreter over changing shapes."""

from __future__ import annotations

import numpy as np
import pytest

from dynashape.compile.pipeline import compile_graph
from dynashape.frontend.options import ParseOptions
from dynashape.frontend.parse import parse_model
from tests.compile.test_fusion import FUSED, Builder, check_sequence, randn

C = 8


def _paddle_reshape(b: Builder, x: str) -> str:
    """[N, C, H, W] -> [N, C, H * W] through Concat(Slice(Shape(x), 0, 2), [-1])."""
    shp = b.op("Shape", x)
    head = b.op("Slice", shp, b.const([0], np.int64), b.const([2], np.int64), b.const([0], np.int64))
    return b.op("Reshape", x, b.op("Concat", head, b.const([-1], np.int64), axis=0))


def _torch_reshape(b: Builder, x: str) -> str:
    """[N, C, H, W] -> [N, -1, C] through Concat(Unsqueeze(Gather(Shape(x), 0)), [-1, C])."""
    n = b.op("Gather", b.op("Shape", x), b.const(0, np.int64), axis=0)
    target = b.op("Concat", b.op("Unsqueeze", n, b.const([0], np.int64)), b.const([-1, C], np.int64), axis=0)
    return b.op("Reshape", b.op("Transpose", x, perm=[0, 2, 3, 1]), target)


def _layer_norm(b: Builder, y: str) -> str:
    mean = b.op("ReduceMean", y, axes=[-1], keepdims=1)
    d = b.op("Sub", y, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=[-1], keepdims=1)
    return b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const(1e-5))))


def _feeds(seed: int):
    rng = np.random.default_rng(seed)
    return [{"x": randn(rng, n, C, h, w)} for n, h, w in [(1, 3, 5), (4, 2, 6), (2, 5, 5), (1, 3, 5)]]


@pytest.mark.parametrize("form", ["paddle", "torch"])
def test_the_reshape_gets_its_rank_and_the_norm_after_it_fuses(form):
    b = Builder()
    x = b.input("x", ["n", C, "h", "w"])
    y = (_paddle_reshape if form == "paddle" else _torch_reshape)(b, x)
    tokens = b.op("Transpose", y, perm=[0, 2, 1]) if form == "paddle" else y  # SVTR's [N, HW, C]
    out = _layer_norm(b, tokens)
    model = b.model([out])
    check_sequence(model, _feeds(1))
    # compiled from the bare model (no value_info: onnx's own inference with data propagation,
    # which the session asks for first, follows this small case; on ocr_rec_v4 it gave nothing)
    program = compile_graph(parse_model(model, ParseOptions()))
    reshape = next(n for n in program.graph.nodes if n.op_type == "Reshape")
    shape = reshape.outputs[0].shape
    assert shape is not None and len(shape) == 3
    assert shape[1].is_static and shape[1].min == C if form == "paddle" else shape[2].min == C
    fused = [n.op_type for n in program.fused.nodes if n.domain == FUSED]
    assert fused == ["LayerNorm"], fused


def test_numbers_in_part_fold_into_the_shape_function():
    """Entries that are all numbers (static dims read through Shape) give the shape itself."""
    b = Builder()
    x = b.input("x", ["n", C, 4, 4])
    shp = b.op("Shape", x, start=1)  # [C, 4, 4]: all static
    y = b.op("Reshape", x, b.op("Concat", b.const([-1], np.int64), shp, axis=0))
    model = b.model([y])
    check_sequence(model, [{"x": randn(np.random.default_rng(2), n, C, 4, 4)} for n in (1, 3, 2)])
    program = compile_graph(parse_model(model, ParseOptions()))
    shape = next(n for n in program.graph.nodes if n.op_type == "Reshape").outputs[0].shape
    assert [d.min for d in shape[1:]] == [C, 4, 4]
