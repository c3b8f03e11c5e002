"""Layout ops (tensor.py) over sequences of shapes in one session, against onnxruntime and the
ONNX reference evaluator. Shape-defining inputs are tested both as runtime inputs and as
constants, since the runtime handles the two differently (volatile vs constant shape deps)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from . import harness
from .harness import make_model, rand, run_sequence

I64 = np.int64
# DYNASHAPE_TEST_DEVICE=cuda runs the same sequences on a GPU session
DEVICE = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")


def run_op(op_type, steps, attrs=None, opset=17, n_outputs=1, const=None, refs=("ort", "ref"), seed=0):
    """``steps``: per run, a list with one entry per input: a shape tuple (fresh random float
    data), an array (used as is), or a callable ``rng -> array``. Inputs in ``const`` are
    initializers and their entries in ``steps`` are ignored."""
    rng = np.random.default_rng(seed)
    const = const or {}
    feeds_seq = []
    for step in steps:
        feeds = {}
        for i, e in enumerate(step):
            if i in const:
                continue
            if callable(e):
                e = e(rng)
            elif isinstance(e, tuple):
                e = rand(e, np.float32, rng)
            feeds[f"in{i}"] = np.asarray(e)
        feeds_seq.append(feeds)
    n_in = len(steps[0])
    sample = {**{f"in{i}": v for i, v in const.items()}, **feeds_seq[0]}
    in_types = [onnx.helper.np_dtype_to_tensor_dtype(sample[f"in{i}"].dtype) for i in range(n_in)]
    ranks = [np.ndim(sample[f"in{i}"]) for i in range(n_in)]
    if any(np.ndim(v) != ranks[int(k[2:])] for f in feeds_seq for k, v in f.items()):
        ranks = None  # a rank changes along the sequence: unknown-rank inputs
    model = make_model(op_type, n_in, in_types, attrs, opset, n_outputs, const, ranks)
    return run_sequence(model, feeds_seq, refs, device=DEVICE)


def ints(*v):
    return np.array(v, dtype=I64)


# ---- Reshape / Flatten / Squeeze / Unsqueeze / Transpose ------------------------------------------
RESHAPE_STEPS = [[(2, 3, 4), ints(6, -1)], [(4, 5), ints(0, -1, 1)], [(3, 8), ints(2, -1, 3)],
                 [(2, 3, 4), ints(6, -1)], [(1, 6), ints(-1)], [(5, 1, 2), ints(0, 0, 2)]]


def test_reshape_runtime_shape():
    run_op("Reshape", RESHAPE_STEPS)


def test_reshape_const_shape():
    run_op("Reshape", [[s, None] for s in [(2, 3), (6,), (4, 3, 2), (2, 3), (1, 6, 1), (3, 4)]],
           const={1: ints(-1, 6)})


def test_reshape_allowzero():
    # allowzero=1: a 0 in the shape is a real 0, not "copy the input dim"
    steps = [[(2, 0, 3), ints(0, 3)], [(4, 3), ints(3, 4)], [(0, 5), ints(5, 0)], [(2, 6), ints(3, 4, 1)],
             [(4, 3), ints(3, 4)]]
    run_op("Reshape", steps, {"allowzero": 1}, opset=14)


@pytest.mark.parametrize("axis,opset", [(1, 13), (0, 13), (-1, 13), (2, 9)])
def test_flatten(axis, opset):
    run_op("Flatten", [[(2, 3, 4)], [(5, 1, 2)], [(1, 7, 3, 2)], [(2, 3, 4)], [(3, 2, 1)]], {"axis": axis},
           opset=opset)


def test_squeeze_runtime_axes():
    run_op("Squeeze", [[(2, 1, 3), ints(1)], [(1, 4, 1), ints(0, -1)], [(3, 1), ints(-1)],
                       [(2, 1, 3), ints(1)],
                       [(1, 1, 1, 5), ints(0, 2)]])


def test_squeeze_const_and_no_axes():
    run_op("Squeeze", [[s, None] for s in [(2, 1, 3), (4, 1, 1), (1, 1, 5), (2, 1, 3), (3, 1, 2)]],
           const={1: ints(1)})
    run_op("Squeeze", [[(2, 1, 3)], [(1, 4, 1)], [(3, 1)], [(2, 1, 3)], [(1, 1, 1, 5)]])


def test_squeeze_unsqueeze_axes_attribute():
    seq = [[(2, 1, 3)], [(4, 1, 1)], [(1, 1, 5)], [(2, 1, 3)], [(3, 1, 2)]]
    run_op("Squeeze", seq, {"axes": [1]}, opset=11)
    run_op("Unsqueeze", seq, {"axes": [0, -1]}, opset=11)


def test_unsqueeze_runtime_and_const_axes():
    run_op("Unsqueeze", [[(2, 3), ints(0)], [(4,), ints(0, -1)], [(2, 1, 3), ints(1, 3)], [(2, 3), ints(0)],
                         [(5,), ints(-1)]])
    run_op("Unsqueeze", [[(2, 3), None], [(4,), None], [(2, 1, 3), None], [(2, 3), None], [(5, 2), None]],
           const={1: ints(0, -1)})


@pytest.mark.parametrize("perm", [None, [1, 0, 2], [2, 0, 1]])
def test_transpose(perm):
    run_op("Transpose", [[(2, 3, 4)], [(1, 5, 2)], [(4, 2, 3)], [(2, 3, 4)], [(3, 1, 1)]],
           {} if perm is None else {"perm": perm})


# ---- Concat / Split ---------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concat(axis):
    def sh(a, b, c):
        base = [2, 3]
        return [tuple(n if k == axis % 2 else d for k, d in enumerate(base)) for n in (a, b, c)]
    run_op("Concat", [sh(1, 2, 3), sh(4, 1, 1), sh(2, 2, 2), sh(1, 2, 3), sh(0, 3, 1)], {"axis": axis})


def test_split_num_outputs():
    # opset 18 chunks of ceil(dim / n), the last smaller
    run_op("Split", [[(7, 2)], [(9, 3)], [(3, 1)], [(7, 2)], [(12, 2)]], {"num_outputs": 3, "axis": 0},
           opset=18, n_outputs=3)


def test_split_sizes_input_and_const():
    run_op("Split", [[(2, 5), ints(2, 3)], [(3, 4), ints(1, 3)], [(1, 7), ints(6, 1)], [(2, 5), ints(2, 3)],
                     [(4, 2), ints(1, 1)]], {"axis": 1}, opset=13, n_outputs=2)
    run_op("Split", [[(2, 5), None], [(3, 5), None], [(1, 5), None], [(2, 5), None], [(6, 5), None]],
           {"axis": -1}, opset=13, n_outputs=3, const={1: ints(1, 3, 1)})


def test_split_attribute():
    run_op("Split", [[(5, 2)], [(5, 3)], [(5, 1)], [(5, 2)], [(5, 4)]], {"split": [2, 3]}, opset=11,
           n_outputs=2)


# ---- Slice -----------------------------------------------------------------------------------------
BIG = np.iinfo(np.int64).max


def test_slice_runtime_params():
    steps = [
        [(6, 4), ints(1, 0), ints(5, 3), ints(0, 1), ints(2, 1)],
        [(3, 5), ints(-1), ints(-BIG), ints(1), ints(-1)],           # whole axis reversed
        [(7, 2, 3), ints(10, 1), ints(-10, 2), ints(0, 2), ints(-3, 1)],  # clamped start, negative step
        [(6, 4), ints(1, 0), ints(5, 3), ints(0, 1), ints(2, 1)],
        [(4, 4), ints(-3, 0), ints(BIG, BIG), ints(-2, -1), ints(1, 2)],
        [(5, 3), ints(4), ints(1), ints(0), ints(-2)],
    ]
    run_op("Slice", steps, opset=13)


def test_slice_const_params():
    seq = [[s, None, None, None, None] for s in [(6, 4), (3, 5), (8, 2), (6, 4), (2, 9)]]
    run_op("Slice", seq, opset=13, const={1: ints(1, -1), 2: ints(BIG, -BIG), 3: ints(0, 1), 4: ints(2, -1)})


def test_slice_without_axes_steps():
    run_op("Slice", [[(6, 4), ints(1, 1), ints(4, -1)], [(3, 3), ints(0, 0), ints(2, 2)],
                     [(9, 5), ints(-3, 2), ints(BIG, 5)], [(6, 4), ints(1, 1), ints(4, -1)],
                     [(2, 8), ints(1, 2), ints(2, 3)]], opset=13)


def test_slice_attributes_opset9():
    run_op("Slice", [[(6, 4)], [(3, 5)], [(9, 2)], [(6, 4)], [(4, 7)]],
           {"starts": [1, -2], "ends": [1000, -1], "axes": [0, 1]}, opset=9)


# ---- Expand / Tile ---------------------------------------------------------------------------------
def test_expand():
    run_op("Expand", [[(3, 1), ints(2, 3, 4)], [(1,), ints(5)], [(2, 1, 1), ints(2, 3, 2)],
                      [(3, 1), ints(2, 3, 4)], [(4, 3), ints(1, 1)]])
    run_op("Expand", [[s, None] for s in [(3, 1), (1,), (1, 4), (3, 1), (3, 4)]], const={1: ints(2, 3, 4)})


def test_tile():
    run_op("Tile", [[(2, 3), ints(2, 1)], [(1, 4), ints(3, 2)], [(3, 1), ints(1, 5)], [(2, 3), ints(2, 1)],
                    [(2, 2), ints(0, 2)], [(2, 2), ints(2, 2)]])
    run_op("Tile", [[s, None] for s in [(2, 3), (1, 4), (3, 1), (2, 3), (5, 2)]], const={1: ints(2, 3)})


# ---- Pad ------------------------------------------------------------------------------------------
PAD_STEPS = [[(3, 4), ints(1, 2, 0, 1)], [(5, 2), ints(0, 1, 2, 1)], [(2, 6), ints(1, 0, 1, 3)],
             [(3, 4), ints(1, 2, 0, 1)], [(4, 3), ints(2, 2, 2, 2)]]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_modes(mode):
    cv = np.array(1.5, dtype=np.float32)
    steps = [s + ([cv] if mode == "constant" else []) for s in PAD_STEPS]
    run_op("Pad", steps, {"mode": mode}, opset=13)


def test_pad_wrap_opset19():
    run_op("Pad", PAD_STEPS, {"mode": "wrap"}, opset=19)
    # pads longer than the axis wrap around more than once; onnxruntime 1.30 reads garbage there
    # (1.31 is right), so this sequence checks against the reference evaluator only
    run_op("Pad", [[(2, 3), ints(3, 4, 2, 5)], [(1, 2), ints(2, 5, 3, 0)], [(3, 1), ints(4, 0, 7, 2)],
                   [(2, 3), ints(3, 4, 2, 5)], [(2, 2), ints(1, 1, 1, 1)]], {"mode": "wrap"}, opset=19,
           refs=("ref",))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_negative(mode):
    # (onnxruntime measures reflect pads against the cropped axis and wants them below its size)
    steps = [[(5, 4), ints(-1, 1, 1, -1)], [(4, 6), ints(2, -3, -1, 1)], [(3, 5), ints(0, 1, -2, 0)],
             [(5, 4), ints(-1, 1, 1, -1)], [(6, 6), ints(-2, -2, 1, 1)]]
    # the reference evaluator pads with np.pad, which rejects negative pads: onnxruntime only
    run_op("Pad", steps, {"mode": mode}, opset=13, refs=("ort",))


def test_pad_const_pads_and_axes():
    run_op("Pad", [[s, None] for s in [(3, 4), (1, 2), (5, 1), (3, 4), (2, 7)]], {"mode": "edge"}, opset=13,
           const={1: ints(1, 0, 2, 3)})
    steps = [[(2, 3, 4), ints(1, 2), np.array(2.0, np.float32), ints(-1)],
             [(1, 5, 2), ints(0, 3), np.array(-1.0, np.float32), ints(-1)],
             [(3, 2, 6), ints(2, 0), np.array(4.0, np.float32), ints(-1)],
             [(2, 3, 4), ints(1, 2), np.array(2.0, np.float32), ints(-1)],
             [(1, 1, 1), ints(2, 2), np.array(3.0, np.float32), ints(-1)]]
    run_op("Pad", steps, {"mode": "constant"}, opset=18)


def test_pad_attribute_opset2():
    run_op("Pad", [[(3, 4)], [(1, 2)], [(5, 1)], [(3, 4)], [(2, 7)]],
           {"pads": [1, 0, 2, 3], "mode": "constant", "value": 0.5}, opset=2)


# ---- DepthToSpace / SpaceToDepth -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    run_op("DepthToSpace", [[(1, 8, 2, 3)], [(2, 4, 1, 1)], [(1, 12, 3, 2)], [(1, 8, 2, 3)], [(3, 4, 2, 2)]],
           {"blocksize": 2, "mode": mode})


def test_space_to_depth():
    run_op("SpaceToDepth", [[(1, 2, 4, 6)], [(2, 1, 2, 2)], [(1, 3, 6, 4)], [(1, 2, 4, 6)], [(3, 1, 2, 8)]],
           {"blocksize": 2})


# ---- Trilu / CumSum / EyeLike / ReverseSequence ----------------------------------------------------
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu(upper):
    run_op("Trilu", [[(3, 4), ints(0)[0]], [(2, 5, 2), ints(-1)[0]], [(4, 4), ints(2)[0]],
                     [(3, 4), ints(0)[0]],
                     [(1, 6, 3), ints(-4)[0]]], {"upper": upper}, opset=14)
    run_op("Trilu", [[(3, 4)], [(5, 2)], [(2, 2, 3)], [(3, 4)], [(6, 1)]], {"upper": upper}, opset=14)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    run_op("CumSum", [[(3, 4), ints(1)[0]], [(5,), ints(0)[0]], [(2, 3, 2), ints(-2)[0]],
                      [(3, 4), ints(1)[0]],
                      [(1, 6), ints(-1)[0]]], {"exclusive": exclusive, "reverse": reverse}, opset=14)


def test_cumsum_int32():
    def r(shape):
        return lambda rng: rng.integers(-9, 9, size=shape).astype(np.int32)
    run_op("CumSum", [[r((3, 4)), ints(0)[0]], [r((5, 2)), ints(1)[0]], [r((2, 2)), ints(0)[0]],
                      [r((3, 4)), ints(0)[0]], [r((7, 1)), ints(0)[0]]], {"exclusive": 1}, opset=14)


@pytest.mark.parametrize("k", [0, 1, -2])
def test_eyelike(k):
    run_op("EyeLike", [[(3, 4)], [(5, 2)], [(1, 1)], [(3, 4)], [(6, 6)]], {"k": k})
    run_op("EyeLike", [[(3, 4)], [(5, 2)], [(2, 2)], [(3, 4)], [(4, 6)]],
           {"k": k, "dtype": onnx.TensorProto.INT64})


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis, time_axis):
    def lens(b, t):
        return lambda rng: rng.integers(1, t + 1, size=b).astype(I64)

    def step(t, b, extra):
        shape = [0, 0]
        shape[time_axis], shape[batch_axis] = t, b
        return [tuple(shape) + extra, lens(b, t)]
    run_op("ReverseSequence", [step(4, 3, (2,)), step(2, 5, (2,)), step(6, 1, (3,)), step(4, 3, (2,)),
                               step(3, 2, (1,))], {"batch_axis": batch_axis, "time_axis": time_axis})


def test_shape_subgraph_feeds_reshape_and_slice():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, and Slice ends from Shape: the shape ops
    run in a host-side shape_of subgraph, the data ops on the session device."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        h.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
        h.make_node("Concat", ["bu", "m1"], ["target"], axis=0),
        h.make_node("Reshape", ["x", "target"], ["r"]),
        h.make_node("Slice", ["s", "one", "two"], ["s1"]),  # second dim of x
        h.make_node("Slice", ["r", "zero", "s1", "one"], ["y"]),  # first dim-1 columns of r
        h.make_node("Transpose", ["y"], ["yt"], perm=[1, 0]),
        h.make_node("Split", ["yt"], ["o0", "o1"], axis=1, num_outputs=2),
    ]
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in [
        ("i0", np.array(0, I64)), ("ax0", ints(0)), ("m1", ints(-1)), ("one", ints(1)), ("two", ints(2)),
        ("zero", ints(0))]]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["a", "b", "c"])],
                     [h.make_tensor_value_info(n, TP.FLOAT, None) for n in ("o0", "o1")], initializer=inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=8)
    rng = np.random.default_rng(1)
    shapes = [(2, 3, 4), (3, 2, 5), (2, 4, 2), (2, 3, 4), (4, 1, 3)]
    run_sequence(model, [{"x": rand(s, np.float32, rng)} for s in shapes], device=DEVICE)


@pytest.mark.parametrize("opset", [11, 13])
def test_split_equal_parts_from_output_count(opset):
    """Before opset 18 an equal split has as many parts as the node has outputs."""
    harness.check_op("Split", [[(6, 4)], [(3, 2)], [(9, 5)], [(6, 4)], [(12, 1)]], attrs={"axis": 0}, opset=opset,
             n_outputs=3)
