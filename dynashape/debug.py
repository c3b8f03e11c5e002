"""Looking inside a model: intermediate values as outputs, and the first node where two runtimes part.

    sess = InferenceSession(model, extra_outputs=["attn_scores", "mlp/out"])   # or "all"
    report = first_divergence(model, feeds)   # against onnxruntime, node by node

A wrong answer without an error is only found by comparing values node by node with a
runtime that is right; ``first_divergence`` does that with onnxruntime, which runs the same
graph with the same values exposed, and names the first node whose output differs.

Neither runtime can output a value computed inside an If's branch, so the branch an If takes
(its condition is a value of the run) is inlined into the main graph, its nodes and values
renamed ``"<If node> / <branch> / <inner name>"`` (values of the outer scope keep their names),
and both runtimes run the flattened model too; an If inside a branch is inlined on the next
round, from the flattened run's value of its condition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

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
    copy: the values of the same names are compared).

    The values inside an If's taken branch are compared too, named ``"<If> / <branch> / <inner>"``
    (see ``inline_branches``): each runtime runs the model, then the model with the branches its
    own run took inlined, until no If is left (a value is taken from the first run that has it, so
    an If's outputs are those of the runtime's own If, not of the inlined copy)."""

    from .api import InferenceSession
    from .frontend.parse import load_model_proto

    proto = load_model_proto(model)
    ref = proto if reference is None else load_model_proto(reference)
    want, _ = _flattened_values(ref, feeds, onnxruntime_values)

    def ours(m, f):
        sess = InferenceSession(expose(m, "all"), **session_options)
        return dict(zip([a.name for a in sess.get_outputs()], sess.run(None, f)))

    got, graph = _flattened_values(proto, feeds, ours)
    producer = {o: n for n in graph.node for o in n.output}
    for n in proto.graph.node:  # an If's outputs: the If (its inlined copy's Identity stands in for it)
        for o in n.output:
            producer[o] = n
    order = {o: i for i, n in enumerate(graph.node) for o in n.output}
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


def _flattened_values(proto: onnx.ModelProto, feeds: dict, run, rounds: int = 16):
    """Every value ``run(model, feeds)`` gives for ``proto`` and for its copies with the taken
    branches inlined, round after round (the first run that has a name gives its value), and the
    last, most flattened graph (the order of the values)."""
    values = dict(run(proto, feeds))
    for _ in range(rounds):
        known = {**_constants(proto), **feeds, **values}
        flat = inline_branches(proto, known)
        if flat is proto:
            break
        proto = flat
        for k, v in run(proto, feeds).items():
            values.setdefault(k, v)
    return values, proto.graph


def _constants(proto: onnx.ModelProto) -> dict:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def inline_branches(proto: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """A copy of ``proto`` where every If of the main graph whose condition has a value in
    ``values`` is replaced by the nodes of the branch it takes, at its place in the graph: the
    branch's nodes, values and initializers renamed ``"<If> / then_branch / <name>"`` (an If
    without a name is ``If_<index>``; names of the outer scope stay, so a body that reads an outer
    value reads the same one), then an Identity per If output from the branch's output. ``proto``
    itself when there is no such If. An If inside a branch becomes an If of the main graph, inlined
    by the next call with the value of its condition."""
    g = proto.graph
    if not any(n.op_type == "If" and n.input[0] in values for n in g.node):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    taken = set()
    for n in g.node:
        for o in n.output:
            taken.add(o)
    taken |= {t.name for t in g.initializer} | {i.name for i in g.input}
    nodes = []
    for i, n in enumerate(g.node):
        if n.op_type != "If" or n.input[0] not in values:
            nodes.append(n)
            continue
        branch = "then_branch" if bool(np.asarray(values[n.input[0]]).reshape(-1)[0]) else "else_branch"
        body = next(a.g for a in n.attribute if a.name == branch)
        prefix = f"{n.name or f'If_{i}'} / {branch} / "
        defined = [o for m in body.node for o in m.output if o] + [t.name for t in body.initializer] + \
                  [t.values.name for t in body.sparse_initializer] + [x.name for x in body.input]
        rename = {}
        for name in defined:
            new, k = prefix + name, 1
            while new in taken:  # (a name of the outer graph that happens to look like ours)
                new, k = f"{prefix}{name}#{k}", k + 1
            rename[name] = new
            taken.add(new)
        for t in body.initializer:
            c = out.graph.initializer.add()
            c.CopyFrom(t)
            c.name = rename[t.name]
        for t in body.sparse_initializer:
            c = out.graph.sparse_initializer.add()
            c.CopyFrom(t)
            c.values.name = rename[t.values.name]
        for vi in body.value_info:
            if vi.name in rename:
                c = out.graph.value_info.add()
                c.CopyFrom(vi)
                c.name = rename[vi.name]
        for j, m in enumerate(body.node):
            c = onnx.NodeProto()
            c.CopyFrom(m)
            c.name = prefix + (m.name or f"{m.op_type}_{j}")
            c.input[:] = [rename.get(x, x) for x in m.input]
            c.output[:] = [rename.get(x, x) for x in m.output]
            for a in c.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    _rename_outer_refs(sub, rename)
            nodes.append(c)
        for src, dst in zip(body.output, n.output):
            if dst:
                nodes.append(onnx.helper.make_node("Identity", [rename.get(src.name, src.name)], [dst],
                                                   name=f"{prefix}output {dst}"))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _rename_outer_refs(graph: onnx.GraphProto, rename: dict) -> None:
    """Rename, in ``graph`` and the graphs inside it, the references to names of the scope around
    it that ``rename`` renames (a name the graph defines itself is its own)."""
    own = {o for m in graph.node for o in m.output} | {t.name for t in graph.initializer} | \
          {x.name for x in graph.input}
    rename = {k: v for k, v in rename.items() if k not in own}
    if not rename:
        return
    for m in graph.node:
        m.input[:] = [rename.get(x, x) for x in m.input]
        for a in m.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _rename_outer_refs(sub, rename)
    for o in graph.output:  # (a body output may be an outer value itself)
        if o.name in rename:
            o.name = rename[o.name]


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
