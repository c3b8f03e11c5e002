"""onnxruntime's GroupQueryAttention written out as the attention exporters write (the session option
``gqa_as_concat``, which ``dynashape.generate`` sets on CUDA): a model builder's decoder then steps
in whole-step CUDA graphs like a torch.onnx or optimum export.

The whole-step decode (codegen/step_graph.py) recognises ``present = Concat(past, new)`` and an
attention over the presents; GroupQueryAttention hides both inside one op, whose present and
positions follow each row's ``seqlens_k`` (data) rather than the past's length. Per node:

    q, k, v  = Split(query) (packed) or the op's query, key, value; [b, s, heads * h] each
    q, k, v  = Transpose(Reshape(., [0, 0, heads, h]), [0, 2, 1, 3])          [b, heads, s, h]
    q, k     = x * cos + rotate_half(x) * sin  at positions past .. past + s - 1 (do_rotary)
    present_k = Concat(past_k, k, 2)             present_v = Concat(past_v, v, 2)
    y = Softmax(q @ repeat(present_k)^T * scale + mask) @ repeat(present_v)    (heads / kv_heads)
    out = Reshape(Transpose(y, [0, 2, 1, 3]), [0, 0, heads * h])

with one additive mask for all layers: 0 where key j is seen by query i (``j <= past + i`` and the
``attention_mask`` input is 1 at j), the dtype's lowest value elsewhere, as HF's exports make it.
fuse_rotary, fuse_attention and the KV appends then find their patterns.

Semantics. Where every row's mask is all ones (one row, or rows of one length) this is the op's
computation: ``seqlens_k`` is then the past's length + s - 1 for every row, the op's positions and
write positions are the past's length onwards, and it sees every key up to its own position. With
padding the op expects each row's tokens first (its present written at each row's own length);
the rewritten model expects the concat convention of HF's exports: left padding, masked by the
``attention_mask``, positions counted from the padded start (rotary depends on the distance between
positions only, so a left-padded row's attention is the row's alone). ``dynashape.generate``
left-pads, so its rows get their own tokens either way; a caller that feeds the session right-padded
rows of the op's convention must leave the option off.

Only where the rewrite is exact for unpadded rows: every GroupQueryAttention has pasts that are
graph inputs, presents that are graph outputs, ``seqlens_k`` = ReduceSum(attention_mask) - 1 (cast)
with ``attention_mask`` a graph input, and the plain causal form (no window, softcap, sink, bias,
position_ids, quantized cache, interleaved rotary, partial rotary). Otherwise the model is left as
it is and ``refusal(proto)`` says why.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_PLAIN = {"local_window_size": -1, "softcap": 0.0, "smooth_softmax": -1, "qk_output": 0, "causal": 1,
          "kv_cache_bit_width": 0, "k_quant_type": b"NONE", "v_quant_type": b"NONE", "rotary_interleaved": 0}
_LOWEST = {TensorProto.FLOAT: float(np.finfo(np.float32).min), TensorProto.FLOAT16: float(np.finfo(np.float16).min),
           TensorProto.BFLOAT16: -3.3895313892515355e38}
_NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def gqa_as_concat(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """(the model rewritten, None), or (``proto`` unchanged, why not)."""
    why = refusal(proto)
    if why is not None:
        return proto, why
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    _Rewrite(out.graph).run()
    return out, None


def refusal(proto: onnx.ModelProto) -> str | None:
    """Why the model's GroupQueryAttention nodes cannot be written out (None: they can)."""
    g = proto.graph
    nodes = [n for n in g.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    if not nodes:
        return "no GroupQueryAttention"
    inputs = {i.name: i for i in g.input}
    outputs = {o.name for o in g.output}
    consts = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    masks = set()
    for n in nodes:
        ins = list(n.input) + [""] * (17 - len(n.input))
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        odd = {k: attrs[k] for k, v in _PLAIN.items() if k in attrs and attrs[k] != v}
        if odd or any(ins[9:]):
            return f"GroupQueryAttention {n.name}: attributes {odd} or inputs the rewrite lacks"
        if ins[3] not in inputs or ins[4] not in inputs or len(n.output) > 3 \
                or not all(o in outputs for o in n.output[1:3]):
            return f"GroupQueryAttention {n.name}: pasts that are not graph inputs or presents not graph outputs"
        if _elem(inputs[ins[3]]) not in _LOWEST:
            return f"GroupQueryAttention {n.name}: a past of element type {_elem(inputs[ins[3]])}"
        mask = _mask_of(ins[5], producer, inputs)
        if mask is None:
            return f"GroupQueryAttention {n.name}: seqlens_k is not ReduceSum(attention_mask) - 1 of a graph input"
        masks.add(mask)
        heads, kv = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
        width = _last_dim(ins[0], producer, inputs, consts)
        parts = heads if ins[1] else heads + 2 * kv
        if heads <= 0 or kv <= 0 or heads % kv or not width or width % parts:
            return f"GroupQueryAttention {n.name}: heads {heads} / {kv} and a query width {width} that do not divide"
        head = width // parts
        if attrs.get("do_rotary", 0):
            cos = consts.get(ins[7])
            if cos is None or ins[8] not in consts or len(cos.dims) != 2 or 2 * cos.dims[1] != head:
                return f"GroupQueryAttention {n.name}: cos/sin caches that are not constants over the whole head"
    if len(masks) != 1:
        return "the GroupQueryAttention nodes read different attention masks"
    return None


def _elem(v: onnx.ValueInfoProto) -> int:
    return v.type.tensor_type.elem_type


def _dims(v: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]


def _last_dim(name: str, producer: dict, inputs: dict, consts: dict) -> int | None:
    """The last dim of ``name`` where the model says it: a graph input's, a product's by a constant
    (MatMul's weight, MatMulNBits' N), through a bias Add or a Cast; None otherwise."""
    for _ in range(8):
        if name in inputs:
            d = _dims(inputs[name])
            return d[-1] if d else None
        n = producer.get(name)
        if n is None:
            return None
        if n.op_type == "MatMulNBits":
            return _attr(n, "N", None)
        if n.op_type == "MatMul" and n.input[1] in consts:
            return consts[n.input[1]].dims[-1]
        if n.op_type not in ("Add", "Cast"):
            return None
        name = n.input[1] if n.op_type == "Add" and n.input[0] in consts else n.input[0]
    return None


def _mask_of(seqlens: str, producer: dict, inputs: dict) -> str | None:
    """The graph input ``seqlens`` is ReduceSum(., axis 1) - 1 of (through Casts), or None."""
    n = producer.get(seqlens)
    while n is not None and n.op_type == "Cast":
        n = producer.get(n.input[0])
    if n is None or n.op_type != "Sub":
        return None
    r = producer.get(n.input[0])
    while r is not None and r.op_type == "Cast":
        r = producer.get(r.input[0])
    if r is None or r.op_type != "ReduceSum" or r.input[0] not in inputs:
        return None
    return r.input[0]


class _Rewrite:
    def __init__(self, g: onnx.GraphProto) -> None:
        self.g = g
        self.inputs = {i.name: i for i in g.input}
        self.consts = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output}
        self.made = 0
        self.shared: dict | None = None
        self.targets: dict = {}

    def name(self, what: str) -> str:
        self.made += 1
        return f"/gqa_as_concat/{what}_{self.made}"

    def const(self, what: str, value) -> str:
        name = self.name(what)
        self.g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, out: list, op: str, ins: list, **attrs) -> list[str]:
        outs = [self.name(f"{op}_out") for _ in range(out)] if isinstance(out, int) else out
        self.pending.append(helper.make_node(op, ins, outs, name=self.name(op), **attrs))
        return outs

    def run(self) -> None:
        new_nodes = []
        for n in self.g.node:
            if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft":
                self.pending = []
                self.expand(n)
                new_nodes.extend(self.pending)
            else:
                new_nodes.append(n)
        del self.g.node[:]
        self.g.node.extend(new_nodes)

    def prelude(self, n: onnx.NodeProto, query: str, dtype: int) -> dict:
        """What every layer shares: this step's positions, the rotary tables at them, the mask."""
        if self.shared is not None:
            return self.shared
        mask = _mask_of(n.input[5], self.producer, self.inputs)
        one, zero = self.const("one", np.array(1, np.int64)), self.const("zero", np.array(0, np.int64))
        (pshape,) = self.node(1, "Shape", [n.input[3]], start=2, end=3)
        (sshape,) = self.node(1, "Shape", [query], start=1, end=2)
        (past,) = self.node(1, "Squeeze", [pshape])
        (s,) = self.node(1, "Squeeze", [sshape])
        (total,) = self.node(1, "Add", [past, s])
        (pos,) = self.node(1, "Range", [past, total, one])  # [s]
        (keys,) = self.node(1, "Range", [zero, total, one])  # [total]
        (row,) = self.node(1, "Unsqueeze", [pos, self.const("axes", np.array([1], np.int64))])  # [s, 1]
        (seen,) = self.node(1, "LessOrEqual", [keys, row])  # [s, total]: key j at or before query i
        (seen4,) = self.node(1, "Unsqueeze", [seen, self.const("axes", np.array([0, 1], np.int64))])
        (ones,) = self.node(1, "Cast", [mask], to=TensorProto.BOOL)
        (ones4,) = self.node(1, "Unsqueeze", [ones, self.const("axes", np.array([1, 2], np.int64))])  # [b,1,1,t]
        (keep,) = self.node(1, "And", [seen4, ones4])  # [b, 1, s, total]
        zeros = self.const("zero_f", np.array(0, _NP.get(dtype, np.float32)))
        lowest = self.const("lowest", np.array(_LOWEST[dtype], _NP.get(dtype, np.float32)))
        if dtype not in _NP:  # bfloat16: numpy has none, made by casts
            (zeros,) = self.node(1, "Cast", [zeros], to=dtype)
            (lowest,) = self.node(1, "Cast", [lowest], to=dtype)
        (add_mask,) = self.node(1, "Where", [keep, zeros, lowest])
        shared = {"pos": pos, "mask": add_mask}
        if _attr(n, "do_rotary", 0):
            ax = self.const("axes", np.array([0, 1], np.int64))
            for which, cache in (("cos", n.input[7]), ("sin", n.input[8])):
                (half,) = self.node(1, "Gather", [cache, pos], axis=0)  # [s, h / 2]
                (full,) = self.node(1, "Concat", [half, half], axis=-1)  # [s, h]
                if self.consts[cache].data_type != dtype:
                    (full,) = self.node(1, "Cast", [full], to=dtype)
                (shared[which],) = self.node(1, "Unsqueeze", [full, ax])  # [1, 1, s, h]
        self.shared = shared
        return shared

    def expand(self, n: onnx.NodeProto) -> None:
        ins = list(n.input) + [""] * (9 - len(n.input))
        heads, kv = _attr(n, "num_heads", 0), _attr(n, "kv_num_heads", 0)
        past_k = self.inputs[ins[3]]
        width = _last_dim(ins[0], self.producer, self.inputs, self.consts)
        h = width // (heads if ins[1] else heads + 2 * kv)
        dtype = _elem(past_k)
        if ins[1]:
            q, k, v = ins[0], ins[1], ins[2]
        else:
            sizes = self.const("split", np.array([heads * h, kv * h, kv * h], np.int64))
            q, k, v = self.node(3, "Split", [ins[0], sizes], axis=2)
        shared = self.prelude(n, ins[0], dtype)
        perm = [0, 2, 1, 3]
        q4, k4, v4 = (self.node(1, "Transpose", self.node(1, "Reshape", [x, self.heads_of(ins[0], m, h)]),
                                perm=perm)[0] for x, m in ((q, heads), (k, kv), (v, kv)))
        if _attr(n, "do_rotary", 0):
            q4, k4 = (self.rotate(x, h, shared["cos"], shared["sin"]) for x in (q4, k4))
        outs = list(n.output) + [""] * (3 - len(n.output))
        present_k = outs[1] or self.name("present_k")
        present_v = outs[2] or self.name("present_v")
        self.node([present_k], "Concat", [ins[3], k4], axis=2)
        self.node([present_v], "Concat", [ins[4], v4], axis=2)
        keys, values = (self.repeat(x, heads, kv, h) for x in (present_k, present_v))
        (kt,) = self.node(1, "Transpose", [keys], perm=[0, 1, 3, 2])
        (scores,) = self.node(1, "MatMul", [q4, kt])
        scale = _attr(n, "scale", 0.0) or 1.0 / float(np.sqrt(h))
        factor = self.const("scale", np.array(scale, _NP.get(dtype, np.float32)))
        if dtype not in _NP:
            (factor,) = self.node(1, "Cast", [factor], to=dtype)
        (scaled,) = self.node(1, "Mul", [scores, factor])
        (masked,) = self.node(1, "Add", [scaled, shared["mask"]])
        (p,) = self.node(1, "Softmax", [masked], axis=-1)
        (y,) = self.node(1, "MatMul", [p, values])
        (yt,) = self.node(1, "Transpose", [y], perm=perm)
        self.node([outs[0]], "Reshape", [yt, self.const("shape", [0, 0, heads * h])])

    def heads_of(self, query: str, heads: int, h: int) -> str:
        """The target [b, s, heads, h] of the reshape that splits the heads, its b and s read from the
        query's shape as torch.onnx writes it: a Reshape whose target holds s asks whether s is 0 (a 0 in
        a target copies the input's dim), which a decode step's trace answers (s is 1 there), so that
        its specialization has s = 1 and its positions are device values of the past's length
        (codegen/step_graph.py)."""
        key = ("heads", query, heads)
        if key not in self.targets:
            (shape,) = self.node(1, "Shape", [query], start=0, end=2)
            (self.targets[key],) = self.node(1, "Concat", [shape, self.const("heads", [heads, h])], axis=0)
        return self.targets[key]

    def rotate(self, x: str, h: int, cos: str, sin: str) -> str:
        """x * cos + rotate_half(x) * sin, as torch.onnx writes it (fuse_rotary's pattern)."""
        last = self.const("axes", np.array([-1], np.int64))
        (hi,) = self.node(1, "Slice", [x, self.const("start", [h // 2]), self.const("end", [h]), last])
        (lo,) = self.node(1, "Slice", [x, self.const("start", [0]), self.const("end", [h // 2]), last])
        (neg,) = self.node(1, "Neg", [hi])
        (rot,) = self.node(1, "Concat", [neg, lo], axis=-1)
        (a,) = self.node(1, "Mul", [x, cos])
        (b,) = self.node(1, "Mul", [rot, sin])
        (y,) = self.node(1, "Add", [a, b])
        return y

    def repeat(self, x: str, heads: int, kv: int, h: int) -> str:
        """HF's repeat_kv: each KV head read by heads / kv query heads (fuse_attention's pattern)."""
        if heads == kv:
            return x
        (u,) = self.node(1, "Unsqueeze", [x, self.const("axes", np.array([2], np.int64))])
        (e,) = self.node(1, "Expand", [u, self.const("reps", [1, 1, heads // kv, 1, 1])])
        # the target's dims taken from x's shape (the keys' count as the shape program knows it: a -1
        # would leave it unknown, and fuse_attention proves the repeat from the dims)
        (shape,) = self.node(1, "Shape", [x])
        (batch,) = self.node(1, "Slice", [shape, self.const("start", [0]), self.const("end", [1])])
        (rest,) = self.node(1, "Slice", [shape, self.const("start", [2]), self.const("end", [4])])
        (target,) = self.node(1, "Concat", [batch, self.const("heads", [heads]), rest], axis=0)
        (r,) = self.node(1, "Reshape", [e, target])
        return r


def _attr(n: onnx.NodeProto, name: str, default):
    for a in n.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
