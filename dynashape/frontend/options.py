"""Dynamic-dimension parse options, named as in MIGraphX, and how they combine.

Precedence for one axis of one input, highest first:
  dynamic_dims[input][axis]   the user named this very axis (None there: fall through)
  dim_params[symbol]          the axis carries that ONNX dim_param
  default_dynamic_dim         the axis is symbolic or missing in the model
  the model's own dim_value   a fixed size
Every source that speaks for an axis must agree with the ones above it: a fixed model size
that dynamic_dims contradicts, or two inputs sharing a symbol given disjoint ranges, is an
OptionsError that names the input, axis and symbol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import OptionsError, ShapeError
from ..shape import Dimension, DimLike, PartialShape


@dataclass(frozen=True)
class ParseOptions:
    default_dynamic_dim: Dimension | None = None
    dynamic_dims: Mapping[str, Sequence[DimLike]] = field(default_factory=dict)
    dim_params: Mapping[str, Dimension] = field(default_factory=dict)
    # session.reshape(): dynamic_dims replace the model's fixed sizes instead of having to contain them
    reshape: bool = False

    @staticmethod
    def make(default_dynamic_dim=None, dynamic_dims=None, dim_params=None, reshape: bool = False) -> ParseOptions:
        for name, dims in (dynamic_dims or {}).items():
            if isinstance(dims, (str, bytes)):
                raise OptionsError(f"dynamic_dims[{name!r}] must be a list of dims, got {dims!r}")
        try:
            ddd = None if default_dynamic_dim is None else Dimension.of(default_dynamic_dim)
            dd = {k: list(v) for k, v in (dynamic_dims or {}).items()}
            dp = {k: Dimension.of(v) for k, v in (dim_params or {}).items()}
        except (ShapeError, TypeError) as e:
            raise OptionsError(f"malformed dynamic-dim option: {e}") from e
        return ParseOptions(ddd, dd, dp, reshape)


@dataclass
class ModelDim:
    """One axis as the model declares it."""

    value: int | None  # dim_value, when positive
    symbol: str | None  # dim_param


def resolve_input_shapes(inputs: dict[str, list[ModelDim] | None],
                         opts: ParseOptions) -> dict[str, PartialShape | None]:
    """Apply the options to the declared input shapes; a None shape means unknown rank."""
    unknown = sorted(set(opts.dynamic_dims) - set(inputs))
    if unknown:
        raise OptionsError(f"dynamic_dims names input(s) {unknown} that the model does not have; "
                           f"its inputs are {sorted(inputs)}")
    symbols = {d.symbol for dims in inputs.values() if dims for d in dims if d.symbol}
    stray = sorted(set(opts.dim_params) - symbols)
    if stray:
        raise OptionsError(f"dim_params names symbol(s) {stray} that no input uses; "
                           f"the model's symbols are {sorted(symbols)}")

    resolved: dict[str, list[Dimension] | None] = {}
    for name, dims in inputs.items():
        given = opts.dynamic_dims.get(name)
        if dims is None and given is None:
            resolved[name] = None
            continue
        if dims is None:
            dims = [ModelDim(None, None) for _ in given]
        if given is not None and len(given) != len(dims):
            raise OptionsError(f"dynamic_dims[{name!r}] has {len(given)} dims but input {name!r} has rank {len(dims)}")
        out = []
        for axis, md in enumerate(dims):
            out.append(_resolve_axis(name, axis, md, None if given is None else given[axis], opts))
        resolved[name] = out
    _unify_symbols(resolved)
    return {k: None if v is None else PartialShape(v) for k, v in resolved.items()}


def _resolve_axis(name: str, axis: int, md: ModelDim, given: DimLike, opts: ParseOptions) -> Dimension:
    where = f"input {name!r} axis {axis}"
    if given is not None:
        d = Dimension.of(given)
        if md.value is not None and not d.contains(md.value) and not opts.reshape:
            raise OptionsError(f"{where}: the model fixes it to {md.value} but dynamic_dims gives {d}")
        if md.symbol and md.symbol in opts.dim_params:
            try:
                d = d.merge(opts.dim_params[md.symbol])
            except ShapeError as e:
                raise OptionsError(f"{where}: dynamic_dims gives {d} but dim_params[{md.symbol!r}] "
                                   f"gives {opts.dim_params[md.symbol]}, which do not overlap") from e
        return d.with_symbol(md.symbol)
    if md.value is not None:
        return Dimension(md.value, md.value, (), md.symbol)
    if md.symbol and md.symbol in opts.dim_params:
        return opts.dim_params[md.symbol].with_symbol(md.symbol)
    if opts.default_dynamic_dim is not None:
        return opts.default_dynamic_dim.with_symbol(md.symbol)
    return Dimension.dynamic(md.symbol)


def _unify_symbols(resolved: dict[str, list[Dimension] | None]) -> None:
    """Axes that share a symbol are one dimension: give them all the intersection of ranges."""
    merged: dict[str, Dimension] = {}
    for name, dims in resolved.items():
        for axis, d in enumerate(dims or ()):
            if d.symbol is None:
                continue
            prev = merged.get(d.symbol)
            try:
                merged[d.symbol] = d if prev is None else prev.merge(d)
            except ShapeError as e:
                raise OptionsError(f"symbol {d.symbol!r} is {prev} elsewhere but {d} at input {name!r} "
                                   f"axis {axis}: the ranges do not overlap") from e
    for dims in resolved.values():
        for axis, d in enumerate(dims or ()):
            if d.symbol is not None:
                dims[axis] = merged[d.symbol]
