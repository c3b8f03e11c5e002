"""The input shapes a session builds for at load, and feeds of them: every combination of the
optimal values the options give (``_prebuild``: static impls ready before the first call) and the
representative shapes whose guards the shape program splits on (``precompile``: generated code
ready before the first call at a new shape)."""

from __future__ import annotations

import itertools

import torch

from .feeds import InputSpec, _torch_dtype

MAX_OPTIMAL_SHAPES = 32


def optimal_shapes(specs: list[InputSpec]) -> list[tuple]:
    """Input shapes at the optimal values (every combination of the symbols' optimals), or []
    when some dynamic axis has none (no full shape to build for)."""
    symbols: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        if spec.shape is None:
            return []
        for d in spec.shape:
            if d.is_static:
                continue
            if not d.optimals:
                return []
            symbols[d.symbol or f"{spec.name}:{id(d)}"] = d.optimals
    if not symbols:
        return []
    names = list(symbols)
    out = []
    for values in itertools.product(*(symbols[n] for n in names)):
        env = dict(zip(names, values))
        out.append(tuple(tuple(d.min if d.is_static else env[d.symbol or f"{spec.name}:{id(d)}"] for d in spec.shape)
                         for spec in specs))
        if len(out) >= MAX_OPTIMAL_SHAPES:
            break
    return out


_GENERIC = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def representative_shapes(specs: list[InputSpec]) -> list[tuple]:
    """Input shapes with every dynamic dim at a generic value (distinct primes within each
    range, so no two dims look equal by chance), then with each symbol at 1 in turn: the
    signatures whose guards the shape program splits on most (``batch == 1``, ``seq == 1``)."""
    dims: dict[str, object] = {}
    for spec in specs:
        if spec.shape is None:
            return []
        for a, d in enumerate(spec.shape):
            if not d.is_static:
                dims.setdefault(d.symbol or f"{spec.name}:{a}", d)
    if not dims:
        return []
    generic: dict[str, int] = {}
    for k, (name, d) in enumerate(dims.items()):
        v = _GENERIC[k % len(_GENERIC)]
        generic[name] = max(d.min, v if d.max is None else min(v, d.max))
    ones = [n for n, d in dims.items() if d.contains(1) and generic[n] != 1]
    combos = [generic] + [{**generic, n: 1} for n in ones]
    if 1 < len(ones) <= 3:  # decode at batch 1: batch and new tokens both 1
        combos.append({**generic, **dict.fromkeys(ones, 1)})

    def shape_of(spec: InputSpec, env: dict) -> tuple:
        return tuple(d.min if d.is_static else env[d.symbol or f"{spec.name}:{a}"] for a, d in enumerate(spec.shape))
    return [tuple(shape_of(spec, env) for spec in specs) for env in combos]


# the stride of the vision models' deepest feature maps (YOLO, PP-OCR's detector: 32), for
# aligned_shapes
IMAGE_ALIGN = 32


def aligned_shapes(specs: list[InputSpec], shapes: list[tuple]) -> list[tuple]:
    """``shapes`` with the dynamic dims past the second axis of inputs of rank 3 or more (an image's
    sides, a spectrogram's frames) multiplied by IMAGE_ALIGN, within their ranges: what a model
    whose sides must be multiples of its stride accepts where the primes of representative_shapes
    are refused (a value of 1 stays 1)."""
    out = []
    for shape in shapes:
        row = []
        for spec, dims in zip(specs, shape):
            new = list(dims)
            if spec.shape is not None and len(dims) >= 3:
                for a in range(2, len(dims)):
                    d = spec.shape[a]
                    if not d.is_static and dims[a] > 1:
                        v = dims[a] * IMAGE_ALIGN
                        new[a] = v if d.max is None or v <= d.max else dims[a]
            row.append(tuple(new))
        out.append(tuple(row))
    return out


def numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def sample(spec: InputSpec, shape: tuple, device: torch.device) -> torch.Tensor:
    """A feed of this shape for building: random floats, ones for integers (a valid index or
    count in the models people run), True for booleans."""
    dt = _torch_dtype(spec.elem_type)
    if dt.is_floating_point:
        return torch.randn(shape, device=device).to(dt)
    return torch.ones(shape, dtype=dt, device=device)

