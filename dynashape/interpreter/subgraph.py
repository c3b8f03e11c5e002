"""SubgraphRunner: runs a control-flow body (If/Loop/Scan) as a nested Network.

The body reads outer-scope values by name; the runner copies their current tensors from the
parent's slots into the child's before each call, so a body always sees this run's values.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import Graph


class SubgraphRunner:
    """``make_network(graph)`` builds the child (the parent passes its own constructor: this
    module does not import the Network that imports it)."""

    def __init__(self, graph: Graph, parent, make_network: Callable) -> None:
        self.graph, self.parent = graph, parent
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self._make_network = make_network
        self._net = None

    @property
    def net(self):
        if self._net is None:  # built on first use: many bodies never run (an If's other branch)
            self._net = self._make_network(self.graph)
        return self._net

    def __call__(self, *inputs) -> list:
        net = self.net
        pvals = self.parent.vals
        for v, slot in net.outer:
            if v.is_const:  # the child holds its own copy of outer constants
                continue
            src = self.parent.slot_of(v)
            net.vals[slot] = pvals[src]
        return net.run(dict(zip(self.input_names, inputs)))
