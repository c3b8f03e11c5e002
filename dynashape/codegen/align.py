"""FC fake alignment: which regions one static impl may serve for several row counts.

OpenVINO's GPU plugin rounds the batch of a fully connected layer up to a multiple of 8 or 16
when it picks the layer's kernel ("fake alignment"), so batches 1 to 8 share one compiled
kernel. The same holds for a region of our static impls whose work is row by row along a
symbol: built once for that symbol rounded up (``runtime/aligned.py`` runs it over padded copies
of the live-ins and hands back the real rows), it serves every smaller value, and a decode at
batch 1, 3 or 7 replays one graph instead of building three. Where products over constant
weights dominate (a decode step's projections and MLP) the padded rows cost nothing measurable:
the product is bound by reading its weight.

A region qualifies for a symbol ``S`` when every node in it treats the rows of ``S`` apart:
- every value it reads or makes whose shape depends on ``S`` has ``S`` exactly as its first dim,
  and constants as its other dims (padding then appends whole rows of a fixed size);
- the products read one row per value of ``S`` (``[S, 1, k]`` in a decode step, ``[S, k]``): the
  padded rows are at most ``m - 1`` more product rows, as OpenVINO pads M. BERT's ``[batch,
  seq, k]`` is not aligned along the batch: padding batch 1 to 8 would be 8x the rows;
- each node is an op known to work row by row along its first axis: element-wise ops (inputs
  that carry ``S`` at the output's rank), products whose weight does not carry ``S``, views that
  keep the first axis, normalisations, softmax and reductions over other axes, an embedding
  lookup;
- at least one product over a constant weight (what the alignment is for: element-wise regions
  are not aligned, their cost grows with the padded rows).
Nothing else is aligned: the region keeps one impl per value of its symbols.

Convolutional regions (``kind == "conv"``) are the other case: a CNN's images are independent
(convolutions over constant weights, pooling, LRN and inference normalisations over one image,
element-wise ops), so a region whose values all have the batch as their leading dim and fixed
sizes behind it serves any batch up to a bucket from one CUDA graph. Padding costs compute there
(a padded image is convolved like a real one), so their buckets are finer than a decoder's
(``runtime/aligned.py``): what is bought is a replayed, tuned graph at once for a batch never seen.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Node, Value
from ..shape import expr as E
from ..shape.symint import SymInt
from .regions import _INPLACE, _OUT

ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log",
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh", "Erf", "Gelu", "Silu", "Softplus", "Clip", "Cast",
    "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Not", "Identity",
    "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "HardSwish", "Elu", "Selu", "Mish", "SiluMul", "RotaryHalf",
    "Expand", "Dropout", "Sum", "Mean",
})
VIEWS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Concat", "Split"})
LAST_AXIS = frozenset({"RMSNorm", "LayerNorm"})  # our fused norms: over the last axis
AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization"})  # over axis (and after): not the first
PRODUCTS = frozenset({"MatMul", "Gemm", "Linear", "MatMulAdd", "GatedMatMulAdd", "RMSNormLinear"})
# convolutions over a constant weight: image by image along the batch (our fused forms included)
CONVS = frozenset({"Conv", "ConvAct", "ConvRelu", "ConvAddRelu", "ConvTranspose"})
# over one image's channels and pixels, never across images
PER_IMAGE = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool",
                       "LRN", "InstanceNormalization", "BatchNormalization"})
# reductions, row by row where the rows of the symbol lead both their input and their output (so
# the first axis is not reduced): torch.onnx writes a ResNet's global average pool as a ReduceMean
# over axes (2, 3), and without these its whole region had one impl per batch value
REDUCTIONS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"})


def aligned_symbol(nodes: list[Node], dims_of, canon, candidates) -> str | None:
    """The symbol (of ``candidates``, in order) along which every node of a region works row by
    row, with a product over a constant weight among them; None when there is none.
    ``dims_of(v)``: a value's dims (ints and SymInts) or None; ``canon(d)``: a SymInt's expression."""
    if not any(n.op_type in PRODUCTS | CONVS and _has_const_weight(n) for n in nodes):
        return None
    for s in candidates:
        if all(rowwise(n, s, dims_of, canon) for n in nodes):
            return s
    return None


def carries(dims, s, canon) -> bool:
    """Whether a shape depends on ``s`` (a symbol, or a tuple of them: on any)."""
    syms = (s,) if isinstance(s, str) else s
    return dims is not None and any(x in _free(d, canon) for d in dims for x in syms)


def _free(d, canon) -> frozenset[str]:
    return canon(d).free if isinstance(d, SymInt) else frozenset()


def _leading(dims, lead: tuple[str, ...], canon) -> bool:
    """The symbols of ``lead`` exactly as the first dims, in order, and no symbol in the others:
    whole rows of a fixed size (rows of ``S``, or tokens of ``(B, S)``)."""
    k = len(lead)
    return (len(dims) >= k and all(isinstance(d, SymInt) and canon(d) == E.sym(x) for d, x in zip(dims, lead))
            and not any(_free(d, canon) for d in dims[k:]))


def _has_const_weight(n: Node) -> bool:
    return len(n.inputs) >= 2 and n.inputs[1] is not None and n.inputs[1].is_const


def rowwise(n: Node, lead, dims_of, canon) -> bool:
    """Whether node ``n`` treats the rows along ``lead`` apart: a symbol, or a tuple of symbols
    that lead every value in this order (a transformer's ``(batch, seq)``: its tokens, which
    ``codegen/tokens.py`` runs as rows of ``batch * seq``)."""
    lead = (lead,) if isinstance(lead, str) else tuple(lead)
    k = len(lead)
    tensors: list[tuple[Value, bool]] = [(v, True) for v in n.inputs if v is not None and v.kind == "tensor"]
    tensors += [(v, False) for v in n.outputs if v is not None and v.kind == "tensor"]
    dims = {}
    for v, _ in tensors:
        d = dims_of(v)
        if d is None:
            return False
        dims[id(v)] = d
        if carries(d, lead, canon) and not _leading(d, lead, canon):
            return False  # not whole rows, or rows whose size follows another symbol
    ins = [v for v, is_in in tensors if is_in and carries(dims[id(v)], lead, canon)]
    outs = [v for v, is_in in tensors if not is_in]
    if not ins and not any(carries(dims[id(v)], lead, canon) for v in outs):
        return True  # the node does not see the symbols at all
    if not outs or not all(carries(dims[id(v)], lead, canon) for v in outs):
        return False  # rows reduced away, or folded into another dim
    rank = len(dims[id(outs[0])])
    op = n.op_type
    if op in ELEMENTWISE or op in LAST_AXIS:
        return all(len(dims[id(v)]) == rank for v in ins) and (op not in LAST_AXIS or rank >= k + 1)
    if op in VIEWS:  # the leading dims stay on both sides: rows map to themselves
        return True
    if op in AXIS_OPS:
        axis = n.attrs.get("axis", -1)
        return (axis % rank if rank else 0) >= k
    if op in PRODUCTS:
        if op == "Gemm" and (n.attrs.get("transA", 0) or k > 1):
            return False
        w = n.inputs[1] if len(n.inputs) > 1 else None
        if w is not None and w.kind == "tensor" and carries(dims[id(w)], lead, canon) and not (op == "MatMul"
                                                                                            and rank >= 3):
            return False  # the rows would be the product's reduction
        a = dims[id(n.inputs[0])] if n.inputs[0] is not None else None
        if a is not None and carries(a, lead, canon) and any(x != 1 for x in a[k:-1]):
            return False  # several product rows per row: padding would multiply the work
        return all(len(dims[id(v)]) == rank for v in ins)
    if k > 1:
        return op == "Gather" and _embedding(n, lead, dims, canon)
    if op in CONVS:  # the images of x, one by one, over a weight that does not carry s
        w = n.inputs[1] if len(n.inputs) > 1 else None
        return w is not None and not carries(dims.get(id(w)) or dims_of(w), lead, canon)
    if op in PER_IMAGE:
        return not n.attrs.get("training_mode", 0)
    if op in REDUCTIONS:  # input and output lead with s (checked above): axis 0 is kept
        return len(ins) == 1 and ins[0] is n.inputs[0]
    if op == "Gather":
        return _embedding(n, lead, dims, canon)
    return False


def _embedding(n: Node, lead, dims, canon) -> bool:
    """A constant table read at indices that carry the rows (an embedding lookup)."""
    return (n.inputs[0] is not None and not carries(dims[id(n.inputs[0])], lead, canon)
            and n.attrs.get("axis", 0) == 0)


@dataclass
class Alignment:
    """How a region's static impls are aligned along ``symbol`` (``runtime/aligned.py``); for
    kind "tokens" along the rows of ``symbol * symbol2`` (``codegen/tokens.py``)."""

    symbol: str
    kind: str  # "conv" (a convolutional region: batch buckets by default on CUDA), "fc" (opt-in), "tokens"
    key_pos: int  # its position in the region's key
    sig_pos: int  # its position in the specialization's signature
    members: list[tuple[int, int] | None]  # per live-in: (group, position) of an arena member, or None
    carries_in: list[bool]  # per live-in: its first dim is the symbol (padded rows)
    written: list[bool]  # per live-in: the region writes it (copied back after a replay)
    carries_out: list[bool]  # per live-out: its first dim is the symbol (the real rows handed on)
    symbol2: str | None = None  # "tokens": the second leading symbol (a sequence), padded to 1
    key_pos2: int = -1
    sig_pos2: int = -1

    @property
    def lead(self) -> tuple[str, ...]:
        return (self.symbol,) if self.symbol2 is None else (self.symbol, self.symbol2)


def token_pair(nodes: list[Node], dims_of, canon, candidates: list[str]) -> tuple[str, str] | None:
    """Two symbols ``(B, S)`` that lead every value of the region that carries either, in this
    order, with every node working token by token (``rowwise`` along the pair) and a product over
    a constant weight among them: the region's tokens are independent rows."""
    if not any(n.op_type in PRODUCTS and _has_const_weight(n) for n in nodes):
        return None
    for a in candidates:
        for b in candidates:
            if a != b and all(rowwise(n, (a, b), dims_of, canon) for n in nodes):
                return a, b
    return None


