"""What a user runs before trusting us with a model: `dynashape check MODEL [--compare]`.

The report says whether every op (subgraphs included) has a kernel here, at the model's opset
and domain; which inputs are dynamic and what their dims are called (a placeholder name such as
``?`` or ``unk__3`` means "unknown", not "equal"); and, comparing, runs random inputs of a few
random shapes here and in onnxruntime and gives the largest error per output.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from .errors import DynashapeError, UnsupportedOpError
from .ops.registry import lookup
from .shape import is_placeholder


@dataclass
class OpRow:
    domain: str
    op_type: str
    opset: int
    count: int
    supported: bool
    detail: str = ""


def _nodes(g: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for n in g.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _nodes(sub)


def op_report(proto: onnx.ModelProto) -> list[OpRow]:
    """One row per (domain, op type), with the opset the model imports for that domain."""
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in proto.opset_import}
    local = {(f.domain, f.name) for f in proto.functions}  # model-local functions are inlined at load
    counts = Counter((n.domain if n.domain != "ai.onnx" else "", n.op_type) for n in _nodes(proto.graph))
    rows = []
    for (dom, op_type), k in sorted(counts.items()):
        opset = opsets.get(dom, 1)
        if (dom, op_type) in local:
            rows.append(OpRow(dom, op_type, opset, k, True, "model-local function (inlined)"))
            continue
        try:
            lookup(op_type, dom, opset)
            rows.append(OpRow(dom, op_type, opset, k, True))
        except UnsupportedOpError as e:
            rows.append(OpRow(dom, op_type, opset, k, False, str(e).split("; the supported")[0]))
    return rows


@dataclass
class InputRow:
    name: str
    dtype: str
    dims: list  # ints, symbol names, or None for an unnamed dynamic dim
    note: str


def input_report(proto: onnx.ModelProto) -> list[InputRow]:
    inits = {i.name for i in proto.graph.initializer}
    rows = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue  # an initializer listed as an input (old IR): overridable, rarely fed
        t = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?"
        if not t.HasField("shape"):
            rows.append(InputRow(vi.name, dtype, [], "rank unknown"))
            continue
        dims, notes = [], []
        for axis, d in enumerate(t.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(d.dim_value)
            elif not is_placeholder(d.dim_param):
                dims.append(d.dim_param)
            else:
                dims.append(None)
                if d.dim_param:
                    notes.append(f"axis {axis} named {d.dim_param!r}: a placeholder, read as unknown")
        dyn = sum(not isinstance(d, int) for d in dims)
        notes.insert(0, "static" if not dyn else f"{dyn} dynamic dim(s)")
        rows.append(InputRow(vi.name, dtype, dims, "; ".join(notes)))
    return rows


@dataclass
class CompareRow:
    shapes: dict  # input name -> shape
    errors: dict  # output name -> max abs error (inf: shape or dtype differ)
    status: str  # "match", "MISMATCH", "dynashape error: ...", "onnxruntime refused: ..."


def random_feeds(inputs: list[InputRow], rng: np.random.Generator, given: dict, dim_choices=(1, 2, 3, 5, 8),
                 int_high: int = 10) -> dict:
    """Random inputs, never zeros: a named dim takes one value for every axis carrying it, an
    unnamed one its own; ``given`` (name -> shape) overrides."""
    sym: dict[str, int] = {}
    feeds = {}
    for r in inputs:
        if r.name in given:
            shape = tuple(given[r.name])
        else:
            shape = tuple(d if isinstance(d, int) else
                          sym.setdefault(d, int(rng.choice(dim_choices))) if d else int(rng.choice(dim_choices))
                          for d in r.dims)
        dt = np.dtype(r.dtype if r.dtype != "?" else "float32")
        if dt == np.bool_:
            feeds[r.name] = rng.random(shape) < 0.5
        elif dt.kind in "iu":
            feeds[r.name] = rng.integers(1 if int_high > 1 else 0, max(int_high, 1), size=shape).astype(dt)
        else:
            feeds[r.name] = rng.uniform(-1, 1, size=shape).astype(dt)
    return feeds


def compare(model, trials: int = 3, seed: int = 0, given: dict | None = None, int_high: int = 10,
            rtol: float = 1e-3, atol: float = 1e-4, **session_options) -> list[CompareRow]:
    """Run ``trials`` random shapes in one dynashape session and in onnxruntime (CPU, defaults)."""
    import onnxruntime as ort

    from .api import InferenceSession
    from .debug import compare_values
    from .frontend.parse import load_model_proto

    proto = load_model_proto(model)
    inputs = input_report(proto)
    rng = np.random.default_rng(seed)
    data = proto.SerializeToString()
    feeds_seq = [random_feeds(inputs, rng, given or {}, int_high=int_high) for _ in range(trials)]
    want = []
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    for f in feeds_seq:
        try:
            want.append(ref.run(None, f))
        except Exception as e:  # noqa: BLE001  the shapes were wrong for the model, not for us
            want.append(f"onnxruntime refused: {str(e).splitlines()[0][:160]}")
    del ref  # its thread pool must not spin while we run
    sess = InferenceSession(proto, **session_options)
    rows = []
    for f, w in zip(feeds_seq, want):
        shapes = {k: list(v.shape) for k, v in f.items()}
        if isinstance(w, str):
            rows.append(CompareRow(shapes, {}, w))
            continue
        try:
            got = sess.run(None, f)
        except DynashapeError as e:
            rows.append(CompareRow(shapes, {}, f"dynashape error: {type(e).__name__}: {str(e)[:200]}"))
            continue
        errs, bad = {}, False
        for name, g, wv in zip(names, got, w):
            row = compare_values(g, wv, rtol, atol)
            if row is not None:
                errs[name] = row[0]
                bad = bad or row[1]
        rows.append(CompareRow(shapes, errs, "MISMATCH" if bad else "match"))
    return rows
