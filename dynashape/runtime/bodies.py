"""Control-flow bodies (If, Loop, Scan, SequenceMap) for the compiled runtime.

A body is compiled like any graph, with the outer-scope values it reads as extra inputs after
its own: the node's line in the parent's generated code passes them (``_outer=``), and the
body's generated code reads them like inputs. Each node gets a ``BodyKernel`` per request: the
op's kernel with a ``BodyRunner`` per subgraph in place of the graph attribute.
"""

from __future__ import annotations

from functools import partial

from ..ir import Graph, Node


class BodyRunner:
    """Runs one body: ``runner(*inputs)`` -> list of outputs (fresh tensors the op may keep)."""

    def __init__(self, graph: Graph, make_runner, make_network) -> None:
        self.graph = graph
        self.outer: dict = {}
        self._runner = make_runner(graph)
        self._make_network = make_network
        self._net = None
        self.names = [v.name for v in graph.inputs]

    def __call__(self, *inputs) -> list:
        vals = list(inputs) + [self.outer[v.name] for v in self.graph.outer]
        outs = self._runner.run(vals, hand_out=True)
        if outs is not None:
            return outs
        return self._interpret(inputs)

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


class BodyKernel:
    """A control-flow node's kernel for one request; ``_outer`` carries this run's outer values."""

    def __init__(self, node: Node, make_runner, make_network, device) -> None:
        od = node.opdef
        attrs = dict(node.attrs)
        if "_device" in od.attrs:
            attrs["_device"] = device
        runners: dict[str, list[BodyRunner]] = {}
        for key, sub in node.subgraphs.items():
            runners.setdefault(key.split(".")[0], []).append(BodyRunner(sub, make_runner, make_network))
        self.runners = [r for rs in runners.values() for r in rs]
        self.fn = partial(od.fn, **attrs, **{k: r if len(r) > 1 else r[0] for k, r in runners.items()})

    def __call__(self, *inputs, _outer: dict):
        for r in self.runners:
            r.outer = _outer
        return self.fn(*inputs)
