"""Shapes drawn at random within ranges, every one new: what `dynashape bench --random-shapes` and
benchmarks/new_sizes.py feed, as an OCR or detection service sees a new image size on almost
every call.

A spec gives each input's dims: ``x=1x3x96..640x96..640`` (a number, or a range LO..HI whose values
are LO, LO + step, ... up to HI; ``96..640/32`` gives a range its own step). A dim shared by several
inputs is named where it is drawn and referred to by name elsewhere:
``input_ids=b:1..8xs:16..128 attention_mask=bxs``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .errors import OptionsError

_RANGE = re.compile(r"^(?:([A-Za-z_]\w*):)?(\d+)\.\.(\d+)(?:/(\d+))?$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Spec:
    """Inputs' dims: each an int, or the name of a drawn value; ``values`` per drawn name."""
    dims: dict[str, tuple]  # input -> (int | str, ...)
    values: dict[str, tuple[int, ...]]  # drawn name -> its allowed values, in order

    def distinct(self) -> int:
        return math.prod(len(v) for v in self.values.values())


def parse(items, step: int = 1) -> Spec:
    """``items``: 'NAME=DIMS' strings (several may share one argument, separated by spaces)."""
    if step < 1:
        raise OptionsError(f"the step of random shapes must be at least 1, not {step}")
    dims: dict[str, tuple] = {}
    values: dict[str, tuple[int, ...]] = {}
    refs: list[tuple[str, str]] = []
    for item in (t for text in items for t in text.split()):
        name, eq, text = item.partition("=")
        if not eq or not name or not text:
            raise OptionsError(f"bad random shape {item!r}; write it as NAME=DIMS, e.g. x=1x3x96..640x96..640")
        if name in dims:
            raise OptionsError(f"random shape of {name!r} given twice")
        out = []
        for d in text.split("x"):
            m = _RANGE.match(d)
            if d.isdigit():
                out.append(int(d))
            elif m:
                label, lo, hi, own = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
                by = int(own) if own else step
                if hi < lo or by < 1:
                    raise OptionsError(f"bad range {d!r} in {item!r}: LO..HI with LO <= HI and a step of 1 or more")
                label = label or f"{name}[{len(out)}]"
                if label in values:
                    raise OptionsError(f"the dim {label!r} is drawn twice in the random shapes")
                values[label] = tuple(range(lo, hi + 1, by))
                out.append(label)
            elif _NAME.match(d):
                out.append(d)
                refs.append((d, item))
            else:
                raise OptionsError(f"bad dim {d!r} in random shape {item!r}: a number, LO..HI, NAME:LO..HI or NAME")
        dims[name] = tuple(out)
    for ref, item in refs:
        if ref not in values:
            raise OptionsError(f"{item!r} refers to {ref!r}, which no random shape draws (write it as {ref}:LO..HI)")
    return Spec(dims, values)


def draw(spec: Spec, calls: int, seed: int = 0) -> list[dict[str, tuple[int, ...]]]:
    """``calls`` shape sets, no two alike (an error where the ranges hold fewer)."""
    total = spec.distinct()
    if total < calls:
        raise OptionsError(f"the random shapes' ranges hold {total} distinct shape set(s), fewer than the "
                           f"{calls} calls asked for")
    rng = np.random.default_rng(seed)
    names = list(spec.values)
    sizes = [len(spec.values[n]) for n in names]
    if total <= 1 << 20:  # every combination by its index, drawn without replacement
        picks = [np.unravel_index(int(i), sizes) if names else () for i in rng.choice(total, calls, replace=False)]
    else:  # too many to enumerate: draw and skip a repeat (rare at these sizes)
        seen, picks = set(), []
        while len(picks) < calls:
            p = tuple(int(rng.integers(s)) for s in sizes)
            if p not in seen:
                seen.add(p)
                picks.append(p)
    out = []
    for p in picks:
        chosen = {n: spec.values[n][int(i)] for n, i in zip(names, p)}
        out.append({k: tuple(chosen[d] if isinstance(d, str) else d for d in ds) for k, ds in spec.dims.items()})
    return out
