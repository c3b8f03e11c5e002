"""Generated code for one specialization: a straight-line runner, its guard check and its groups.

From the shape program (``compile/shape_program.py``) and the memory plan
(``compile/memory_plan.py``) of one specialization this writes Python source, as torch.fx's
codegen does, and compiles it:

``accepts(shapes)``
    whether input shapes meet the specialization's guards (ranks, shared dims, the guards).
``run(st, *inputs)``
    reads the input symbols, and when they changed since the last call asks the request state
    to ``enter`` the new signature (that is ``update_shape`` / ``update_impl`` /
    ``realloc_if_needed`` for the whole network: arena growth, new views); then one line per
    kernel, writing into the buffers of the memory plan, and returns the outputs.
``g<i>(st, sig)``, one per *group*
    everything that depends only on the values of a set of input symbols and not on data: views
    of arena buffers, views of those views (Reshape, Transpose, Slice ...), shape values that
    kernels read as tensors, host nodes computing from shapes only. A group is rebuilt only when
    its symbols change, and the request keeps a few builds per group, so a shape that comes back
    finds its views made, and a decode step rebuilds only what depends on the past length.

The source is readable (``dynashape show --code``, ``DYNASHAPE_DUMP_CODE``); each line that runs
a node is mapped back to it, so an exception names the node.
"""

from __future__ import annotations

import functools
import keyword
import linecache
import operator
import re
from dataclasses import dataclass, field
from functools import partial
from itertools import count

import torch

from ..compile import affine
from ..compile.arena import overlapping
from ..compile.memory_plan import AS_VIEW, ArenaBuffer, MemoryPlan, plan_memory
from ..compile.shape_program import Trace
from ..ir import Node, Value
from ..ops.conv import conv1d
from ..ops.cpu_conv import conv2d as cpu_conv2d
from ..ops.ort_math import sigmoid, tanh
from ..ops.registry import COMPUTED, bound_kernel
from ..ops.shapes import norm_axes
from ..ops.tensor import _perm
from ..ops.tuned_conv import conv2d_op
from ..shape import expr as E
from ..shape.symint import NeedsConcrete, SymInt, is_one, same_dim, same_dims
from . import align
from .emitters import Emit, emit
from .regions import Item, Member, Region, partition
from .step_graph import HELPERS, KVInfo, Refused, StepPlan, step_plan

_ids = count()


def first_result(r):
    """A kernel of optional extra outputs called without out= gives a tuple, or its one tensor."""
    return r[0] if isinstance(r, (tuple, list)) else r


class MemoRefused(Exception):
    """A memo node whose inputs are not all group members (a value of symbols bound during the
    run): the specialization is traced again without memo data (``runtime/compiled.py``)."""


@dataclass
class Group:
    symbols: frozenset[str]
    members: list[str] = field(default_factory=list)
    lines: list[tuple[str, Node | None]] = field(default_factory=list)
    first: int = 0  # creation order, for a stable order among groups of one size
    index: int = -1
    key: tuple[int, ...] = ()  # positions of its symbols in the signature


@dataclass
class RegionCode:
    """A region of ``run`` (``regions.py``) and what its static impls are built from."""

    region: Region
    fn: object  # r<k>(*key symbols, *live-ins) -> live-outs: the region's lines as a function
    symvars: list[str]  # locals of the key symbols, in key order
    body: list[str]
    align: align.Alignment | None = None  # one impl for several values of a symbol (align.py)


@dataclass
class SpecCode:
    trace: Trace
    plan: MemoryPlan
    source: str
    filename: str
    run: object
    accepts: object
    refresh: list
    groups: list[Group]
    sig_symbols: list[str]
    arena: list[ArenaBuffer]
    arena_dtypes: list[torch.dtype]
    arena_dtype_index: list[int]  # per arena buffer: its dtype's index
    output_values: list[Value]  # values of class "output", by the index st.out() takes
    kv_nodes: list[Node]
    sub_nodes: list[Node]  # nodes with subgraphs: their kernel is per request
    outputs: list[str]  # per graph output: keep | clone | check (see _output_action)
    line_nodes: dict[int, Node]
    namespace: dict
    inplace_inputs: int = 0  # Concat inputs written in place by their producers, per run
    size_symbols: tuple[int, ...] = ()  # positions in the signature of the symbols arena sizes read
    group_keys: list = field(default_factory=list)  # per group: signature -> the values of its symbols
    regions: list[RegionCode] = field(default_factory=list)  # regions that static impls may serve
    aligned_positions: dict = field(default_factory=dict)  # signature position of an aligned symbol -> kinds
    kernel_items: int = 0  # nodes with lines in run (regions.py's items)
    bound_kernels: int = 0  # of them, kernels bound to their node's constants (registry.binder)
    sized_nodes: list = field(default_factory=list)  # st.sized's nodes: (node, output dtypes)
    input_locals: list[str] = field(default_factory=list)  # run's parameters, in input order
    step: StepCode | None = None  # the whole decode step over KV storages (step_graph.py)
    step_refused: str = ""  # why there is no whole-step function (when there are KV appends)
    accepted_guards: list = field(default_factory=list)  # the guards ``accepts`` checks (their keys)

    @functools.cached_property
    def arena_lifetimes(self) -> tuple[list[int], list[int], list[list[int]]]:
        """First and last steps of the arena buffers, and which overlap (compile/arena.py)."""
        first, last = [b.first for b in self.arena], [b.last for b in self.arena]
        return first, last, overlapping(first, last)


@dataclass
class StepCode:
    plan: StepPlan
    fn: object  # step(*other symbols, C, P, *storages, *live-ins) -> results that are not presents
    members: dict[str, tuple[int, int]]  # live-in member -> (group, position): where SpecState.cur has it
    prep: object = None  # prep(*other symbols, C, *its live-ins) -> the capacity values (step_capacity.py)


def _ident(name: str, prefix: str) -> str:
    s = re.sub(r"\W", "_", name)
    if not s or s[0].isdigit() or keyword.iskeyword(s):
        s = f"_{s}"
    return f"{prefix}{s}"


class _Names:
    def __init__(self) -> None:
        self.used: set[str] = {"st", "sig", "torch", "DEV", "cur", "off", "A", "first"}

    def new(self, base: str, prefix: str = "") -> str:
        name = _ident(base, prefix)[:48]
        cand, k = name, 1
        while cand in self.used:
            cand, k = f"{name}_{k}", k + 1
        self.used.add(cand)
        return cand


