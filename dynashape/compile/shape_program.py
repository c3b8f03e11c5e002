"""The shape program: every value's dims as expressions of the input symbols, for one specialization.

``trace(graph, input_shapes)`` runs each node's ordinary shape function over SymInts (see
``shape/symint.py``): input dims become symbols (one per dynamic axis; axes that share an ONNX
dim name and agree share a symbol), arithmetic becomes expressions, and every decision the
ranges cannot make is answered by the traced signature and recorded as a guard. The result is
valid for every signature that meets its guards.

Each node gets a kind, which is what the generated code does with it:

- ``sym``: its outputs are small int tensors known as expressions (``Shape -> Gather -> Concat``);
  nothing runs, the values are part of the program (and become tensors only where a kernel reads
  them);
- ``memo``: a host node computing from shapes only (``Range(0, seq)``), whose value is not a few
  ints: it runs when a symbol it depends on changes, not on every call;
- ``view``: a view op (Reshape, Transpose, Slice ...) of a known shape;
- ``data``: a kernel whose output shape is known as expressions: it gets a planned buffer;
- ``dyn``: a break point: a data-dependent op (NonZero, Unique, a TopK whose k comes from data,
  control flow), or a node whose shape function needs a value known only at run time. It runs,
  its result is taken as it is, and the dims of its outputs become new *runtime* symbols that
  the program continues with.

An If whose condition the program knows for this signature (a test of a dim or a rank: exporters
write ``squeeze(dim)`` as "If the dim is 1, Squeeze, else Identity") is no break point: the branch
it takes is traced in its place, as its nodes, and the test is a guard (``Trace.inlined_ifs``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..errors import ShapeError
from ..ir import Graph, Node, Value
from ..ir.dtypes import torch_dtype
from ..ops.fused import CannotServe
from ..shape import expr as E
from ..shape import is_placeholder
from ..shape.symint import NeedsConcrete, ShapeEnv, SymInt, expr_of
from . import affine
from .affine import Affine
from .inline_if import branch_taken, output_identities
from .patterns import RANDOM_OPS
from .symbolic_values import SymValue
from .symbolic_values import evaluate as evaluate_values


@dataclass
class ValueInfo:
    """What the program knows of a value: dims (ints and SymInts; None when even the rank is
    unknown), its symbolic value (small int tensors), dtype and where it lives."""

    dims: tuple | None
    dtype: torch.dtype | None
    host: bool = False
    sval: SymValue | None = None
    runtime: bool = False  # dims read runtime symbols: known only once the run got there
    affine: Affine | None = None  # elements as expressions of their indices (masks, positions)
    layout: str | None = None  # "nhwc": channels-last strides (compile/channels_last.py)

    def numel(self):
        n: int | SymInt = 1
        for d in self.dims:
            n = n * d
        return n


@dataclass
class NodeInfo:
    node: Node
    kind: str  # sym | memo | view | data | dyn | dead
    host: bool
    reason: str = ""  # why a node is dyn
    # the op describes more outputs than the node has (LayerNormalization's Mean and InvStdDev):
    # its kernel called without out= returns them all, the node's own first
    more_results: bool = False
    drop_inputs: frozenset = frozenset()  # inputs this specialization does not need (a mask true everywhere)


@dataclass
class InputDim:
    """An input axis the program reads: it defines ``symbol`` or must equal it (a shared name)."""

    input: int
    axis: int
    symbol: str
    defines: bool


@dataclass
class Trace:
    env: ShapeEnv
    graph: Graph
    input_values: list[Value]
    input_ranks: list[int | None]
    input_dims: list[InputDim]
    info: dict[int, ValueInfo]  # id(Value) -> info
    nodes: list[NodeInfo]
    runtime_symbols: dict[str, tuple[Value, int]] = field(default_factory=dict)  # symbol -> (value, axis)
    unfused: int = 0  # fused nodes traced as the nodes they replaced
    inlined_ifs: int = 0  # If nodes traced as the branch their condition takes here
    memo_data_refused: int = 0  # nodes memo data would take but whose values read runtime symbols

    def of(self, v: Value) -> ValueInfo:
        return self.info[id(v)]

    @property
    def guards(self):
        return self.env.guard_list()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.kind] = out.get(n.kind, 0) + 1
        return out


def _dtype(v: Value) -> torch.dtype | None:
    if v.kind != "tensor":
        return None
    try:
        return torch_dtype(v.elem_type)
    except KeyError:
        return None


def trace(graph: Graph, input_shapes: list[tuple[int, ...] | None], inputs: list[Value] | None = None,
          seed: ShapeEnv | None = None, memo_data: bool = False) -> Trace:
    """The shape program of ``graph`` specialised by the guards that ``input_shapes`` (one per
    input of ``inputs``, default the graph's inputs; None for an absent optional or a sequence)
    satisfy. Raises ShapeError naming the node when the shapes do not fit the model. ``seed``:
    the guards and equalities of an earlier trace (or of the code built from it), known from the
    start. ``memo_data``: data computed from shapes and constants alone is memo too (``_memo_data``)."""
    inputs = list(graph.inputs) if inputs is None else inputs
    t = _trace_once(graph, input_shapes, inputs, seed)
    if t.env.replace and (seed is None or t.env.replace.keys() - seed.replace.keys()):
        # what later nodes taught (seq == 1 in a decode step) makes earlier ones simpler too: a
        # Range(0, seq) is then one known element, not data. A second pass knows it from the start.
        t = _trace_once(graph, input_shapes, inputs, t.env)
    _drop_dead(t)
    if memo_data:
        _memo_data(t)
    return t


def _memo_data(t: Trace) -> None:
    """Data and views computed only from values made from shapes (memo, sym) and constants
    become memo: computed in the group of their symbols, once per signature the group meets, not
    every call. T5's relative position bias (buckets from the Range of the lengths, logs,
    divisions, a Gather of the bias table, a Transpose) was ~12 kernels a call of a decoder
    without a KV cache, whose every call brings a new length; the groups' builds are kept for
    when the length comes back. On the CPU, where host and device memory are the same (on a GPU
    such a mask would be made on the host and copied each time its group is built)."""
    made = set()
    returned = {id(v) for v in t.graph.outputs}  # (the caller's memory: sized, and checked, by the plan)
    for ni in t.nodes:
        node = ni.node
        if ni.kind in ("sym", "memo"):
            made.update(id(v) for v in node.outputs if v is not None)
            continue
        if ni.kind not in ("data", "view") or ni.drop_inputs or node.subgraphs or node.op_type in RANDOM_OPS \
                or any(id(v) in returned for v in node.outputs if v is not None):
            continue
        ins = [v for v in node.inputs if v is not None]
        if not ins or not all(v.is_const or id(v) in made for v in ins) or not any(id(v) in made for v in ins):
            continue
        if any(v is not None and t.of(v).dtype is None for v in node.outputs):
            continue
        if _reads_runtime(t, ins) or any(v is not None and t.of(v).runtime for v in node.outputs):
            # a group is keyed by input symbols: a value of symbols a break point binds during the
            # run (a Slice whose ends are data, then Shape -> ConstantOfShape) has no group to be
            # made in. It stays data, computed every call.
            t.memo_data_refused += 1
            continue
        ni.kind, ni.host = "memo", True
        for v in node.outputs:
            if v is not None:
                t.of(v).host = True
                made.add(id(v))


def _reads_runtime(t: Trace, ins: list[Value]) -> bool:
    """Whether any of ``ins`` has dims or elements that read runtime symbols."""
    for v in ins:
        if v.is_const:
            continue
        info = t.of(v)
        if info.runtime or _sval_runtime(t.env, info):
            return True
    return False


def _drop_dead(t: Trace) -> None:
    """Nodes nothing reads in this specialization (a mask it drops; a node kept only for the
    nodes a fused one would run where it cannot serve) become ``dead``: no code."""
    needed = {id(v) for v in t.graph.outputs}
    for ni in reversed(t.nodes):
        if not any(v is not None and id(v) in needed for v in ni.node.outputs):
            ni.kind = "dead"
            continue
        if ni.kind == "sym" and ni.node.op_type == "Shape" and _measured_only(t, ni.node.inputs[0]):
            continue  # the program knows the shape it reads: its input need not be made for it
        for i, v in enumerate(ni.node.inputs):
            if v is not None and i not in ni.drop_inputs:
                needed.add(id(v))
        for sub in ni.node.subgraphs.values():
            needed.update(id(v) for v in sub.outer)


def _measured_only(t: Trace, v: Value | None) -> bool:
    """Whether ``v``'s dims are expressions of the input symbols (none bound by a node at run
    time): a Shape of it is then known without making it."""
    info = t.info.get(id(v)) if v is not None else None
    return info is not None and info.dims is not None and not info.runtime


def _trace_once(graph: Graph, input_shapes: list, inputs: list[Value], seed: ShapeEnv | None) -> Trace:
    env = ShapeEnv()
    t = Trace(env, graph, inputs, [], [], {}, [])
    _trace_inputs(t, input_shapes)
    if seed is not None:
        env.replace = dict(seed.replace)
        env.guards = dict(seed.guards)
    for node in graph.nodes:
        _trace_into(t, node)
    return t


def _trace_into(t: Trace, node: Node) -> None:
    """Trace ``node``; a fused node whose kernel cannot serve this signature is traced as the
    nodes it replaced (unfusion, counted); an If whose condition is known, as its branch."""
    taken = _taken_branch(t, node)
    if taken is not None:
        t.inlined_ifs += 1
        for n in taken:
            _trace_into(t, n)
        return
    try:
        t.nodes.append(_trace_node(t, node))
    except CannotServe:
        t.unfused += 1
        for n in node.unfused:
            _trace_into(t, n)


def _taken_branch(t: Trace, node: Node) -> list[Node] | None:
    """The nodes that compute an If's outputs for this signature: the branch its condition takes
    (known from the shapes, the comparison a guard) and an Identity per output; None when the
    condition comes from data or the branch yields sequences or optionals."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None:
        return None
    info = _input_info(t, node.inputs[0])
    sv = info.sval if info is not None else None
    if sv is None or sv.numel() != 1:
        return None
    cond = sv.reshape(-1).tolist()[0]
    if isinstance(cond, SymInt):
        return None
    name = "then_branch" if bool(cond) else "else_branch"
    branch = branch_taken(node, bool(cond))
    if branch is None:
        return None
    made = node.__dict__.setdefault("_taken", {})  # the same Identity nodes in every trace of the If
    if name not in made:
        made[name] = output_identities(node, branch, f"{node.name}_{name}_out")
    return [*branch.nodes, *made[name]]


