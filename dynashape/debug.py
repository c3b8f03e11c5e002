"""Looking inside a model: intermediate values as outputs, and the first node where two runtimes part.

    sess = InferenceSession(model, extra_outputs=["attn_scores", "mlp/out"])   # or "all"
    report = first_divergence(model, feeds)   # against onnxruntime, node by node

A wrong answer without an error is only found by comparing values node by node with a
runtime that is right; ``first_divergence`` does that with onnxruntime, which runs the same
graph with the same values exposed, and names the first node whose output differs.

Neither runtime can output a value computed inside an If's branch or a Loop's body, so the
branch an If takes (its condition is a value of the run) is inlined into the main graph, its
nodes and values renamed ``"<If node> / <branch> / <inner name>"`` (values of the outer scope keep
their names), a Loop unrolled (``"<Loop> / iteration <i> / <inner name>"``, as many iterations as
onnxruntime runs), and both runtimes run the flattened model too; an If or Loop inside a body is
inlined on the next round, from the flattened run's values. Scan bodies are not descended into
(their outputs are compared).
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
                     reference=None, relative_to: str = "element", **session_options) -> list[Divergence]:
    """Run ``model`` on ``feeds`` in dynashape and in onnxruntime (graph optimizations off, so
    every value exists there too) with every intermediate exposed, and compare node by node in
    graph order. Returns the rows that differ beyond ``rtol``/``atol`` (the first is where the
    two part: later ones may only inherit it), or every compared row with ``all_rows``.
    ``reference``: the model onnxruntime runs instead of ``model`` (an original beside an edited
    copy: the values of the same names are compared). ``relative_to="tensor"``: ``rtol`` scales
    the value's largest magnitude instead of each element's (a convolution's sums of large terms
    that cancel to near zero differ by their rounding, which is not a divergence).

    The values inside an If's taken branch and a Loop's iterations are compared too, named
    ``"<If> / <branch> / <inner>"`` and ``"<Loop> / iteration <i> / <inner>"`` (see
    ``inline_branches``): each runtime runs the model, then the model with the branches its own
    run took inlined and the Loops unrolled (as many iterations as onnxruntime runs that model:
    ``loop_iterations``), round after round until nothing is left to inline (a value is taken from
    the first run that has it, so an If's or Loop's outputs are those of the runtime's own If or
    Loop, not of the inlined copy)."""

    from .api import InferenceSession
    from .frontend.parse import load_model_proto

    proto = load_model_proto(model)
    ref = proto if reference is None else load_model_proto(reference)
    want, _ = _flattened_values(ref, feeds, onnxruntime_values)

    def ours(m, f):
        sess = InferenceSession(expose(m, "all"), **session_options)
        return dict(zip([a.name for a in sess.get_outputs()], sess.run(None, f)))

    got, graphs = _flattened_values(proto, feeds, ours)
    producer = {}
    for g in graphs:  # an If's or Loop's outputs: the If or Loop (not the Identity standing in for it)
        for n in g.node:
            for o in n.output:
                producer.setdefault(o, n)
    order = {o: i for i, n in enumerate(graphs[-1].node) for o in n.output}
    rows = []
    for name in sorted(want, key=lambda o: order.get(o, -1)):  # graph order: the first row is the first to part
        if name not in got:  # (a reference's value the model does not have)
            continue
        g, w = got[name], want[name]
        n = producer.get(name)
        row = compare_values(g, w, rtol, atol, relative_to)
        if row is None:
            continue
        err, bad, note = row
        if bad or all_rows:
            rows.append(Divergence(n.name if n else "", n.op_type if n else "(input)", name, err, note))
    return rows


def _flattened_values(proto: onnx.ModelProto, feeds: dict, run, rounds: int = 16):
    """Every value ``run(model, feeds)`` gives for ``proto`` and for its copies with the taken
    branches and the iterations of its Loops inlined, round after round (the first run that has a
    name gives its value), and the graphs of the rounds (the last, most flattened one orders the
    values)."""
    values, graphs = dict(run(proto, feeds)), [proto.graph]
    for _ in range(rounds):
        known = {**_constants(proto), **feeds, **values}
        flat = inline_branches(proto, known, loop_iterations(proto, feeds))
        if flat is proto:
            break
        proto = flat
        graphs.append(proto.graph)
        for k, v in run(proto, feeds).items():
            values.setdefault(k, v)
    return values, graphs


def _constants(proto: onnx.ModelProto) -> dict:
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


_ITERATIONS = "dynashape.debug iterations of "  # (the probe's extra Loop output: a name no model has)


def loop_iterations(proto: onnx.ModelProto, feeds: dict) -> dict:
    """How many times each Loop of the main graph runs its body on ``feeds``, by the first output's
    name: onnxruntime runs a copy whose Loops also scan out their iteration number (a Loop's count
    is not an output; the trip count and the condition may both decide it). Empty when there is no
    Loop, or onnxruntime cannot run the copy."""
    loops = [n for n in proto.graph.node if n.op_type == "Loop" and n.output and n.output[0]]
    if not loops:
        return {}
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    names = []
    for n in probe.graph.node:
        if n.op_type != "Loop" or not n.output or not n.output[0]:
            continue
        body = next(a.g for a in n.attribute if a.name == "body")
        it = body.input[0]
        counter = _ITERATIONS + "body"
        body.node.append(onnx.helper.make_node("Identity", [it.name], [counter]))
        body.output.append(onnx.helper.make_tensor_value_info(counter, onnx.TensorProto.INT64, None))
        names.append(_ITERATIONS + n.output[0])
        n.output.append(names[-1])
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(x, onnx.TensorProto.INT64, None) for x in names)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
        want = {i.name for i in sess.get_inputs()}
        got = sess.run(names, {k: v for k, v in feeds.items() if k in want})
    except Exception:  # noqa: BLE001  (the Loops stay as they are: their outputs are still compared)
        return {}
    return {x[len(_ITERATIONS):]: int(np.asarray(v).shape[0]) for x, v in zip(names, got)}


def inline_branches(proto: onnx.ModelProto, values: dict, iterations: dict | None = None,
                    max_iterations: int = 64) -> onnx.ModelProto:
    """A copy of ``proto`` where every If of the main graph whose condition has a value in
    ``values`` is replaced by the nodes of the branch it takes, at its place in the graph: the
    branch's nodes, values and initializers renamed ``"<If> / then_branch / <name>"`` (an If
    without a name is ``If_<index>``; names of the outer scope stay, so a body that reads an outer
    value reads the same one), then an Identity per If output from the branch's output. ``proto``
    itself when there is nothing to inline. An If inside a branch becomes an If of the main graph,
    inlined by the next call with the value of its condition.

    ``iterations`` (``loop_iterations``: how many times each Loop runs, by its first output): a
    Loop that runs 1 to ``max_iterations`` times is unrolled the same way, iteration ``i``'s copy of
    the body renamed ``"<Loop> / iteration <i> / <name>"`` (its iteration number a constant, its
    condition true, as it is in an iteration that runs, its loop-carried inputs the previous
    iteration's outputs), the Loop's outputs the last iteration's values and the scan outputs'
    concatenation."""
    g = proto.graph
    iterations = iterations or {}

    def unrolled(n):
        return n.op_type == "Loop" and 0 < iterations.get(n.output[0] if n.output else "", 0) <= max_iterations

    if not any((n.op_type == "If" and n.input[0] in values) or unrolled(n) for n in g.node):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    taken = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    nodes = []
    for i, n in enumerate(g.node):
        if n.op_type == "If" and n.input[0] in values:
            branch = "then_branch" if bool(np.asarray(values[n.input[0]]).reshape(-1)[0]) else "else_branch"
            body = next(a.g for a in n.attribute if a.name == branch)
            prefix = f"{n.name or f'If_{i}'} / {branch} / "
            rename = _inline_body(body, prefix, {}, taken, out.graph, nodes)
            for src, dst in zip(body.output, n.output):
                if dst:
                    nodes.append(onnx.helper.make_node("Identity", [rename.get(src.name, src.name)], [dst],
                                                       name=f"{prefix}output {dst}"))
        elif unrolled(n):
            nodes.extend(_unroll_loop(n, i, iterations[n.output[0]], taken, out.graph, opset))
        else:
            nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _unroll_loop(n: onnx.NodeProto, index: int, count: int, taken: set, graph: onnx.GraphProto,
                 opset: int) -> list:
    """The nodes of ``count`` iterations of the Loop ``n`` (see inline_branches), then its outputs."""
    from onnx import helper

    body = next(a.g for a in n.attribute if a.name == "body")
    name = n.name or f"Loop_{index}"
    carried = [x for x in n.input[2:]]
    nv = len(carried)
    scans: list[list[str]] = [[] for _ in body.output[1 + nv:]]
    nodes = []

    def rank_of(vi):  # onnxruntime feeds a body's iteration number and condition at the rank they declare
        t = vi.type.tensor_type
        return [1] if t.HasField("shape") and len(t.shape.dim) == 1 else []

    for it in range(count):
        prefix = f"{name} / iteration {it} / "
        it_name, cond_name = f"{prefix}{body.input[0].name}", f"{prefix}{body.input[1].name}"
        for x, v, kind in ((body.input[0], it, onnx.TensorProto.INT64), (body.input[1], True, onnx.TensorProto.BOOL)):
            if _reads(body, x.name):  # (a constant nothing reads: onnxruntime warns of it)
                c = f"{prefix}{x.name}"
                nodes.append(helper.make_node("Constant", [], [c], name=c,
                                              value=helper.make_tensor(c, kind, rank_of(x), [v])))
        taken |= {it_name, cond_name}
        bind = {body.input[0].name: it_name, body.input[1].name: cond_name,
                **{x.name: c for x, c in zip(body.input[2:], carried)}}
        rename = _inline_body(body, prefix, bind, taken, graph, nodes)
        carried = [rename.get(o.name, o.name) for o in body.output[1:1 + nv]]
        for k, o in enumerate(body.output[1 + nv:]):
            scans[k].append(rename.get(o.name, o.name))
    for src, dst in zip(carried, n.output[:nv]):
        if dst:
            nodes.append(helper.make_node("Identity", [src], [dst], name=f"{name} / output {dst}"))
    axes = f"{name} / axes"
    if scans and opset >= 13:
        graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), axes))
    for k, (parts, dst) in enumerate(zip(scans, n.output[nv:])):
        if not dst:
            continue
        rows = []
        for it, x in enumerate(parts):
            row = f"{name} / iteration {it} / scan {k}"
            rows.append(row)
            nodes.append(helper.make_node("Unsqueeze", [x, axes], [row], name=row) if opset >= 13 else
                         helper.make_node("Unsqueeze", [x], [row], name=row, axes=[0]))
        nodes.append(helper.make_node("Concat", rows, [dst], name=f"{name} / output {dst}", axis=0))
    return nodes


def _inline_body(body: onnx.GraphProto, prefix: str, bind: dict, taken: set, graph: onnx.GraphProto,
                 nodes: list) -> dict:
    """Append to ``nodes`` a copy of ``body``'s nodes (and to ``graph`` its initializers and
    value_info), every name the body defines renamed ``prefix + name`` and its inputs ``bind``'s
    names; returns the renaming (of the body's inputs too)."""
    defined = [o for m in body.node for o in m.output if o] + [t.name for t in body.initializer] + \
              [t.values.name for t in body.sparse_initializer]
    rename = dict(bind)
    for name in defined:
        new, k = prefix + name, 1
        while new in taken:  # (a name of the outer graph that happens to look like ours)
            new, k = f"{prefix}{name}#{k}", k + 1
        rename[name] = new
        taken.add(new)
    for t in body.initializer:
        c = graph.initializer.add()
        c.CopyFrom(t)
        c.name = rename[t.name]
    for t in body.sparse_initializer:
        c = graph.sparse_initializer.add()
        c.CopyFrom(t)
        c.values.name = rename[t.values.name]
    for vi in body.value_info:
        if vi.name in rename and vi.name not in bind:
            c = graph.value_info.add()
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
    return rename


def _reads(graph: onnx.GraphProto, name: str) -> bool:
    """Whether a node of ``graph`` (or of a graph inside it that does not define ``name`` itself)
    reads ``name``, or ``graph`` outputs it."""
    if any(o.name == name for o in graph.output):
        return True
    for m in graph.node:
        if name in m.input:
            return True
        for a in m.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                own = {o for k in sub.node for o in k.output} | {x.name for x in sub.input}
                if name not in own and _reads(sub, name):
                    return True
    return False


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


def compare_values(g, w, rtol: float, atol: float, relative_to: str = "element"):
    """(max abs error, differs?, note) of one value, None when it cannot be compared (strings).
    ``relative_to``: "element" (|g - w| <= atol + rtol |w| element by element) or "tensor" (rtol
    times the largest finite |w|)."""
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
        if relative_to == "element":
            scale = np.abs(w64)
        else:
            finite = np.abs(w64[np.isfinite(w64)])
            scale = finite.max() if finite.size else 0.0
        bad = ~same & ((diff > atol + rtol * scale) | ~np.isfinite(g64) | ~np.isfinite(w64))
    err = float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan")
    return err, bool(bad.any() or np.isnan(diff).any()), ""
