"""Pass: the attention core written out by exporters becomes one scaled_dot_product_attention.

    scores = MatMul(q [* cq], kT [* ck]) [/ c | * c]      (or com.microsoft FusedMatMul(q, kT | k, alpha))
    scores = scores + mask | Where(mask, -inf, scores) | Where(mask, scores, -inf)     (optional)
    p = Softmax(scores, last axis) [then Where(IsNaN(p), 0, p)]
    out = MatMul(p, v)

``kT`` is the keys with their last two axes swapped; where the pass can prove which tensor that
is (a Transpose of the last two axes, or torch.onnx's Reshape -> Transpose(0, 2, 1) -> Reshape
chain) the fused op reads the keys themselves. Keys and values repeated for grouped-query
attention (``Reshape(Expand(Unsqueeze(kv, 2)))``, HF's repeat_kv) are read before the repeat, and
the kernel repeats them itself (``enable_gqa``, torch >= 2.5). All scales multiply into one.
"""

from __future__ import annotations

from ..ir import Graph, Node, Value
from ..ops.fused import SDPA_GQA
from .patterns import const_ints, fuse, only_feeds, producer, rank, scalar


def _scaled(v: Value) -> tuple[Value, float, list[Node]]:
    """``v`` as ``x * c`` (c a scalar constant, either side): (x, c, [the Mul])."""
    n = producer(v, "Mul")
    if n is not None:
        for a, b in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            c = scalar(b)
            if c is not None and not a.is_const:
                return a, c, [n]
    return v, 1.0, []


def _scores_product(v: Value) -> tuple[Node, float, int] | None:
    """``v`` = q @ kT: (the product node, its scale, 1 when its second input is kT, 0 when it is the
    keys themselves). onnxruntime's optimizer writes the scaled product as FusedMatMul(alpha,
    transB); one whose first operand or batch dims it transposes is not attention's."""
    n = producer(v, "MatMul")
    if n is not None:
        return n, 1.0, 1
    n = v.producer if v is not None else None
    if n is None or n.op_type != "FusedMatMul" or n.domain != "com.microsoft" or n.attrs.get("transA", 0) \
            or n.attrs.get("transBatchA", 0) or n.attrs.get("transBatchB", 0):
        return None
    return n, float(n.attrs.get("alpha", 1.0)), 0 if n.attrs.get("transB", 0) else 1


def _swaps_last_two(perm, r: int | None) -> bool:
    return r is not None and perm is not None and list(perm) == list(range(r - 2)) + [r - 1, r - 2]


