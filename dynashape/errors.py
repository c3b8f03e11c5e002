"""Typed errors. Each says what was given, what was expected, and where.

They derive from the builtin exception a Python user would expect (KeyError for an unknown
input name, TypeError for a wrong dtype, ValueError for a wrong shape), so ``except ValueError``
style code written for ONNX Runtime keeps working.
"""

from __future__ import annotations

import copy

OPERATORS_DOC = "docs/operators.md"


class DynashapeError(Exception):
    """Base of every error dynashape raises on purpose."""


class ShapeError(DynashapeError, ValueError):
    """Shapes that cannot be combined (a broadcast or merge that has no answer)."""


class OptionsError(DynashapeError, ValueError):
    """Session or parse options that are malformed or contradict each other."""


class UnknownOptionError(OptionsError, AttributeError):
    """A SessionOptions field that does not exist (an AttributeError too, so that
    ``getattr(so, name, default)`` keeps working)."""


class InvalidModelError(DynashapeError, ValueError):
    """A model file that is missing, truncated, malformed or internally inconsistent."""


class UnsupportedOpError(DynashapeError, NotImplementedError):
    """An op with no implementation for its domain and opset, found while loading."""

    def __init__(self, op_type: str, domain: str, opset: int, node_name: str, detail: str = "") -> None:
        self.op_type, self.domain, self.opset, self.node_name = op_type, domain, opset, node_name
        dom = domain or "ai.onnx"
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"unsupported op {op_type!r} of domain {dom!r} at opset {opset} in node {node_name!r}{extra}; "
            f"the supported ops and opsets are listed by `dynashape ops` and in {OPERATORS_DOC}"
        )


class InputError(DynashapeError):
    """Base of the errors about the feeds given to run()."""


class UnknownInputError(InputError, KeyError):
    def __init__(self, name: str, expected: list[str]) -> None:
        self.name = name
        super().__init__(f"unknown input name {name!r}; the model's inputs are {expected}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.args[0]


class MissingInputError(InputError, KeyError):
    def __init__(self, missing: list[str], given: list[str]) -> None:
        self.missing = missing
        super().__init__(f"missing input(s) {missing}; given {given}")

    def __str__(self) -> str:
        return self.args[0]


class UnknownOutputError(InputError, KeyError):
    def __init__(self, name: str, expected: list[str]) -> None:
        super().__init__(f"unknown output name {name!r}; the model's outputs are {expected}")

    def __str__(self) -> str:
        return self.args[0]


class InputTypeError(InputError, TypeError):
    """A feed of the wrong element type or of a type that is not a tensor at all."""


class InputRankError(InputError, ValueError):
    """A feed whose rank differs from the declared one."""


class InputShapeError(InputError, ValueError):
    """A feed with a dimension outside its declared range, or dims that must agree but do not."""


class SymbolDisagreementError(InputShapeError):
    """Two axes that share a dim name are fed different sizes. onnxruntime runs such feeds, so
    the session unlinks the name (with a warning) unless the user pinned it with dim_params."""

    def __init__(self, message: str, symbol: str) -> None:
        super().__init__(message)
        self.symbol = symbol


class DimensionWarning(UserWarning):
    """A model's dim names do not hold for the feeds given (the session ran them anyway)."""


class ExecutionError(DynashapeError, RuntimeError):
    """A node failed while running; names the node and op so the model can be inspected."""


class IndexOutOfRangeError(DynashapeError, IndexError):
    """An index read from data (Gather, GatherND, ScatterND, OneHot, ...) outside the bounds of
    the axis it indexes; the message names the index, the axis and its size."""


class MemoryLimitError(DynashapeError, MemoryError):
    """A buffer larger than the device or host can hold, or than ``max_buffer_bytes``: refused
    before anything is allocated; the message names the node, op, shape and bytes."""


class LimitExceededError(DynashapeError, RuntimeError):
    """A run stopped by a limit of the session (``max_loop_iterations``)."""


class RunTerminatedError(DynashapeError, RuntimeError):
    """A run refused because its RunOptions has ``terminate`` set (onnxruntime's "Exiting due
    to terminate flag being set to true"); the session is unchanged and later runs work."""


class RequestBusyError(DynashapeError, RuntimeError):
    """A request asked to run while it is running for another caller (one request serves one
    caller at a time: make one per thread, or use an AsyncInferQueue)."""


class UnsupportedFeatureError(DynashapeError, NotImplementedError):
    """An onnxruntime API form that dynashape does not implement (a raw buffer pointer in
    IOBinding); the message names the dynashape call to use instead."""


class ServerBusyError(DynashapeError, RuntimeError):
    """A serving replica's queue is full (``max_queue``): the request was refused at once rather
    than queued without bound (HTTP 503); retry later or add replicas."""


class ConversationLostError(DynashapeError, KeyError):
    """A decode step for a conversation whose state (its KV cache) is not on the replica that got
    it: it expired after the idle timeout, was evicted, or its replica restarted. Start the
    conversation again (``start=True``) with its whole prompt."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class KVCapacityError(DynashapeError, MemoryError):
    """A request whose prompt plus its longest answer needs more KV blocks than the paged KV pool
    holds (dynashape/paged): refused when it arrives, before any block is taken; the message gives
    the blocks it needs and the pool's size."""


def at_node(e: Exception, node_name: str, op_type: str, detail: str = "") -> Exception:
    """``e`` as the error of a node: a dynashape error keeps its type (so ``except
    IndexOutOfRangeError`` works) with the node named in front; anything else becomes an
    ExecutionError naming the node."""
    where = f"node {node_name!r} ({op_type}){detail}"
    if isinstance(e, DynashapeError) and not isinstance(e, ExecutionError):
        if getattr(e, "node", None) is not None:
            return e  # named already (a body's node inside a Loop)
        try:
            new = copy.copy(e)  # MemoryError's subclasses must be made by calling the class
        except TypeError:  # a class whose __init__ takes more than the message
            new = e.__class__.__new__(e.__class__)
            new.__dict__.update(e.__dict__)
        new.args = (f"{where}: {e}",)
        new.node = node_name
        return new
    if isinstance(e, ExecutionError):
        return e
    return ExecutionError(f"{where} failed: {type(e).__name__}: {e}")


class GenerationError(DynashapeError, RuntimeError):
    """A generation step asked of a Generator that cannot take it (done, at max_length, no prompt)."""


class StreamEndedError(DynashapeError, RuntimeError):
    """A token stream of a served generation ended before its last token: its replica died, was
    stopped, or the engine's step failed (the message says which). Only the streams of that
    replica (or that step) end; resend the request."""
