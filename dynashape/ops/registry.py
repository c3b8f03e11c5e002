"""The op registry: an op is a torch kernel and a shape function, found by (domain, type, opset).

A kernel is ``fn(*inputs, out=None, **attrs)``: it writes into ``out`` when given (a tensor, or a
tuple for several outputs) and returns its result(s). A shape function is
``infer(shapes, values, **attrs) -> list of shapes``; ``shapes`` holds one tuple of dims per input
(ints at run time, ints or Dimensions at compile time, None for an absent optional input), and
``values[i]`` holds the value of input i as a CPU tensor when i is in ``shape_deps`` (None when
not known at compile time). Attributes come as keyword arguments with the defaults of the spec.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import UnsupportedOpError

ONNX_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class OpDef:
    op_type: str
    domain: str
    since: int
    fn: Callable
    infer: Callable | None
    shape_deps: tuple[int, ...] = ()
    # Output aliases an input (Reshape, Squeeze...): no buffer of its own, nothing copied.
    view: bool = False
    # Output shape depends on input *values* (NonZero, Unique): known only after the kernel ran.
    data_dependent: bool = False
    # Whether the kernel writes into a given ``out``; when not, its result is adopted as is.
    writes_out: bool = True
    # Runs on the host whatever the session's device (strings, sequences of host objects).
    host: bool = False
    # Cheap ops on small integer tensors may join a shape_of subgraph and run on the host.
    shape_op: bool = False
    attrs: frozenset[str] = field(default_factory=frozenset)
    notes: str = ""


_REGISTRY: dict[tuple[str, str], list[OpDef]] = {}


def _attr_names(fn: Callable) -> frozenset[str]:
    params = inspect.signature(fn).parameters.values()
    return frozenset(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "out")


def op(op_type: str, since: int | tuple[int, ...] = 1, domain: str = "", *, infer: Callable | None = None,
       shape_deps: tuple[int, ...] = (), view: bool = False, data_dependent: bool = False,
       writes_out: bool = True, host: bool = False, shape_op: bool = False, notes: str = ""):
    """Register a kernel for ``op_type`` from opset ``since`` on (until a later registration).
    A tuple of opsets registers it at each: the versions whose spec changed (new types, say)
    while one kernel still serves them all, so each shows in the operators list."""

    def deco(fn: Callable) -> Callable:
        for s in since if isinstance(since, tuple) else (since,):
            d = OpDef(op_type, "" if domain == "ai.onnx" else domain, s, fn, infer, tuple(shape_deps),
                      view, data_dependent or infer is None, writes_out and infer is not None and not view,
                      host, shape_op, _attr_names(fn), notes)
            versions = _REGISTRY.setdefault((d.domain, op_type), [])
            versions[:] = sorted([v for v in versions if v.since != s] + [d], key=lambda v: v.since)
        return fn

    return deco


_BINDERS: dict[tuple[str, str], Callable] = {}


class _Computed:
    def __repr__(self) -> str:
        return "COMPUTED"


COMPUTED = _Computed()  # a binder's input that is computed at run time (None: absent)


def binder(op_type: str, domain: str = ""):
    """Register ``fn(consts, attrs)`` for ``op_type``: given a node's inputs (a tensor per constant
    input, COMPUTED for one computed at run time, None for an absent one) and attributes, a kernel
    with the op's calling convention that has read, checked and prepared those constants once
    (scales, zero points, tables), or None where it has nothing to prepare. The generated CPU
    runner calls it in the registered kernel's place; the interpreter keeps the registered kernel
    (the reference)."""

    def deco(fn: Callable) -> Callable:
        _BINDERS[("" if domain == "ai.onnx" else domain, op_type)] = fn
        return fn

    return deco


def bound_kernel(d: OpDef, consts: list, attrs: dict) -> Callable | None:
    """The bound form of ``d``'s kernel for these constants (``binder``), or None."""
    fn = _BINDERS.get((d.domain, d.op_type))
    return None if fn is None else fn(consts, attrs)


def lookup(op_type: str, domain: str, opset: int, node_name: str = "") -> OpDef:
    """The newest registration at or below ``opset``, or a load-time UnsupportedOpError.
    (Every op module is imported with the package, in ``ops/__init__.py``.)"""
    dom = "" if domain == "ai.onnx" else domain
    versions = _REGISTRY.get((dom, op_type))
    if not versions:
        raise UnsupportedOpError(op_type, domain, opset, node_name)
    best = None
    for v in versions:
        if v.since <= opset:
            best = v
    if best is None:
        raise UnsupportedOpError(op_type, domain, opset, node_name,
                                 f"implemented from opset {versions[0].since} on")
    return best


def registered() -> dict[tuple[str, str], list[OpDef]]:
    return dict(_REGISTRY)


def op_flags(d: OpDef, *, adopts: bool = True, host: bool = False) -> list[str]:
    """What the operators table says of an op beside its opsets (docs/operators.md, ``dynashape ops``)."""
    flags = [f for f, on in (("view", d.view), ("data-dependent", d.data_dependent), ("shape_of", d.shape_op),
                             ("adopts", adopts and not d.writes_out and not d.view and not d.data_dependent),
                             ("host", host and d.host)) if on]
    return flags + ([d.notes] if d.notes else [])


def domain_order(domains) -> list[str]:
    """The table's order of domains: ai.onnx first, the fused ops of com.dynashape last."""
    return sorted(domains, key=lambda d: (d != "ai.onnx", d == "com.dynashape", d))
