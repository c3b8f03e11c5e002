"""The graph IR: values, nodes and graphs. Plain containers; passes do the thinking."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..shape import PartialShape


@dataclass(eq=False)
class Value:
    """A named edge. ``shape`` None means the rank is unknown; ``const`` holds a folded value."""

    name: str
    elem_type: int = 0  # onnx.TensorProto element type; 0 = not known yet
    shape: PartialShape | None = None
    kind: str = "tensor"  # tensor | sequence | optional
    const: Any = None  # torch.Tensor (CPU) or numpy array for strings, when known at compile time
    producer: Node | None = None
    users: list[Node] = field(default_factory=list)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def __repr__(self) -> str:
        return f"%{self.name}:{self.shape}"


@dataclass(eq=False)
class Node:
    op_type: str
    domain: str
    name: str
    inputs: list[Value | None]
    outputs: list[Value | None]
    attrs: dict[str, Any]
    opset: int
    subgraphs: dict[str, Graph] = field(default_factory=dict)

    def __repr__(self) -> str:
        ins = ", ".join("-" if v is None else f"%{v.name}" for v in self.inputs)
        outs = ", ".join("-" if v is None else f"%{v.name}" for v in self.outputs)
        return f"{outs} = {self.op_type}({ins})"


@dataclass(eq=False)
class Graph:
    """Nodes in topological order. ``outer`` lists values a subgraph reads from its parent."""

    name: str
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    values: dict[str, Value]
    opsets: dict[str, int]
    outer: list[Value] = field(default_factory=list)

    def rebuild_users(self) -> None:
        for v in self.values.values():
            v.users = []
            v.producer = None
        for n in self.nodes:
            for v in n.inputs:
                if v is not None:
                    v.users.append(n)
            for v in n.outputs:
                if v is not None:
                    v.producer = n
            for sub in n.subgraphs.values():
                for v in sub.outer:
                    if n not in v.users:
                        v.users.append(n)
