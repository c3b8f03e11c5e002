"""What may be batched, and how: read from the model's declared dims once, at load.

A request's feeds can join others along the batch axis when every input and every output carries
the model's batch symbol on one axis (outputs are split back along it). An axis the user declares
paddable (a text length) is padded up to a bucket, with its mask input padded with 0s so that the
padding is invisible to the real positions; outputs that carry the padded symbol are cut back to
each request's own length. Anything the declared dims cannot prove is refused at load, with the
reason, instead of guessed at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import OptionsError


@dataclass(frozen=True)
class ServePolicy:
    batch_symbol: str | None
    batch_axes: dict[str, int]               # input -> its batch axis
    output_batch_axes: dict[str, int]        # output -> its batch axis
    why_not_batched: str | None = None       # set when batching is off for this model
    pad_symbol: str | None = None
    pad_axes: dict[str, int] = field(default_factory=dict)         # input -> the axis padded
    pad_values: dict[str, float] = field(default_factory=dict)     # input -> its pad value
    output_pad_axes: dict[str, int] = field(default_factory=dict)  # output -> the axis cut back
    mask: str | None = None
    pad_multiple: int = 16
    state: dict[str, str] = field(default_factory=dict)            # past input -> present output

    @property
    def batches(self) -> bool:
        return self.why_not_batched is None


def _axes_named(shapes: dict[str, list], symbol: str) -> dict[str, int]:
    return {n: s.index(symbol) for n, s in shapes.items() if symbol in s}


def _mentions(dim, symbol: str) -> bool:
    """Whether a declared dim is an expression of ``symbol`` (``past + seq``) other than itself."""
    if not isinstance(dim, str) or dim == symbol:
        return False
    return symbol in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", dim)


def _batch_symbol(inputs: dict[str, list], given: str | None) -> str | None:
    if given is not None:
        if not any(given in s for s in inputs.values()):
            raise OptionsError(f"batch_symbol={given!r}: no input declares that dim "
                               f"(inputs: {', '.join(f'{n}{s}' for n, s in inputs.items())})")
        return given
    firsts = {s[0] if s else None for s in inputs.values()}
    if len(firsts) == 1:
        (sym,) = firsts
        if isinstance(sym, str):
            return sym
    return None


def state_pairs(inputs: list[str], outputs: list[str], given: dict[str, str] | None = None) -> dict[str, str]:
    """Past input -> present output: given, or by name (``past*`` fed from ``present*`` with the
    same rest of the name, as exporters of HF-style decoders name them)."""
    if given is not None:
        for past, present in given.items():
            if past not in inputs or present not in outputs:
                raise OptionsError(f"state {past!r} -> {present!r}: expected an input and an output of the model")
        return dict(given)
    pairs = {}
    for past in inputs:
        if "past" not in past:
            continue
        for repl in (past.replace("past_key_values", "present"), past.replace("past", "present")):
            if repl in outputs:
                pairs[past] = repl
                break
    return pairs


def derive_policy(inputs: dict[str, list], outputs: dict[str, list], *, batch_symbol: str | None = None,
                  pad: dict | None = None, mask: str | None = None, pad_multiple: int = 16,
                  state: dict[str, str] | None = None) -> ServePolicy:
    """The policy of a model whose inputs and outputs declare these dims (ints or symbol names)."""
    state = state_pairs(list(inputs), list(outputs), state)
    sym = _batch_symbol(inputs, batch_symbol)
    why = None
    b_in, b_out = {}, {}
    if sym is None:
        why = "the inputs do not share a named batch dim on axis 0 (give batch_symbol=)"
    else:
        b_in, b_out = _axes_named(inputs, sym), _axes_named(outputs, sym)
        lacking = [n for n in inputs if n not in b_in] + [n for n in outputs if n not in b_out]
        if lacking:
            why = f"{', '.join(lacking)} do not carry the batch dim {sym!r}"
        mixed = [n for n, s in outputs.items() if any(_mentions(d, sym) for d in s)]
        if mixed:
            why = f"{', '.join(mixed)} have dims computed from the batch dim {sym!r}"
    if pad_multiple < 1:
        raise OptionsError(f"pad_multiple={pad_multiple}: expected an int >= 1")
    if not pad:
        if mask is not None:
            raise OptionsError(f"mask={mask!r} without pad=: say which input's axis is paddable and its pad value")
        return ServePolicy(sym, b_in, b_out, why, state=state, pad_multiple=pad_multiple)
    return _with_padding(inputs, outputs, sym, b_in, b_out, why, pad, mask, pad_multiple, state)


def _with_padding(inputs, outputs, sym, b_in, b_out, why, pad: dict, mask, pad_multiple, state) -> ServePolicy:
    if mask is None or mask not in inputs:
        raise OptionsError(f"pad={pad!r} needs mask= naming the model's mask input (one of {', '.join(inputs)}): "
                           "padding is only invisible when the mask hides it")
    symbols = set()
    values = {}
    for name, spec in pad.items():
        if name not in inputs:
            raise OptionsError(f"pad: {name!r} is not an input (inputs: {', '.join(inputs)})")
        axis, value = spec if isinstance(spec, tuple) else (None, spec)
        dims = inputs[name]
        if axis is None:  # the one named dim that is not the batch dim
            named = [i for i, d in enumerate(dims) if isinstance(d, str) and d != sym]
            if len(named) != 1:
                raise OptionsError(f"pad: {name!r} {dims} has {len(named)} named non-batch dims; give (axis, value)")
            axis = named[0]
        if not isinstance(dims[axis], str):
            raise OptionsError(f"pad: {name!r} axis {axis} is the fixed size {dims[axis]}, not a dynamic dim")
        symbols.add(dims[axis])
        values[name] = value
    if len(symbols) != 1:
        raise OptionsError(f"pad: the padded axes must share one dim name, got {sorted(symbols)}")
    (psym,) = symbols
    pad_axes = _axes_named(inputs, psym)
    values = {n: values.get(n, 0) for n in pad_axes}
    values[mask] = 0
    if mask not in pad_axes:
        raise OptionsError(f"mask {mask!r} {inputs[mask]} does not carry the padded dim {psym!r}")
    mixed = [n for n, s in outputs.items() if any(_mentions(d, psym) for d in s)]
    if mixed:
        raise OptionsError(f"pad: outputs {', '.join(mixed)} have dims computed from {psym!r}; they cannot be cut "
                           "back to each request's length")
    return ServePolicy(sym, b_in, b_out, why, psym, pad_axes, values, _axes_named(outputs, psym), mask,
                       pad_multiple, state)
