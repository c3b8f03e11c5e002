"""Control-flow bodies (If, Loop, Scan, SequenceMap) for the compiled runtime.

A body is compiled like any graph, with the outer-scope values it reads as extra inputs after
its own: the node's line in the parent's generated code passes them (``_outer=``), and the
body's generated code reads them like inputs. Each node gets a ``BodyKernel`` per request: the
op's kernel with a ``BodyRunner`` per subgraph in place of the graph attribute.
"""

from __future__ import annotations

import logging
from functools import partial

from ..ir import Graph, Node

log = logging.getLogger(__name__)


class BodyRunner:
    """Runs one body: ``runner(*inputs)`` -> list of outputs.

    A Loop or Scan body runs once per iteration: its outputs are not handed out each time (no
    allocation per iteration) but written into two sets of buffers the body keeps, used in turn,
    so that the values an iteration reads (the last one's carried outputs) are never the buffers
    it writes. ``reuses_outputs`` tells the op so: what it keeps past the next iteration (scan
    outputs, the final carried values) it copies. An If branch runs once per call: fresh outputs.
    """

    def __init__(self, graph: Graph, make_runner, make_network, keep_outputs: bool = False,
                 shift: int = 0) -> None:
        self.graph = graph
        self.outer: dict = {}
        self._runner = make_runner(graph)
        self._make_network = make_network
        self._net = None
        self.names = [v.name for v in graph.inputs]
        self.reuses_outputs = keep_outputs
        # a body output that is its own input (output j is input j + shift: Loop 1, Scan 0) is a
        # value passed through unchanged, the same every iteration: not copied per iteration.
        # paddle2onnx's Loops carry their weights so (SLANet: 2.4 MB copied an iteration, 501
        # iterations a call). By induction it is the Loop's initial value, never a buffer set.
        self._carried = (shift, len(graph.inputs)) if keep_outputs else None
        self._turn = 0
        self._warmed = False

    def __call__(self, *inputs) -> list:
        self._warmed = True  # compiled by this run: nothing to do ahead
        vals = list(inputs) + [self.outer[v.name] for v in self.graph.outer]
        if self.reuses_outputs:
            self._turn ^= 1
            outs = self._runner.run(vals, hand_out=False, buffer_set=self._turn, carried=self._carried)
        else:
            outs = self._runner.run(vals, hand_out=True)
        if outs is not None:
            return outs
        return self._interpret(inputs)

    def warm(self) -> None:
        """An If's branch not taken, once, at the node's first run: run it with this run's outer
        values and drop its outputs, so that its specialization is traced and compiled now (the
        first call of a session is the slow one anyway) and not at the first call that takes it
        (silero-vad's other sample rate: 17-20x that call's steady time). A branch that cannot run
        on these values (it may expect other shapes) is left to compile at its first real use."""
        if self._warmed:
            return
        try:
            self()
        except Exception as e:  # noqa: BLE001  only a head start: its real first use reports errors
            log.info("If branch %s not compiled ahead (it runs on its first use): %s", self.graph.name, e)

    def _interpret(self, inputs) -> list:
        """No specialization serves these shapes: the interpreter runs the body (counted)."""
        if self._net is None:
            self._net = self._make_network(self.graph)
        net = self._net
        for v, slot in net.outer:
            if not v.is_const:
                net.vals[slot] = self.outer[v.name]
        self._runner.stats["interpreter_runs"] += 1
        return net.run(dict(zip(self.names, inputs)))


_ITERATING = frozenset({"Loop", "Scan"})  # ops whose body runs once per iteration


class BodyKernel:
    """A control-flow node's kernel for one request; ``_outer`` carries this run's outer values."""

    def __init__(self, node: Node, make_runner, make_network, device) -> None:
        od = node.opdef
        attrs = dict(node.attrs)
        if "_device" in od.attrs:
            attrs["_device"] = device
        runners: dict[str, list[BodyRunner]] = {}
        loops = node.op_type in _ITERATING and node.domain in ("", "ai.onnx")
        shift = 1 if node.op_type == "Loop" else 0  # Loop: (iteration, cond, carried...) -> (cond, carried...)
        for key, sub in node.subgraphs.items():
            runners.setdefault(key.split(".")[0], []).append(BodyRunner(sub, make_runner, make_network, loops,
                                                                        shift))
        self.runners = [r for rs in runners.values() for r in rs]
        self.fn = partial(od.fn, **attrs, **{k: r if len(r) > 1 else r[0] for k, r in runners.items()})

    def __call__(self, *inputs, _outer: dict):
        for r in self.runners:
            r.outer = _outer
        return self.fn(*inputs)
