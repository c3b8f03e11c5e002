"""Program: the compiled graph, printable, from which Networks are built."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, elem_type_name


@dataclass
class Program:
    """``graph``: what the interpreter runs; ``fused``: the same after the fusion passes, what
    the generated code runs (None when fusion is off)."""

    graph: Graph
    pass_times: dict[str, float] = field(default_factory=dict)
    fused: Graph | None = None

    def __str__(self) -> str:
        g = self.graph
        lines = [f"program {g.name}: {len(g.nodes)} nodes"]
        for v in g.inputs:
            lines.append(f"  input  %{v.name}: {elem_type_name(v.elem_type)}{v.shape}")
        for n in g.nodes:
            flags = " [shape_of]" if getattr(n, "shape_of", False) else ""
            outs = ", ".join(f"%{v.name}: {elem_type_name(v.elem_type)}{v.shape}" for v in n.outputs if v is not None)
            ins = ", ".join("-" if v is None else ("$" if v.is_const else "%") + v.name for v in n.inputs)
            lines.append(f"  {outs} = {n.op_type}({ins}){flags}")
        for v in g.outputs:
            lines.append(f"  output %{v.name}: {elem_type_name(v.elem_type)}{v.shape}")
        return "\n".join(lines)