def _trace_inputs(t: Trace, input_shapes: list) -> None:
    env = t.env
    by_name: dict[str, str] = {}  # dim name -> symbol
    for i, (v, shape) in enumerate(zip(t.input_values, input_shapes)):
        t.input_ranks.append(None if shape is None else len(shape))
        if shape is None or v.kind != "tensor":
            t.info[id(v)] = ValueInfo(None, _dtype(v))
            continue
        declared = v.shape if v.shape is not None and len(v.shape) == len(shape) else None
        dims: list = []
        for axis, n in enumerate(shape):
            d = declared[axis] if declared is not None else None
            if d is not None and d.is_static:
                dims.append(d.min)  # the feed check made sure of it
                continue
            name = d.symbol if d is not None and not is_placeholder(d.symbol) else None
            sym = by_name.get(name) if name else None
            if sym is not None and env.hints[sym] == n:
                dims.append(env.wrap(_sym_expr(sym)))
                t.input_dims.append(InputDim(i, axis, sym, False))
                continue
            sym = _fresh(env, name or f"{v.name}_{axis}")
            lo, hi = (d.min, d.max) if d is not None else (0, None)
            dims.append(env.symbol(sym, n, lo, hi))
            t.input_dims.append(InputDim(i, axis, sym, True))
            if name and name not in by_name:
                by_name[name] = sym
        t.info[id(v)] = ValueInfo(tuple(dims), _dtype(v))


