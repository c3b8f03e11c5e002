from .pipeline import PASSES, compile_graph
from .program import Program

__all__ = ["PASSES", "Program", "compile_graph"]
