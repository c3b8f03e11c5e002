"""Memory dependencies: which node outputs must never share memory.

The memory pool lets values share one buffer when they are never needed at the same time. Two
passes say when that is, from the compiled graph alone:

- ``basic_memory_dependencies``: nodes run one after another in the graph's (topological) order.
  A value lives from its producer to its last reader; two values conflict iff those intervals
  overlap. A node's inputs and outputs overlap at that node, so they never share.
- ``out_of_order_memory_dependencies``: any two nodes with no path between them may run at the
  same time. ``v`` can hand its memory to ``w`` only if every node touching ``v`` happens before
  ``w``'s producer in the DAG (or the reverse). This relation contains the basic one.

Only values that *own* memory are keyed: node outputs that are not views, not constants, not
produced by a shape_of node and not graph outputs. A view (Reshape, Squeeze, Identity...) owns
nothing: it aliases its first input's memory, so that memory lives as long as the view is read.
Owners whose memory the runtime does not take from the pool (data-dependent ops, kernels whose
result is adopted as is) are still keyed, with ``pooled`` False: a pooled value may conflict
with them, and the integrator may want to know about them.

A node with subgraphs (If, Loop, Scan) reads every outer value its bodies read. Its bodies are
separate networks with their own pools and their own dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph, Node, Value, torch_dtype
from ..ops.registry import OpDef, lookup


@dataclass(frozen=True)
class OwnedValue:
    """A value with memory of its own. Positions are node indices in the graph's order;
    ``last == number of nodes`` when a graph output aliases it (read when outputs are collected)."""

    name: str
    first: int  # index of the producer
    last: int  # index of the last node reading it, through views
    pooled: bool  # False: the runtime adopts a fresh tensor for it instead of asking the pool


class MemoryDeps:
    """The conflict relation over the owned values of one graph, keyed by value name."""

    kind = "abstract"

    def __init__(self, owned: dict[str, OwnedValue], aliases: dict[str, frozenset[str]], num_nodes: int) -> None:
        self.owned = owned
        self.num_nodes = num_nodes
        self._aliases = aliases
        # the names the runtime asks the pool for, in producer order
        self.roots: tuple[str, ...] = tuple(n for n, o in owned.items() if o.pooled)

    def _get(self, name: str) -> OwnedValue:
        try:
            return self.owned[name]
        except KeyError:
            raise KeyError(f"{name!r} owns no memory in this graph (a view, constant, shape_of value, "
                           f"graph input or output?); ask with the root value's name") from None

    def conflicts(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` must live in disjoint memory. A value never conflicts with itself."""
        va, vb = self._get(a), self._get(b)
        return va is not vb and self._conflict(va, vb)

    def conflict_set(self, name: str) -> frozenset[str]:
        """Every other owned value ``name`` must not share memory with."""
        v = self._get(name)
        return frozenset(o.name for o in self.owned.values() if o is not v and self._conflict(v, o))

    def live_interval(self, name: str) -> tuple[int, int]:
        """(first, last) node positions of in-order execution during which the memory is in use."""
        v = self._get(name)
        return v.first, v.last

    def is_pooled(self, name: str) -> bool:
        return self._get(name).pooled

    def aliases_of(self, name: str) -> frozenset[str]:
        """The owned values whose memory ``name`` may be (its view root; itself for an owner;
        empty for values aliasing inputs or constants)."""
        return self._aliases.get(name, frozenset())

    def _conflict(self, a: OwnedValue, b: OwnedValue) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self.owned)} owned, {len(self.roots)} pooled>"


class BasicMemoryDeps(MemoryDeps):
    kind = "basic"

    def _conflict(self, a: OwnedValue, b: OwnedValue) -> bool:
        return a.first <= b.last and b.first <= a.last


class OutOfOrderMemoryDeps(MemoryDeps):
    kind = "out_of_order"

    def __init__(self, owned: dict[str, OwnedValue], aliases: dict[str, frozenset[str]], num_nodes: int,
                 touches: dict[str, int], ancestors: list[int]) -> None:
        super().__init__(owned, aliases, num_nodes)
        self._touches = touches  # name -> bitset of node indices that write or read the memory
        self._ancestors = ancestors  # node index -> bitset of its strict ancestors

    def _before(self, a: OwnedValue, b: OwnedValue) -> bool:
        """Every node touching ``a`` happens before ``b`` is written: ``b`` may take ``a``'s memory."""
        return self._touches[a.name] & ~self._ancestors[b.first] == 0

    def _conflict(self, a: OwnedValue, b: OwnedValue) -> bool:
        return not (self._before(a, b) or self._before(b, a))


def basic_memory_dependencies(graph: Graph, written_into: dict[str, str] | None = None) -> BasicMemoryDeps:
    """``written_into``: value -> the owned value whose memory its producer writes it into (a
    producer writing into its slot of an in-place Concat's storage): that memory then lives
    from the earliest such producer on."""
    owned, aliases, _ = _analyse(graph, written_into or {})
    return BasicMemoryDeps(owned, aliases, len(graph.nodes))


