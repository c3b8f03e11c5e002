"""How a Network gets its memory: the options, and the wiring of pool, predictor and in-place concat.

Kept out of network.py so that the run loop stays readable: this file decides, once per
Network, which outputs the pool serves (from the memory dependencies of the compile pass),
which Concats work in place and which producers feed them, and preallocates the outputs whose
shapes are static in descending size order (the order that lets the pool reuse the most).
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from ..compile.memory_deps import basic_memory_dependencies, out_of_order_memory_dependencies
from ..memory.config import MEMORY_DEPS, MemoryConfig
from ..memory.pool import MemoryPool
from ..ops.shapes import prod
from .inplace_concat import InplaceConcat


class MemoryNet(Protocol):
    """What the wiring reads and sets on the Network it sets up (the Network imports this module)."""

    graph: object
    insts: list
    memory: MemoryConfig
    engine: object
    stats: Counter
    pool: MemoryPool | None
    inplace_outputs: list

DEPS = {"in_order": basic_memory_dependencies, "out_of_order": out_of_order_memory_dependencies}
assert set(DEPS) == set(MEMORY_DEPS)


def setup_memory(net: MemoryNet) -> MemoryPool | None:
    cfg = net.memory
    net.inplace_outputs = []
    if cfg.inplace_concat:
        _setup_inplace_concats(net)
    _count_concat_copies(net)
    pool = None
    if cfg.pool:
        deps = _deps(net)
        roots = set(deps.roots)
        owner = {}
        for inst in net.insts:
            if inst.host or not inst.writes_out or inst.inplace is not None:
                continue
            for k, v in enumerate(inst.node.outputs):
                if v is not None and v.name in roots:
                    inst.pool_keys[k] = v.name
                    owner[v.name] = (inst, k)
        for inst in net.insts:
            # the storage of a Concat inside the graph comes from the pool too, under its output's
            # name: its lifetime (from its first producer on) is in the in-order dependencies
            name = inst.node.outputs[0].name if inst.inplace is not None else None
            if name in roots and cfg.memory_deps == "in_order":
                inst.inplace.pool_key = name
                owner[name] = (inst, 0)
        pool = MemoryPool(net.engine, deps, on_move=lambda user, buf: _rebind(owner[user], buf))
    net.pool = pool
    _preallocate_static(net)
    return pool


def _deps(net: MemoryNet):
    if net.memory.memory_deps != "in_order":
        return DEPS[net.memory.memory_deps](net.graph)
    written_into = {inst.node.outputs[0].name: inst.feeds.inst.node.outputs[0].name
                    for inst in net.insts if inst.feeds is not None}
    return basic_memory_dependencies(net.graph, written_into)


def _rebind(owner: tuple, record) -> None:
    inst, k = owner
    inst.rebind(k, record)


def _setup_inplace_concats(net: MemoryNet) -> None:
    """A Concat of device tensors works in place; each input's producer that writes into a given
    ``out`` and whose result only this Concat reads writes into the Concat's storage."""
    producer = {id(v): inst for inst in net.insts for v in inst.node.outputs if v is not None}
    order = {id(inst): i for i, inst in enumerate(net.insts)}
    outputs = {id(v) for v in net.graph.outputs}
    index = 0
    for inst in net.insts:
        node = inst.node
        if node.op_type != "Concat" or inst.host or inst.shape_of or not inst.writes_out:
            continue
        if any(v is None or v.is_const or v.kind != "tensor" for v in node.inputs):
            continue
        output = id(node.outputs[0]) in outputs
        # spare room along the axis only where a later run may extend the storage in place: an
        # output the caller may feed back (a KV cache's present); inside the graph, exact
        inst.inplace = plan = InplaceConcat(inst, index, net.memory.kv_growth if output else None)
        index += output
        inst.kernel = lambda *xs, out=None, _plan=plan: _plan.run(list(xs))
        inst.writes_out = False
        if output:
            net.inplace_outputs.append(inst)
        # when each input exists: graph inputs from the start, the others after their producer
        made_at = [order[id(producer[id(v)])] if id(v) in producer else -1 for v in node.inputs]
        for i, v in enumerate(node.inputs):
            feeder = producer.get(id(v))
            if (feeder is None or not feeder.single_out or not feeder.writes_out or feeder.host
                    or feeder.feeds is not None or len(v.users) != 1 or id(v) in outputs
                    or node.inputs.count(v) != 1):
                continue
            at = order[id(feeder)]
            ready = tuple(j for j, t in enumerate(made_at) if t < at)
            feeder.feeds = plan
            plan.feeders_of[id(feeder)] = (i, ready)
            if plan.first_feeder is None or at < order[id(plan.first_feeder)]:
                plan.first_feeder = feeder


def _count_concat_copies(net: MemoryNet) -> None:
    """A plain Concat copies every input: counted like the in-place one's copies, so that the
    bytes moved per step compare (a KV cache without in-place concat copies the whole past)."""
    for inst in net.insts:
        if inst.op_type != "Concat" or inst.inplace is not None or inst.shape_of or inst.host:
            continue
        def counted(*xs, out=None, _k=inst.kernel, _stats=net.stats):
            _stats["concat_bytes_copied"] += sum(x.numel() * x.element_size() for x in xs if x is not None)
            return _k(*xs, out=out)
        inst.kernel = counted


def _preallocate_static(net: MemoryNet) -> None:
    """Outputs whose shapes are static at compile time get their buffers now, largest first (in
    place Concats served by the pool too: their storage is their output)."""
    todo = []
    for inst in net.insts:
        pooled_concat = inst.inplace is not None and inst.inplace.pool_key is not None
        if not (inst.writes_out or pooled_concat) or inst.host or inst.shape_of:
            continue
        for k, v in enumerate(inst.node.outputs):
            if v is None or v.shape is None or not v.shape.is_static or inst.out_dtypes[k] is None:
                continue
            n = prod(v.shape.to_static())
            todo.append((n * inst.out_dtypes[k].itemsize, inst, k, n))
    for _, inst, k, n in sorted(todo, key=lambda t: -t[0]):
        if inst.inplace is not None:
            plan = inst.inplace
            plan.flat = net.pool.get(plan.pool_key, n, inst.out_dtypes[k], dynamic=True)
            plan.owned = plan.flat.view(tuple(inst.node.outputs[k].shape.to_static()))
            continue
        inst.buffers[k] = inst._take(k, n, inst.out_dtypes[k])
        inst.capacity[k] = n