def _sym_expr(name: str):
    from ..shape.expr import sym
    return sym(name)


def _fresh(env: ShapeEnv, base: str) -> str:
    base = re.sub(r"\W", "_", base) or "d"
    name, k = base, 1
    while name in env.order:
        name, k = f"{base}_{k}", k + 1
    return name


def _const_info(v: Value) -> ValueInfo:
    c = v.const
    if isinstance(c, torch.Tensor):
        return ValueInfo(tuple(c.shape), c.dtype, host=True, sval=SymValue.of(c))
    return ValueInfo(tuple(getattr(c, "shape", ())), None, host=True)


def _input_info(t: Trace, v: Value | None) -> ValueInfo | None:
    if v is None:
        return None
    info = t.info.get(id(v))
    if info is None and v.is_const:
        info = t.info[id(v)] = _const_info(v)
    return info


def _trace_node(t: Trace, node: Node) -> NodeInfo:
    od = node.opdef
    host = bool(getattr(node, "shape_of", False)) or od.host
    ins = [_input_info(t, v) for v in node.inputs]
    if node.subgraphs or any(v is not None and v.kind != "tensor" for v in (*node.inputs, *node.outputs)):
        return _dyn(t, node, host, "control flow or sequences: the kernel's result decides")
    if od.infer is None:
        return _dyn(t, node, host, "data-dependent output shape")
    shapes = []
    for v, info in zip(node.inputs, ins):
        if v is None:
            shapes.append(None)
        elif info is None or info.dims is None:
            return _dyn(t, node, host, f"shape of input {v.name!r} known only at run time")
        else:
            shapes.append(info.dims)
    values: list = [None] * len(node.inputs)
    for i in od.shape_deps:
        if i >= len(node.inputs) or node.inputs[i] is None:
            continue
        if ins[i].sval is not None:
            values[i] = ins[i].sval
        elif node.inputs[i].is_const:
            values[i] = node.inputs[i].const
        else:
            return _dyn(t, node, host, f"shape input {node.inputs[i].name!r} computed from data")
    env = t.env
    try:
        outs = od.infer(shapes, values, **node.attrs)
    except CannotServe:
        if getattr(node, "unfused", None):
            raise
        return _dyn(t, node, host, "the fused kernel cannot serve these shapes")
    except NeedsConcrete as e:
        return _dyn(t, node, host, str(e))
    except ShapeError as e:
        raise ShapeError(f"node {node.name!r} ({node.op_type}) with input shapes {_show(shapes)}: {e}") from e
    except Exception as e:  # noqa: BLE001  a shape function that cannot work symbolically: run time decides
        return _dyn(t, node, host, f"shape function: {type(e).__name__}: {e}")
    more = len(outs) > len(node.outputs)
    outs = list(outs[:len(node.outputs)]) + [None] * (len(node.outputs) - len(outs))
    if not _probe(t, node, shapes, values, outs):
        return _dyn(t, node, host, "its shape function used a dim as a plain number")
    for v, s in zip(node.outputs, outs):
        if v is None:
            continue
        if s is None or not all(isinstance(d, int) for d in s):
            return _dyn(t, node, host, "shape function gave no shape")
    svals = None
    if od.shape_op or host:
        in_svals = [None if i is None else i.sval for i in ins]
        if all(sv is not None for sv, v in zip(in_svals, node.inputs) if v is not None) or node.op_type in (
                "Shape", "Size"):
            try:
                svals = evaluate_values(node, shapes, in_svals, [tuple(s) if s is not None else None for s in outs])
            except NeedsConcrete:
                svals = None
    aff = None
    if svals is None and len(node.outputs) == 1 and any(
            i is not None and (i.affine is not None or i.sval is not None) for i in ins):
        try:
            aff = affine.evaluate(node, [None if i is None else i.affine for i in ins],
                                  [None if i is None else i.sval for i in ins], tuple(outs[0]), env)
        except NeedsConcrete:
            aff = None
    for k, (v, s) in enumerate(zip(node.outputs, outs)):
        if v is None:
            continue
        runtime = not all(env.hinted(d.expr) for d in s if isinstance(d, SymInt))
        sv = svals[k] if svals is not None and k < len(svals) else None
        t.info[id(v)] = ValueInfo(tuple(s), _dtype(v), host=host, sval=sv, runtime=runtime,
                                  affine=aff if k == 0 else None, layout=getattr(v, "layout", None))
    if svals is not None:
        return NodeInfo(node, "sym", host)
    if getattr(node, "shape_of", False):
        runtime = any(i is not None and (i.runtime or _sval_runtime(env, i)) for i in ins)
        if runtime:
            return _dyn(t, node, host, "a host node reading run-time dims")
        return NodeInfo(node, "memo", host, more_results=more)
    if od.view:
        return NodeInfo(node, "view", host)
    return NodeInfo(node, "data", host, more_results=more, drop_inputs=_droppable(t, node, ins))


