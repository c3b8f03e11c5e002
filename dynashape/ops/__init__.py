"""Op kernels and shape functions, one module per op family."""

from . import _all  # noqa: F401  (imports every op module: each registers its ops with the registry)
from .registry import OpDef, lookup, op, registered

__all__ = ["OpDef", "lookup", "op", "registered"]
