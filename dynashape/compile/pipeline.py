"""The compile pipeline: a plain list of named passes, each timed and dumpable."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..ir import Graph
from .dead_nodes import remove_dead_nodes
from .program import Program
from .propagate import propagate
from .resolve_ops import resolve_ops
from .shape_subgraphs import mark_shape_subgraphs

log = logging.getLogger(__name__)

PASSES: list[tuple[str, Callable[[Graph], Graph]]] = [
    ("resolve_ops", resolve_ops),
    ("propagate", propagate),  # shape inference + constant folding in one forward walk
    ("remove_dead_nodes", remove_dead_nodes),
    ("mark_shape_subgraphs", mark_shape_subgraphs),
]


def compile_graph(graph: Graph, dump_after: set[str] | None = None) -> Program:
    timings = {}
    for name, fn in PASSES:
        t0 = time.perf_counter()
        graph = fn(graph)
        timings[name] = time.perf_counter() - t0
        log.debug("pass %s: %.2f ms, %d nodes", name, timings[name] * 1e3, len(graph.nodes))
        if dump_after and name in dump_after:
            log.info("after %s:\n%s", name, Program(graph, timings))
    _compile_subgraphs_tail(graph)
    return Program(graph, timings)


def _compile_subgraphs_tail(graph: Graph) -> None:
    for node in graph.nodes:
        for sub in node.subgraphs.values():
            mark_shape_subgraphs(sub)
            _compile_subgraphs_tail(sub)