def _droppable(t: Trace, node: Node, ins: list) -> frozenset:
    """Inputs of a fused attention that this specialization does without: a mask that masks
    nothing (true everywhere for a keep mask, false everywhere for a drop mask, zeros to add)."""
    if node.domain != "com.dynashape" or node.op_type != "Attention" or len(ins) < 4 or ins[3] is None:
        return frozenset()
    a = ins[3].affine
    if a is None:
        return frozenset()
    kind = node.attrs.get("mask_kind")
    try:
        if kind in ("keep", "drop"):
            truth = affine.always(a, t.env)
            if truth is (kind == "keep"):
                return frozenset({3})
        elif kind == "add" and a.pred is None and a.expr.key == "0":
            return frozenset({3})
    except NeedsConcrete:
        pass
    return frozenset()


def _probe(t: Trace, node: Node, shapes: list, values: list, outs: list) -> bool:
    """Whether the symbolic result still holds at other values of the symbols.

    A shape function that indexes or slices with a dim (``s[b + m:]``), or loops ``range(d)``,
    reads the traced value without asking the SymInt, so no guard records it. Running the same
    function on plain ints at perturbed symbol values (that meet the guards) and comparing with
    the expressions evaluated there finds it; such a node is then run concretely."""
    env = t.env
    exprs = [expr_of(d) for s in shapes if s is not None for d in s]
    exprs += [expr_of(x) for v in values if isinstance(v, SymValue) for x in v.flat() if isinstance(x, int)]
    if not any(e.terms for e in exprs) or not all(env.hinted(e) for e in exprs):
        return True
    for bump in (lambda h: h + 1, lambda h: 2 * h + 3):
        pert = {k: bump(h) for k, h in env.hints.items() if k not in env.replace}
        for k, r in env.replace.items():
            try:
                pert[k] = E.evaluate(r, pert)
            except KeyError:
                pass
        if not all(g.holds(pert) for g in env.guard_list() if g.expr.free <= pert.keys()):
            continue
        try:
            conc_shapes = [None if s is None else tuple(E.evaluate(expr_of(d), pert) for d in s) for s in shapes]
            conc_values = [_concrete(v, pert) for v in values]
            got = node.opdef.infer(conc_shapes, conc_values, **node.attrs)
        except Exception:  # noqa: BLE001  perturbed values the model does not accept: no verdict
            continue
        for o, g in zip(outs, got):
            if o is None or g is None:
                continue
            want = tuple(E.evaluate(expr_of(d), pert) for d in o)
            if tuple(int(x) for x in g) != want:
                return False
        return True
    return True