class _Builder:
    def __init__(self, trace: Trace, device: torch.device, consts_device, consts_host, inplace: bool) -> None:
        self.t = trace
        self.env = trace.env
        self.device = device
        self.plan = plan_memory(trace, inplace)
        self.names = _Names()
        self.ns: dict = {"torch": torch, "DEV": device, "first": first_result, "_conv1d": conv1d,
                         "_conv2d": conv2d_op, "_cpu_conv2d": cpu_conv2d, "_tanh": tanh, "_sigmoid": sigmoid, **HELPERS}
        self.consts_device, self.consts_host = consts_device, consts_host
        self.local: dict[int, str] = {}  # id(Value) -> local holding it in the body
        self.member: dict[tuple, tuple[Group, str]] = {}  # (kind, id) -> (group, member name)
        self.same_rhs: dict[tuple, str] = {}  # (id(group), a value member's expression) -> its first name
        self.groups: dict[frozenset, Group] = {}
        self.items: list[Item] = []  # the body of run: the lines of each node (regions.py)
        self._pending: list[str] = []  # setup lines of the node whose lines come next
        self._ni = None  # the node being generated
        self.member_info: dict[str, Member] = {}
        self.symvar: dict[str, str] = {}
        self.sig_symbols: list[str] = []
        self.output_values: list[Value] = []
        self.kv_nodes: list[Node] = []
        self.sub_nodes: list[Node] = []
        self.sized_nodes: list[tuple] = []  # break points whose sizes come from data: (node, output dtypes)
        self.inplace_inputs = 0  # Concat inputs their producers write in place, per run
        self.dropped = 0  # inputs not needed in this specialization (masks that mask nothing)
        self.bound_kernels = 0  # kernels bound to their node's constants (registry.binder)
        self.arena_index: dict[int, int] = {id(b.value): i for i, b in enumerate(self.plan.arena)}
        self.arena_dtypes: list[torch.dtype] = []
        for b in self.plan.arena:
            dt = self.t.of(b.value).dtype
            if dt not in self.arena_dtypes:
                self.arena_dtypes.append(dt)
        for k, dt in enumerate(self.arena_dtypes):  # the dtypes of the arena's views, for the whole step
            self.ns[f"ADT{k}"] = dt
        self.input_symbols = {d.symbol for d in trace.input_dims if d.defines}
        self.strides: dict[int, tuple] = {}  # strides (SymInts) of the group members that are views
        self.memo_nodes: dict[int, object] = {}  # id(Value) -> NodeInfo of a memo node, made on use
        # member -> (element sources, dtype, shape, on the host): the values of shapes made in groups
        self.sval_members: dict[str, tuple] = {}
        self.member_value: dict[str, tuple[Value, bool]] = {}  # members that hold a value: (it, on the device)
        self.step: StepPlan | None = None  # the whole-step function (step_graph.py), or why not
        self.step_refused = ""

    # ---- sources of dims -----------------------------------------------------------------------
    def src(self, d) -> str:
        if isinstance(d, SymInt):
            return E.source(self.env.canon(d.expr), self._symname)
        if isinstance(d, E.Expr):
            return E.source(self.env.canon(d), self._symname)
        return str(int(d))

    def _symname(self, s: str) -> str:
        return self.symvar[s]

    def free(self, d) -> frozenset[str]:
        if isinstance(d, SymInt):
            return self.env.canon(d.expr).free
        if isinstance(d, E.Expr):
            return self.env.canon(d).free
        return frozenset()

    def dims_free(self, dims) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for d in dims or ():
            out |= self.free(d)
        return out

    def is_input_only(self, syms: frozenset[str]) -> bool:
        return syms <= self.input_symbols

    # ---- groups ------------------------------------------------------------------------------------
    def group(self, syms: frozenset[str]) -> Group:
        g = self.groups.get(syms)
        if g is None:
            g = self.groups[syms] = Group(syms, first=len(self.groups))
        return g

    def add_member(self, key: tuple, syms: frozenset[str], base: str, lines_fn, node: Node | None = None,
                   buffer: bool = True, shape_syms: frozenset[str] | None = None, value: Value | None = None,
                   on_device: bool = False) -> str:
        """A name made in the group of ``syms``. ``buffer``: memory kernels read and write in
        place (an arena view, a slot, a view of one), else a value made from shapes;
        ``shape_syms``: the symbols its shape depends on (default: ``syms``)."""
        hit = self.member.get(key)
        if hit is not None:
            return hit[1]
        g = self.group(syms)
        name = self.names.new(base)
        lines = lines_fn(name)
        same = self._computed_already(g, name, lines, buffer)
        if same is not None:
            self.member[key] = (g, same)
            return same
        for line in lines:
            g.lines.append((line, node))
        g.members.append(name)
        self.member[key] = (g, name)
        self.member_info[name] = Member(g.symbols, buffer, g.symbols if shape_syms is None else shape_syms)
        if value is not None:
            self.member_value[name] = (value, on_device)
        return name

    def _computed_already(self, g: Group, name: str, lines: list[str], buffer: bool) -> str | None:
        """The member of ``g`` a value made from shapes repeats, by its line's text: exporters
        rebuild a mask's ``arange`` per layer from the Shape of another tensor each time, which
        only the shape program sees to be the same length (T5's decoder made six per call).
        Buffers and lines that write into memory are never shared."""
        head = f"{name} = "
        if buffer or len(lines) != 1 or not lines[0].startswith(head):
            return None
        rhs = lines[0][len(head):]
        if "out=" in rhs or "empty" in rhs or "_(" in rhs:
            return None
        first = self.same_rhs.setdefault((id(g), rhs), name)
        return None if first == name else first

    def member_syms(self, key: tuple) -> frozenset[str] | None:
        hit = self.member.get(key)
        return None if hit is None else hit[0].symbols

    # ---- values as sources -----------------------------------------------------------------------
    def const(self, v: Value, host: bool) -> str:
        table, prefix = (self.consts_host, "h_") if host else (self.consts_device, "c_")
        name = _ident(v.name, prefix)
        if name not in self.ns:
            self.ns[name] = table(v) if callable(table) else table[v.name]
        return name

    def sval_tensor(self, v: Value, host: bool, inline: list) -> str:
        """A symbolic value as a tensor (a kernel reads it): a group member when it depends on
        input symbols only, else made inline where it is used."""
        info = self.t.of(v)
        sv = info.sval
        elems = sv.flat()
        syms = frozenset().union(*(self.free(x) for x in elems)) if elems else frozenset()
        dt = repr(sv.dtype).replace("torch.", "torch.")
        shape = tuple(sv.shape)
        # made on the host, then queued to the device: torch.tensor(..., device=) copies and waits
        # for the copy, a host sync per new signature (a decode step's every step, on an H100)
        dev = "" if host else ").to(DEV, non_blocking=True"

        def lines(name: str) -> list[str]:
            items = [self.src(x) if not isinstance(x, bool) else repr(x) for x in elems]
            if shape == ():
                return [f"{name} = torch.tensor({items[0]}, dtype={dt}{dev})"]
            if len(shape) == 1:
                return [f"{name} = torch.tensor([{', '.join(items)}], dtype={dt}{dev})"]
            return [f"{name} = torch.tensor([{', '.join(items)}], dtype={dt}{dev}).reshape({shape!r})"]
        if self.is_input_only(syms):
            name = self.add_member(("sval", id(v), host), syms, f"{v.name}_{'h' if host else 'd'}", lines,
                                   buffer=False, shape_syms=frozenset())
            # its elements as sources: a whole-step function computes them on the device
            self.sval_members[name] = ([self.src(x) if not isinstance(x, bool) else repr(x) for x in elems], dt,
                                       shape, host)
            return name
        name = self.names.new(f"{v.name}_val")
        inline.extend(lines(name))
        return name

    def use(self, v: Value | None, host: bool, inline: list, in_group: bool = False) -> str | None:
        """Source of value ``v`` read by a node running on the host (``host``) or the device."""
        if v is None:
            return None
        if v.is_const:
            return self.const(v, host)
        c = self.plan.cls.get(id(v))
        if c == "sym":
            return self.sval_tensor(v, host, inline)
        key = ("value", id(v))
        hit = self.member.get(key)
        if hit is None and id(v) in self.memo_nodes:
            self._make_memo(self.memo_nodes[id(v)])
            hit = self.member.get(key)
        lives_on_host = self._on_host(v)
        if hit is not None:
            g, name = hit
            if lives_on_host == host or self.device.type == "cpu":  # (.to() of the same memory: itself)
                return name
            base = f"{v.name}_{'h' if host else 'd'}"
            to = ".cpu()" if host else ".to(DEV, non_blocking=True)"
            info = self.member_info[name]
            return self.add_member(("copy", id(v), host), g.symbols, base, lambda n: [f"{n} = {name}{to}"],
                                   buffer=False, shape_syms=info.shape_syms, value=v, on_device=not host)
        name = self.local[id(v)]
        if lives_on_host == host or not isinstance(self.t.of(v).dtype, torch.dtype) or self.device.type == "cpu":
            return name
        moved = self.names.new(f"{v.name}_{'h' if host else 'd'}")
        inline.append(f"{moved} = {name}.cpu()" if host else f"{moved} = {name}.to(DEV, non_blocking=True)")
        return moved

    def _on_host(self, v: Value) -> bool:
        c = self.plan.cls.get(id(v))
        if c == "input":
            return False
        return self.t.of(v).host

    # ---- the steps ---------------------------------------------------------------------------------
    def build(self) -> None:
        for d in self.t.input_dims:
            if d.defines:
                self.symvar[d.symbol] = self.names.new(d.symbol, "s_")
                self.sig_symbols.append(d.symbol)
        for v in self.t.input_values:
            self.local[id(v)] = self.names.new(v.name, "x_")
        for step, ni in enumerate(self.t.nodes):
            self._ni = ni
            getattr(self, f"_{ni.kind}")(step, ni)
        self._ni = None
        self.results = []
        for v in self.t.graph.outputs:
            if v.is_const:
                self.results.append(self.const(v, False))
            elif id(v) in self.local:
                self.results.append(self.local[id(v)])
            else:  # a group member, or a value only the program knows (a shape value)
                inline: list[str] = []
                self.results.append(self.use(v, self._on_host(v), inline))
                self._body(inline, None)
        if self._pending:  # what makes the results: never part of a region
            self.items.append(Item(self._pending, None, frozenset(), bounding=True))
            self._pending = []

    def _sym(self, step, ni) -> None:
        return  # part of the program: made a tensor only where a kernel reads it

    def _dead(self, step, ni) -> None:
        return  # nothing reads it in this specialization

    def _memo(self, step, ni) -> None:
        """Host nodes computing from shapes only: made in their group when something reads them
        (a mask this specialization drops is never built)."""
        for v in ni.node.outputs:
            if v is not None:
                self.memo_nodes[id(v)] = ni

    def _make_memo(self, ni) -> None:
        node = ni.node
        inline: list[str] = []
        ins = [self.use(v, True, inline, in_group=True) for v in node.inputs]  # makes memo inputs first
        syms = frozenset()
        for v in node.inputs:
            if v is None or v.is_const:
                continue
            ms = self.member_syms(("value", id(v)))
            if ms is None:
                ms = self.dims_free(self.t.of(v).sval.flat() if self.t.of(v).sval is not None else ())
            syms |= ms
        if inline:  # an input made per call, not in a group: this node cannot be made once per group
            raise MemoRefused(f"memo node {node.name!r} ({node.op_type}) reads values made per call")
        kname = self.kernel(node, host=True)
        outs = [v for v in node.outputs]
        args = ", ".join(a or "None" for a in ins)
        view = node.opdef.view

        def lines(name: str) -> list[str]:
            if len(outs) == 1:  # the op's emitter (a direct torch call) where it has one
                return emit(self._emit_ctx(node, ins, [name], [None], kname, ni.more_results), as_view=view)
            return [f"{name} = {kname}({args})"]
        def shape_syms(v):
            info = self.t.info.get(id(v))
            return syms if info is None or info.dims is None else self.dims_free(info.dims)
        if len(outs) == 1:
            self.add_member(("value", id(outs[0])), syms, outs[0].name, lines, node, False, shape_syms(outs[0]),
                            value=outs[0])
        else:
            tup = self.add_member(("node", id(node)), syms, f"{node.name}_res", lines, node, False, syms)
            for k, v in enumerate(outs):
                if v is not None:
                    self.add_member(("value", id(v)), syms, v.name, lambda n, k=k: [f"{n} = {tup}[{k}]"], node,
                                    False, shape_syms(v))

    def kernel(self, node: Node, host: bool) -> str:
        name = self.names.new(node.name or node.op_type, "k_")
        od = node.opdef
        attrs = dict(node.attrs)
        if "_device" in od.attrs:
            attrs["_device"] = torch.device("cpu") if host else self.device
        fn = None
        if self.device.type == "cpu" and any(x is not None and x.is_const for x in node.inputs):
            # constant scales, zero points, tables read and checked once, not per call
            fn = bound_kernel(od, [None if x is None else x.const if x.is_const else COMPUTED for x in node.inputs],
                              dict(node.attrs))
            self.bound_kernels += fn is not None
        self.ns[name] = fn or (partial(od.fn, **attrs) if attrs else od.fn)
        return name

    def _emit_ctx(self, node: Node, ins: list, outs: list, bufs: list, kname: str, more: bool = False) -> Emit:
        t = self.t
        info = [None if v is None else t.info.get(id(v)) for v in node.inputs]
        oinfo = [None if v is None else t.info.get(id(v)) for v in node.outputs]
        return Emit(node, ins, outs, bufs, kname,
                    [None if i is None else i.dims for i in info], [None if i is None else i.dims for i in oinfo],
                    [None if i is None else i.dtype for i in info], [None if i is None else i.dtype for i in oinfo],
                    [None if i is None else i.sval for i in info], self.src, more,
                    self.device.type == "cpu" or bool(getattr(node, "shape_of", False)) or node.opdef.host)

    def _view(self, step, ni) -> None:
        node = ni.node
        v = node.outputs[0]
        src = node.inputs[0]
        info = self.t.of(v)
        hit = self.member.get(("value", id(src)))
        deps_ok = all(i == 0 or x is None or x.is_const or self.plan.cls.get(id(x)) == "sym"
                      for i, x in enumerate(node.inputs))
        syms = self.dims_free(info.dims)
        for x in node.inputs[1:]:
            if x is not None and not x.is_const:
                sv = self.t.of(x).sval
                syms |= self.dims_free(sv.flat()) if sv is not None else frozenset({"<data>"})
        # a view of a group member is made with the member (once per symbol values), when the
        # strides say it is a view: a reshape that must copy would give a copy that goes stale
        strides = self._view_strides(node, src, info) if hit is not None and deps_ok else None
        if hit is not None and deps_ok and strides is not None and self.is_input_only(syms | hit[0].symbols):
            g, sname = hit
            # the view emitters of the ops whose strides are followed need no shape tensors: their
            # parameters are ints of the program (None stands for the shape inputs)
            ins = [sname] + [None] * (len(node.inputs) - 1)

            same = same_dims(self.t.of(src).dims, info.dims)

            def lines(name: str) -> list[str]:
                if node.op_type in _RESHAPES and same:  # the tensor itself: view() would restride its
                    return [f"{name} = {ins[0]}"]         # size-1 dims, and a channels-last one then reads as NCHW
                if node.op_type in _RESHAPES:  # view() never copies: the strides said it is a view
                    return [f"{name} = {ins[0]}.view({self._dims_tuple(v)})"]
                return emit(self._emit_ctx(node, ins, [name], [None], "None"), as_view=True, default=False)
            base = self.member_info[sname]
            self.add_member(("value", id(v)), syms | g.symbols, v.name, lines, node, base.buffer,
                            syms | base.shape_syms)
            self.strides[id(v)] = strides
            return
        name = self.local[id(v)] = self.names.new(v.name, "t_")
        inline: list[str] = []
        src_name = self.use(src, ni.host, inline)
        lines = emit(self._emit_ctx(node, [src_name] + [None] * (len(node.inputs) - 1), [name], [None], "None"),
                     as_view=True, default=False)
        if lines is None:  # the kernel serves: it reads the shape inputs as tensors
            ins = [src_name] + [self.use(x, ni.host, inline) for x in node.inputs[1:]]
            lines = emit(self._emit_ctx(node, ins, [name], [None], self.kernel(node, ni.host)), as_view=True)
        self._body(inline, None)
        self._body(lines, node)

    def _data(self, step, ni) -> None:
        node = ni.node
        if node.op_type in AS_VIEW and node.domain in ("", "ai.onnx"):
            return self._view(step, ni)
        if node.op_type == "Split" and all(self.plan.cls.get(id(v)) == "view" for v in node.outputs):
            return self._split_views(ni)
        inline: list[str] = []
        # inputs the kernel reads as numbers on the host (axes, pads, repeats: the op's shape
        # inputs) are given as host tensors: a device copy would be read back with a sync per call
        host_in = node.opdef.shape_deps
        ins = [None if i in ni.drop_inputs else self.use(x, ni.host or i in host_in, inline)
               for i, x in enumerate(node.inputs)]
        self.dropped += len(ni.drop_inputs)
        outs, bufs = [], []
        for v in node.outputs:
            if v is None:
                outs.append(None)
                bufs.append(None)
                continue
            c = self.plan.cls[id(v)]
            if c in ("arena", "slot"):  # the (arena) view is the value: the kernel writes into it
                name = self.local[id(v)] = self._arena_member(v) if c == "arena" else self._slot_member(v)
                outs.append(name)
                bufs.append(name)
                continue
            name = self.local[id(v)] = self.names.new(v.name, "t_")
            outs.append(name)
            if c == "kvslot":  # the KV cache's storage is found (the past in place, or copied) first
                concat, _ = self.plan.slots[id(v)]
                past = self.use(concat.inputs[0], False, inline)
                inline.append(f"{name} = st.kv[{self.kv_index(concat)}].prepare({past}, {self._dims_tuple(v)})")
                bufs.append(name)
                self.inplace_inputs += 1
            elif c == "output":
                k = len(self.output_values)
                self.output_values.append(v)
                inline.append(f"{name} = st.out({k}, {self._dims_tuple(v)})")
                bufs.append(name)
            else:
                bufs.append(None)
        self._body(inline, None)
        if len(node.outputs) == 1 and self.plan.cls[id(node.outputs[0])] == "kv":
            args = ", ".join(x for x in ins if x is not None)
            self._body([f"{outs[0]} = st.kv[{self.kv_index(node)}]({args})"], node)
            return
        fed = [i for i, x in enumerate(node.inputs) if x is not None and id(x) in self.plan.slots]
        concat = node.op_type == "Concat" and node.domain in ("", "ai.onnx") and not ni.host
        if fed and concat:  # producers wrote into their slots: copy the rest
            self.inplace_inputs += len(fed)
            syms = self.dims_free(self.t.of(node.outputs[0]).dims)
            lines = []
            for i, x in enumerate(node.inputs):
                if x is None or i in fed:
                    continue
                view = self._slot_view(node, i)  # made with the group, not per call
                slot = self.add_member(("slot", id(node), i), syms, f"{x.name}_slot", lambda n, v=view: [f"{n} = {v}"])
                lines.append(f"{slot}.copy_({ins[i]})")
            self._body(lines + self._count_copied(node, fed), node)
            return
        kname = self.kernel(node, ni.host)
        self._body(emit(self._emit_ctx(node, ins, outs, bufs, kname, ni.more_results), as_view=False), node)
        if concat:
            self._body(self._count_copied(node, ()), node)

    def _split_views(self, ni) -> None:
        """The parts of a Split the memory plan made views (``_split_as_views``): narrowed from
        the input's group member with it, else where the node runs."""
        node = ni.node
        src = node.inputs[0]
        dims = [self.t.of(v).dims for v in node.outputs]
        a = norm_axes([node.attrs.get("axis", 0)], len(self.t.of(src).dims))[0]
        sizes = [self.src(d[a]) for d in dims]
        starts = [" + ".join(sizes[:k]) or "0" for k in range(len(sizes))]
        syms = self.dims_free([d[a] for d in dims])
        hit = self.member.get(("value", id(src)))
        old = self.strides.get(id(src))
        if hit is not None and old is not None and self.is_input_only(syms | hit[0].symbols):
            g, sname = hit
            base = self.member_info[sname]
            for v, start, size in zip(node.outputs, starts, sizes):
                self.add_member(("value", id(v)), syms | g.symbols, v.name,
                                lambda n, b=start, k=size: [f"{n} = {sname}.narrow({a}, {b}, {k})"], node,
                                base.buffer, syms | base.shape_syms)
                self.strides[id(v)] = old
            return
        inline: list[str] = []
        x = self.use(src, ni.host, inline)
        lines = []
        for v, start, size in zip(node.outputs, starts, sizes):
            name = self.local[id(v)] = self.names.new(v.name, "t_")
            lines.append(f"{name} = {x}.narrow({a}, {start}, {size})")
        self._body(inline, None)
        self._body(lines, node)

    def _count_copied(self, node: Node, fed) -> list[str]:
        """The bytes a Concat copies this run (memory_stats' concat_bytes_copied)."""
        total: E.Expr = E.const(0)
        for i, x in enumerate(node.inputs):
            info = None if x is None or i in fed else self.t.of(x)
            if info is None or info.dims is None or info.dtype is None:
                continue
            n: E.Expr = E.const(info.dtype.itemsize)
            for d in info.dims:
                n = E.mul(n, d.expr if isinstance(d, SymInt) else E.const(d))
            total = E.add(total, n)
        if E.as_int(total) == 0:
            return []
        return [f"st.stats['concat_bytes_copied'] += {self.src(total)}"]

    def kv_index(self, node: Node) -> int:
        if node not in self.kv_nodes:
            self.kv_nodes.append(node)
        return self.kv_nodes.index(node)

    def _slot_view(self, concat: Node, i: int) -> str:
        """Source of input ``i``'s slot in the Concat's buffer (along its axis)."""
        out = concat.outputs[0]
        buf = self._arena_member(out)
        dims = self.t.of(out).dims
        axis = concat.attrs["axis"] % len(dims)
        offset: E.Expr = E.const(0)
        for x in concat.inputs[:i]:
            if x is not None:
                d = self.t.of(x).dims[axis]
                offset = E.add(offset, d.expr if isinstance(d, SymInt) else E.const(d))
        d = self.t.of(concat.inputs[i]).dims[axis]
        return f"{buf}.narrow({axis}, {self.src(offset)}, {self.src(d)})"

    def _slot_member(self, v: Value) -> str:
        concat, i = self.plan.slots[id(v)]
        view = self._slot_view(concat, i)
        syms = self.dims_free(self.t.of(concat.outputs[0]).dims)
        return self.add_member(("value", id(v)), syms, f"t_{v.name}", lambda n: [f"{n} = {view}"])

    def _view_strides(self, node: Node, src: Value, info) -> tuple | None:
        """The strides of a view op's output from its input's (a group member), or None when the
        op is not a view there (a reshape that has to copy) or its strides are not followed."""
        old = self.strides.get(id(src))
        if old is None or info.dims is None or node.domain not in ("", "ai.onnx"):
            return None
        op, dims = node.op_type, info.dims
        try:
            if op in _RESHAPES:
                return _reshape_strides(self.t.of(src).dims, old, dims)
            if op == "Transpose":
                perm = _perm(len(old), node.attrs.get("perm"))
                return tuple(old[p] for p in perm)
            if op == "Slice":
                return self._slice_strides(node, old)
            if op == "Expand":  # new leading axes and axes of 1 that grow read one element: stride 0
                pad = len(dims) - len(old)
                src_dims = (1,) * pad + tuple(self.t.of(src).dims)
                full = (0,) * pad + tuple(old)
                # a dim kept as it is keeps its stride, a literal 1 gets stride 0 whatever it grows
                # to: neither asks a symbol's value (no guard)
                return tuple(st if same_dim(sd, d) else 0 if is_one(sd) or (sd == 1 and d != 1) else st
                             for sd, d, st in zip(src_dims, dims, full))
        except NeedsConcrete:
            return None
        return None

    def _slice_strides(self, node: Node, old: tuple) -> tuple | None:
        if node.opset >= 10:
            vals = [None if x is None else self.t.of(x).sval for x in node.inputs[1:5]]
            if vals[0] is None or vals[1] is None or (len(node.inputs) > 3 and node.inputs[3] is not None
                                                      and vals[2] is None):
                return None
            axes = None if len(vals) < 3 or vals[2] is None else vals[2].flat()
            steps = None if len(vals) < 4 or vals[3] is None else vals[3].flat()
            if len(node.inputs) > 4 and node.inputs[4] is not None and steps is None:
                return None
        else:
            axes, steps = node.attrs.get("axes"), None
        n = len(old)
        if steps is None:
            return old
        axes = list(range(len(steps))) if axes is None else [a % n for a in axes]
        out = list(old)
        for a, sp in zip(axes, steps):
            if not isinstance(sp, int) or sp <= 0:
                return None  # a negative step flips: the kernel copies
            out[a] = out[a] * sp
        return tuple(out)

    def _dims_tuple(self, v: Value) -> str:
        items = [self.src(d) for d in self.t.of(v).dims]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    def _arena_member(self, v: Value) -> str:
        i = self.arena_index[id(v)]
        info = self.t.of(v)
        dims = [self.src(d) for d in info.dims]
        stride_dims = _strides(info.dims, info.layout)
        strides = [self.src(x) for x in stride_dims]
        a = self.arena_dtypes.index(info.dtype)
        shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        stride = "(" + ", ".join(strides) + ("," if len(strides) == 1 else "") + ")"
        syms = self.dims_free(info.dims)
        self.strides[id(v)] = stride_dims
        return self.add_member(("value", id(v)), syms, f"t_{v.name}",
                               lambda n: [f"{n} = A[{a}].as_strided({shape}, {stride}, off[{i}])"])

    def _dyn(self, step, ni) -> None:
        node = ni.node
        inline: list[str] = []
        ins = [self.use(x, ni.host, inline) for x in node.inputs]
        outs = []
        for v in node.outputs:
            outs.append(None if v is None else self.names.new(v.name, "t_"))
            if v is not None:
                self.local[id(v)] = outs[-1]
        self._body(inline, None)
        args = ", ".join(a if a is not None else "None" for a in ins)
        targets = _unpack(outs)
        if node.subgraphs:
            k = len(self.sub_nodes)
            self.sub_nodes.append(node)
            outer: dict[str, str] = {}
            for sub in node.subgraphs.values():
                for v in sub.outer:
                    if v.name not in outer:
                        outer[v.name] = self.use(v, ni.host, inline)
            self._body(inline, None)
            pairs = ", ".join(f"{n!r}: {src}" for n, src in outer.items())
            sep = ", " if args else ""
            call = f"st.sub[{k}]({args}{sep}_outer={{{pairs}}})"
        elif node.opdef.infer is not None and node.opdef.shape_deps and not _bounded_by_input(node):
            # sizes from data: st.sized runs the shape function on the values and refuses a
            # negative or absurd size before the kernel allocates anything (ops/limits.py)
            k = len(self.sized_nodes)
            self.sized_nodes.append((node, [self.t.of(v).dtype if v is not None else None for v in node.outputs]))
            call = f"st.sized({k}, {self.kernel(node, ni.host)}, ({args}{',' if args else ''}))"
        else:
            call = f"{self.kernel(node, ni.host)}({args})"
        # a kernel of optional extra results (MaxPool's Indices) gives a tuple: the node's is the first
        wrap = ni.more_results and not node.subgraphs
        self._body([f"{targets} = {f'first({call})' if wrap else call}"], node)
        # the dims of the result are runtime symbols from here on
        binds = []
        for sym, (v, axis) in self.t.runtime_symbols.items():
            if any(v is o for o in node.outputs):
                self.symvar[sym] = self.names.new(sym, "u_")
                binds.append(f"{self.symvar[sym]} = {self.local[id(v)]}.shape[{axis}]")
        self._body(binds, node)

    def _body(self, lines: list[str], node: Node | None) -> None:
        """Lines of ``run``: setup lines (``node`` None) wait for the node whose lines follow."""
        if node is None:
            self._pending.extend(lines)
            return
        syms: frozenset[str] = frozenset()
        for v in list(node.inputs) + list(node.outputs):
            info = None if v is None or v.is_const else self.t.info.get(id(v))
            if info is not None and info.dims is not None:
                syms |= self.dims_free(info.dims)
        ni = self._ni
        body = self._pending + [x for x in lines if not x.startswith("st.stats[")]
        counters = [x for x in lines if x.startswith("st.stats[")]  # host counters: run either way
        self.items.append(Item(body, node, syms, host=bool(ni is not None and ni.host),
                               bounding=bool(ni is not None and ni.kind == "dyn"), counters=counters,
                               setup=len(self._pending)))
        self._pending = []

    # ---- regions -------------------------------------------------------------------------------
    def _regions(self, params: list[str]) -> list[Region]:
        """The regions static impls may serve: of two kernels or more, keyed by symbols of the
        signature or of break points before them."""
        found = partition(self.items, self.member_info, self.symvar, params, self.results,
                          self.device.type == "cuda")
        keep = [r for r in found if r.static and all(x in self.symvar for x in r.syms)]
        for k, r in enumerate(keep):
            r.index = k
        return keep

    def _step_plan(self, params: list[str], groups: list[Group]) -> tuple[StepPlan | None, str]:
        """The whole-step function of this specialization (step_graph.py), or why there is none."""
        kv = []
        for i, node in enumerate(self.kv_nodes):
            past, out = node.inputs[0], node.outputs[0]
            dims = self.t.of(past).dims
            axis = node.attrs.get("axis", 0) % len(dims)
            d = dims[axis]
            free = self.free(d)
            growth = shift = None
            if len(free) == 1:  # the past's length is g + c (c free of g): g grows, P holds g + c
                g = next(iter(free))
                rest = self.env.canon(E.sub(E.sym(g), self.env.canon(d.expr if isinstance(d, SymInt) else d)))
                if g not in rest.free:
                    growth, shift = g, E.source(rest, self._symname)
            new_len = self.src(self.t.of(node.inputs[1]).dims[axis]) if len(node.inputs) == 2 else None
            total = self.src(self.t.of(out).dims[axis])
            kv.append(KVInfo(i, axis, self.local.get(id(past)), self.local.get(id(out)), growth, new_len, shift,
                             total))
        out_dtypes = {k: repr(self.t.of(v).dtype) for k, v in enumerate(self.output_values)}
        input_dims = {self.local[id(v)]: [self.src(x) for x in self.t.of(v).dims or ()] for v in self.t.input_values}
        keysyms = [s for s in self.sig_symbols if s not in self.env.replace]
        try:
            plan = step_plan(self.items, kv, self.member_info, self.sval_members, self.symvar, keysyms,
                             params, self.results, out_dtypes, self.device.type == "cuda",
                             [(grp.symbols, [line for line, _ in grp.lines]) for grp in groups],
                             self._fills(), input_dims)
        except Refused as e:
            return None, str(e)
        return plan, ""

    def _fills(self) -> dict[str, tuple]:
        """Members that hold a mask made from shapes that is the same everywhere in this
        specialization (a causal mask of a one-token step): name -> (value, dtype, dims sources,
        on the device)."""
        out = {}
        for name, (v, on_device) in self.member_value.items():
            info = self.t.of(v)
            a = info.affine
            if a is None or a.pred is None or info.dims is None:
                continue
            try:
                truth = affine.always(a, self.env)
            except NeedsConcrete:
                truth = None
            if truth is not None:
                out[name] = (truth, repr(info.dtype), [self.src(x) for x in info.dims], on_device)
        return out

    def _put_region(self, r: Region, put) -> None:
        """``run``'s lines for region ``r``: its static impl for the key when there is one, else
        its lines inline (the dynamic impl); the counters of its nodes either way."""
        key = _tuple([self.symvar[x] for x in sorted(r.syms)])
        put(f"o = st.static({r.index}, {key}, {_tuple(r.live_in)}) if S else None")
        put("if o is None:")
        for i in r.items:
            it = self.items[i]
            for k, line in enumerate(it.lines):
                put(line, it.node if k >= it.setup else None, indent=2)
        if r.live_out:
            put("else:")
            put(f"{', '.join(r.live_out)}{',' if len(r.live_out) == 1 else ''} = o", indent=2)
        for i in r.items:
            for line in self.items[i].counters:
                put(line, self.items[i].node)

    # ---- assembling the source ------------------------------------------------------------------
    def assemble(self) -> tuple[str, dict[int, Node], list[Group]]:
        groups = sorted(self.groups.values(), key=lambda g: (len(g.symbols), g.first))
        pos = {s: i for i, s in enumerate(self.sig_symbols)}
        for i, g in enumerate(groups):
            g.index = i
            g.key = tuple(sorted(pos[s] for s in g.symbols))
        out: list[str] = []
        line_nodes: dict[int, Node] = {}

        def put(line: str, node: Node | None = None, indent: int = 1) -> None:
            out.append("    " * indent + line)
            if node is not None:
                line_nodes[len(out)] = node
        sig_unpack = ", ".join(self.symvar[s] for s in self.sig_symbols)
        # groups
        for g in groups:
            out.append(f"def g{g.index}(st, sig):")
            put(f"# group {g.index}: depends on {sorted(g.symbols) or 'no symbol'}")
            if self.sig_symbols:
                put(f"{sig_unpack}{',' if len(self.sig_symbols) == 1 else ''} = sig")
            put("A, off, cur = st.typed, st.off, st.cur")
            for h in groups[:g.index]:
                if h.symbols < g.symbols or not h.symbols:
                    if h.members:
                        put(f"{', '.join(h.members)}{',' if len(h.members) == 1 else ''} = cur[{h.index}]")
            for line, node in g.lines:
                put(line, node)
            put(f"return ({', '.join(g.members)}{',' if len(g.members) == 1 else ''})")
            out.append("")
        # regions: their lines as functions, what static impls are built from
        param_list = [self.local[id(v)] for v in self.t.input_values]
        self.regions = self._regions(param_list)
        for r in self.regions:
            symvars = [self.symvar[x] for x in sorted(r.syms)]
            out.append(f"def r{r.index}({', '.join(symvars + r.live_in)}):")
            put(f"# region {r.index}: depends on {sorted(r.syms) or 'no symbol'}")
            for i in r.items:
                for line in self.items[i].lines:
                    put(line, self.items[i].node)
            put(f"return ({', '.join(r.live_out)}{',' if len(r.live_out) == 1 else ''})")
            out.append("")
        self.step, self.step_refused = self._step_plan(param_list, groups)
        if self.step is not None:
            out.extend(self.step.source.splitlines() + [""])
            if self.step.prep:
                out.extend(self.step.prep.splitlines() + [""])
        # run
        params = ", ".join(param_list)
        out.append(f"def run(st{', ' if params else ''}{params}):")
        for d in self.t.input_dims:
            if d.defines:
                put(f"{self.symvar[d.symbol]} = {self.local[id(self.t.input_values[d.input])]}.shape[{d.axis}]")
        put(f"sig = ({sig_unpack}{',' if len(self.sig_symbols) == 1 else ''})")
        if self.step is not None:  # the whole step over KV storages (runtime/decode_graph.py), else the lines
            put("if st.step is not None:")
            put(f"o = st.step(sig, {_tuple(param_list)})", indent=2)
            put("if o is not None:", indent=2)
            put("return o", indent=3)
        put("if sig != st.sig:")
        put("st.enter(sig)", indent=2)
        if any(g.members for g in groups):
            put("cur = st.cur")
        for g in groups:
            if g.members:
                put(f"{', '.join(g.members)}{',' if len(g.members) == 1 else ''} = cur[{g.index}]")
        if self.regions:
            put("S = st.static_now()")
        start = {r.items[0]: r for r in self.regions}
        inside = {i for r in self.regions for i in r.items}
        for i, it in enumerate(self.items):
            r = start.get(i)
            if r is not None:
                self._put_region(r, put)
            elif i not in inside:
                for k, line in enumerate(it.lines + it.counters):
                    put(line, it.node if k >= it.setup else None)
        results = self.results
        put(f"return ({', '.join(results)}{',' if len(results) == 1 else ''})")
        out.append("")
        # accepts: last, with every guard the code's making asked (the step plan's included)
        out.append("def accepts(shapes):")
        ranks = self.t.input_ranks
        conds = []
        for i, r in enumerate(ranks):
            has = f"shapes[{i}] is not None and len(shapes[{i}]) == {r}"
            conds.append(f"shapes[{i}] is None" if r is None else has)
        put("if not (" + " and ".join(conds or ["True"]) + "):")
        put("return False", indent=2)
        for d in self.t.input_dims:
            if d.defines:
                put(f"{self.symvar[d.symbol]} = shapes[{d.input}][{d.axis}]")
        eq = [f"shapes[{d.input}][{d.axis}] == {self.symvar[d.symbol]}" for d in self.t.input_dims if not d.defines]
        guards = [g for g in self.t.guards if g.expr.free <= self.input_symbols]
        self.accepted_guards = [g.key for g in guards]
        conds = eq + [f"({gd.source(self._symname)})" for gd in guards]
        put("return " + (" and ".join(conds) if conds else "True"))
        out.append("")
        return "\n".join(out) + "\n", line_nodes, groups


