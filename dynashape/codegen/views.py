"""The code builder's views: arena views, Concat slots and views of group members.

A view of memory the request keeps (the arena, a Concat's buffer) is made in the group of the
symbols its dims depend on, once per their values; a view op over such a member joins it there
when its strides (``strides.py``) say it stays a view. What cannot be made once runs in ``run``.
"""

from __future__ import annotations

from ..ir import Node, Value
from ..ops.shapes import norm_axes
from ..shape import expr as E
from ..shape.symint import SymInt, same_dims
from .emitters import emit
from .strides import _RESHAPES, _strides


class Views:
    """The code builder's part (``builder._Builder``) that names views: what kernels write into
    and read through without a copy."""

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

