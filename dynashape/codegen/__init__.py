"""Code generation: a specialization's shape program and memory plan as Python source."""

from .spec import build_spec
from .spec_code import MemoRefused, SpecCode

__all__ = ["MemoRefused", "SpecCode", "build_spec"]