def _tuple(names: list[str]) -> str:
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"


def _unpack(outs: list) -> str:
    """Targets of a call: kernels of several outputs may return more than the node has."""
    if len(outs) == 1:
        return outs[0] or "_"
    return ", ".join(o or "_" for o in outs) + ", *_"


def _strides(dims, layout: str | None) -> tuple:
    """Contiguous strides, or channels-last ones (N, C, H, W -> H*W*C, 1, W*C, C)."""
    if layout == "nhwc" and len(dims) == 4:
        n, c, h, w = dims
        return (h * w * c, 1, w * c, c)
    return _contiguous(dims)


def _contiguous(dims) -> tuple:
    acc, out = 1, []
    for d in reversed(dims):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


def _reshape_strides(old_shape, old_strides, new_shape) -> tuple | None:
    """The strides of ``view(new_shape)`` of a tensor of these sizes and strides, or None when the
    reshape copies. torch's rule (``computeStride``), with every decision taken on expressions and
    none asked of the symbols' values, so that no guard comes out of it: what is found is a view
    for every value of the symbols, and what is not is a copy, right for every value too. (Asking
    made guards such as ``batch == 1``: one specialization for batch 1 and another for the rest.)
    - the same shape: the same strides (a layout pass's no-op reshape);
    - strides that are the sizes' contiguous strides (dims of a literal 1 aside: their stride
      addresses nothing): any shape of that numel, with its contiguous strides;
    - otherwise chunk by chunk: a dim joins the next chunk when it is a literal 1 or its stride is
      that chunk's extent (as expressions), and the new dims must rebuild each chunk's numel as
      the same expression. A symbolic dim is never taken as 1 (``is_one``): a view that holds
      only when it is 1 is left to a copy."""
    if len(old_shape) == len(new_shape) and all(same_dim(o, n) for o, n in zip(old_shape, new_shape)):
        return tuple(old_strides)
    if all(same_dim(st, c) or is_one(d) for d, st, c in zip(old_shape, old_strides, _contiguous(old_shape))):
        return _contiguous(new_shape)
    if any(type(d) is int and d == 0 for d in old_shape):  # no elements: any strides address them
        return _contiguous(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel, view_numel = 1, 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel = tensor_numel * old_shape[d]
        if d == 0 or not (is_one(old_shape[d - 1]) or same_dim(old_strides[d - 1], tensor_numel * chunk_base)):
            while view_d >= 0 and (not same_dim(view_numel, tensor_numel) or is_one(new_shape[view_d])):
                new_strides[view_d] = view_numel * chunk_base
                view_numel = view_numel * new_shape[view_d]
                view_d -= 1
            if not same_dim(view_numel, tensor_numel):
                return None
            if d > 0:
                chunk_base = old_strides[d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return tuple(new_strides)


_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
# ops whose shape inputs only rearrange or select the input's elements: the result never holds
# more than the input already does, so no value read from data can make it absurd (no st.sized:
# ~10 us a call, silero-vad ran seven a call after its If's)
_SIZE_BOUNDED = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Transpose"})


def _bounded_by_input(node: Node) -> bool:
    return node.op_type in _SIZE_BOUNDED and node.domain in ("", "ai.onnx")


def _output_action(plan: MemoryPlan, v: Value) -> str:
    """What the caller's copy of output ``v`` needs: ``keep`` (its memory is the caller's),
    ``clone`` (it is memory the request keeps, an input or a constant), ``check`` (a kernel result
    that may be an input or a view of one: decided at run time)."""
    c = plan.cls.get(id(v), "const" if v.is_const else "input")
    if c in ("input", "const", "sym", "memo"):
        return "clone"
    if c == "view":
        kept = ("arena", "input", "const", "memo", "sym")
        return "clone" if any(plan.cls.get(r) in kept for r in plan.roots.get(id(v), ())) else "keep"
    if c == "adopt" and id(v) in plan.outputs_needing_check:
        return "check"
    return "keep"


def build_spec(trace: Trace, device: torch.device, consts_device, consts_host, inplace: bool = True) -> SpecCode:
    """Generate and compile the code of one specialization (see the module docstring).
    ``consts_device(v)`` / ``consts_host(v)`` give a constant's tensor on the device / host;
    ``inplace``: producers write into their slot of a Concat's buffer."""
    b = _Builder(trace, device, consts_device, consts_host, inplace)
    b.build()
    source, line_nodes, groups = b.assemble()
    filename = f"<dynashape:{trace.graph.name}:{next(_ids)}>"
    code = compile(source, filename, "exec")
    ns = b.ns
    exec(code, ns)  # noqa: S102  our own generated source
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns["__symvars__"] = dict(b.symvar)
    outputs = [_output_action(b.plan, v) for v in trace.graph.outputs]
    spec = SpecCode(trace, b.plan, source, filename, ns["run"], ns["accepts"], [ns[f"g{g.index}"] for g in groups],
                    groups, b.sig_symbols, b.plan.arena, b.arena_dtypes,
                    [b.arena_dtypes.index(trace.of(a.value).dtype) for a in b.plan.arena], b.output_values,
                    b.kv_nodes, b.sub_nodes, outputs, line_nodes, ns, b.inplace_inputs,
                    tuple(i for i, name in enumerate(b.sig_symbols)
                          if any(name in a.nbytes.free for a in b.plan.arena)))
    spec.group_keys = [_key_of(g.key) for g in groups]
    spec.accepted_guards = b.accepted_guards  # what ``accepts`` checks (tests: every guard the build made)
    spec.kernel_items = sum(1 for it in b.items if it.node is not None)
    spec.bound_kernels = b.bound_kernels
    spec.sized_nodes = b.sized_nodes
    spec.step_refused = b.step_refused if b.kv_nodes else ""
    spec.input_locals = [b.local[id(v)] for v in trace.input_values]
    where = {name: (g.index, j) for g in groups for j, name in enumerate(g.members)}  # arena members
    if b.step is not None:
        spec.step = StepCode(b.step, ns["step"], {n: where[n] for n in b.step.live_in + b.step.prep_live_in
                                                  if n in where}, ns.get("prep") if b.step.prep else None)
    values = {id(v): v for n in trace.graph.nodes for v in n.inputs + n.outputs if v is not None}
    values.update((id(v), v) for v in trace.input_values)
    by_local = {name: values[i] for i, name in b.local.items() if i in values}
    for r in b.regions:
        symvars = [b.symvar[x] for x in sorted(r.syms)]
        body = [line for i in r.items for line in b.items[i].lines]
        nodes = [b.items[i].node for i in r.items if b.items[i].node is not None]
        aligned = align.plan(r, nodes, body, where, lambda n: b.member_info[n].shape_syms, by_local.get,
                             lambda v: trace.info[id(v)].dims if id(v) in trace.info else None,
                             lambda d: trace.env.canon(d.expr), b.input_symbols, b.sig_symbols)
        spec.regions.append(RegionCode(r, ns[f"r{r.index}"], symvars, body, aligned))
    spec.aligned_positions = {}
    for rc in spec.regions:
        if rc.align is not None:
            spec.aligned_positions.setdefault(rc.align.sig_pos, set()).add(rc.align.kind)
    return spec


def _key_of(positions: tuple[int, ...]):
    if not positions:
        return lambda sig: ()
    if len(positions) == 1:
        (p,) = positions
        return lambda sig: (sig[p],)
    return operator.itemgetter(*positions)