def _same_dims(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(x.known_equal(y) for x, y in zip(a, b))


def _untransposed(kt: Value) -> tuple[Value, list[Node]] | None:
    """The keys whose last two axes ``kt`` swaps, when provable: (keys, the nodes between)."""
    t = producer(kt, "Transpose")
    if t is not None and _swaps_last_two(t.attrs.get("perm"), rank(t.inputs[0])):
        return t.inputs[0], [t]
    r2 = producer(kt, "Reshape")
    t = producer(r2.inputs[0] if r2 else None, "Transpose")
    r1 = producer(t.inputs[0] if t else None, "Reshape")
    if r1 is None or t.attrs.get("perm") != [0, 2, 1]:
        return None
    k = r1.inputs[0]
    ks, mid, out = k.shape, r1.outputs[0].shape, kt.shape
    if ks is None or mid is None or out is None or len(ks) != 4 or len(mid) != 3 or len(out) != 4:
        return None
    if not (_same_dims(mid[1:], ks[2:]) and _same_dims(out[:2], ks[:2]) and _same_dims(out[2:], ks[2:][::-1])):
        return None
    return k, [r1, t, r2]


def _unrepeated(x: Value) -> tuple[Value, list[Node], int] | None:
    """``x = Reshape(Expand(Unsqueeze(kv, 2), [1, 1, g, 1, 1]), [b, h * g, n, d])``: (kv, nodes, g)."""
    if not SDPA_GQA:
        return None
    r = producer(x, "Reshape")
    e = producer(r.inputs[0] if r else None, "Expand")
    u = producer(e.inputs[0] if e else None, "Unsqueeze")
    if u is None:
        return None
    axes = u.attrs.get("axes") if u.attrs.get("axes") is not None else const_ints(u.inputs[1] if len(u.inputs) > 1
                                                                                   else None)
    reps = const_ints(e.inputs[1])
    if reps is None:  # a shape computed at run time ([b, kv_heads, g, n, d] from Shape nodes): read the dims
        reps = _expand_factors(u.outputs[0].shape, e.outputs[0].shape)
    kv = u.inputs[0]
    if axes not in ([2], [-3]) or reps is None or len(reps) != 5 or any(v != 1 for i, v in enumerate(reps) if i != 2):
        return None
    ks, out = kv.shape, x.shape
    if ks is None or out is None or len(ks) != 4 or len(out) != 4 or not _same_dims(out[2:], ks[2:]):
        return None
    if ks[1].is_static and out[1].is_static and out[1].min != ks[1].min * reps[2]:
        return None
    return kv, [u, e, r], reps[2]


def _expand_factors(src, out) -> list[int] | None:
    """The factors of an Expand of shape ``src`` to ``out``: 1 where the dims are equal, the out
    dim where the source's is 1 and the out dim static; None when the dims do not prove it."""
    if src is None or out is None or len(src) != len(out):
        return None
    reps = []
    for a, b in zip(src, out):
        if a.known_equal(b):
            reps.append(1)
        elif a.is_static and a.min == 1 and b.is_static:
            reps.append(b.min)
        else:
            return None
    return reps


def _scores_mask(s: Value):
    """(scores before the mask, mask, mask kind, nodes) for ``s`` = scores with a mask applied."""
    n = producer(s, ("Add", "Where"))
    if n is None:
        return s, None, "none", []
    if n.op_type == "Add":
        a, b = n.inputs
        ma, mb = _scores_product(a) or _scale_of(a), _scores_product(b) or _scale_of(b)
        if ma is not None and mb is None:
            return a, b, "add", [n]
        if mb is not None and ma is None:
            return b, a, "add", [n]
        return s, None, "none", []
    c, x, y = n.inputs
    if scalar(x) == float("-inf") and not y.is_const:
        return y, c, "drop", [n]
    if scalar(y) == float("-inf") and not x.is_const:
        return x, c, "keep", [n]
    return s, None, "none", []


def _scale_of(v: Value) -> Node | None:
    n = producer(v, ("Div", "Mul"))
    if n is None:
        return None
    return n if _scores_product(n.inputs[0]) is not None or _scores_product(n.inputs[1]) is not None else None


def _softmax_input(p: Value) -> tuple[Node, Value, bool, list[Node]] | None:
    """``p`` = Softmax(s) over the last axis, possibly with NaNs made 0: (softmax, s, nan_to_zero, nodes)."""
    w = producer(p, "Where")
    if w is not None:
        isnan = producer(w.inputs[0], "IsNaN")
        sm = producer(w.inputs[2], "Softmax")
        if isnan is None or sm is None or isnan.inputs[0] is not w.inputs[2] or scalar(w.inputs[1]) != 0.0:
            return None
        nodes, nan = [sm, isnan, w], True
    else:
        sm = producer(p, "Softmax")
        if sm is None:
            return None
        nodes, nan = [sm], False
    r = rank(sm.inputs[0])
    axis = sm.attrs.get("axis", -1 if sm.opset >= 13 else 1)
    if r is None or axis not in (-1, r - 1):
        return None
    return sm, sm.inputs[0], nan, nodes


def fuse_attention(graph: Graph) -> Graph:
    for mm in [n for n in graph.nodes if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]:
        if mm not in graph.nodes:
            continue
        found = _match(graph, mm)
        if found is not None:
            nodes, ins, attrs = found
            attrs["heads_last"] = int(_heads_merged_after(mm.outputs[0], graph))
            fuse(graph, nodes, "Attention", ins, attrs)
    return graph


def _heads_merged_after(y: Value, graph: Graph) -> bool:
    """Whether the attention's (B, N, S, H) result is read only by Transpose(0, 2, 1, 3) (the heads
    put side by side before a Reshape): the kernel then writes it in that order, and the
    transpose leaves a contiguous tensor whose reshape is a view instead of a copy."""
    if rank(y) != 4 or not y.users or any(y is o for o in graph.outputs):
        return False
    return all(u.op_type == "Transpose" and u.domain in ("", "ai.onnx")
               and list(u.attrs.get("perm", ())) == [0, 2, 1, 3] for u in y.users)


def _match(graph: Graph, mm: Node):
    p, v = mm.inputs
    sm = _softmax_input(p)
    if sm is None or rank(v) is None or rank(v) < 3:
        return None
    _, s, nan, sm_nodes = sm
    s0, mask, mask_kind, mask_nodes = _scores_mask(s)
    scale, scale_nodes = 1.0, []
    d = producer(s0, ("Div", "Mul"))
    if d is not None and _scores_product(s0) is None:
        c = scalar(d.inputs[1]) if d.op_type == "Div" else None
        if d.op_type == "Div" and c:
            scale, s1, scale_nodes = 1.0 / c, d.inputs[0], [d]
        else:
            s1, c, scale_nodes = _scaled(s0)
            scale = c
    else:
        s1 = s0
    found = _scores_product(s1)
    if found is None:
        return None
    qk, alpha, kt_given = found
    q, cq, q_nodes = _scaled(qk.inputs[0])
    kt, ck, k_nodes = _scaled(qk.inputs[1])
    if rank(q) is None or rank(q) != rank(kt) or rank(q) != rank(v) or rank(q) < 3:
        return None
    scale *= cq * ck * alpha
    inner = [*q_nodes, *k_nodes, qk, *scale_nodes, *mask_nodes, *sm_nodes]
    k, k_transposed, k_extra = kt, kt_given, []
    un = _untransposed(kt) if kt_given else None
    if un is not None:
        k, k_extra = un[0], un[1]
        k_transposed = 0
    gqa, v_extra = 0, []
    rk, rv = (_unrepeated(k) if not k_transposed else None), _unrepeated(v)
    if rk is not None and rv is not None and rk[2] == rv[2]:
        k, v, gqa = rk[0], rv[0], rk[2]  # the repeat factor: the query must have that many heads per kv head
        k_extra, v_extra = k_extra + rk[1], rv[1]
    nodes = [*inner, mm]
    if not all(only_feeds(o, nodes, graph) for n in inner for o in n.outputs if o is not None):
        return None
    # the transposes and repeats go too when nothing else reads them; else the keys are read
    # transposed as they are, and nothing is repeated by the kernel
    extra = k_extra + v_extra
    fused = nodes + extra
    if extra and not all(only_feeds(o, nodes + extra, graph) for n in extra for o in n.outputs if o is not None):
        if all(_read_or_measured(o, nodes + extra, graph) for n in extra for o in n.outputs if o is not None):
            # Shape nodes read the repeated keys too (to build the Reshape's target): the repeat
            # stays for them, and as only its shape is read, no kernel runs for it
            fused = nodes
        else:
            k, k_transposed, gqa, v, extra, fused = kt, kt_given, 0, mm.inputs[1], [], nodes
    if mask is not None and mask_kind in ("drop", "keep"):
        flipped = producer(mask, "Not")  # Where(Not(m), -inf, s) is Where(m, s, -inf): read m
        if flipped is not None:
            mask, mask_kind = flipped.inputs[0], "keep" if mask_kind == "drop" else "drop"
    ins = [q, k, v] + ([mask] if mask is not None else [])
    attrs = {"scale": scale, "mask_kind": mask_kind, "k_transposed": k_transposed, "gqa": gqa,
             "nan_to_zero": int(nan)}
    return _ordered(graph, fused), ins, attrs


def _read_or_measured(v: Value, nodes: list[Node], graph: Graph) -> bool:
    """``v`` is read by ``nodes`` or by Shape nodes only (and is no graph output)."""
    if any(v is o for o in graph.outputs):
        return False
    ids = {id(n) for n in nodes}
    return all(id(u) in ids or u.op_type == "Shape" for u in v.users)


def _ordered(graph: Graph, nodes: list[Node]) -> list[Node]:
    """The pattern's nodes in graph order (the last one's outputs are the fused node's)."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    return sorted({id(n): n for n in nodes}.values(), key=lambda n: pos[id(n)])
