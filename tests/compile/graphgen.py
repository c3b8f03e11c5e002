"""Random ONNX graphs over inputs with dynamic dims, for comparing the executors.

``RandomGraph`` keeps a pool of values with their shapes written as *tokens*: ``"N"`` and ``"M"``
for the input dims, ints for fixed dims, and strings such as ``"min(N,2)"`` or ``"(N+M)"`` for dims
computed from them. Equal tokens are equal at run time whatever N and M are, so two values with
equal (or 1) tokens can be combined elementwise, concatenated or multiplied. Each step picks an op
from a vocabulary and values of the pool; every value is 2-D (ops that go through another rank,
Unsqueeze/Squeeze or a flattening Reshape, come back to 2-D).
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

OPSET = 18
INT_MAX = np.iinfo(np.int64).max

STEPS = ("unary", "exp", "binary", "div", "matmul_const", "matmul", "transpose", "reshape_swap", "reshape_flat",
         "unsqueeze", "slice", "concat", "reduce", "softmax", "expand")


def _dim_min(t, k: int):
    return min(t, k) if isinstance(t, int) else f"min({t},{k})"


def _dim_minus(t, k: int):
    return max(t - k, 0) if isinstance(t, int) else f"max({t}-{k},0)"


def _dim_half(t):
    return -(-t // 2) if isinstance(t, int) else f"ceil({t}/2)"


def _dim_last_two_but_one(t):
    """Slice(starts=-3, ends=-1): min(2, d - 1), at least 0."""
    return max(min(2, t - 1), 0) if isinstance(t, int) else f"neg({t})"


def _dim_sum(t, u):
    return t + u if isinstance(t, int) and isinstance(u, int) else f"({t}+{u})"


def _broadcast(s, t):
    """The broadcast of two token shapes, or None when the tokens do not say they fit."""
    out = []
    for x, y in zip(s, t):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


class RandomGraph:
    def __init__(self, draw, y_shape: tuple, inputs_may_be_empty: bool = False) -> None:
        self.draw = draw
        self.inputs_may_be_empty = inputs_may_be_empty
        self.nodes: list = []
        self.inits: list = []
        self.pool: list[tuple[str, tuple]] = [("x", ("N", "M")), ("y", y_shape)]
        self.y_shape = y_shape
        self.k = 0
        self.log: list[str] = []

    # ---- building blocks --------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.k += 1
        return f"{base}_{self.k}"

    def const(self, arr: np.ndarray, base: str = "c") -> str:
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.fresh(f"n_{op}"), **attrs))
        return outs[0] if n_out == 1 else outs

    def add(self, name: str, shape: tuple, what: str) -> None:
        self.pool.append((name, shape))
        self.log.append(f"{name}{list(shape)} = {what}")

    def pick(self, cond=None):
        cands = [v for v in self.pool if cond is None or cond(v)]
        return self.draw(st.sampled_from(cands)) if cands else None

    def shape_of(self, name: str) -> str:
        return self.node("Shape", [name])

    def gather_dim(self, shape_name: str, axis: int) -> str:
        return self.node("Gather", [shape_name, self.const(np.array([axis], np.int64), "ax")], axis=0)

    # ---- the vocabulary --------------------------------------------------------------------------
    def step(self, kind: str) -> None:
        getattr(self, f"_{kind}")()

    def _unary(self):
        v, s = self.pick()
        op = self.draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "Neg", "Abs"]))
        self.add(self.node(op, [v]), s, f"{op}({v})")

    def _exp(self):
        v, s = self.pick()
        lo, hi = self.const(np.array(-3, np.float32), "lo"), self.const(np.array(3, np.float32), "hi")
        clipped = self.node("Clip", [v, lo, hi])
        self.add(self.node("Exp", [clipped]), s, f"Exp(Clip({v}, -3, 3))")

    def _binary(self):
        v, s = self.pick()
        op = self.draw(st.sampled_from(["Add", "Sub", "Mul"]))
        partner = self.pick(lambda w: _broadcast(s, w[1]) is not None)
        kind = self.draw(st.sampled_from(["value", "scalar", "row"]))
        if kind == "scalar":
            w, t = self.const(np.array(self.draw(st.sampled_from([0.5, -1.25, 2.0])), np.float32)), ()
        elif kind == "row":
            w, t = self.const(np.array([[self.draw(st.sampled_from([0.75, -1.5, 3.0]))]], np.float32)), (1, 1)
        else:
            w, t = partner
        out_shape = _broadcast(s, t) if t else s
        self.add(self.node(op, [v, w]), out_shape, f"{op}({v}, {w})")

    def _div(self):
        v, s = self.pick()
        w, t = self.pick(lambda w: _broadcast(s, w[1]) is not None)
        # the divisor is sigmoid(w) + 0.5: never near zero
        den = self.node("Add", [self.node("Sigmoid", [w]), self.const(np.array(0.5, np.float32), "half")])
        self.add(self.node("Div", [v, den]), _broadcast(s, t), f"Div({v}, Sigmoid({w}) + 0.5)")

    def _matmul_const(self):
        v, s = self.pick()
        if not isinstance(s[1], int):  # make the last dim fixed first: a keepdims reduction over it
            v = self.node("ReduceSum", [v, self.const(np.array([1], np.int64), "axes")], keepdims=1)
            s = (s[0], 1)
        k = self.draw(st.integers(1, 4))
        rng = np.random.default_rng(self.draw(st.integers(0, 2**16)))
        w = self.const(rng.uniform(-1, 1, size=(s[1], k)).astype(np.float32), "w")
        self.add(self.node("MatMul", [v, w]), (s[0], k), f"MatMul({v}, W[{s[1]}, {k}])")

    def _matmul(self):
        v, s = self.pick()
        w, t = self.pick(lambda w: w[1][1] == s[1])  # v itself qualifies
        wt = self.node("Transpose", [w], perm=[1, 0])
        self.add(self.node("MatMul", [v, wt]), (s[0], t[0]), f"MatMul({v}, Transpose({w}))")

    def _transpose(self):
        v, s = self.pick()
        self.add(self.node("Transpose", [v], perm=[1, 0]), (s[1], s[0]), f"Transpose({v})")

    def _reshape_swap(self):
        """(A, B) -> (B, A) with the target from Shape -> Gather -> Concat (a reshape, not a transpose)."""
        v, s = self.pick()
        shp = self.shape_of(v)
        target = self.node("Concat", [self.gather_dim(shp, 1), self.gather_dim(shp, 0)], axis=0)
        # allowzero: a 0 in the target is a 0, not "copy the input's dim" (dims can be 0 after a Slice)
        self.add(self.node("Reshape", [v, target], allowzero=1), (s[1], s[0]),
                 f"Reshape({v}, [dim1, dim0] of Shape({v}))")

    def _reshape_flat(self):
        """Flatten, an op on the flat values, back to Shape(v)."""
        v, s = self.pick()
        flat = self.node("Reshape", [v, self.const(np.array([-1], np.int64), "flat")])
        mid = self.node(self.draw(st.sampled_from(["Neg", "Sigmoid"])), [flat])
        self.add(self.node("Reshape", [mid, self.shape_of(v)], allowzero=1), s,
                 f"Reshape(op(Reshape({v}, [-1])), Shape({v}))")

    def _unsqueeze(self):
        v, s = self.pick()
        axis = self.draw(st.integers(0, 2))
        axes = self.const(np.array([axis], np.int64), "axes")
        up = self.node("Unsqueeze", [v, axes])
        mid = self.node(self.draw(st.sampled_from(["Relu", "Tanh"])), [up])
        self.add(self.node("Squeeze", [mid, axes]), s, f"Squeeze(op(Unsqueeze({v}, {axis})), {axis})")

    def _slice(self):
        v, s = self.pick()
        axis = self.draw(st.integers(0, 1))
        kind = self.draw(st.sampled_from(["head", "tail", "drop_first", "step2", "neg_start"]))
        starts, ends, steps = {"head": (0, 2, 1), "tail": (-2, INT_MAX, 1), "drop_first": (1, INT_MAX, 1),
                               "step2": (0, INT_MAX, 2), "neg_start": (-3, -1, 1)}[kind]
        d = s[axis]
        new = {"head": _dim_min(d, 2), "tail": _dim_min(d, 2), "drop_first": _dim_minus(d, 1),
               "step2": _dim_half(d),
               "neg_start": _dim_last_two_but_one(d)}[kind]
        ins = [v] + [self.const(np.array([x], np.int64), "sl") for x in (starts, ends, axis, steps)]
        out = list(s)
        out[axis] = new
        self.add(self.node("Slice", ins), tuple(out), f"Slice({v}, {kind}, axis {axis})")

    def _concat(self):
        v, s = self.pick()
        axis = self.draw(st.integers(0, 1))
        other = 1 - axis
        w, t = self.pick(lambda w: w[1][other] == s[other])
        if self.draw(st.booleans()):  # a second branch of the same value
            w, t = self.node("Sigmoid", [v]), s
        out = list(s)
        out[axis] = _dim_sum(s[axis], t[axis])
        self.add(self.node("Concat", [v, w], axis=axis), tuple(out), f"Concat({v}, {w}, axis {axis})")

    def may_be_zero(self, d) -> bool:
        if isinstance(d, int):
            return d == 0
        return self.inputs_may_be_empty or "max(" in d or "neg(" in d

    def _reduce(self):
        v, s = self.pick()
        axis = self.draw(st.integers(0, 1))
        # the mean of nothing is undefined in ONNX (torch says NaN, onnxruntime 0): sums there
        op = "ReduceSum" if self.may_be_zero(s[axis]) else self.draw(st.sampled_from(["ReduceMean", "ReduceSum"]))
        out = list(s)
        out[axis] = 1
        r = self.node(op, [v, self.const(np.array([axis], np.int64), "axes")], keepdims=1)
        self.add(r, tuple(out), f"{op}({v}, axis {axis})")

    def _softmax(self):
        v, s = self.pick()
        axis = self.draw(st.sampled_from([0, 1, -1]))
        self.add(self.node("Softmax", [v], axis=axis), s, f"Softmax({v}, {axis})")

    def _expand(self):
        picked = self.pick(lambda v: 1 in v[1])
        if picked is not None:
            v, s = picked
        else:  # make one: a keepdims reduction
            v, s = self.pick()
            op = "ReduceSum" if self.may_be_zero(s[1]) else "ReduceMean"
            v = self.node(op, [v, self.const(np.array([1], np.int64), "axes")], keepdims=1)
            s = (s[0], 1)
        w, t = self.pick(lambda w: _broadcast(s, w[1]) is not None)
        self.add(self.node("Expand", [v, self.shape_of(w)]), _broadcast(s, t), f"Expand({v}, Shape({w}))")

    # ---- the model ---------------------------------------------------------------------------------
    def model(self, outputs: list[str]) -> onnx.ModelProto:
        inputs = [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "M"]),
                  helper.make_tensor_value_info("y", TP.FLOAT, list(self.y_shape))]
        outs = [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs]
        g = helper.make_graph(self.nodes, "random", inputs, outs, initializer=self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


class Case:
    """A drawn model with its shape sequence; the repr is what hypothesis prints on a failure."""

    def __init__(self, model, log, shapes, y_broadcast, seed) -> None:
        self.model, self.log, self.shapes, self.y_broadcast, self.seed = model, log, shapes, y_broadcast, seed

    def __repr__(self) -> str:
        return ("Case(\n  " + "\n  ".join(self.log) + f"\n  shapes (N, M): {self.shapes}"
                + f"\n  y is [1, M]: {self.y_broadcast}, seed {self.seed}\n)")


@st.composite
def cases(draw, min_steps: int = 2, max_steps: int = 8, max_dim: int = 7, min_dim: int = 1):
    y_broadcast = draw(st.booleans())
    g = RandomGraph(draw, (1, "M") if y_broadcast else ("N", "M"), min_dim == 0)
    for _ in range(draw(st.integers(min_steps, max_steps))):
        g.step(draw(st.sampled_from(STEPS)))
    made = [name for name, _ in g.pool[2:]]
    outputs = [made[-1]]
    extra = draw(st.sampled_from(made))
    if extra not in outputs:
        outputs.append(extra)
    # a sequence of (N, M): a few distinct pairs, 1s likely, revisited in a random order
    dims = st.one_of(st.just(1), st.integers(min_dim, max_dim))
    pairs = draw(st.lists(st.tuples(dims, dims), min_size=1, max_size=4))
    shapes = draw(st.lists(st.sampled_from(pairs), min_size=3, max_size=6))
    return Case(g.model(outputs), g.log + [f"outputs {outputs}"], shapes, y_broadcast, draw(st.integers(0, 2**32 - 1)))
