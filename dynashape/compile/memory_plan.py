"""The memory plan of one specialization: where each value's memory comes from, and for how long.

A pure function of the shape program. Classes:

- ``arena``: an intermediate with a planned size (an expression of the input symbols that never
  shrinks when a symbol grows): a slice of the request's arena, whose offset the runtime gets
  from ``compile/arena.py`` for the sizes at the symbols' current capacity;
- ``output``: the memory of a graph output (or the root a graph output is a view of): a buffer
  of its own, handed to the caller in torch mode;
- ``kv``: a Concat whose output is a graph output and whose first input a graph input (a KV cache's
  ``present``): its storage has room to grow along the axis, and a ``past`` fed back from it is
  extended in place;
- ``adopt``: the kernel allocates (break points, kernels without ``out=``, sizes known only at run
  time, sizes that can shrink when a symbol grows);
- ``view``: no memory; aliases its input;
- ``sym`` / ``memo``: shape values (no device memory; see ``shape_program.py``).

Lifetimes are in steps (node positions) and follow aliases: a view, or a result that may be an
input itself (a kernel called without ``out=`` may return a view or its input), keeps its roots alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Node, Value
from ..shape import expr as E
from ..shape.symint import SymInt, is_one
from .channels_last import NHWC
from .shape_program import Trace

# ops the generated code writes as views although their kernel copies (the result is only read)
AS_VIEW = frozenset({"Expand", "Identity"})
# kernels that write a strided ``out`` correctly (a slot of a Concat along an inner axis is one)
STRIDED_OUT_OK = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Relu", "Sigmoid", "Tanh", "Where", "Cast"})


def _appends_kv(node: Node, graph_inputs: set[int], graph_outputs: set[int]) -> bool:
    """A KV cache's append: ``present = Concat(past, new)``, a graph input first, a graph output."""
    return (node.op_type == "Concat" and bool(node.inputs) and node.inputs[0] is not None
            and id(node.inputs[0]) in graph_inputs and node.outputs[0] is not None
            and id(node.outputs[0]) in graph_outputs)


def kv_appends(graph) -> int:
    """How many KV-cache appends ``graph`` makes: a decoder whose past the caller feeds back."""
    ins, outs = {id(v) for v in graph.inputs}, {id(v) for v in graph.outputs}
    return sum(_appends_kv(n, ins, outs) for n in graph.nodes)


@dataclass
class ArenaBuffer:
    value: Value
    nbytes: E.Expr  # over the input symbols
    first: int
    last: int


@dataclass
class MemoryPlan:
    cls: dict[int, str]  # id(Value) -> class
    roots: dict[int, frozenset[int]]  # id(Value) -> ids of the values whose memory it may be
    arena: list[ArenaBuffer] = field(default_factory=list)
    outputs_needing_check: set[int] = field(default_factory=set)  # results that may alias planned memory
    # in-place concat: id(value) -> (the Concat it is written into, its input index). Class
    # "slot": a view of the Concat's arena buffer; class "kvslot": of a KV cache's storage
    slots: dict[int, tuple[Node, int]] = field(default_factory=dict)
    lifetimes: dict[int, tuple[int, int]] = field(default_factory=dict)  # id(root) -> (first, last) step

    def of(self, v: Value) -> str:
        return self.cls[id(v)]


def _nbytes(info) -> E.Expr | None:
    if info.dims is None or info.dtype is None or info.runtime:
        return None
    n = E.const(info.dtype.itemsize)
    for d in info.dims:
        n = E.mul(n, d.expr if isinstance(d, SymInt) else E.const(d))
    return n


def _sized_monotone(info, env) -> bool:
    """Whether the buffer never needs more bytes at smaller symbols than at larger ones: each dim
    non-decreasing in every symbol (a product of dims, all >= 0 as sizes, then is too; the
    expanded product may look otherwise: N * ((H - 1) // 2 + 1) has the term N * ((H - 1) // 2))."""
    return all(E.monotone(env.canon(d.expr)) for d in info.dims if isinstance(d, SymInt))