def plan(region, nodes: list[Node], body: list[str], where: dict[str, tuple[int, int]], shape_syms,
         value_of, dims_of, canon, input_symbols, sig_symbols: list[str]) -> Alignment | None:
    """The alignment of ``region`` (a ``regions.Region``), or None. ``where``: arena member name ->
    (group, position); ``shape_syms(name)``: a member's shape symbols; ``value_of(name)``: the
    Value a local holds (None when unknown)."""
    key_syms = sorted(region.syms)
    candidates = [x for x in key_syms if x in input_symbols]
    s = aligned_symbol(nodes, dims_of, canon, candidates)
    lead: tuple[str, ...] = (s,) if s is not None else ()
    if s is None:
        pair = token_pair(nodes, dims_of, canon, candidates) if len(key_syms) == 2 else None
        if pair is None:
            return None
        lead = pair

    def carried(name: str) -> bool | None:
        if name in where:
            return any(x in shape_syms(name) for x in lead)
        v = value_of(name)
        return None if v is None else carries(dims_of(v), lead, canon)
    written = {m.group(1) for line in body for m in list(_OUT.finditer(line)) + list(_INPLACE.finditer(line))}
    cin = [carried(n) for n in region.live_in]
    cout = [carried(n) for n in region.live_out]
    if None in cin or None in cout or not any(cin):
        return None  # a name whose shape is not known here, or no rows come in: not aligned
    members = [where.get(n) for n in region.live_in]
    flags = [n in written for n in region.live_in]
    if len(lead) == 2:
        a, b = lead
        return Alignment(a, "tokens", key_syms.index(a), sig_symbols.index(a), members, cin, flags, cout,
                         b, key_syms.index(b), sig_symbols.index(b))
    kind = "conv" if any(n.op_type in CONVS for n in nodes) else "fc"
    return Alignment(s, kind, key_syms.index(s), sig_symbols.index(s), members, cin, flags, cout)
