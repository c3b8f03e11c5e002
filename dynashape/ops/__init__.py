"""Op kernels and shape functions, one module per op family."""

from .registry import OpDef, lookup, op, registered

__all__ = ["OpDef", "lookup", "op", "registered"]
