"""Code generation: a specialization's shape program and memory plan as Python source."""

from .builder import SpecCode, build_spec

__all__ = ["SpecCode", "build_spec"]