def out_of_order_memory_dependencies(graph: Graph) -> OutOfOrderMemoryDeps:
    owned, aliases, touches = _analyse(graph)
    return OutOfOrderMemoryDeps(owned, aliases, len(graph.nodes), touches, _ancestor_bitsets(graph))


# ---- the analysis both passes share -----------------------------------------------------------

def _opdef(node: Node) -> OpDef:
    od = getattr(node, "opdef", None)  # set by resolve_ops; hand-built IR may not have it yet
    return od if od is not None else lookup(node.op_type, node.domain, node.opset, node.name)


def _reads(node: Node) -> list[Value]:
    vals = [v for v in node.inputs if v is not None]
    for sub in node.subgraphs.values():
        vals.extend(sub.outer)
    return vals


def _non_tensor(node: Node) -> bool:
    return any(v is not None and v.kind != "tensor" for v in (*node.inputs, *node.outputs))


def _may_hold_inputs(node: Node, od: OpDef) -> bool:
    """Whether the node's result may contain its input tensors themselves: a sequence or optional
    holds the tensors put into it, and a body may return an outer value as is. A kernel written
    to fill ``out`` is called without one when an output's dtype is unknown, and may then return
    a view of an input (a transpose, a same-type cast). Other kernels return fresh tensors."""
    if node.subgraphs or _non_tensor(node):
        return True
    return od.writes_out and not all(_known_dtype(v) for v in node.outputs if v is not None)


def _is_view(node: Node, od: OpDef) -> bool:
    # as the runtime decides: with sequences or optionals around there is no view
    return od.view and bool(node.inputs) and node.inputs[0] is not None and not _non_tensor(node)


def _known_dtype(v: Value) -> bool:
    try:
        torch_dtype(v.elem_type)
    except KeyError:
        return False
    return True


def _pooled(v: Value, node: Node, od: OpDef) -> bool:
    """Whether the runtime writes ``v`` into a buffer it asks the pool for."""
    return (od.writes_out and od.infer is not None and not od.data_dependent and not od.host
            and not _may_hold_inputs(node, od) and v.kind == "tensor" and _known_dtype(v))


def _analyse(graph: Graph, written_into: dict[str, str] | None = None
             ) -> tuple[dict[str, OwnedValue], dict[str, frozenset[str]], dict[str, int]]:
    """Owned values with their lifetimes, each value's alias set, and the bitset of the nodes
    touching each owned value's memory (producer, readers through aliases, end of graph)."""
    n = len(graph.nodes)
    end_bit = 1 << n  # "the outputs are collected": after every node
    graph_outputs = {id(v) for v in graph.outputs}
    alias: dict[int, frozenset[str]] = {}  # id(value) -> names of the owned values it may alias
    first: dict[str, int] = {}
    pooled: dict[str, bool] = {}
    touches: dict[str, int] = {}

    def touch(v: Value, bit: int) -> None:
        for r in alias.get(id(v), ()):
            touches[r] |= bit

    for i, node in enumerate(graph.nodes):
        od = _opdef(node)
        bit = 1 << i
        reads = _reads(node)
        for v in reads:
            touch(v, bit)
        view = _is_view(node, od)
        shape_of = bool(getattr(node, "shape_of", False))
        held = frozenset().union(*(alias.get(id(v), ()) for v in reads)) if _may_hold_inputs(node, od) else frozenset()
        for v in node.outputs:
            if v is None:
                continue
            if view:
                alias[id(v)] = alias.get(id(node.inputs[0]), frozenset())
                continue
            mine = held
            if not (shape_of or v.is_const or id(v) in graph_outputs):
                if v.name in first:
                    raise ValueError(f"value name {v.name!r} is produced twice in graph {graph.name!r}")
                first[v.name], pooled[v.name], touches[v.name] = i, _pooled(v, node, od), bit
                mine = mine | {v.name}
            alias[id(v)] = mine
    for v in graph.outputs:
        touch(v, end_bit)
    for v, into in (written_into or {}).items():
        if v in first and into in first:
            first[into] = min(first[into], first[v])
            touches[into] |= touches[v]

    owned = {name: OwnedValue(name, f, touches[name].bit_length() - 1, pooled[name]) for name, f in first.items()}
    aliases = {v.name: alias[id(v)] for v in graph.values.values() if alias.get(id(v))}
    for name in owned:  # values missing from graph.values (hand-built IR) still answer for themselves
        aliases.setdefault(name, frozenset({name}))
    return owned, aliases, touches


def _ancestor_bitsets(graph: Graph) -> list[int]:
    """For each node (graph order is topological), the bitset of nodes with a path to it."""
    producer: dict[int, int] = {}
    ancestors: list[int] = []
    for i, node in enumerate(graph.nodes):
        acc = 0
        for v in _reads(node):
            p = producer.get(id(v))
            if p is not None:
                acc |= ancestors[p] | (1 << p)
        ancestors.append(acc)
        for v in node.outputs:
            if v is not None:
                producer[id(v)] = i
    return ancestors