def plan_memory(t: Trace, inplace: bool = True) -> MemoryPlan:
    g = t.graph
    env = t.env
    graph_outputs = {id(v) for v in g.outputs}
    graph_inputs = {id(v) for v in t.input_values}
    cls: dict[int, str] = {}
    roots: dict[int, frozenset[int]] = {}
    for v in t.input_values:
        cls[id(v)] = "input"
        # its own root: a view of it (an Identity the code makes an alias) is memory the caller
        # passed in, so as a graph output it is copied (and a Loop body's carried value is not the
        # same memory as an output of the iteration before: tests/test_subgraphs.py)
        roots[id(v)] = frozenset({id(v)})
    producer_step: dict[int, int] = {}
    for step, ni in enumerate(t.nodes):
        node = ni.node
        for v in node.outputs:
            if v is not None:
                producer_step[id(v)] = step
        # a body's result may be (a view of) a value it reads from the graph around it
        ins = [v for v in node.inputs if v is not None] + _outer_reads(node)
        in_roots = frozenset().union(*(roots.get(id(v), frozenset()) for v in ins)) if ins else frozenset()
        for v in node.outputs:
            if v is None:
                continue
            if ni.kind == "dead":
                cls[id(v)], roots[id(v)] = "dead", frozenset()
                continue
            info = t.of(v)
            if ni.kind in ("sym", "memo"):
                c, r = ni.kind, frozenset()
            elif ni.kind == "view" or (ni.kind == "data" and node.op_type in AS_VIEW) or (
                    ni.kind == "data" and _split_as_views(t, node, cls, graph_outputs)):
                src = node.inputs[0]
                r = roots.get(id(src))
                if r is None:  # a constant, or a value of the graph around a body: memory nobody may write
                    cls.setdefault(id(src), "const" if src.is_const else "input")
                    r = frozenset({id(src)})
                c = "view"
            elif ni.kind == "dyn" or ni.host or not node.opdef.writes_out or info.dtype is None:
                # a kernel called without out= may hand back an input or a view of one
                c, r = "adopt", in_roots | {id(v)}
            elif _nbytes(info) is None or not _sized_monotone(info, env):
                c, r = "adopt", in_roots | {id(v)}
            elif _appends_kv(node, graph_inputs, graph_outputs):
                c, r = "kv", frozenset({id(v)})
            else:
                c, r = "arena", frozenset({id(v)})
            cls[id(v)], roots[id(v)] = c, r
    for v in g.outputs:  # constants and values nobody produced
        cls.setdefault(id(v), "const" if v.is_const else "input")
        roots.setdefault(id(v), frozenset())
    # the memory a graph output is (through views) is the caller's: not arena memory
    for v in g.outputs:
        if cls[id(v)] in ("view", "arena"):
            for r in roots[id(v)]:
                if cls.get(r) == "arena":
                    cls[r] = "output"
    slots = _plan_slots(t, cls, graph_outputs, inplace)
    for vid, (concat, _) in slots.items():
        cls[vid] = "kvslot" if cls[id(concat.outputs[0])] == "kv" else "slot"
        roots[vid] = frozenset({id(concat.outputs[0])})
    # last use of every root, through everything that may alias it
    n = len(t.nodes)
    last: dict[int, int] = {}
    for step, ni in enumerate(t.nodes):
        if ni.kind in ("sym", "memo", "dead"):
            continue  # they read shapes, not memory (or do not run)
        for v in ni.node.inputs:
            if v is None:
                continue
            for r in roots.get(id(v), ()):
                last[r] = max(last.get(r, -1), step)
        for v in _outer_reads(ni.node):
            for r in roots.get(id(v), ()):
                last[r] = max(last.get(r, -1), step)
    for v in g.outputs:
        for r in roots.get(id(v), ()):
            last[r] = n
    plan = MemoryPlan(cls, roots, slots=slots)
    plan.lifetimes = {vid: (step, max(last.get(vid, step), step)) for vid, step in producer_step.items()}
    values = {id(v): v for ni in t.nodes for v in ni.node.outputs if v is not None}
    written_from: dict[int, int] = {}  # a Concat's buffer is written from its first slot's producer on
    for vid, (concat, _) in slots.items():
        cid = id(concat.outputs[0])
        written_from[cid] = min(written_from.get(cid, producer_step[cid]), producer_step[vid])
    for vid, c in cls.items():
        if c != "arena":
            continue
        v = values[vid]
        first = written_from.get(vid, producer_step[vid])
        plan.arena.append(ArenaBuffer(v, env.canon(_nbytes(t.of(v))), first, max(last.get(vid, first), first)))
    for v in g.outputs:
        c = cls[id(v)]
        if c == "adopt" and any(cls.get(r) in ("arena", "output", "kv") or r in graph_inputs
                                for r in roots[id(v)] if r != id(v)):
            plan.outputs_needing_check.add(id(v))
    return plan


