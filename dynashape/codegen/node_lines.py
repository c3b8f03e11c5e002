"""The code builder's lines per kind of node (``NodeInfo.kind`` of the shape program).

``sym`` and ``dead`` nodes write nothing; ``memo`` nodes (host values from shapes only) are made in
their group when read; ``data`` nodes are one kernel call into the memory plan's buffers (or a view,
a Concat over slots, a KV append); ``dyn`` nodes are break points whose sizes come from data.
"""

from __future__ import annotations

from ..compile.memory_plan import AS_VIEW
from ..ir import Node
from .emitters import emit
from .spec_code import MemoRefused


class NodeLines:
    """The code builder's part (``builder._Builder``) that writes each node's lines."""

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


def _unpack(outs: list) -> str:
    """Targets of a call: kernels of several outputs may return more than the node has."""
    if len(outs) == 1:
        return outs[0] or "_"
    return ", ".join(o or "_" for o in outs) + ", *_"


# ops whose shape inputs only rearrange or select the input's elements: the result never holds
# more than the input already does, so no value read from data can make it absurd (no st.sized:
# ~10 us a call, silero-vad ran seven a call after its If's)
_SIZE_BOUNDED = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Transpose"})


def _bounded_by_input(node: Node) -> bool:
    return node.op_type in _SIZE_BOUNDED and node.domain in ("", "ai.onnx")

