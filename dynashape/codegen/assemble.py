"""The code builder's last step: the groups, regions, whole-step function and ``run`` as one source."""

from __future__ import annotations

from ..compile import affine
from ..ir import Node
from ..shape import expr as E
from ..shape.symint import NeedsConcrete, SymInt
from . import tokens
from .dead_locals import drop_dead
from .guards import accepts_source
from .regions import Region, partition
from .spec_code import Group
from .step_graph import KVInfo, Refused, StepPlan, step_plan


class Assembly:
    """The code builder's part (``builder._Builder``) that lays out the source from its groups and items."""

    def _regions(self, params: list[str]) -> list[Region]:
        """The regions static impls may serve: of two kernels or more, keyed by symbols of the
        signature or of break points before them."""
        cut = None
        if tokens.cuts(self.device):  # per-token parts of a transformer apart from its attention
            info, env = self.t.info, self.env
            cut = tokens.cut_for(self.items, lambda v: info[id(v)].dims if id(v) in info else None,
                                 lambda d: env.canon(d.expr), self.input_symbols)
        found = partition(self.items, self.member_info, self.symvar, params, self.results,
                          self.device.type == "cuda", cut)
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
        run_at = len(out)
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
        out, line_nodes = _with_dels(out, run_at, line_nodes)
        out.append("")
        # accepts: last, with every guard the code's making asked (the step plan's included)
        source, self.accepted_guards = accepts_source(self.t, self.symvar, self.input_symbols, self._symname)
        out.extend(source)
        out.append("")
        return "\n".join(out) + "\n", line_nodes, groups


def _with_dels(out: list[str], run_at: int, line_nodes: dict[int, Node]) -> tuple[list[str], dict[int, Node]]:
    """``run``'s body (from ``out[run_at + 1]`` on) with its dead tensor locals deleted
    (dead_locals.py), and ``line_nodes`` (1-based line numbers) moved with the lines."""
    body, origin = drop_dead(out[run_at + 1:])
    moved = {k: v for k, v in line_nodes.items() if k <= run_at + 1}
    for j, i in enumerate(origin):
        node = line_nodes.get(run_at + 2 + i) if i >= 0 else None
        if node is not None:
            moved[run_at + 2 + j] = node
    return out[:run_at + 1] + body, moved


def _tuple(names: list[str]) -> str:
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
