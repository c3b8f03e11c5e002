"""Per-op source emitters: the line of generated code that runs one node.

The default calls the op's registered kernel (``k_<node>(a, b, out=buf)``), which is correct
for every op. The emitters below write the hot ops as direct torch calls instead, with their
parameters as ints from the shape program: a view op never reads a shape tensor back with
``.tolist()``, an Add of two float tensors is ``torch.add`` without the kernel's dtype checks.
An emitter returns None when it does not apply (another dtype, a negative Slice step ...): the
default then serves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..ir import Node
from ..ops import small_work
from ..ops.shapes import norm_axes
from ..ops.tensor import _perm, _slice_params
from ..shape import expr as E
from ..shape.symint import SymInt, same_dims

_FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


@dataclass
class Emit:
    """What an emitter knows of its node: sources of inputs, targets, out= buffers, dims."""

    node: Node
    ins: list[str | None]  # source of each input tensor, None for an absent optional input
    outs: list[str | None]  # local each output is bound to (None: the node lacks that output)
    bufs: list[str | None]  # out= buffer per output (None: the kernel allocates)
    kernel: str  # global name of the op's kernel, attributes bound
    in_dims: list[tuple | None]  # dims of each input (ints and SymInts)
    out_dims: list[tuple | None]
    in_dtypes: list[torch.dtype | None]
    out_dtypes: list[torch.dtype | None]
    values: list  # symbolic value of each input (SymValue) or None
    src: Callable  # int | SymInt -> Python source
    more_results: bool = False  # a kernel without out= returns a tuple even for one output
    on_cpu: bool = True  # where the node runs

    def dims_src(self, dims) -> str:
        items = [self.src(d) for d in dims]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _default(e: Emit) -> list[str]:
    args = ", ".join(a if a is not None else "None" for a in e.ins)
    targets = _targets(e)
    if any(b is not None for b in e.bufs):
        out = e.bufs[0] if len(e.bufs) == 1 else "(" + ", ".join(b or "None" for b in e.bufs) + ",)"
        sep = ", " if args else ""
        return [f"{targets} = {e.kernel}({args}{sep}out={out})"]
    if e.more_results and len(e.outs) == 1:
        return [f"{targets} = first({e.kernel}({args}))"]
    return [f"{targets} = {e.kernel}({args})"]


def _targets(e: Emit) -> str:
    """Kernels of several outputs may return more than the node has (LSTM's Y_c): ``*_``."""
    if len(e.outs) == 1:
        return e.outs[0] or "_"
    return ", ".join(o or "_" for o in e.outs) + ", *_"


def _reshape(e: Emit) -> list[str] | None:
    if same_dims(e.in_dims[0], e.out_dims[0]):
        # the tensor itself: reshape() would restride its size-1 dims (a channels-last tensor of
        # batch 1 then reads as NCHW to the next convolution, which copies it)
        return [f"{e.outs[0]} = {e.ins[0]}"]
    return [f"{e.outs[0]} = {e.ins[0]}.reshape({e.dims_src(e.out_dims[0])})"]


def _transpose(e: Emit) -> list[str] | None:
    perm = _perm(len(e.in_dims[0]), e.node.attrs.get("perm"))
    return [f"{e.outs[0]} = {e.ins[0]}.permute({tuple(perm)!r})"]


def _identity(e: Emit) -> list[str] | None:
    return [f"{e.outs[0]} = {e.ins[0]}"]


def _expand(e: Emit) -> list[str] | None:
    # the output dims are the broadcast of input and target; torch.expand prepends new axes itself
    return [f"{e.outs[0]} = {e.ins[0]}.expand({e.dims_src(e.out_dims[0])})"]


def _ints(v) -> list | None:
    return None if v is None else v.flat()


def _slice(e: Emit) -> list[str] | None:
    x = e.ins[0]
    if e.node.opset >= 10:
        starts, ends = _ints(e.values[1]), _ints(e.values[2])
        axes = _ints(e.values[3]) if len(e.values) > 3 else None
        steps = _ints(e.values[4]) if len(e.values) > 4 else None
        if starts is None or ends is None or (len(e.ins) > 3 and e.ins[3] is not None and axes is None) or (
                len(e.ins) > 4 and e.ins[4] is not None and steps is None):
            return None
    else:
        a = e.node.attrs
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    params = _slice_params(tuple(e.in_dims[0]), starts, ends, axes, steps)
    if any(not isinstance(sp, int) or sp <= 0 or isinstance(sp, SymInt) and E.as_int(sp.expr) is None
           for _, _, _, sp in params):
        return None  # a negative or symbolic step: the kernel flips
    idx = [":"] * len(e.in_dims[0])
    for a, st, _en, sp in params:
        length = e.out_dims[0][a]
        step = "" if sp == 1 else f":{e.src(sp)}"
        idx[a] = f"{e.src(st)}:{e.src(st + (length - 1) * sp + 1 if sp != 1 else st + length)}{step}"
    while idx and idx[-1] == ":":
        idx.pop()
    if not idx:
        return [f"{e.outs[0]} = {x}"]
    return [f"{e.outs[0]} = {x}[{', '.join(idx)}]"]


def _squeeze_like(e: Emit) -> list[str] | None:
    return _reshape(e)


def _binary(fn: str) -> Callable[[Emit], list[str] | None]:
    def emit(e: Emit) -> list[str] | None:
        dts = e.in_dtypes
        if dts[0] not in _FLOATS or dts[0] != dts[1] or e.out_dtypes[0] != dts[0]:
            return None
        if e.bufs[0] is None:
            return [f"{e.outs[0]} = {fn}({e.ins[0]}, {e.ins[1]})"]
        return [f"{e.outs[0]} = {fn}({e.ins[0]}, {e.ins[1]}, out={e.bufs[0]})"]
    return emit


def _matmul(e: Emit) -> list[str] | None:
    if e.in_dtypes[0] not in _FLOATS or e.in_dtypes[0] != e.in_dtypes[1]:
        return None
    if len(e.in_dims[0]) < 2 or len(e.in_dims[1]) < 2:
        return None  # 1-D operands: the kernel knows how torch resizes their out=
    out = f", out={e.bufs[0]}" if e.bufs[0] is not None else ""
    line = f"torch.matmul({e.ins[0]}, {e.ins[1]}{out})"
    if not e.on_cpu:
        return [f"{e.outs[0]} = {line}"]
    # On the CPU a small product runs on one thread (ops/small_work.py): the kernel decides, except
    # where a's size alone tells (a weight of known columns): then the call is inline above it
    n = e.in_dims[1][-1]
    if len(e.in_dims[1]) > 2 or type(n) is not int or n < 1:
        return None
    return [f"{e.outs[0]} = {line} if {e.ins[0]}.numel() >= {-(-small_work.MIN_WORK // n)} else "
            f"{e.kernel}({e.ins[0]}, {e.ins[1]}{out})"]


def _einsum(e: Emit) -> list[str] | None:
    """An Einsum that is a product of the trailing letters of its first operand with the leading
    ones of its second, in order, the rest kept in order (``abcd,cde->abe``: tf2onnx's attention
    output projection): one matmul over the operands reshaped to two dims, where torch.einsum
    permuted and copied (~18 against ~9 us at 32 x 128 x 64)."""
    eq = e.node.attrs.get("equation", "").replace(" ", "")
    if len(e.ins) != 2 or "->" not in eq or "." in eq or e.in_dtypes[0] not in _FLOATS \
            or e.in_dtypes[0] != e.in_dtypes[1] or e.in_dims[1] is None or e.out_dims[0] is None:
        return None
    lhs, out = eq.split("->")
    a, b = lhs.split(",")
    if len(set(a + b)) != len(set(a)) + len(set(b)) - len(set(a) & set(b)) or len(set(a)) != len(a) \
            or len(set(b)) != len(b):
        return None
    k = next((j for j in range(min(len(a), len(b)), 0, -1) if a[-j:] == b[:j]), 0)
    if not k or len(set(a) & set(b)) != k or out != a[:-k] + b[k:] or len(a) == k:
        return None
    bd = e.in_dims[1]
    if not all(isinstance(d, int) for d in bd):
        return None  # (a constant weight's dims: the sizes below are numbers)
    kk, n = math.prod(bd[:k]), math.prod(bd[k:])
    y = f"torch.matmul({e.ins[0]}.reshape(-1, {kk}), {e.ins[1]}.reshape({kk}, {n})"
    if e.bufs[0] is None:
        return [f"{e.outs[0]} = {y}).view({e.dims_src(e.out_dims[0])})"]
    return [f"{y}, out={e.bufs[0]}.view(-1, {n}))", f"{e.outs[0]} = {e.bufs[0]}"]


def _unary(fn: str) -> Callable[[Emit], list[str] | None]:
    def emit(e: Emit) -> list[str] | None:
        if e.in_dtypes[0] not in _FLOATS or e.out_dtypes[0] != e.in_dtypes[0]:
            return None
        if e.bufs[0] is None:
            return [f"{e.outs[0]} = {fn}({e.ins[0]})"]
        return [f"{e.outs[0]} = {fn}({e.ins[0]}, out={e.bufs[0]})"]
    return emit


def _tanh(e: Emit) -> list[str] | None:
    """On the CPU ops/ort_math.py's tanh (onnxruntime's bits, in C: torch's is ~8x slower)."""
    return _unary("_tanh" if e.on_cpu else "torch.tanh")(e)


def _sigmoid(e: Emit) -> list[str] | None:
    """On the CPU ops/ort_math.py's sigmoid (onnxruntime's bits: a quantized model rounds them)."""
    return _unary("_sigmoid" if e.on_cpu else "torch.sigmoid")(e)


def _gather(e: Emit) -> list[str] | None:
    """Gather along axis 0 of int64 indices (an embedding lookup): index_select straight into the
    output. On the CPU, index_select refuses a negative index (ONNX counts it from the end): the
    kernel, which normalises indices, then serves that call. On CUDA an out-of-range index would
    be a device assert, so the kernel always serves there."""
    if (e.node.attrs.get("axis", 0) != 0 or not e.on_cpu or e.in_dtypes[1] != torch.int64
            or e.bufs[0] is None or len(e.in_dims[0]) < 1):
        return None
    rest = ", ".join(e.src(d) for d in e.in_dims[0][1:])
    flat = f"({e.bufs[0]}).view((-1{', ' if rest else ''}{rest}))"
    return ["try:",
            f"    torch.index_select({e.ins[0]}, 0, {e.ins[1]}.view(-1), out={flat})",
            "except (IndexError, RuntimeError):",
            f"    {e.outs[0]} = {e.kernel}({e.ins[0]}, {e.ins[1]}, out={e.bufs[0]})"]


def _compare(fn: str) -> Callable[[Emit], list[str] | None]:
    def emit(e: Emit) -> list[str] | None:
        if e.in_dtypes[0] != e.in_dtypes[1] or e.in_dtypes[0] in (None, torch.uint16, torch.uint32, torch.uint64):
            return None
        out = f", out={e.bufs[0]}" if e.bufs[0] is not None else ""
        return [f"{e.outs[0]} = {fn}({e.ins[0]}, {e.ins[1]}{out})"]
    return emit


def _int_binary(fn: str) -> Callable[[Emit], list[str] | None]:
    """Add / Sub / Mul of one float or signed int dtype (unsigned ints have kernels of their own)."""
    def emit(e: Emit) -> list[str] | None:
        dts = e.in_dtypes
        ok = _FLOATS | {torch.int64, torch.int32, torch.int16, torch.int8}
        if dts[0] not in ok or dts[0] != dts[1] or e.out_dtypes[0] != dts[0]:
            return None
        out = f", out={e.bufs[0]}" if e.bufs[0] is not None else ""
        return [f"{e.outs[0]} = {fn}({e.ins[0]}, {e.ins[1]}{out})"]
    return emit


def _not(e: Emit) -> list[str] | None:
    if e.in_dtypes[0] != torch.bool:
        return None
    out = f", out={e.bufs[0]}" if e.bufs[0] is not None else ""
    return [f"{e.outs[0]} = torch.logical_not({e.ins[0]}{out})"]


def _conv(e: Emit) -> list[str] | None:
    """Conv with explicit symmetric pads: torch's convNd straight, its parameters constants."""
    a = e.node.attrs
    x_dims, w_dims = e.in_dims[0], e.in_dims[1]
    n = len(x_dims) - 2
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID") or n not in (1, 2, 3) or len(w_dims) != n + 2:
        return None
    if n == 1 and e.on_cpu and e.node.inputs[1].is_const:
        return None  # the node's bound kernel (ops/conv.py bound_conv1d): its weight and shapes' arguments kept
    pads = [0] * (2 * n) if a.get("auto_pad") == "VALID" else list(a.get("pads") or [0] * (2 * n))
    if pads[:n] != pads[n:]:
        return None
    strides = tuple(a.get("strides") or [1] * n)
    dilations = tuple(a.get("dilations") or [1] * n)
    bias = e.ins[2] if len(e.ins) > 2 and e.ins[2] is not None else "None"
    # ops/conv.py: tiny batched 1-D ones as a product on CPU; ops/tuned_conv.py: 2-D ones on CUDA take
    # the form a static impl's build timed fastest; ops/cpu_conv.py: 2-D ones on the CPU
    fn = "_conv1d" if n == 1 else ("_cpu_conv2d" if e.on_cpu else "_conv2d") if n == 2 else f"torch.conv{n}d"
    return [f"{e.outs[0]} = {fn}({e.ins[0]}, {e.ins[1]}, {bias}, {strides!r}, {tuple(pads[:n])!r}, "
            f"{dilations!r}, {a.get('group', 1)})"]


def _concat(e: Emit) -> list[str] | None:
    xs = [x for x in e.ins if x is not None]
    dims = [d for d in e.in_dims if d is not None]
    axis = norm_axes([e.node.attrs["axis"]], len(dims[0]))[0]
    args = "[" + ", ".join(xs) + "]"
    if e.bufs[0] is None:
        return [f"{e.outs[0]} = torch.cat({args}, {axis})"]
    return [f"{e.outs[0]} = torch.cat({args}, {axis}, out={e.bufs[0]})"]


def _split(e: Emit) -> list[str] | None:
    """Split sized from the shape program's output dims (the kernel reads the sizes back from a
    tensor and checks them): torch.split's views, copied into the parts' buffers where the memory
    plan gave them (views of the input where it adopts the parts)."""
    if e.in_dims[0] is None or not e.outs or any(d is None for d in e.out_dims) or any(o is None for o in e.outs):
        return None
    a = norm_axes([e.node.attrs.get("axis", 0)], len(e.in_dims[0]))[0]
    sizes = [e.src(d[a]) for d in e.out_dims]
    if all(b is None for b in e.bufs):
        return [f"{', '.join(e.outs)}, = torch.split({e.ins[0]}, [{', '.join(sizes)}], {a})"]
    if any(b is None for b in e.bufs):
        return None
    return [f"{o} = {b}.copy_({e.ins[0]}.narrow({a}, {' + '.join(sizes[:k]) or 0}, {sizes[k]}))"
            for k, (o, b) in enumerate(zip(e.outs, e.bufs))]


def _constant_of_shape(e: Emit) -> list[str] | None:
    """ConstantOfShape of dims the shape program knows: filled where the node runs (its kernel,
    given only a host shape, made the tensor on the CPU; on CUDA, YOLOv8's anchor grid then met a
    device tensor), or its buffer filled."""
    value = e.node.attrs.get("value")
    fill = 0.0 if value is None else value.reshape(()).item()
    dt = e.out_dtypes[0]
    if e.out_dims[0] is None or dt is None or not isinstance(fill, (int, float, bool)) or not math.isfinite(fill):
        return None
    if e.bufs[0] is not None:
        return [f"{e.outs[0]} = {e.bufs[0]}.fill_({fill!r})"]
    where = "" if e.on_cpu else ", device=DEV"
    return [f"{e.outs[0]} = torch.full({e.dims_src(e.out_dims[0])}, {fill!r}, dtype={dt}{where})"]


def _range(e: Emit) -> list[str] | None:
    """Range of start, limit and delta the shape program knows (a decoder's positions: 0 .. seq):
    torch.arange over the output's own length, n = max(ceil((limit - start) / delta), 0), which
    torch's arange would refuse for a negative count; the kernel reads three tensors back."""
    vals = [_ints(v) for v in e.values[:3]]
    dt = e.out_dtypes[0]
    if len(vals) < 3 or any(v is None or len(v) != 1 for v in vals) or e.out_dims[0] is None \
            or dt not in (torch.int64, torch.int32, torch.float32, torch.float64) or not e.on_cpu:
        return None  # (on a device the kernel, which puts the result where its out= is)
    start, delta = vals[0][0], vals[2][0]
    if type(delta) is not int or delta == 0:
        return None
    s, n = e.src(start), e.src(e.out_dims[0][0])
    out = f", out={e.bufs[0]}" if e.bufs[0] is not None else ""
    return [f"{e.outs[0]} = torch.arange({s}, {s} + ({n}) * {delta}, {delta}, dtype={dt}{out})"]


VIEW_EMITTERS: dict[str, Callable[[Emit], list[str] | None]] = {
    "Reshape": _reshape, "Flatten": _reshape, "Squeeze": _squeeze_like, "Unsqueeze": _squeeze_like,
    "Transpose": _transpose, "Identity": _identity, "Expand": _expand, "Slice": _slice,
}

EMITTERS: dict[str, Callable[[Emit], list[str] | None]] = {
    "Add": _int_binary("torch.add"), "Sub": _int_binary("torch.sub"), "Mul": _binary("torch.mul"),
    "Gather": _gather, "Not": _not, "Conv": _conv, "Equal": _compare("torch.eq"), "Less": _compare("torch.lt"),
    "LessOrEqual": _compare("torch.le"), "Greater": _compare("torch.gt"), "GreaterOrEqual": _compare("torch.ge"),
    "Div": _binary("torch.div"), "MatMul": _matmul, "Einsum": _einsum, "Concat": _concat,
    "Sigmoid": _sigmoid, "Tanh": _tanh, "Exp": _unary("torch.exp"),
    "Neg": _unary("torch.neg"), "Sqrt": _unary("torch.sqrt"), "Reciprocal": _unary("torch.reciprocal"),
    "Cos": _unary("torch.cos"), "Sin": _unary("torch.sin"), "Erf": _unary("torch.erf"),
    "Abs": _unary("torch.abs"), "Log": _unary("torch.log"), "Range": _range,
    "Split": _split, "ConstantOfShape": _constant_of_shape,
}


def emit(e: Emit, as_view: bool, default: bool = True) -> list[str] | None:
    """The lines for one node; ``as_view``: the node's output is a view of its first input.
    ``default=False``: None when no emitter applies (the caller then calls the kernel)."""
    op = e.node.op_type
    if e.node.domain in ("", "ai.onnx"):
        table = VIEW_EMITTERS if as_view else EMITTERS
        fn = table.get(op)
        if fn is not None:
            lines = fn(e)
            if lines is not None:
                return lines
    return _default(e) if default else None
