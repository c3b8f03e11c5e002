"""Sizes that come from data, checked before anything is allocated.

A shape function run on values read from data (Expand's shape, Tile's repeats, Range's limit,
ConstantOfShape, Pad, OneHot's depth) can ask for a negative dim or for 2^40 elements. Both
executors call ``check_output_sizes`` with the inferred output shapes before the kernel runs and
before any buffer is made: a negative dim is a ShapeError, a buffer larger than the engine's
limit (``max_buffer_bytes``, else what the machine holds) a MemoryLimitError, neither reaching
torch's allocator. ``shape_failure`` turns what a shape function raises on such values
(ZeroDivisionError for a Range delta of 0, ValueError for a NaN limit, OverflowError) into a
ShapeError.
"""

from __future__ import annotations

import contextvars

import torch

from ..errors import DynashapeError, LimitExceededError, ShapeError

# the session's max_loop_iterations for the run under way (per thread: a contextvar)
MAX_LOOP_ITERATIONS: contextvars.ContextVar[int | None] = contextvars.ContextVar("max_loop_iterations", default=None)


def check_loop(i: int) -> None:
    """Before iteration ``i`` of a Loop: a trip count or condition from data (2^40 trips) would
    otherwise run unbounded; the session's ``max_loop_iterations`` stops it with a typed error."""
    limit = MAX_LOOP_ITERATIONS.get()
    if limit is not None and i >= limit:
        raise LimitExceededError(f"Loop: iteration {i} reaches the session's max_loop_iterations ({limit})")


def shape_failure(e: Exception, op_type: str) -> Exception:
    if isinstance(e, DynashapeError):
        return e
    return ShapeError(f"{op_type}: the output shape cannot be computed from these inputs' values: "
                      f"{type(e).__name__}: {e}")


def check_output_sizes(op_type: str, shapes, dtypes, engine) -> None:
    """``engine.check_size(nbytes, what)`` refuses what is too large (memory/engine.py)."""
    for k, (shape, dt) in enumerate(zip(shapes, dtypes)):
        if shape is None:
            continue
        if any(d < 0 for d in shape):
            raise ShapeError(f"{op_type}: output {k} would have the negative shape {list(shape)}")
        n = 1
        for d in shape:
            n *= d
        size = dt.itemsize if isinstance(dt, torch.dtype) else 8
        engine.check_size(n * size, f"{op_type}: output {k} of shape {list(shape)}")