def _split_as_views(t: Trace, node: Node, cls: dict, graph_outputs: set) -> bool:
    """A Split of a planned buffer, or of a kernel's own result, into parts the graph reads but
    does not return: the parts are views of it (``narrow``: made with the buffer's group, never
    per call, or where the node runs), where the parts were copied out one by one (a fused QKV
    product's three heads per layer: on a GPU three copy kernels). A channels-last buffer's parts
    are strided views, which its readers take as they are (a CPU convolution's C tile reads a
    channel slice in place: cpu_conv_dense.pixel_stride): a YOLOv8 C2f block had copied each part of
    its Split out, and the Concat after it copied them again."""
    if node.op_type != "Split" or node.domain not in ("", "ai.onnx") or not node.outputs:
        return False
    src = node.inputs[0]
    if src is None or cls.get(id(src)) not in ("arena", "adopt") or t.of(src).dims is None \
            or t.of(src).layout not in (None, NHWC):
        return False
    return all(v is not None and id(v) not in graph_outputs and t.of(v).dims is not None for v in node.outputs)


def _plan_slots(t: Trace, cls: dict, graph_outputs: set, inplace: bool) -> dict[int, tuple[Node, int]]:
    """Inputs of a Concat whose producer writes them straight into the Concat's buffer: the
    producer is a kernel with ``out=`` writing a planned buffer, the Concat is the value's only
    reader, and the slot is contiguous, or the kernel writes strided outputs correctly. For a
    KV cache's Concat only the new part can be (the past is the caller's)."""
    if not inplace:
        return {}
    slots: dict[int, tuple[Node, int]] = {}
    for ni in t.nodes:
        node = ni.node
        if node.op_type != "Concat" or ni.kind != "data" or node.domain not in ("", "ai.onnx"):
            continue
        out = node.outputs[0]
        if cls.get(id(out)) not in ("arena", "kv"):
            continue
        dims = t.of(out).dims
        axis = node.attrs["axis"] % len(dims)
        # a channels-last buffer's channel slots are never contiguous
        outer_is_one = t.of(out).layout is None and _all_one(dims[:axis])
        for i, v in enumerate(node.inputs):
            if v is None or cls.get(id(v)) != "arena" or id(v) in graph_outputs or id(v) in slots:
                continue
            if cls[id(out)] == "kv" and i != len(node.inputs) - 1:
                continue
            p = v.producer
            if p is None or len(v.users) != 1 or node.inputs.count(v) != 1 or len(p.outputs) != 1:
                continue
            if not (outer_is_one and cls[id(out)] != "kv") and p.op_type not in STRIDED_OUT_OK:
                continue
            slots[id(v)] = (node, i)
    return slots


def _all_one(dims) -> bool:
    """Whether every dim is 1 for every signature of the specialization (a literal 1, or a symbol
    a guard has made 1): slots are then contiguous. A symbolic dim is not asked (a guard on
    ``batch == 1`` would trace batch 1 apart from the rest): it counts as not 1, and only
    producers that write strided outputs get a slot."""
    return all(is_one(d) for d in dims)


def _outer_reads(node) -> list[Value]:
    out: list[Value] = []
    for sub in node.subgraphs.values():
        out.extend(sub.outer)
    return out
