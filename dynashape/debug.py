"""Looking inside a model: intermediate values as outputs, and the first node where two runtimes part.

    sess = InferenceSession(model, extra_outputs=["attn_scores", "mlp/out"])   # or "all"
    report = first_divergence(model, feeds)   # against onnxruntime, node by node

A wrong answer without an error is only found by comparing values node by node with a
runtime that is right; ``first_divergence`` does that with onnxruntime, which runs the same
graph with the same values exposed, and names the first node whose output differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .frontend.expose import expose


@dataclass
class Divergence:
    node: str  # the node that produced the value
    op_type: str
    output: str
    max_abs: float  # max |dynashape - reference| (inf for a shape or dtype mismatch)
    note: str = ""


def onnxruntime_values(model, feeds: dict) -> dict:
    """Every typed value of ``model`` by name, as onnxruntime computes it with its graph
    optimizations off (so that every value of the graph exists there)."""
    import onnxruntime as ort

    from .frontend.parse import load_model_proto

    typed = expose(load_model_proto(model), "all")
    # onnxruntime cannot output a value of unknown type: leave those out
    keep = [o for o in typed.graph.output if o.type.HasField("tensor_type") and o.type.tensor_type.elem_type]
    del typed.graph.output[:]
    typed.graph.output.extend(keep)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(typed.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in keep]
    return dict(zip(names, ref.run(names, feeds)))


def first_divergence(model, feeds: dict, rtol: float = 1e-4, atol: float = 1e-5, all_rows: bool = False,
                     reference=None, **session_options) -> list[Divergence]:
    """Run ``model`` on ``feeds`` in dynashape and in onnxruntime (graph optimizations off, so
    every value exists there too) with every intermediate exposed, and compare node by node in
    graph order. Returns the rows that differ beyond ``rtol``/``atol`` (the first is where the
    two part: later ones may only inherit it), or every compared row with ``all_rows``.
    ``reference``: the model onnxruntime runs instead of ``model`` (an original beside an edited
    copy: the values of the same names are compared)."""

    from .api import InferenceSession
    from .frontend.parse import load_model_proto

    proto = expose(load_model_proto(model), "all")
    want = onnxruntime_values(proto if reference is None else reference, feeds)
    sess = InferenceSession(proto, **session_options)
    got = dict(zip([a.name for a in sess.get_outputs()], sess.run(None, feeds)))
    producer = {o: n for n in proto.graph.node for o in n.output}
    order = {o: i for i, n in enumerate(proto.graph.node) for o in n.output}
    rows = []
    for name in sorted(want, key=lambda o: order.get(o, -1)):  # graph order: the first row is the first to part
        if name not in got:  # (a reference's value the model does not have)
            continue
        g, w = got[name], want[name]
        n = producer.get(name)
        row = compare_values(g, w, rtol, atol)
        if row is None:
            continue
        err, bad, note = row
        if bad or all_rows:
            rows.append(Divergence(n.name if n else "", n.op_type if n else "(input)", name, err, note))
    return rows


def compare_values(g, w, rtol: float, atol: float):
    """(max abs error, differs?, note) of one value, None when it cannot be compared (strings)."""
    g, w = np.asarray(g), np.asarray(w)
    if w.dtype == object or w.dtype.kind in "SU":
        return None
    if g.shape != w.shape:
        return float("inf"), True, f"shape {g.shape} vs {w.shape}"
    if g.size == 0:
        return 0.0, False, ""
    if w.dtype.kind in "biu":
        diff = np.abs(g.astype(np.int64) - w.astype(np.int64))
        err = float(diff.max())
        return err, err > 0, f"{int((diff > 0).sum())} of {w.size} integers differ" if err else ""
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    with np.errstate(invalid="ignore"):
        # equal infinities (a mask's -inf) and NaN against NaN agree; np.where, not item
        # assignment: a 0-d difference is a numpy scalar, which takes none
        same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
        diff = np.where(same, 0.0, np.abs(g64 - w64))
        # an infinity or NaN that the other side does not have differs, whatever the tolerance
        # (rtol times an infinite reference would excuse anything)
        bad = ~same & ((diff > atol + rtol * np.abs(w64)) | ~np.isfinite(g64) | ~np.isfinite(w64))
    err = float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan")
    return err, bool(bad.any() or np.isnan(diff).any()), ""
