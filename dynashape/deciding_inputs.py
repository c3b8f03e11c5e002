"""Inputs that decide an If: a scalar fed with the same value call after call (silero-vad's sample
rate) is made a constant in a variant of the model, one per value seen, so that the If folds at
compile time (compile/inline_if.py) and the branch it takes is part of the caller's generated code.

Run as a node, silero-vad's If cost a sub-program call a run: a dict of the body's ~40 outer values
built, their shapes checked, the body's own code entered, and no fusion across the If. Each call
reads the scalar feed (the guard) and runs the variant made for its value; a new value takes its
own variant, so a changed condition always takes its branch. The session's first value gets its
variant at once (the first call compiles anyway); a later one at its second call (a model compile,
silero-vad's 15-65 ms here), the first running the general model, whose If compiled both branches
at its first run (``decided_if_first_sight``): a value seen once costs no compile.

Not for every model: a variant holds its own copy of the weights, so a model above
``MAX_MODEL_BYTES`` (a merged decoder's ``use_cache_branch``) keeps its If nodes, as does one that
has seen ``MAX_VALUES`` values of its deciding inputs (a step counter is not a switch); both are
counted in the session's stats (``decided_if_refused``).
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import TensorProto, numpy_helper

MAX_VALUES = 4  # distinct values (per model) made into variants; beyond, the Ifs run as nodes
MAX_MODEL_BYTES = 64 << 20  # weights duplicated per variant: small models only
_SCALAR_TYPES = {TensorProto.BOOL, TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
                 TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}
# ops through which a condition is computed from the scalar (all cheap, all foldable)
_FOLDABLE = frozenset({"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
                       "Cast", "Reshape", "Squeeze", "Unsqueeze", "Gather", "Identity", "Constant", "Add", "Sub",
                       "Mul", "Div", "Mod", "Shape", "Size", "Slice", "Concat", "ReduceMin", "ReduceMax"})


def _is_scalar(vi: onnx.ValueInfoProto) -> bool:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or t.elem_type not in _SCALAR_TYPES or not t.HasField("shape"):
        return False
    return all(d.HasField("dim_value") and d.dim_value == 1 for d in t.shape.dim)


def deciding_inputs(proto: onnx.ModelProto) -> tuple[str, ...]:
    """The scalar integer or bool inputs an If condition of the main graph is computed from
    (through foldable ops and constants only), or () where variants do not apply."""
    g = proto.graph
    if sum(t.ByteSize() for t in g.initializer) > MAX_MODEL_BYTES:
        return ()
    consts = {t.name for t in g.initializer}
    candidates = {i.name for i in g.input if _is_scalar(i) and i.name not in consts}
    if not candidates:
        return ()
    # value -> the candidate inputs it is computed from, for values computed from candidates and constants only
    roots: dict[str, frozenset] = {c: frozenset([c]) for c in candidates}
    found: set[str] = set()
    for node in g.node:
        if node.op_type == "If" and node.input and node.input[0] in roots:
            found |= roots[node.input[0]]
        if node.op_type not in _FOLDABLE or node.domain not in ("", "ai.onnx"):
            continue
        ins = [i for i in node.input if i]
        if all(i in roots or i in consts for i in ins) and any(i in roots for i in ins):
            r = frozenset().union(*(roots[i] for i in ins if i in roots))
            for o in node.output:
                roots[o] = r
        elif all(i in consts for i in ins):
            consts.update(node.output)
    return tuple(sorted(found))


def value_of(x):
    """The Python value of a one-element host array or tensor, or None (a device tensor: reading
    it would wait for the device; anything else: the general model serves it)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.item() if x.size == 1 else None
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.numel() == 1:
        return x.item()
    return None


def pinned(proto: onnx.ModelProto, values: dict[str, object]) -> onnx.ModelProto:
    """``proto`` with the inputs ``values`` names turned into initializers of those values."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    kept = [i for i in g.input if i.name not in values]
    for i in g.input:
        if i.name in values:
            t = i.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            arr = np.full([d.dim_value for d in t.shape.dim], values[i.name], dtype=dtype)
            g.initializer.append(numpy_helper.from_array(arr, i.name))
    del g.input[:]
    g.input.extend(kept)
    return out
