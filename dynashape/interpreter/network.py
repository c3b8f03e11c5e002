"""Network: one PrimitiveInst per node, the value slots they share, and the run loop."""

from __future__ import annotations

from collections import Counter
from functools import partial

import torch

from ..compile.program import Program
from ..ir import Graph, Value
from ..ir.dtypes import torch_dtype
from ..memory import Engine
from ..memory.config import MemoryConfig
from ..memory.staging import InputStager
from .memory_setup import setup_memory
from .primitive_inst import PrimitiveInst, shape_key
from .subgraph import SubgraphRunner


class Network:
    """Executable form of a graph for one device; holds per-request state (shapes, buffers)."""

    def __init__(self, graph: Graph | Program, device: torch.device, engine: Engine | None = None,
                 outer_slots: dict[int, int] | None = None, memory: MemoryConfig | None = None) -> None:
        self.graph = graph.graph if isinstance(graph, Program) else graph
        self.device = device
        self.engine = engine or Engine(device)
        self.memory = memory or MemoryConfig()
        self.stats: Counter = Counter()
        self.predictor = self.memory.make_predictor(self.engine)
        self.stage = InputStager(device, self.engine, self.predictor, self.stats)
        self._slot: dict[tuple[int, str], int] = {}
        self.vals: list = []
        g = self.graph
        # outer-scope values (subgraphs) get a slot each, filled by the caller before a run
        self.outer = [(v, self._slot_for(v, "value")) for v in g.outer]
        # a body's shapes follow its outer values as much as its inputs (an If body has none)
        self.outer_slots = [s for v, s in self.outer if not v.is_const]
        self.input_slots = {v.name: self._slot_for(v, "value") for v in g.inputs}
        self.insts: list[PrimitiveInst] = []
        host_values: set[int] = set()
        for node in g.nodes:
            self.insts.append(self._make_inst(node, host_values))
        self.output_slots = [(v.name, self._output_slot(v)) for v in g.outputs]
        self.last_in_shapes = None
        self.runs = 0  # runs started: stamps what is laid out for one run only (in-place concat)
        # Without data-dependent shapes, the network's shapes are a function of its input shapes:
        # if those did not change, no node's did, and one comparison stands for all of them.
        self.shapes_follow_inputs = not any(i.data_dependent or i.volatile_deps for i in self.insts)
        producer = {s: inst for inst in self.insts for s in inst.out_slots if s is not None}
        self.output_insts = []
        for _, s in self.output_slots:
            inst = producer.get(s)
            if inst is not None and inst.writes_out:
                self.output_insts.append((inst, inst.out_slots.index(s)))
        self.fresh_output_slots = {s for i in self.insts if not i.view for s in i.out_slots if s is not None}
        self.pool = setup_memory(self)
        self._fast_fns = {id(i): i.step if any(i is o for o, _ in self.output_insts) else _fast_fn(i)
                          for i in self.insts}
        self.fast_steps: list = []
        self.profiler = None  # a dynashape.profiler.Profiler: every run takes the full flow, timed per node

    # ---- building -------------------------------------------------------------------------
    def dtype_of(self, v: Value | None) -> torch.dtype | None:
        if v is None or v.kind != "tensor":
            return None
        try:
            return torch_dtype(v.elem_type)
        except KeyError:
            return None

    def _slot_for(self, v: Value, where: str) -> int:
        key = (id(v), where)
        if key not in self._slot:
            self._slot[key] = len(self.vals)
            self.vals.append(None)
            if v.is_const:
                c = v.const
                if isinstance(c, torch.Tensor) and where == "device":
                    c = c.to(self.device)
                self.vals[self._slot[key]] = c
        return self._slot[key]

    def slot_of(self, v: Value) -> int:
        """The slot holding ``v`` (a subgraph asks its parent for outer values)."""
        for where in ("value", "device", "host"):
            s = self._slot.get((id(v), where))
            if s is not None:
                return s
        if self.graph.outer and v in self.graph.outer:
            return self._slot[(id(v), "value")]
        raise KeyError(v.name)

    def _output_slot(self, v: Value) -> int:
        if v.is_const:
            return self._slot_for(v, "host")
        return self._slot[(id(v), "value")]

    def _make_inst(self, node, host_values: set[int]) -> PrimitiveInst:
        od = node.opdef
        host = bool(getattr(node, "shape_of", False)) or od.host
        reads_shape_only = node.op_type in ("Shape", "Size")
        in_slots, xfer = [], []
        for i, v in enumerate(node.inputs):
            if v is None:
                in_slots.append(None)
                xfer.append(False)
                continue
            as_value = host or i in od.shape_deps or reads_shape_only
            if v.is_const:
                in_slots.append(self._slot_for(v, "host" if as_value else "device"))
                xfer.append(False)
            else:
                in_slots.append(self._slot[(id(v), "value")])
                on_host = id(v) in host_values
                xfer.append(not reads_shape_only and i not in od.shape_deps and on_host != host)
        out_slots = [None if v is None else self._slot_for(v, "value") for v in node.outputs]
        if host:
            host_values.update(id(v) for v in node.outputs if v is not None)
        attrs = dict(node.attrs)
        if "_device" in od.attrs:  # kernels that create values from nothing (SequenceEmpty) need it
            attrs["_device"] = torch.device("cpu") if host else self.device
        kernel = partial(od.fn, **attrs) if attrs else od.fn
        if node.subgraphs:
            runners = {}
            for key, sub in node.subgraphs.items():
                runners.setdefault(key.split(".")[0], []).append(SubgraphRunner(sub, self, self._child))
            kernel = partial(od.fn, **attrs, **{k: r if len(r) > 1 else r[0] for k, r in runners.items()})
        inst = PrimitiveInst(node, self, in_slots, out_slots, kernel, tuple(xfer))
        inst.volatile_deps = any(
            (v := node.inputs[i]) is not None and not v.is_const and (
                v.producer is None or not getattr(v.producer, "shape_of", False))
            for i in inst.shape_deps)
        return inst

    def _child(self, graph: Graph) -> Network:
        """A control-flow body's network: same device, engine and memory options."""
        return Network(graph, self.device, self.engine, memory=self.memory)

    def predict(self, key: str, shape: tuple, dtype: torch.dtype, can_reuse: bool) -> tuple[bool, tuple]:
        """The ShapePredictor's advice for a buffer about to be (re)allocated."""
        if self.predictor is None:
            return False, ()
        return self.predictor.predict(key, tuple(shape), dtype.itemsize * 8, can_reuse)

    # ---- running --------------------------------------------------------------------------
    def run(self, feeds: dict[str, torch.Tensor], hand_out: bool = True) -> list:
        """Run on ``feeds``. ``hand_out``: the outputs' buffers go to the caller (torch outputs);
        when False (the caller copies them, as numpy outputs are) the network keeps them for the
        next run, where the predictor can grow them ahead."""
        vals = self.vals
        self.runs += 1
        for name, t in feeds.items():
            vals[self.input_slots[name]] = self.stage(name, t)
        shapes = tuple(map(shape_key, feeds.values()))
        if self.outer_slots:
            shapes += tuple(shape_key(vals[s]) for s in self.outer_slots)
        try:
            prof = self.profiler
            if prof is None and self.shapes_follow_inputs and shapes == self.last_in_shapes:
                self.stats["fast_runs"] += 1
                try:
                    for f in self.fast_steps:
                        f(vals)
                except Exception:
                    # Redo the run through the full flow: it names the failing node, and a
                    # kernel that failed on these inputs fails there again.
                    self.reset()
                    for inst in self.insts:
                        inst.step(vals)
                    raise
            else:
                self.stats["shape_change_runs"] += 1
                for inst in self.insts:
                    if prof is None:
                        inst.step(vals)
                    else:
                        prof.step(inst, vals)
                self.last_in_shapes = shapes
                # the nodes the unchanged-shape path runs: not shape_of ones, not empty ones
                self.fast_steps = [self._fast_fns[id(i)] for i in self.insts if not i.shape_of and not i.skipped]
        except BaseException:
            self.reset()
            raise
        return self._collect_outputs(vals, hand_out)

    def _collect_outputs(self, vals: list, hand_out: bool = True) -> list:
        outs = [vals[s] for _, s in self.output_slots]
        if not hand_out:
            return outs
        handed = set()
        inplace_slots = set()
        for inst in self.inplace_outputs:
            inst.inplace.hand_out()
            inplace_slots.add(inst.out_slot0)
        handed_slots = set()
        for inst, k in self.output_insts:
            buf = inst.buffers[k]
            if buf is not None and id(buf) not in handed:
                handed.add(id(buf))
                handed_slots.add(inst.out_slots[k])
                inst.release_output(k)
        for j, (_, s) in enumerate(self.output_slots):
            t = outs[j]
            # Views, constants and pass-through inputs alias memory the network keeps or the
            # caller owns: the caller gets a copy, never an alias it could see change.
            if s in inplace_slots or s in handed_slots:
                continue  # the buffer (or concat storage) was just handed to the caller: theirs now
            if isinstance(t, torch.Tensor) and (s not in self.fresh_output_slots or t._base is not None):
                outs[j] = t.clone()
            elif isinstance(t, list):
                # a sequence may hold tensors that are node buffers the next run overwrites
                outs[j] = [x.clone() if isinstance(x, torch.Tensor) else x for x in t]
        return outs

    def reset(self) -> None:
        self.last_in_shapes = None
        for inst in self.insts:
            inst.reset()


def _fast_fn(inst: PrimitiveInst):
    """The unchanged-shape path of one node: no shape work at all, just the kernel into its
    buffer. A closure per node keeps the per-call Python work to a minimum."""
    kernel, slots, o = inst.kernel, inst.in_slots, inst.out_slot0
    if inst.feeds is not None:  # the Concat's storage may have changed: find our slot again
        def feed(vals):
            inst.plan_feed(vals)
            inst.execute(inst.gather(vals), vals)
        return feed
    if inst.xfer is not None or not inst.single_out or None in slots or o is None:
        return lambda vals: inst.execute(inst.gather(vals), vals)
    if len(slots) == 2:
        a, b = slots

        def two(vals):
            vals[o] = kernel(vals[a], vals[b], out=inst.out)
        return two
    if len(slots) == 1:
        (a,) = slots

        def one(vals):
            vals[o] = kernel(vals[a], out=inst.out)
        return one

    def many(vals):
        vals[o] = kernel(*[vals[s] for s in slots], out=inst.out)
    return many
