"""The bad-input table: each case is a model, session options and feeds, the error it must raise
(a dynashape.errors type) and words its message must contain; or ``None`` where the input is odd
but valid and must give onnxruntime's answer. After an error the same session runs a good feed
and must still agree with onnxruntime. ``docs/reliability.md`` is generated from this table by
``scripts/gen_reliability_doc.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import TensorProto as TP
from onnx import helper

from dynashape import Dimension
from dynashape import errors as E


@dataclass
class Case:
    id: str
    group: str
    model: Callable[[], onnx.ModelProto | bytes | str]
    feeds: Callable[[], object] | None  # None: the error comes at load
    error: type | None  # None: valid input, compared with onnxruntime
    words: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)
    good: Callable[[], dict] | None = None  # a valid feed run after the error (default: the model's own)
    absurd: bool = False  # a size no machine holds: nothing may be allocated for it
    output_names: object = None


def rng():
    return np.random.default_rng(0)


def f32(*shape):
    return rng().uniform(-2, 2, size=shape).astype(np.float32)


def mk(nodes, inputs, outputs, inits=(), opset=18, name="g"):
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def one(op, ins, name, inputs, **attrs):
    """A model of one node ``name`` whose float output is ``y``."""
    return lambda: mk([helper.make_node(op, ins, ["y"], name=name, **attrs)], inputs, [("y", TP.FLOAT, None)])


def init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


# ---- models ---------------------------------------------------------------------------------------
def add_model():
    """y = x + b, x [N, 3] with N in 1..8, b an initializer that is also an input (overridable)."""
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"], name="add")],
        "add",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3]), helper.make_tensor_value_info("b", TP.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 3])],
        initializer=[init("b", np.array([1, 2, 3], np.float32))],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def add_good():
    return {"x": f32(2, 3)}


def two_in():
    return mk(
        [helper.make_node("Mul", ["x", "z"], ["y"], name="mul")],
        [("x", TP.FLOAT, ["batch", 3]), ("z", TP.FLOAT, ["batch", 3])],
        [("y", TP.FLOAT, ["batch", 3])],
    )


def two_good():
    return {"x": f32(2, 3), "z": f32(2, 3) + 1}


def int_in():
    return mk(
        [helper.make_node("Add", ["i", "one"], ["y"], name="inc")],
        [("i", TP.INT64, ["N"])],
        [("y", TP.INT64, ["N"])],
        [init("one", np.array([1], np.int64))],
    )


def int_good():
    return {"i": np.arange(5, dtype=np.int64)}


def gather_nd():
    return mk(
        [helper.make_node("GatherND", ["x", "i"], ["y"], name="pick")],
        [("x", TP.FLOAT, [3, 4]), ("i", TP.INT64, ["K", 2])],
        [("y", TP.FLOAT, None)],
    )


def gather_nd_good():
    return {"x": f32(3, 4), "i": np.array([[0, 1], [2, -1]], np.int64)}


def scatter_nd():
    return mk(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="put")],
        [("x", TP.FLOAT, [3, 4]), ("i", TP.INT64, ["K", 2]), ("u", TP.FLOAT, ["K"])],
        [("y", TP.FLOAT, [3, 4])],
    )


def scatter_nd_good():
    return {"x": f32(3, 4), "i": np.array([[0, 1], [2, 3]], np.int64), "u": f32(2)}


def gather(axis=0):
    return mk(
        [helper.make_node("Gather", ["x", "i"], ["y"], name="take", axis=axis)],
        [("x", TP.FLOAT, [3, 4]), ("i", TP.INT64, ["K"])],
        [("y", TP.FLOAT, None)],
    )


def gather_good():
    return {"x": f32(3, 4), "i": np.array([0, 2, -1], np.int64)}


def gather_el():
    return mk(
        [helper.make_node("GatherElements", ["x", "i"], ["y"], name="take_el", axis=1)],
        [("x", TP.FLOAT, [3, 4]), ("i", TP.INT64, [3, "K"])],
        [("y", TP.FLOAT, [3, "K"])],
    )


def gather_el_good():
    return {"x": f32(3, 4), "i": np.array([[0, 3], [1, -1], [2, 0]], np.int64)}


def scatter_el():
    return mk(
        [helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], name="put_el", axis=1)],
        [("x", TP.FLOAT, [3, 4]), ("i", TP.INT64, [3, 1]), ("u", TP.FLOAT, [3, 1])],
        [("y", TP.FLOAT, [3, 4])],
    )


def scatter_el_good():
    return {"x": f32(3, 4), "i": np.array([[0], [3], [-1]], np.int64), "u": f32(3, 1)}


def onehot():
    return mk(
        [helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="hot")],
        [("i", TP.INT64, ["K"]), ("d", TP.INT64, []), ("v", TP.FLOAT, [2])],
        [("y", TP.FLOAT, None)],
    )


def onehot_good():
    return {"i": np.array([0, 2, 1], np.int64), "d": np.array(3, np.int64), "v": np.array([0, 1], np.float32)}


def topk():
    return mk(
        [helper.make_node("TopK", ["x", "k"], ["v", "ix"], name="top")],
        [("x", TP.FLOAT, [2, "N"]), ("k", TP.INT64, [1])],
        [("v", TP.FLOAT, None), ("ix", TP.INT64, None)],
    )


def topk_good():
    return {"x": f32(2, 5), "k": np.array([2], np.int64)}


def compress():
    return mk(
        [helper.make_node("Compress", ["x", "c"], ["y"], name="keep", axis=0)],
        [("x", TP.FLOAT, [3, 2]), ("c", TP.BOOL, ["K"])],
        [("y", TP.FLOAT, None)],
    )


def compress_good():
    return {"x": f32(3, 2), "c": np.array([True, False, True])}


expand = one("Expand", ["x", "s"], "grow", [("x", TP.FLOAT, [1, 4]), ("s", TP.INT64, ["R"])])


def expand_good():
    return {"x": f32(1, 4), "s": np.array([3, 4], np.int64)}


const_of_shape = one("ConstantOfShape", ["s"], "fill", [("s", TP.INT64, [2])])


def cos_good():
    return {"s": np.array([2, 3], np.int64)}


tile = one("Tile", ["x", "r"], "tile", [("x", TP.FLOAT, [2, 2]), ("r", TP.INT64, [2])])


def tile_good():
    return {"x": f32(2, 2), "r": np.array([2, 3], np.int64)}


def range_model(dt=TP.FLOAT):
    return mk(
        [helper.make_node("Range", ["a", "b", "c"], ["y"], name="count")],
        [("a", dt, []), ("b", dt, []), ("c", dt, [])],
        [("y", dt, None)],
    )


def range_good():
    return {"a": np.array(0, np.float32), "b": np.array(5, np.float32), "c": np.array(1.5, np.float32)}


def rfeed(a, b, c, dt=np.float32):
    return lambda: {"a": np.array(a, dt), "b": np.array(b, dt), "c": np.array(c, dt)}


pad = one("Pad", ["x", "p"], "pad", [("x", TP.FLOAT, [2, 2]), ("p", TP.INT64, [4])])


def pad_good():
    return {"x": f32(2, 2), "p": np.array([1, 0, 0, 2], np.int64)}


reshape = one("Reshape", ["x", "s"], "reshape", [("x", TP.FLOAT, [2, 6]), ("s", TP.INT64, [2])])


def reshape_good():
    return {"x": f32(2, 6), "s": np.array([3, 4], np.int64)}


def matmul_sym():
    return mk(
        [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
        [("a", TP.FLOAT, ["M", "K"]), ("b", TP.FLOAT, ["K2", "N"])],
        [("y", TP.FLOAT, None)],
    )


def matmul_good():
    return {"a": f32(2, 3), "b": f32(3, 4)}


def loop_model():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TP.INT64, []),
            helper.make_tensor_value_info("c_in", TP.BOOL, []),
            helper.make_tensor_value_info("v_in", TP.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []), helper.make_tensor_value_info("v_out", TP.FLOAT, [1])],
        initializer=[init("one", np.array([1], np.float32))],
    )
    return mk(
        [helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body, name="the_loop")],
        [("M", TP.INT64, []), ("v0", TP.FLOAT, [1])],
        [("v", TP.FLOAT, [1])],
        opset=17,
    )


def loop_good():
    return {"M": np.array(5, np.int64), "v0": f32(1)}


def bad_attr(node, inputs, outputs):
    return lambda: mk([node], inputs, outputs)


X34 = [("x", TP.FLOAT, [3, 4])]
Y = [("y", TP.FLOAT, None)]


def opset(n):
    def make():
        m = mk([helper.make_node("Relu", ["x"], ["y"], name="relu")], X34, Y)
        m.opset_import[0].version = n
        return m

    return make


def bad_init():
    m = mk([helper.make_node("Add", ["x", "w"], ["y"], name="add_w")], X34, Y)
    t = onnx.TensorProto(name="w", data_type=TP.FLOAT, dims=[4, 3])
    t.float_data.extend([1.0] * 5)
    m.graph.initializer.append(t)
    return m


def cyclic():
    return mk(
        [
            helper.make_node("Add", ["x", "b2"], ["a2"], name="first"),
            helper.make_node("Relu", ["a2"], ["b2"], name="second"),
            helper.make_node("Identity", ["a2"], ["y"], name="out"),
        ],
        X34,
        Y,
    )


def x34():
    return {"x": f32(3, 4)}


# ---- the table ----------------------------------------------------------------------------------
def _feeds_cases() -> list[Case]:
    c = []
    add = add_model
    bad = {
        "unknown-input": ({"x": f32(2, 3), "q": f32(3)}, E.UnknownInputError, ("'q'", "inputs are")),
        "missing-input": ({}, E.MissingInputError, ("missing", "'x'")),
        "feeds-not-dict-list": ([f32(2, 3)], E.InputTypeError, ("dict",)),
        "feeds-none": (None, E.InputTypeError, ("dict",)),
        "feeds-tuple": ((f32(2, 3),), E.InputTypeError, ("dict",)),
        "float64-feed": ({"x": f32(2, 3).astype(np.float64)}, E.InputTypeError, ("'x'", "double", "float")),
        "int32-feed": ({"x": np.ones((2, 3), np.int32)}, E.InputTypeError, ("'x'", "int32")),
        "bool-feed": ({"x": np.ones((2, 3), bool)}, E.InputTypeError, ("'x'", "bool")),
        "complex-feed": ({"x": np.ones((2, 3), np.complex64)}, E.InputTypeError, ("'x'",)),
        "object-feed": ({"x": np.array([["a"] * 3] * 2, object)}, E.InputTypeError, ("'x'",)),
        # a list of numbers is taken as onnxruntime takes it (an array of the input's type); a ragged one is not
        "ragged-list-feed": ({"x": [[1.0, 2.0, 3.0], [1.0]]}, E.InputTypeError, ("'x'", "list")),
        "string-feed": ({"x": "1,2,3"}, E.InputTypeError, ("'x'", "str")),
        "none-feed": ({"x": None}, E.InputTypeError, ("'x'", "NoneType")),
        "rank-low": ({"x": f32(3)}, E.InputRankError, ("'x'", "rank 1", "rank 2")),
        "rank-high": ({"x": f32(2, 3, 1)}, E.InputRankError, ("'x'", "rank 3")),
        "zero-d-for-2d": ({"x": np.float32(1.0)}, E.InputRankError, ("'x'", "rank 0")),
        "fixed-dim-wrong": ({"x": f32(2, 4)}, E.InputShapeError, ("'x'", "axis 1", "4")),
        "dim-above-range": ({"x": f32(9, 3)}, E.InputShapeError, ("'x'", "axis 0", "9", "8")),
        "dim-zero-below-range": ({"x": f32(0, 3)}, E.InputShapeError, ("'x'", "axis 0", "0")),
        "torch-wrong-dtype": ({"x": torch.ones(2, 3, dtype=torch.float64)}, E.InputTypeError, ("'x'",)),
        "torch-wrong-rank": ({"x": torch.ones(6)}, E.InputRankError, ("'x'",)),
        "torch-int-for-float": ({"x": torch.ones(2, 3, dtype=torch.int32)}, E.InputTypeError, ("'x'",)),
        "float16-feed": ({"x": f32(2, 3).astype(np.float16)}, E.InputTypeError, ("'x'", "float16")),
        "sequence-for-tensor": ({"x": [f32(2, 3), f32(2, 3)]}, E.InputRankError, ("'x'", "rank 3")),
        "extra-and-missing": ({"q": f32(2, 3)}, E.InputError, ("'q'",)),
    }
    for cid, (feeds, err, words) in bad.items():
        c.append(
            Case(
                cid,
                "feeds",
                add,
                (lambda f=feeds: f),
                err,
                words,
                options={"dynamic_dims": {"x": [Dimension(1, 8), 3]}},
                good=add_good,
            )
        )
    ok = {
        "big-endian": {"x": f32(2, 3).astype(">f4")},
        "read-only": {"x": _readonly(f32(2, 3))},
        "negative-strides": {"x": f32(2, 3)[::-1]},
        "strided-view": {"x": f32(4, 6)[::2, ::2]},
        "fortran-order": {"x": np.asfortranarray(f32(2, 3))},
        "override-initializer": {"x": f32(2, 3), "b": f32(3)},
        "nan-and-inf-values": {"x": np.array([[np.nan, np.inf, -np.inf], [1, 2, 3]], np.float32)},
        "requires-grad-tensor": {"x": torch.rand(2, 3, requires_grad=True)},
        "non-contiguous-tensor": {"x": torch.rand(3, 2).t()},
        "numpy-scalar-batch-1": {"x": f32(1, 3)},
    }
    for cid, feeds in ok.items():
        c.append(Case(cid, "feeds", add, (lambda f=feeds: f), None, good=add_good))
    c.append(
        Case(
            "symbol-disagreement-pinned",
            "feeds",
            two_in,
            lambda: {"x": f32(2, 3), "z": f32(3, 3)},
            E.SymbolDisagreementError,
            ("'batch'", "dim_params"),
            options={"dim_params": {"batch": Dimension(1, 8)}},
            good=two_good,
        )
    )
    c.append(
        Case(
            "unknown-output-name",
            "feeds",
            add,
            add_good,
            E.UnknownOutputError,
            ("'probs'",),
            good=add_good,
            output_names=["probs"],
        )
    )
    c.append(Case("output-name-as-string", "feeds", add, add_good, None, good=add_good, output_names="y"))
    c.append(
        Case(
            "int-overflow-values",
            "feeds",
            int_in,
            lambda: {"i": np.array([2**63 - 1, -(2**63)], np.int64)},
            None,
            good=int_good,
        )
    )
    c.append(
        Case(
            "uint8-for-int64",
            "feeds",
            int_in,
            lambda: {"i": np.ones(3, np.uint8)},
            E.InputTypeError,
            ("'i'", "uint8"),
            good=int_good,
        )
    )
    return c


def _readonly(a):
    a.setflags(write=False)
    return a


def _options_cases() -> list[Case]:
    bad = {
        "unknown-option": ({"speed": "max"}, ("speed", "known options")),
        "device-name": ({"device": "tpu"}, ("tpu",)),
        "verbose-word": ({"verbose": "loud"}, ("verbose", "loud")),
        "dynamic-dims-unknown-input": ({"dynamic_dims": {"q": [1, 3]}}, ("'q'",)),
        "dynamic-dims-wrong-rank": ({"dynamic_dims": {"x": [1, 3, 4]}}, ("'x'", "rank")),
        "dynamic-dims-string": ({"dynamic_dims": {"x": "N,3"}}, ("'x'", "list")),
        "dynamic-dims-contradicts-model": ({"dynamic_dims": {"x": [Dimension(1, 8), 4]}}, ("'x'", "axis 1")),
        "dim-params-unknown-symbol": ({"dim_params": {"T": Dimension(1, 4)}}, ("'T'",)),
        "default-dim-word": ({"default_dynamic_dim": "big"}, ("dynamic-dim",)),
        "executor-word": ({"executor": "fast"}, ("fast",)),
        "static-impls-word": ({"static_impls": "sometimes"}, ("sometimes",)),
        "max-buffer-zero": ({"max_buffer_bytes": 0}, ("max_buffer_bytes",)),
        "max-buffer-word": ({"max_buffer_bytes": "big"}, ("max_buffer_bytes",)),
        "max-loop-negative": ({"max_loop_iterations": -5}, ("max_loop_iterations",)),
        "device-memory-limit-word": ({"device_memory_limit": "lots"}, ("device_memory_limit",)),
    }
    out = []
    for cid, (opts, words) in bad.items():
        out.append(Case(cid, "options", add_model, None, E.OptionsError, words, options=opts))
    return out


def _load_cases() -> list[Case]:
    return [
        Case("opset-99", "load", opset(99), None, E.InvalidModelError, ("99",)),
        Case(
            "concat-without-axis",
            "load",
            bad_attr(helper.make_node("Concat", ["x", "x"], ["y"], name="cat"), X34, Y),
            None,
            E.InvalidModelError,
            ("'cat'", "axis"),
        ),
        Case(
            "cast-to-999",
            "load",
            bad_attr(helper.make_node("Cast", ["x"], ["y"], name="cast", to=999), X34, Y),
            None,
            E.InvalidModelError,
            ("'cast'", "999"),
        ),
        Case(
            "softmax-float-axis",
            "load",
            bad_attr(helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1.5), X34, Y),
            None,
            E.InvalidModelError,
            ("'sm'", "axis"),
        ),
        Case(
            "transpose-perm-repeats",
            "load",
            bad_attr(helper.make_node("Transpose", ["x"], ["y"], name="tr", perm=[0, 0]), X34, Y),
            None,
            E.InvalidModelError,
            ("'tr'", "perm"),
        ),
        Case(
            "gather-axis-out-of-rank",
            "load",
            bad_attr(helper.make_node("Gather", ["x", "x"], ["y"], name="g5", axis=5), X34, Y),
            None,
            E.InvalidModelError,
            ("'g5'", "axis"),
        ),
        Case("initializer-wrong-size", "load", bad_init, None, E.InvalidModelError, ("'w'", "5")),
        Case("cycle", "load", cyclic, None, E.InvalidModelError, ("cycle",)),
        Case(
            "unknown-op",
            "load",
            bad_attr(helper.make_node("Frobnicate", ["x"], ["y"], name="frob"), X34, Y),
            None,
            E.UnsupportedOpError,
            ("Frobnicate", "operators.md"),
        ),
        Case(
            "unknown-domain-op",
            "load",
            bad_attr(helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example"), X34, Y),
            None,
            (E.UnsupportedOpError, E.InvalidModelError),
            ("com.example",),
        ),
        Case(
            "leakyrelu-string-alpha",
            "load",
            bad_attr(helper.make_node("LeakyRelu", ["x"], ["y"], name="leaky", alpha="big"), X34, Y),
            None,
            E.InvalidModelError,
            ("'leaky'", "alpha"),
        ),
        Case(
            "reshape-without-shape",
            "load",
            bad_attr(helper.make_node("Reshape", ["x"], ["y"], name="rs"), X34, Y),
            None,
            (E.InvalidModelError, E.UnsupportedOpError),
            ("'rs'",),
        ),
        Case(
            "undefined-value",
            "load",
            bad_attr(helper.make_node("Add", ["x", "ghost"], ["y"], name="haunted"), X34, Y),
            None,
            E.InvalidModelError,
            ("ghost",),
        ),
        Case("garbage-bytes", "load", lambda: b"\x00\x01not a model at all", None, E.InvalidModelError, ()),
        Case(
            "missing-file",
            "load",
            lambda: "/nonexistent/model.onnx",
            None,
            E.InvalidModelError,
            ("/nonexistent/model.onnx",),
        ),
        Case("truncated-model", "load", lambda: add_model().SerializeToString()[:40], None, E.InvalidModelError, ()),
    ]


def _data_cases() -> list[Case]:
    c = []
    idx = [
        (
            "gathernd-inner-out-of-range",
            gather_nd,
            {"i": np.array([[0, 5]], np.int64)},
            ("5", "out of range"),
            gather_nd_good,
        ),
        (
            "gathernd-negative-out-of-range",
            gather_nd,
            {"i": np.array([[-1, -5]], np.int64)},
            ("-5", "out of range"),
            gather_nd_good,
        ),
        ("gathernd-first-dim", gather_nd, {"i": np.array([[3, 0]], np.int64)}, ("3", "out of range"), gather_nd_good),
        (
            "scatternd-out-of-range",
            scatter_nd,
            {"i": np.array([[0, 5]], np.int64), "u": f32(1)},
            ("5", "out of range"),
            scatter_nd_good,
        ),
        ("gather-out-of-range", gather, {"i": np.array([0, 3], np.int64)}, ("3", "out of range"), gather_good),
        ("gather-negative-out-of-range", gather, {"i": np.array([-4], np.int64)}, ("-4", "out of range"), gather_good),
        (
            "gather-axis1-out-of-range",
            lambda: gather(1),
            {"i": np.array([4], np.int64)},
            ("4", "out of range"),
            lambda: {"x": f32(3, 4), "i": np.array([3, -4], np.int64)},
        ),
        (
            "scatternd-negative-out-of-range",
            scatter_nd,
            {"i": np.array([[-4, 0]], np.int64), "u": f32(1)},
            ("-4", "out of range"),
            scatter_nd_good,
        ),
        (
            "gatherelements-out-of-range",
            gather_el,
            {"i": np.array([[0], [4], [0]], np.int64)},
            ("4", "out of range"),
            gather_el_good,
        ),
        (
            "scatterelements-out-of-range",
            scatter_el,
            {"i": np.array([[0], [9], [1]], np.int64), "u": f32(3, 1)},
            ("9", "out of range"),
            scatter_el_good,
        ),
    ]
    for cid, model, extra, words, good in idx:
        c.append(
            Case(
                cid, "indices", model, (lambda g=good, e=extra: {**g(), **e}), E.IndexOutOfRangeError, words, good=good
            )
        )
    c += [
        Case(
            "onehot-depth-zero",
            "indices",
            onehot,
            lambda: {**onehot_good(), "d": np.array(0, np.int64)},
            (E.ShapeError, E.IndexOutOfRangeError),
            ("depth",),
            good=onehot_good,
        ),
        Case(
            "topk-k-too-large",
            "indices",
            topk,
            lambda: {**topk_good(), "k": np.array([9], np.int64)},
            (E.ShapeError, E.IndexOutOfRangeError),
            ("9",),
            good=topk_good,
        ),
        Case(
            "topk-k-negative",
            "indices",
            topk,
            lambda: {**topk_good(), "k": np.array([-1], np.int64)},
            (E.ShapeError, E.IndexOutOfRangeError),
            ("-1",),
            good=topk_good,
        ),
        Case(
            "compress-condition-too-long",
            "indices",
            compress,
            lambda: {**compress_good(), "c": np.array([True] * 5)},
            (E.ShapeError, E.IndexOutOfRangeError),
            ("5",),
            good=compress_good,
        ),
    ]
    big = 1 << 38
    sizes = [
        (
            "expand-huge",
            expand,
            {"s": np.array([big, 4], np.int64)},
            E.MemoryLimitError,
            ("grow", "bytes"),
            expand_good,
            True,
        ),
        (
            "expand-huge-both",
            expand,
            {"s": np.array([1 << 19, 1 << 19, 4], np.int64)},
            E.MemoryLimitError,
            ("grow", "bytes"),
            expand_good,
            True,
        ),
        (
            "expand-negative",
            expand,
            {"s": np.array([-3, 4], np.int64)},
            E.ShapeError,
            ("grow", "-3"),
            expand_good,
            False,
        ),
        (
            "constantofshape-huge",
            const_of_shape,
            {"s": np.array([1 << 20, 1 << 20], np.int64)},
            E.MemoryLimitError,
            ("fill", "bytes"),
            cos_good,
            True,
        ),
        (
            "constantofshape-negative",
            const_of_shape,
            {"s": np.array([2, -1], np.int64)},
            E.ShapeError,
            ("fill", "-1"),
            cos_good,
            False,
        ),
        (
            "tile-huge",
            tile,
            {"r": np.array([1 << 20, 1 << 20], np.int64)},
            E.MemoryLimitError,
            ("tile", "bytes"),
            tile_good,
            True,
        ),
        ("tile-negative", tile, {"r": np.array([-2, 1], np.int64)}, E.ShapeError, ("tile",), tile_good, False),
        (
            "pad-huge",
            pad,
            {"p": np.array([1 << 40, 0, 0, 0], np.int64)},
            E.MemoryLimitError,
            ("pad", "bytes"),
            pad_good,
            True,
        ),
        (
            "pad-negative-below-zero",
            pad,
            {"p": np.array([-5, 0, 0, 0], np.int64)},
            E.ShapeError,
            ("pad",),
            pad_good,
            False,
        ),
        (
            "reshape-numel-mismatch",
            reshape,
            {"s": np.array([5, 5], np.int64)},
            E.ShapeError,
            ("reshape",),
            reshape_good,
            False,
        ),
        (
            "reshape-two-minus-ones",
            reshape,
            {"s": np.array([-1, -1], np.int64)},
            E.ShapeError,
            ("reshape",),
            reshape_good,
            False,
        ),
    ]
    for cid, model, extra, err, words, good, absurd in sizes:
        c.append(
            Case(cid, "sizes", model, (lambda g=good, e=extra: {**g(), **e}), err, words, good=good, absurd=absurd)
        )
    c += [
        Case(
            "range-huge",
            "sizes",
            range_model,
            rfeed(0, 1e13, 1),
            E.MemoryLimitError,
            ("count", "bytes"),
            good=range_good,
            absurd=True,
        ),
        Case("range-delta-zero", "sizes", range_model, rfeed(0, 10, 0), E.ShapeError, ("count",), good=range_good),
        Case(
            "range-nan-limit",
            "sizes",
            range_model,
            rfeed(0, np.nan, 1),
            E.ShapeError,
            ("count", "nan"),
            good=range_good,
        ),
        Case("range-inf-limit", "sizes", range_model, rfeed(0, np.inf, 1), E.ShapeError, ("count",), good=range_good),
        Case("range-nan-delta", "sizes", range_model, rfeed(0, 5, np.nan), E.ShapeError, ("count",), good=range_good),
        Case(
            "range-int-delta-zero",
            "sizes",
            lambda: range_model(TP.INT64),
            rfeed(0, 10, 0, np.int64),
            E.ShapeError,
            ("count",),
            good=rfeed(0, 10, 3, np.int64),
        ),
        Case("range-empty-is-fine", "sizes", range_model, rfeed(5, 0, 1), None, good=range_good),
        Case(
            "max-buffer-bytes-small",
            "sizes",
            expand,
            lambda: {**expand_good(), "s": np.array([1000, 4], np.int64)},
            E.MemoryLimitError,
            ("grow", "max_buffer_bytes"),
            options={"max_buffer_bytes": 4096},
            good=expand_good,
        ),
        Case(
            "onehot-depth-huge",
            "sizes",
            onehot,
            lambda: {**onehot_good(), "d": np.array(1 << 40, np.int64)},
            E.MemoryLimitError,
            ("hot", "bytes"),
            good=onehot_good,
            absurd=True,
        ),
        Case(  # a read-only view of 2^40 elements holds no memory: refused before the feed's copy
            "feed-broadcast-huge",
            "sizes",
            add_model,
            lambda: {"x": np.broadcast_to(np.float32(1), (2**40, 3))},
            E.MemoryLimitError,
            ("input 'x'", "bytes"),
            good=add_good,
            absurd=True,
        ),
        Case(
            "max-buffer-bytes-output",
            "sizes",
            add_model,
            lambda: {"x": f32(8, 3)},
            E.MemoryLimitError,
            ("max_buffer_bytes",),
            options={"max_buffer_bytes": 64},
            good=add_good,
        ),
        Case(
            "matmul-inner-mismatch",
            "sizes",
            matmul_sym,
            lambda: {"a": f32(2, 3), "b": f32(4, 5)},
            (E.ShapeError, E.ExecutionError),
            ("mm",),
            good=matmul_good,
        ),
        Case(
            "loop-trip-count-huge",
            "sizes",
            loop_model,
            lambda: {"M": np.array(1 << 40, np.int64), "v0": f32(1)},
            E.LimitExceededError,
            ("the_loop", "max_loop_iterations"),
            options={"max_loop_iterations": 10000},
            good=loop_good,
        ),
        Case(
            "loop-trip-negative",
            "sizes",
            loop_model,
            lambda: {"M": np.array(-3, np.int64), "v0": f32(1)},
            None,
            good=loop_good,
        ),
    ]
    return c


def all_cases() -> list[Case]:
    return _feeds_cases() + _options_cases() + _load_cases() + _data_cases() + _MORE


def negative_from_shape_arithmetic():
    """ConstantOfShape([N - 5, 4]): the shape program gives a negative dim for N < 5."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Sub", ["n", "five"], ["m"]),
        helper.make_node("Concat", ["m", "four"], ["shape"], axis=0),
        helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill"),
    ]
    inits = [
        init("zero", np.array([0], np.int64)),
        init("five", np.array([5], np.int64)),
        init("four", np.array([4], np.int64)),
    ]
    return mk(nodes, [("x", TP.FLOAT, ["N", 4])], [("y", TP.FLOAT, None)], inits)


_MORE = [
    Case(
        "negative-dim-from-shape-arithmetic",
        "sizes",
        negative_from_shape_arithmetic,
        lambda: {"x": f32(1, 4)},
        E.ShapeError,
        ("negative",),
        good=lambda: {"x": f32(7, 4)},
    ),
    Case(
        "negative-dim-from-shape-arithmetic-torch",
        "sizes",
        negative_from_shape_arithmetic,
        lambda: {"x": torch.rand(2, 4)},
        E.ShapeError,
        ("negative",),
        good=lambda: {"x": f32(8, 4)},
    ),
]