def _concrete(v, env: dict):
    if not isinstance(v, SymValue):
        return v
    flat = [E.evaluate(expr_of(x), env) if isinstance(x, int) and not isinstance(x, bool) else x for x in v.flat()]
    return torch.tensor(flat, dtype=v.dtype).reshape(v.shape)


def _sval_runtime(env: ShapeEnv, info: ValueInfo) -> bool:
    return info.sval is not None and any(isinstance(x, SymInt) and not env.hinted(x.expr) for x in info.sval.flat())


def _dyn(t: Trace, node: Node, host: bool, reason: str) -> NodeInfo:
    """A break point: the outputs' dynamic dims become runtime symbols, bound after the node ran."""
    for v in node.outputs:
        if v is None:
            continue
        if v.kind != "tensor" or v.shape is None:
            t.info[id(v)] = ValueInfo(None, _dtype(v), host=host, runtime=True)
            continue
        dims = []
        for axis, d in enumerate(v.shape):
            if d.is_static:
                dims.append(d.min)
                continue
            name = _fresh(t.env, f"{v.name}_{axis}")
            dims.append(t.env.symbol(name, None, d.min, d.max))
            t.runtime_symbols[name] = (v, axis)
        t.info[id(v)] = ValueInfo(tuple(dims), _dtype(v), host=host, runtime=True)
    # the shape function did not say whether the kernel has more results than the node (MaxPool's
    # Indices): a one-tensor node's call takes the first of a tuple
    outs = [v for v in node.outputs if v is not None]
    more = len(node.outputs) == 1 and len(outs) == 1 and outs[0].kind == "tensor"
    return NodeInfo(node, "dyn", host, reason, more_results=more)


def _show(shapes) -> list:
    return [None if s is None else tuple(s) for s in shapes]
