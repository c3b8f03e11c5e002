"""What the code builder gives for one specialization: its compiled code and what the runtime reads of it.

``SpecCode`` is what ``runtime/compiled.py`` keeps per specialization; ``Group`` and ``RegionCode``
are the parts of the generated source it rebuilds per symbol values or hands to static impls.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ..compile.arena import overlapping
from ..compile.memory_plan import ArenaBuffer, MemoryPlan
from ..compile.shape_program import Trace
from ..ir import Node, Value
from . import align
from .regions import Region
from .step_graph import StepPlan


class MemoRefused(Exception):
    """A memo node whose inputs are not all group members (a value of symbols bound during the
    run): the specialization is traced again without memo data (``runtime/compiled.py``)."""


@dataclass
class Group:
    symbols: frozenset[str]
    members: list[str] = field(default_factory=list)
    lines: list[tuple[str, Node | None]] = field(default_factory=list)
    first: int = 0  # creation order, for a stable order among groups of one size
    index: int = -1
    key: tuple[int, ...] = ()  # positions of its symbols in the signature


@dataclass
class RegionCode:
    """A region of ``run`` (``regions.py``) and what its static impls are built from."""

    region: Region
    fn: object  # r<k>(*key symbols, *live-ins) -> live-outs: the region's lines as a function
    symvars: list[str]  # locals of the key symbols, in key order
    body: list[str]
    align: align.Alignment | None = None  # one impl for several values of a symbol (align.py)


@dataclass
class SpecCode:
    trace: Trace
    plan: MemoryPlan
    source: str
    filename: str
    run: object
    accepts: object
    refresh: list
    groups: list[Group]
    sig_symbols: list[str]
    arena: list[ArenaBuffer]
    arena_dtypes: list[torch.dtype]
    arena_dtype_index: list[int]  # per arena buffer: its dtype's index
    output_values: list[Value]  # values of class "output", by the index st.out() takes
    kv_nodes: list[Node]
    sub_nodes: list[Node]  # nodes with subgraphs: their kernel is per request
    outputs: list[str]  # per graph output: keep | clone | check (see _output_action)
    line_nodes: dict[int, Node]
    namespace: dict
    inplace_inputs: int = 0  # Concat inputs written in place by their producers, per run
    size_symbols: tuple[int, ...] = ()  # positions in the signature of the symbols arena sizes read
    group_keys: list = field(default_factory=list)  # per group: signature -> the values of its symbols
    regions: list[RegionCode] = field(default_factory=list)  # regions that static impls may serve
    aligned_positions: dict = field(default_factory=dict)  # signature position of an aligned symbol -> kinds
    token_positions: list = field(default_factory=list)  # (batch, seq) signature positions of token regions
    kernel_items: int = 0  # nodes with lines in run (regions.py's items)
    bound_kernels: int = 0  # of them, kernels bound to their node's constants (registry.binder)
    sized_nodes: list = field(default_factory=list)  # st.sized's nodes: (node, output dtypes)
    input_locals: list[str] = field(default_factory=list)  # run's parameters, in input order
    step: StepCode | None = None  # the whole decode step over KV storages (step_graph.py)
    step_refused: str = ""  # why there is no whole-step function (when there are KV appends)
    accepted_guards: list = field(default_factory=list)  # the guards ``accepts`` checks (their keys)

    @functools.cached_property
    def arena_lifetimes(self) -> tuple[list[int], list[int], list[list[int]]]:
        """First and last steps of the arena buffers, and which overlap (compile/arena.py)."""
        first, last = [b.first for b in self.arena], [b.last for b in self.arena]
        return first, last, overlapping(first, last)


@dataclass
class StepCode:
    plan: StepPlan
    fn: object  # step(*other symbols, C, P, *storages, *live-ins) -> results that are not presents
    members: dict[str, tuple[int, int]]  # live-in member -> (group, position): where SpecState.cur has it
    prep: object = None  # prep(*other symbols, C, *its live-ins) -> the capacity values (step_capacity.py)
