"""Padding proof: which input axes a call may pad (with zeros) without changing its outputs' real part.

A BERT-like encoder at a random (batch, seq) per call never repeats a shape, so no static impl
(a CUDA graph keyed by exact dims) ever serves it. Padded to a bucket of each axis it repeats a
handful of shapes, each replayed as one graph, and the outputs are sliced back
(``runtime/padded_calls.py``). That is only correct where the real part of every output does not
depend on what the padding adds, which this module proves from the shape program (each value's
dims as expressions of the input symbols, ``shape_program.trace``) and the ops' semantics, node by
node, for one specialization.

The padded inputs hold zeros in their padded positions (token 0, attention mask 0). Each value gets
a state:
- ``const``: no padded symbol in its dims or its values;
- ``shape``: a small int tensor computed from a padded size (``Shape``): it may shape things
  (a Reshape's target, a Range's limit), never be arithmetic on data, which would see the padded
  size instead of the real one;
- ``clean``: its entries at real coordinates equal the unpadded call's; the padded entries are
  finite values of no concern;
- ``fill``: clean, and every entry whose coordinate is padded along one of the dims ``at`` holds
  exactly ``value`` (the zeros of a padded mask, then ``-inf`` after ``Where(mask, 0, -inf)``);
- ``masked``: clean, and its entries at padded coordinates along ``at`` are <= -1e4 (a score plus
  such a mask).

What mixes positions along a padded axis is allowed only where the padded positions provably
contribute nothing: an attention (or a Softmax) over keys whose padded positions carry such a mask,
a product over the keys whose probabilities are exactly 0 there, and a sum whose padded terms are
exactly 0 (a mean pooling's sum of the tokens times the mask, and the mask's own count). Contractions, reductions and
norms over a padded axis otherwise refuse, as do values whose dims are expressions of a padded
symbol (``batch * seq``: padded rows would sit between real ones), ops this module does not know,
and data-dependent shapes. An embedding lookup must read in-range indices at the padded positions
too: zeros, entries of the model's constants, or positions (a ``Range`` over the axis, maybe offset
as BART's learned positions are: the table's rows less the offset bound the padded value, as do the
trace's guards, such as ``seq <= 512`` for a table of 512 positions:
``padded_calls`` pads only to a signature the same specialization accepts).

Assumed, not proven: values at padded positions stay finite (a padded token is token 0 at a real
position of the table, attending to the real keys), so that a zero weight times a padded value is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import np_dtype
from ..shape import expr as E
from ..shape.symint import SymInt
from .affine import idx as index_symbol

MASK_BOUND = -1e4  # an additive mask at least this negative makes exp() underflow to 0 in float32
# element-wise ops whose padded entries follow from their inputs' (ops/elementwise semantics)
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log",
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Erf", "Gelu", "FastGelu", "QuickGelu", "BiasGelu",
    "Silu", "Swish", "Softplus", "Clip", "Cast", "CastLike", "Where", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Not", "Identity", "Dropout", "Sin", "Cos", "Floor", "Ceil", "Round",
    "Sign", "HardSwish", "Elu", "Selu", "Mish", "SiluMul", "IsNaN", "IsInf", "Expand", "Sum", "Mean", "BiasAdd",
    "PRelu", "BitwiseNot", "BitwiseAnd", "BitwiseOr",
})
# products over a constant weight: the last axis of the input is the contraction (features)
WEIGHTED = frozenset({"Linear", "Gemm", "MatMulAdd", "GatedMatMulAdd", "RMSNormLinear", "FusedMatMul", "PackedLinear"})
# normalisations over the last axis (or ``axis`` and after)
NORMS = frozenset({"LayerNormalization", "LayerNorm", "RMSNorm", "RMSNormalization", "SimplifiedLayerNormalization",
                   "AddLayerNorm", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
# the inputs of these ops that are shapes, axes or counts (a ``shape`` state is allowed there)
SHAPE_INPUTS = {"Reshape": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4}, "Range": {0, 1, 2}, "ConstantOfShape": {0},
                "Squeeze": {1}, "Unsqueeze": {1}, "Split": {1}, "Tile": {1}, "ReduceMean": {1}, "ReduceSum": {1},
                "ReduceMax": {1}, "ReduceMin": {1}}
# scalar semantics of the element-wise ops a fill goes through (masks: casts, compares, Where)
_EVAL = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b, "Neg": lambda a: -a,
    "Div": lambda a, b: a / b if b else (math.copysign(math.inf, a) * math.copysign(1, b) if a else math.nan),
    "Max": max, "Min": min, "Abs": abs, "Identity": lambda a: a, "Not": lambda a: not a,
    "And": lambda a, b: bool(a) and bool(b), "Or": lambda a, b: bool(a) or bool(b),
    "Equal": lambda a, b: a == b, "Less": lambda a, b: a < b, "Greater": lambda a, b: a > b,
    "LessOrEqual": lambda a, b: a <= b, "GreaterOrEqual": lambda a, b: a >= b,
    "Where": lambda c, x, y: x if c else y, "IsNaN": lambda a: a != a,
}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class Refused(Exception):
    """Why padding is not proven: names the node (and its op) that mixes padded positions in."""


@dataclass(frozen=True)
class St:
    kind: str  # const | shape | clean | fill | masked
    value: object = None  # fill: the padded entries' value; const: its value when a scalar
    at: frozenset = frozenset()  # fill / masked: dims whose padded coordinates hold it
    indexes: bool = False  # ints that index in range at padded coordinates too (zeros, constants' entries)


CONST, SHAPE, CLEAN = St("const"), St("shape"), St("clean")


@dataclass
class PadProof:
    """Which input axes carry which padded symbol, and which output axes to slice back."""

    symbols: tuple[str, ...]
    inputs: list[tuple[int, int, str]]  # (input position, axis, symbol)
    outputs: list[list[tuple[int, str]]]  # per graph output: (axis, symbol) to cut to the real size
    limits: dict[str, int]  # symbol -> the most it may be padded to (a table of positions, a guard)


def prove(trace, symbols: tuple[str, ...] | None = None) -> PadProof | str:
    """The padding proof of a specialization's trace for its input symbols (or ``symbols``), or a
    reason (str) why not. Tries every input symbol together, then each alone."""
    syms = tuple(sorted({d.symbol for d in trace.input_dims if d.defines})) if symbols is None else symbols
    if not syms:
        return "no dynamic input axis"
    tries = [syms] + ([(s,) for s in syms] if len(syms) > 1 else [])
    first = ""
    for attempt in tries:
        try:
            return _Prover(trace, frozenset(attempt)).run()
        except Refused as e:
            first = first or str(e)
    return first


class _Prover:
    def __init__(self, trace, padded: frozenset) -> None:
        self.t, self.padded = trace, padded
        self.state: dict[int, St] = {}
        self.limits: dict[str, int] = {}

    # ---- dims ----------------------------------------------------------------------------------
    def pdims(self, v) -> tuple:
        """Per dim of ``v``: the padded symbol it is, or None; refuses an expression of one."""
        info = self.t.info.get(id(v))
        if info is None or info.dims is None:
            raise Refused(f"{v.name}: dims not known to the shape program")
        out = []
        for d in info.dims:
            e = self.t.env.canon(d.expr) if isinstance(d, SymInt) else None
            free = e.free & self.padded if e is not None else frozenset()
            if not free:
                out.append(None)
            elif len(free) == 1 and e == E.sym(next(iter(free))):
                out.append(next(iter(free)))
            else:
                raise Refused(f"{v.name}: a dim {e} that is an expression of a padded axis")
        return tuple(out)

    def const_dim(self, v, k: int):
        d = self.t.info[id(v)].dims[k]
        return self.t.env.canon(d.expr) if isinstance(d, SymInt) else E.const(int(d))

    # ---- the walk ------------------------------------------------------------------------------
    def run(self) -> PadProof:
        t = self.t
        inputs = []
        for pos, v in enumerate(t.input_values):
            dims = self.pdims(v)
            at = frozenset(k for k, s in enumerate(dims) if s is not None)
            inputs += [(pos, k, s) for k, s in enumerate(dims) if s is not None]
            zero = np_dtype(v.elem_type).type(0).item() if v.elem_type else 0
            self.state[id(v)] = St("fill", zero, at, indexes=True) if at else CONST
        if not inputs:
            raise Refused("no input carries the axes")
        for ni in t.nodes:
            if ni.kind == "dead":
                continue
            n = ni.node
            if ni.kind == "dyn":
                raise Refused(f"node {n.name} ({n.op_type}): a shape decided by data")
            if ni.kind == "sym":
                for o in n.outputs:
                    if o is not None:
                        self.state[id(o)] = self._sym_state(o)
                continue
            outs = [o for o in n.outputs if o is not None]
            if ni.kind == "memo" and outs and all(t.info[id(o)].affine is not None for o in outs):
                for o in outs:  # elements that are expressions of their indices (positions, causal masks)
                    self.state[id(o)] = self._affine_state(o)
                continue
            for o, st in zip(outs, self._node(n)):
                self.state[id(o)] = st
        outputs = []
        for v in t.graph.outputs:
            st = self.get(v)
            if st.kind == "shape":
                raise Refused(f"output {v.name}: computed from a padded size")
            if st.kind == "masked":
                raise Refused(f"output {v.name}: masked scores")
            outputs.append([(k, s) for k, s in enumerate(self.pdims(v)) if s is not None])
        for g in t.guards:  # a bound the program holds for (``seq <= 512``): padding stays within it
            free = g.expr.free
            if g.kind == ">=" and len(free) == 1 and next(iter(free)) in self.padded:
                x = next(iter(free))
                c0, c1 = E.evaluate(g.expr, {x: 0}), E.evaluate(g.expr, {x: 1})
                if c1 < c0 and E.evaluate(g.expr, {x: c0 // (c0 - c1)}) >= 0:
                    self.limits[x] = min(self.limits.get(x, 1 << 62), c0 // (c0 - c1))
        return PadProof(tuple(sorted(self.padded)), inputs, outputs, self.limits)

    def get(self, v) -> St:
        if v is None:
            return CONST
        st = self.state.get(id(v))
        if st is not None:
            return st
        if v.is_const:
            c = v.const
            scalar = c.reshape(-1)[0].item() if hasattr(c, "numel") and c.numel() == 1 else None
            st = St("const", scalar, indexes=True)
        else:
            info = self.t.info.get(id(v))
            st = self._sym_state(v) if info is not None and info.sval is not None else None
            if st is None:
                raise Refused(f"{v.name}: no state (not a constant, not computed before)")
        self.state[id(v)] = st
        return st

    def _sym_state(self, v) -> St:
        info = self.t.info.get(id(v))
        if info is None or info.sval is None:
            return CLEAN if info is not None and info.dims is not None else SHAPE
        for e in info.sval.a.reshape(-1):
            if isinstance(e, SymInt) and self.t.env.canon(e.expr).free & self.padded:
                return SHAPE
        a = info.sval.a.reshape(-1)
        return St("const", int(a[0]) if a.size == 1 and not isinstance(a[0], SymInt) else None, indexes=True)

    def _affine_state(self, v) -> St:
        """A position (its index along a padded axis) or a mask built from positions: the same at
        real coordinates; as an index, in range of an axis of the same padded symbol."""
        a = self.t.info[id(v)].affine
        if a.expr.free & self.padded:
            raise Refused(f"{v.name}: positions offset by a padded size")
        return St("clean", None, frozenset(), indexes=a.pred is None)

    # ---- rules ---------------------------------------------------------------------------------
    def _node(self, n) -> list[St]:
        op = n.op_type
        for i, v in enumerate(n.inputs):
            if v is not None and self.get(v).kind == "shape" and i not in SHAPE_INPUTS.get(op, ()):
                raise Refused(f"node {n.name} ({op}): data computed from a padded size (input {i})")
        ins = [self.get(v) if v is not None else None for v in n.inputs]
        if all(s is None or s.kind == "const" for s in ins) and op not in ("Range", "ConstantOfShape"):
            return [St("const", None, indexes=all(s is None or s.indexes for s in ins))] * len(n.outputs)
        rule = getattr(self, f"_op_{op}", None)
        if rule is not None:
            return rule(n, ins)
        if op in ELEMENTWISE:
            return [self._elementwise(n, ins)] * len(n.outputs)
        if op in WEIGHTED:
            return [self._weighted(n, ins)] * len(n.outputs)
        if op in NORMS:
            return [self._norm(n, ins)] * len(n.outputs)
        if op in VIEWS:
            return [self._reshape(n, ins)]
        raise Refused(f"node {n.name} ({op}): an op whose padded positions are not followed here")

    def _check_shapes(self, n, ins, data: set[int]) -> None:
        for i in data:
            if i < len(ins) and ins[i] is not None and ins[i].kind == "shape":
                raise Refused(f"node {n.name} ({n.op_type}): data computed from a padded size")

    def _mapped(self, st: St, v, out) -> frozenset:
        """A broadcast input's dims ``at`` as the output's dims (right-aligned)."""
        off = len(self.t.info[id(out)].dims) - len(self.t.info[id(v)].dims)
        return frozenset(k + off for k in st.at)

    def _elementwise(self, n, ins: list) -> St:
        op, out = n.op_type, n.outputs[0]
        live = [(v, s) for v, s in zip(n.inputs, ins) if v is not None]
        if op == "Expand":
            live = live[:1]
        kinds = {s.kind for _, s in live}
        if "masked" in kinds:
            if op == "Add" and kinds <= {"masked", "clean", "const"}:
                at = frozenset().union(*(self._mapped(s, v, out) for v, s in live if s.kind == "masked"))
                return St("masked", None, at)
            raise Refused(f"node {n.name} ({op}): masked scores through an op other than Add")
        if op in ("Cast", "CastLike", "Identity", "Dropout", "Expand"):
            v, s = live[0]
            if s.kind in ("fill", "masked"):
                value = s.value
                if s.kind == "fill" and op in ("Cast", "CastLike"):
                    to = n.attrs.get("to") if op == "Cast" else n.inputs[1].elem_type
                    value = np.array(value).astype(np_dtype(to)).item()
                return St(s.kind, value, self._mapped(s, v, out), s.indexes)
            return St("clean", None, frozenset(), s.indexes)
        fills = [(v, s) for v, s in live if s.kind == "fill"]
        if op == "Where" and live[0][1].kind == "fill":
            (cv, c), rest = live[0], live[1:]
            pick_v, pick = rest[0] if c.value else rest[1]
            at = self._mapped(c, cv, out)
            if pick.kind == "fill":
                at &= self._mapped(pick, pick_v, out)
            if at and (pick.kind == "fill" or (pick.kind == "const" and pick.value is not None)):
                return St("fill", pick.value, at)
            return CLEAN
        for v, s in fills:  # an absorbing fill decides the result (x and False, x or True, x * 0)
            if (op == "And" and s.value is False) or (op == "Or" and s.value is True):
                return St("fill", s.value, self._mapped(s, v, out))
            other = (live[1][1] if live[0][0] is v else live[0][1]) if op == "Mul" and len(live) == 2 else None
            if other is not None and s.value == 0 and not isinstance(s.value, bool) and (
                    other.kind == "clean" or (other.kind in ("fill", "const") and _finite(other.value))):
                # x * 0 is +-0 for the finite values padded positions hold (not for a fill of -inf or
                # masked scores: 0 * inf is NaN): a masked sum's terms
                return St("fill", 0.0, self._mapped(s, v, out))
        if fills and op in _EVAL and all(s.kind == "fill" or (s.kind == "const" and s.value is not None)
                                         for _, s in live):
            at = frozenset.intersection(*(self._mapped(s, v, out) for v, s in fills))
            if at:
                return St("fill", _EVAL[op](*(s.value for _, s in live)), at)
        if op == "Add" and len(live) == 2:  # a score plus a mask that removes the padded keys
            for (v, s), (_, other) in ((live[0], live[1]), (live[1], live[0])):
                if s.kind == "fill" and isinstance(s.value, float) and s.value <= MASK_BOUND \
                        and other.kind in ("clean", "const"):
                    return St("masked", None, self._mapped(s, v, out))
        return CLEAN

    def _weighted(self, n, ins: list) -> St:
        x = n.inputs[0]
        if self.pdims(x)[-1] is not None:
            raise Refused(f"node {n.name} ({n.op_type}): a product over a padded axis")
        if n.op_type == "Gemm" and n.attrs.get("transA", 0):
            raise Refused(f"node {n.name} (Gemm): a transposed input")
        return CLEAN

    def _norm(self, n, ins: list) -> St:
        x = n.inputs[0]
        dims = self.pdims(x)
        axis = n.attrs.get("axis", -1) % len(dims) if dims else 0
        if any(s is not None for s in dims[axis:]):
            raise Refused(f"node {n.name} ({n.op_type}): a normalisation over a padded axis")
        return CLEAN

    def _segments(self, v) -> tuple[list[str], list]:
        """The padded symbols of ``v``'s dims in order, and the product of the other dims between
        them (expressions): a reshape that keeps both keeps every padded row in its place."""
        syms, prods, acc = [], [], E.const(1)
        for k, s in enumerate(self.pdims(v)):
            if s is None:
                acc = E.mul(acc, self.const_dim(v, k))
            else:
                syms.append(s)
                prods.append(acc)
                acc = E.const(1)
        prods.append(acc)
        return syms, prods

    def _reshape(self, n, ins: list) -> St:
        x, out = n.inputs[0], n.outputs[0]
        (s_in, p_in), (s_out, p_out) = self._segments(x), self._segments(out)
        if s_in != s_out or len(set(s_in)) != len(s_in) or p_in != p_out:
            raise Refused(f"node {n.name} ({n.op_type}): a reshape that moves padded rows")
        st = ins[0]
        if st.kind not in ("fill", "masked"):
            return st if st.kind != "const" else CLEAN
        din, dout = self.pdims(x), self.pdims(out)
        where = {s: k for k, s in enumerate(dout) if s is not None}
        return St(st.kind, st.value, frozenset(where[din[k]] for k in st.at), st.indexes)

    def _op_Transpose(self, n, ins: list) -> list[St]:
        st = ins[0]
        if st.kind not in ("fill", "masked"):
            return [st]
        perm = n.attrs.get("perm") or list(reversed(range(len(self.pdims(n.inputs[0])))))
        inv = {p: k for k, p in enumerate(perm)}
        return [St(st.kind, st.value, frozenset(inv[k] for k in st.at), st.indexes)]

    def _op_Slice(self, n, ins: list) -> list[St]:
        x, out = n.inputs[0], n.outputs[0]
        din, dout = self.pdims(x), self.pdims(out)
        rank = len(din)
        starts, axes, steps = (self._ints(n.inputs[i]) if len(n.inputs) > i and n.inputs[i] is not None else None
                               for i in (1, 3, 4))
        if starts is None:
            raise Refused(f"node {n.name} (Slice): starts not known")
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        for a, s0, st in zip(axes, starts, steps):
            a %= rank
            if din[a] is None and dout[a] is None:
                continue
            if s0 != 0 or st != 1:
                raise Refused(f"node {n.name} (Slice): a slice of a padded axis that is not its first positions")
            if din[a] is not None and dout[a] != din[a] and self.const_dim(out, a) != E.const(1):
                raise Refused(f"node {n.name} (Slice): a slice of a padded axis to another length")
        st = ins[0]
        if st.kind == "const":  # the first positions of a constant table: in range as the table is
            return [St("clean", None, frozenset(), indexes=st.indexes)]
        if st.kind in ("fill", "masked"):
            return [St(st.kind, st.value, frozenset(k for k in st.at if dout[k] is not None), st.indexes)]
        return [st]

    def _ints(self, v) -> list | None:
        if v.is_const:
            return [int(x) for x in v.const.reshape(-1).tolist()]
        info = self.t.info.get(id(v))
        if info is None or info.sval is None:
            return None
        out = []
        for e in info.sval.a.reshape(-1):
            if isinstance(e, SymInt):
                e = E.as_int(self.t.env.canon(e.expr))  # None: at a symbol (an end: told by the dims)
            out.append(None if e is None else int(e))
        return out

    def _op_Concat(self, n, ins: list) -> list[St]:
        out = n.outputs[0]
        axis = n.attrs.get("axis", 0) % len(self.pdims(out))
        if self.pdims(out)[axis] is not None:
            raise Refused(f"node {n.name} (Concat): along a padded axis")
        live = [s for s in ins if s is not None]
        if all(s.kind == "fill" for s in live) and len({(s.value, s.at) for s in live}) == 1:
            return [live[0]]
        return [St("clean", None, frozenset(), all(s.indexes for s in live))]

    def _op_Split(self, n, ins: list) -> list[St]:
        x = n.inputs[0]
        axis = n.attrs.get("axis", 0) % len(self.pdims(x))
        if self.pdims(x)[axis] is not None:
            raise Refused(f"node {n.name} (Split): along a padded axis")
        return [ins[0] if ins[0].kind != "const" else CLEAN] * len(n.outputs)

    def _op_Gather(self, n, ins: list) -> list[St]:
        data, ind = n.inputs[0], n.inputs[1]
        axis = n.attrs.get("axis", 0) % len(self.pdims(data))
        sd, si = ins[0], ins[1]
        if self.pdims(data)[axis] is not None:
            if ind.is_const and ind.const.numel() == 1 and int(ind.const.reshape(-1)[0]) == 0:
                return [CLEAN]  # the first position (a [CLS] token): real whatever the length
            raise Refused(f"node {n.name} (Gather): reads a padded axis at positions not known real")
        if si.kind not in ("const",) and not si.indexes:
            raise Refused(f"node {n.name} (Gather): indices whose padded entries may be out of range")
        rows = self.t.info[id(data)].dims[axis]
        self._position_limit(n, ind, rows)
        if si.kind == "fill":
            if isinstance(rows, int) and not -rows <= int(si.value) < rows:
                raise Refused(f"node {n.name} (Gather): the padding's index {si.value} is out of range")
        if sd.kind in ("fill", "masked"):
            raise Refused(f"node {n.name} (Gather): a lookup into a padded mask")
        return [St("clean", None, frozenset(), indexes=sd.kind == "const" or sd.indexes)]

    def _position_limit(self, n, ind, rows) -> None:
        """Positions (a Range over a padded axis) looked up in a table of ``rows``: that axis is
        padded to ``rows`` at most (its real positions are the table's as the model's are)."""
        info = self.t.info.get(id(ind))
        a = info.affine if info is not None else None
        if a is None or a.pred is not None:
            return
        dims = self.pdims(ind)
        ks = [k for k in range(a.rank) if index_symbol(k) in a.expr.free and dims[k] is not None]
        if not ks:
            return
        offset = E.as_int(E.sub(a.expr, E.sym(index_symbol(ks[0])))) if len(ks) == 1 else None
        if offset is None or offset < 0 or not isinstance(rows, int):
            raise Refused(f"node {n.name} (Gather): positions of a padded axis, scaled or in a table of unknown size")
        s = dims[ks[0]]  # position p + offset (BART's learned positions start at 2): p < rows - offset
        self.limits[s] = min(self.limits.get(s, rows - offset), rows - offset)

    def _op_GatherElements(self, n, ins: list) -> list[St]:
        sd, si = ins[0], ins[1]
        if sd.kind not in ("const", "clean") or not (si.indexes or si.kind == "const"):
            raise Refused(f"node {n.name} (GatherElements): indices or data not followed at padded positions")
        axis = n.attrs.get("axis", 0) % len(self.pdims(n.inputs[0]))
        if self.pdims(n.inputs[0])[axis] is not None:
            raise Refused(f"node {n.name} (GatherElements): reads along a padded axis")
        return [St("clean", None, frozenset(), indexes=sd.indexes)]

    def _op_GatherND(self, n, ins: list) -> list[St]:
        """``data[i, j]`` at an index grid of positions (``Concat`` of ``Range``s along the last
        axis: HF's mask ``mask[b, k]`` spread over ``[b, 1, q, k]``): entry by entry the data's
        entry at the same positions, so a fill stays a fill on the output's dims of its axes."""
        data, ind, out = n.inputs[0], n.inputs[1], n.outputs[0]
        grid = ind.producer
        if n.attrs.get("batch_dims", 0) or grid is None or grid.op_type != "Concat":
            raise Refused(f"node {n.name} (GatherND): indices that are not a grid of positions")
        dout, ddata = self.pdims(out), self.pdims(data)
        read = []
        for comp in grid.inputs:
            a = self.t.info[id(comp)].affine if id(comp) in self.t.info else None
            ks = [k for k in range(a.rank) if a.expr == E.sym(index_symbol(k))] if a is not None else []
            if a is None or a.pred is not None or len(ks) != 1:
                raise Refused(f"node {n.name} (GatherND): an index that is not a position")
            read.append(ks[0])
        if len(read) != len(ddata):
            raise Refused(f"node {n.name} (GatherND): a partial index")
        for t_, k in enumerate(read):
            if ddata[t_] != dout[k]:
                raise Refused(f"node {n.name} (GatherND): positions of another axis")
        sd = ins[0]
        if sd.kind == "fill":
            return [St("fill", sd.value, frozenset(read[k] for k in sd.at), sd.indexes)]
        return [St("clean", None, frozenset(), sd.indexes)]

    def _op_ConstantOfShape(self, n, ins: list) -> list[St]:
        out = n.outputs[0]
        c = n.attrs.get("value")
        value = c.reshape(-1)[0].item() if c is not None and hasattr(c, "reshape") else 0.0
        at = frozenset(k for k, s in enumerate(self.pdims(out)) if s is not None)
        return [St("fill", value, at, True) if at else St("const", value, indexes=True)]

    def _op_Range(self, n, ins: list) -> list[St]:
        if ins[0].kind != "const" or ins[2].kind != "const":
            raise Refused(f"node {n.name} (Range): positions that do not start at a constant")
        return [St("clean", None, frozenset(), indexes=True)]

    def _reduce(self, n, ins: list) -> list[St]:
        x = n.inputs[0]
        dims = self.pdims(x)
        axes = n.attrs.get("axes")
        if axes is None and len(n.inputs) > 1 and n.inputs[1] is not None:
            axes = self._ints(n.inputs[1])
        if axes is None:
            axes = [] if n.attrs.get("noop_with_empty_axes", 0) else list(range(len(dims)))
        if None in axes:
            raise Refused(f"node {n.name} ({n.op_type}): axes not known")
        padded_axes = {a % len(dims) for a in axes if dims[a % len(dims)] is not None}
        st = ins[0]
        if padded_axes and not (n.op_type in ("ReduceSum", "ReduceSumSquare") and st.kind == "fill"
                                and st.value == 0 and padded_axes <= st.at):
            # a sum whose padded terms are exactly 0 (a mean pooling's masked sum, the mask's count)
            # is the real terms' sum; any other reduction over a padded axis would see them
            raise Refused(f"node {n.name} ({n.op_type}): a reduction over a padded axis")
        return [CLEAN]

    _op_ReduceMean = _op_ReduceSum = _op_ReduceMax = _op_ReduceMin = _op_ReduceProd = _reduce
    _op_ReduceL2 = _op_ReduceSumSquare = _op_ReduceLogSumExp = _reduce

    def _op_Softmax(self, n, ins: list) -> list[St]:
        x = n.inputs[0]
        dims = self.pdims(x)
        axis = n.attrs.get("axis", -1) % len(dims)
        if dims[axis] is None:
            return [CLEAN]
        st = ins[0]
        if st.kind == "masked" and axis in st.at or (st.kind == "fill" and axis in st.at
                                                     and isinstance(st.value, float) and st.value <= MASK_BOUND):
            return [St("fill", 0.0, frozenset({axis}))]  # exp() of the masked keys is exactly 0
        raise Refused(f"node {n.name} (Softmax): over a padded axis without a mask on it")

    def _op_MatMul(self, n, ins: list) -> list[St]:
        a, b = n.inputs[0], n.inputs[1]
        da, db = self.pdims(a), self.pdims(b)
        if len(da) < 2 or len(db) < 2:
            raise Refused(f"node {n.name} (MatMul): a vector product")
        if da[-1] is not None or db[-2] is not None:
            sa = ins[0]
            if not (sa.kind == "fill" and sa.value == 0.0 and len(da) - 1 in sa.at):
                raise Refused(f"node {n.name} (MatMul): a product over a padded axis")
        if ins[0].kind == "masked" or ins[1].kind == "masked":
            raise Refused(f"node {n.name} (MatMul): masked scores in a product")
        return [CLEAN]

    def _op_Attention(self, n, ins: list) -> list[St]:
        """softmax(q k^T * scale + mask) v (``ops/fused.py``): keys at padded positions take no
        weight when the mask removes them (an additive mask of -1e4 or less, a boolean one)."""
        q, k = n.inputs[0], n.inputs[1]
        dk = self.pdims(k)
        key = dk[-1] if n.attrs.get("k_transposed", 0) else dk[-2]
        if self.pdims(q)[-1] is not None:
            raise Refused(f"node {n.name} (Attention): a padded head dim")
        if any(s is not None and s.kind in ("masked", "shape") for s in ins[:3]):
            raise Refused(f"node {n.name} (Attention): masked or shape inputs")
        if key is None:
            return [CLEAN]
        mask = n.inputs[3] if len(n.inputs) > 3 else None
        if mask is None:
            raise Refused(f"node {n.name} (Attention): padded keys and no mask")
        sm, last = ins[3], len(self.pdims(mask)) - 1
        kind = n.attrs.get("mask_kind", "none")
        removed = {"add": lambda v: isinstance(v, float) and v <= MASK_BOUND, "keep": lambda v: v is False,
                   "drop": lambda v: v is True}.get(kind)
        if removed is not None and ((sm.kind == "fill" and last in sm.at and removed(sm.value))
                                    or (kind == "add" and sm.kind == "masked" and last in sm.at)):
            return [CLEAN]
        raise Refused(f"node {n.name} (Attention): a mask not proven to remove the padded keys")
