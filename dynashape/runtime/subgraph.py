"""SubgraphRunner: runs a control-flow body (If/Loop/Scan) as a nested Network.

The body reads outer-scope values by name; the runner copies their current tensors from the
parent's slots into the child's before each call, so a body always sees this run's values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..ir import Graph

if TYPE_CHECKING:
    from .network import Network


class SubgraphRunner:
    def __init__(self, graph: Graph, parent: Network) -> None:
        self.graph, self.parent = graph, parent
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self._net: Network | None = None

    @property
    def net(self) -> Network:
        if self._net is None:  # built on first use: many bodies never run (an If's other branch)
            from .network import Network
            self._net = Network(self.graph, self.parent.device, self.parent.engine, memory=self.parent.memory)
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
