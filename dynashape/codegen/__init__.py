"""Code generation: a specialization's shape program and memory plan as Python source."""

from .builder import MemoRefused, SpecCode, build_spec

__all__ = ["MemoRefused", "SpecCode", "build_spec"]
