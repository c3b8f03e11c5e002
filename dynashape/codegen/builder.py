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

``_Builder`` is one class in parts, a file each: this file holds its state, the sources of dims
and values, the groups and the order of the steps; ``node_lines.py`` writes each node's lines,
``views.py`` names arena views, Concat slots and views of group members, ``strides.py`` follows
strides through view ops, ``assemble.py`` lays out the source and ``guards.py`` writes
``accepts``. ``spec.py`` compiles the source into a ``SpecCode`` (``spec_code.py``).
"""

from __future__ import annotations

from functools import partial

import torch

from ..compile.memory_plan import plan_memory
from ..compile.shape_program import Trace
from ..ir import Node, Value
from ..ops.conv import conv1d
from ..ops.cpu_conv import conv2d as cpu_conv2d
from ..ops.ort_math import sigmoid, tanh
from ..ops.registry import COMPUTED, bound_kernel
from ..ops.tuned_conv import conv2d_op
from ..shape import expr as E
from ..shape.symint import SymInt
from .assemble import Assembly
from .emitters import Emit
from .names import _ident, _Names
from .node_lines import NodeLines
from .regions import Item, Member
from .spec_code import Group
from .step_graph import HELPERS, StepPlan
from .strides import Strides
from .views import Views


def first_result(r):
    """A kernel of optional extra outputs called without out= gives a tuple, or its one tensor."""
    return r[0] if isinstance(r, (tuple, list)) else r


class _Builder(NodeLines, Views, Strides, Assembly):
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
