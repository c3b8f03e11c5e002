"""Implementations: the impl cache, the compilation context that builds static impls in the
background, and the static impls themselves (CUDA graphs, specialised Python)."""

from .cache import ImplCache
from .context import CompilationContext
from .static import CannotCapture, build_static, static_builder

__all__ = ["CannotCapture", "CompilationContext", "ImplCache", "build_static", "static_builder"]
