"""Intermediate values as graph outputs: the session option ``extra_outputs`` (see dynashape.debug)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from ..errors import OptionsError


def expose(proto: onnx.ModelProto, names: Sequence[str] | str) -> onnx.ModelProto:
    """A copy of ``proto`` whose graph also outputs ``names`` (values of the main graph), after
    its own outputs; ``"all"``: every node output of the main graph, in node order. An
    initializer or a graph input may be named too: onnxruntime returns such an output as it is
    (a constant's value, the feed), and so does the session."""
    g = proto.graph
    produced = [o for n in g.node for o in n.output if o]
    have = {o.name for o in g.output}
    if isinstance(names, str):
        if names != "all":
            raise OptionsError(f"extra_outputs must be a list of value names or 'all', got {names!r}")
        names = [o for o in produced if o not in have]
    given = {t.name for t in g.initializer} | {t.name for t in g.sparse_initializer} | {i.name for i in g.input}
    missing = sorted(set(names) - set(produced) - have - given)
    if missing:
        raise OptionsError(f"extra_outputs names {missing}, which is no node output, initializer or input of the "
                           f"main graph")
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    try:  # types for the new outputs (onnxruntime wants them; ours only reads the element type)
        inferred = onnx.shape_inference.infer_shapes(out).graph.value_info
    except Exception:  # noqa: BLE001  an output without a type is still an output to us
        inferred = []
    types = {vi.name: vi for vi in list(out.graph.value_info) + list(inferred)}
    for t in g.initializer:  # (an initializer's type is its tensor's; a graph input's declared one wins)
        types.setdefault(t.name, onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    types.update({i.name: i for i in g.input})
    seen = set(have)
    for n in names:
        if n in seen:
            continue
        seen.add(n)
        vi = out.graph.output.add()
        if n in types:
            vi.CopyFrom(types[n])
        else:
            vi.name = n
    return out
