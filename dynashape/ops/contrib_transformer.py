"""onnxruntime's transformer contrib ops outside attention: the fused norms, GELUs, BiasAdd and
FusedMatMul its transformers optimizer (and its graph optimizer) write into BERT, GPT-2, T5 and
ViT models. Domain ``com.microsoft``, except SimplifiedLayerNormalization and the pre-opset-17
LayerNormalization, which onnxruntime registers in the ONNX domain.

Semantics follow onnxruntime's CPU kernels: norms of half inputs compute in float32 and round
once; their statistics outputs are float32. The RMS norms of float32 CPU rows give onnxruntime's
bits (csrc/elementwise.c ort_rms_row: the order its kernels sum and divide in), where the C builds:
a quantized model's next MatMulNBits rounds their output to int8 (issue 35). Multi-output ops
take ``_n_outputs`` (set at load) to know how many outputs the node asks for.
"""

from __future__ import annotations

import ctypes
import functools
from functools import partial

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from . import add_layer_norm, native, ort_math
from .attention import _emit  # the first n results into out's buffers: one helper for both families
from .linalg import _known_differ, _matmul, _matmul_shape
from .norm import _layernorm, _ln_infer
from .registry import COMPUTED, binder, op
from .shapes import same_as_first

MS = "com.microsoft"


def _opt(shapes, i):
    """The shape of optional input i, None when the node leaves it out."""
    return shapes[i] if i < len(shapes) else None


def _compute_type(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _wants(out, n: int, k: int, present=None) -> bool:
    """Whether output k is asked for: within the node's outputs, not a gap where ``out`` says which
    outputs have a buffer, and read by the graph where ``present`` (resolve_ops' ``_present``) says."""
    if k >= n or (present is not None and (k >= len(present) or not present[k])):
        return False
    return not isinstance(out, tuple) or k >= len(out) or out[k] is not None


def _fmt(dims) -> str:
    """A shape for a message: symbolic dims by their value, without pinning them."""
    items = [int.__repr__(d) if isinstance(d, int) else str(d) for d in dims]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _check_vector(shape, size, op_type: str, what: str) -> None:
    if shape is None:
        return
    if len(shape) != 1 or _known_differ(shape[0], size):
        raise ShapeError(f"{op_type}: {what} must have shape {_fmt((size,))}, got {_fmt(shape)}")


# SkipLayerNormalization, SkipSimplifiedLayerNormalization -----------------------------------
def _skip_infer(op_type: str, shapes) -> list:
    x, skip = shapes[0], shapes[1]
    if len(x) not in (2, 3):
        raise ShapeError(f"{op_type}: input must be (batch, seq, hidden) or (tokens, hidden), got {_fmt(x)}")
    ok = len(skip) in (2, 3) and len(skip) <= len(x) and not any(
        _known_differ(a, b) for a, b in zip(skip[-2:], x[-2:]))
    if ok and len(skip) == 3:
        # onnxruntime broadcasts a skip of batch 1 (or without batch) over the input's batch
        ok = skip[0] == 1 or not _known_differ(skip[0], x[0])
    if not ok:
        want = f"{_fmt(x)}, {_fmt((1, *x[1:]))} or {_fmt(x[1:])}" if len(x) == 3 else _fmt(x)
        raise ShapeError(f"{op_type}: skip must have shape {want}, got {_fmt(skip)}")
    stat = tuple(x[:-1]) + (1,)
    return [tuple(x), stat, stat, tuple(x)]  # output, mean, inv_std_var, input_skip_bias_sum


def _skip_ln_infer(shapes, values, **_attrs):
    h = shapes[0][-1] if shapes[0] else None
    for i, what in ((2, "gamma"), (3, "beta"), (4, "bias")):
        _check_vector(_opt(shapes, i), h, "SkipLayerNormalization", what)
    return _skip_infer("SkipLayerNormalization", shapes)


def _skip_rms_infer(shapes, values, **_attrs):
    h = shapes[0][-1] if shapes[0] else None
    for i, what in ((2, "gamma"), (3, "bias")):
        _check_vector(_opt(shapes, i), h, "SkipSimplifiedLayerNormalization", what)
    return _skip_infer("SkipSimplifiedLayerNormalization", shapes)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, without a call where it is already (``to`` costs ~1 us even then, and
    these ops convert five inputs a call)."""
    return t if t.dtype == dtype else t.to(dtype)


def _f32_rows(t) -> bool:
    return type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()


_NORM_THREAD_MIN = 1 << 16  # elements below which a second thread costs more than it saves


def _ort_skip_rms(x, skip, gamma, bias, epsilon: float, with_sum: bool):
    """(y, x + skip + bias or None) as onnxruntime's SkipSimplifiedLayerNormalization computes
    them (csrc/elementwise.c skip_ln_f32), or None where the C pass does not serve."""
    h = x.shape[-1] if x.dim() else 0
    if not h or not _f32_rows(x) or not _f32_rows(skip) or not _f32_rows(gamma) or gamma.shape != (h,) \
            or (bias is not None and (not _f32_rows(bias) or bias.shape != (h,))):
        return None
    if skip.shape == x.shape:
        srows = x.numel() // h
    else:
        dims = list(skip.shape)
        while len(dims) > 1 and dims[0] == 1:
            dims.pop(0)
        if not dims or tuple(dims) != tuple(x.shape[x.dim() - len(dims):]):
            return None
        srows = skip.numel() // h
    fn = native.function("elementwise", "skip_ln_f32", "ppipppiidippi", fallbacks="skip_ln")
    if fn is None:
        return None
    y = torch.empty_like(x)
    total = torch.empty_like(x) if with_sum else None
    n = x.numel()
    fn(x.data_ptr(), skip.data_ptr(), srows, None if bias is None else bias.data_ptr(), gamma.data_ptr(), None,
       n // h, h, float(epsilon), 1, y.data_ptr(), None if total is None else total.data_ptr(),
       torch.get_num_threads() if n >= _NORM_THREAD_MIN else 1)
    native.count("skip_ln_native_calls")
    return y, total


def _skip_norm(x, skip, gamma, beta, bias, epsilon: float, simplified: bool, n: int, out, present=None):
    if simplified and not (_wants(out, n, 1, present) or _wants(out, n, 2, present)):
        got = _ort_skip_rms(x, skip, gamma, bias, epsilon, _wants(out, n, 3, present))
        if got is not None:
            return _emit([got[0], None, None, got[1]], out, n)
    if bias is None and x.is_cuda and not (_wants(out, n, 1, present) or _wants(out, n, 2, present)):
        bufs = out if isinstance(out, tuple) else (out,)
        bufs = list(bufs) + [None] * (4 - len(bufs))
        got = add_layer_norm.skip_norm(x, skip, gamma, beta, epsilon, simplified, bufs[0], bufs[3],
                                       _wants(out, n, 3, present))
        if got is not None:  # one Triton kernel, written into the plan's buffers
            return _emit([got[0], None, None, got[1]], out, n)
    ct = _compute_type(x.dtype)
    s = _as(x, ct) + _as(skip, ct)
    if bias is not None:
        s = s.add_(_as(bias, ct))  # (s is this call's own: the bias in place, no second buffer)
    g = _as(gamma, ct)
    b = None if beta is None else _as(beta, ct)
    h = (x.shape[-1],)
    if not (_wants(out, n, 1, present) or _wants(out, n, 2, present)):  # (mean and inv_std: training's)
        y = F.rms_norm(s, h, g, epsilon) if simplified else F.layer_norm(s, h, g, b, epsilon)
        mean = inv = None
    else:
        if simplified:
            inv = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + epsilon)
            mean = torch.zeros_like(inv)  # onnxruntime writes 0: no centring
            y = s * inv * g
        else:
            var, mean = torch.var_mean(s, -1, correction=0, keepdim=True)
            inv = torch.rsqrt(var + epsilon)
            y = (s - mean) * inv * g
            if b is not None:
                y = y + b
        mean, inv = mean.float(), inv.float()
    total = _as(s, x.dtype) if _wants(out, n, 3, present) else None
    return _emit([_as(y, x.dtype), mean, inv, total], out, n)


@op("SkipLayerNormalization", 1, MS, infer=_skip_ln_infer,
    notes="skip of batch 1 or without batch broadcasts over the input's batch")
def _skip_layer_norm(x, skip, gamma, beta=None, bias=None, *, epsilon=1e-12, _n_outputs=1, _present=None, out=None):
    return _skip_norm(x, skip, gamma, beta, bias, epsilon, False, _n_outputs, out, _present)


@op("SkipSimplifiedLayerNormalization", 1, MS, infer=_skip_rms_infer,
    notes="float32 on the CPU gives onnxruntime's bits")
def _skip_simplified_layer_norm(x, skip, gamma, bias=None, *, epsilon=1e-12, _n_outputs=1, _present=None,
                                out=None):
    return _skip_norm(x, skip, gamma, None, bias, epsilon, True, _n_outputs, out, _present)


# SimplifiedLayerNormalization (ONNX domain) -------------------------------------------------
def _axis(axis: int, rank: int, op_type: str) -> int:
    if not -rank <= axis < rank:
        raise ShapeError(f"{op_type}: axis {axis} is out of range for an input of rank {rank}")
    return axis + rank if axis < 0 else axis


def _rms_infer(shapes, values, *, axis=-1, **_attrs):
    x, scale = shapes[0], shapes[1]
    a = _axis(axis, len(x), "SimplifiedLayerNormalization")
    # scale broadcasts to X without enlarging it (onnxruntime: "NumPy-broadcastable")
    if len(scale) > len(x) or any(d != 1 and _known_differ(d, xd) for d, xd in zip(reversed(scale), reversed(x))):
        raise ShapeError(f"SimplifiedLayerNormalization: scale of shape {_fmt(scale)} does not broadcast to the "
                         f"input's shape {_fmt(x)}; expected {_fmt(x[a:])} or a shape broadcasting to it")
    return [tuple(x), tuple(x[:a]) + (1,) * (len(x) - a)]  # Y, inv_std_var


@op("SimplifiedLayerNormalization", 1, infer=_rms_infer,
    notes="onnxruntime's RMS norm, registered in the ONNX domain; float32 on the CPU gives its bits")
def _simplified_layer_norm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1, _n_outputs=1, out=None):
    # onnxruntime computes in float32 (float64 for double) whatever stash_type says
    a = _axis(axis, x.dim(), "SimplifiedLayerNormalization")
    got = _ort_simplified_ln(x, scale, a, epsilon)
    if got is not None:
        return _emit(list(got), out, _n_outputs)
    ct = _compute_type(x.dtype)
    xs = _as(x, ct)
    inv = torch.rsqrt(xs.pow(2).mean(list(range(a, x.dim())), keepdim=True) + epsilon)
    y = _as(xs * inv * _as(scale, ct), scale.dtype)
    return _emit([y, inv.float()], out, _n_outputs)


@functools.cache
def mlas_layer_norm() -> bool:
    """Whether onnxruntime runs MLAS's AVX2 LayerNorm kernel on this CPU (AVX2 and FMA: its
    SimplifiedLayerNormalization of rows from 16 elements sums in that kernel's order)."""
    return {"avx2", "fma"} <= set(native.cpuinfo("flags").split())


def _ort_simplified_ln(x, scale, a: int, epsilon: float):
    """(Y, inv_std_var) as onnxruntime's SimplifiedLayerNormalization computes them over the dims
    from ``a`` on (csrc/elementwise.c ort_simplified_ln_f32), or None where the C does not serve
    (another dtype or device, a scale that broadcasts)."""
    tail = tuple(x.shape[a:])
    h = 1
    for d in tail:
        h *= d
    if not h or not _f32_rows(x) or not _f32_rows(scale) or scale.numel() != h \
            or tuple(scale.shape)[max(scale.dim() - len(tail), 0):] != tail[max(len(tail) - scale.dim(), 0):]:
        return None
    fn = native.function("elementwise", "ort_simplified_ln_f32", "ppiidippi", fallbacks="ort_simplified_ln")
    if fn is None:
        return None
    y = torch.empty_like(x)
    inv = torch.empty(tuple(x.shape[:a]) + (1,) * len(tail), dtype=torch.float32)
    n = x.numel()
    fn(x.data_ptr(), scale.data_ptr(), n // h, h, float(epsilon), int(mlas_layer_norm()), y.data_ptr(),
       inv.data_ptr(), torch.get_num_threads() if n >= _NORM_THREAD_MIN else 1)
    native.count("ort_simplified_ln_native_calls")
    return y, inv


# onnxruntime runs LayerNormalization below opset 17 too (its own schema in the ONNX domain, the
# same as opset 17's): the transformers optimizer writes it into models of any opset
def _ln_before_17_infer(shapes, values, *, _n_outputs=1, **attrs):
    return _ln_infer(shapes, values, **attrs)


@op("LayerNormalization", 1, infer=_ln_before_17_infer)
def _layernorm_before_17(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, _n_outputs=1, out=None):
    r = _layernorm(x, scale, bias, axis=axis, epsilon=epsilon, stash_type=stash_type, out=out)
    # ONNX's inference gives no type to the output of an op its opset lacks, so the runtime may
    # call without buffers: a one-output node then wants the tensor, not the tuple
    return r[0] if isinstance(r, tuple) and _n_outputs == 1 else r


# EmbedLayerNormalization --------------------------------------------------------------------
def _embed_infer(shapes, values, **_attrs):
    ids, seg, word, pos, seg_emb, gamma, beta = shapes[:7]
    mask, pos_ids = _opt(shapes, 7), _opt(shapes, 8)
    what = "EmbedLayerNormalization"
    if len(ids) != 2:
        raise ShapeError(f"{what}: input_ids must be (batch, seq), got {_fmt(ids)}")
    for name, s in (("segment_ids", seg), ("mask", mask)):
        if s is not None and (len(s) != 2 or any(_known_differ(a, b) for a, b in zip(s, ids))):
            raise ShapeError(f"{what}: {name} must have the shape of input_ids {_fmt(ids)}, got {_fmt(s)}")
    if len(word) != 2:
        raise ShapeError(f"{what}: word_embedding must be (vocab, hidden), got {_fmt(word)}")
    h = word[1]
    for name, s in (("position_embedding", pos), ("segment_embedding", seg_emb)):
        if s is not None and (len(s) != 2 or _known_differ(s[1], h)):
            raise ShapeError(f"{what}: {name} must be {_fmt(('rows', h))}, got {_fmt(s)}")
    _check_vector(gamma, h, what, "gamma")
    _check_vector(beta, h, what, "beta")
    if pos_ids is not None and (len(pos_ids) != 2 or _known_differ(pos_ids[1], ids[1]) or (
            pos_ids[0] != 1 and _known_differ(pos_ids[0], ids[0]))):
        raise ShapeError(f"{what}: position_ids must be {_fmt(ids)} or {_fmt((1, ids[1]))}, got {_fmt(pos_ids)}")
    y = (ids[0], ids[1], h)
    return [y, (ids[0],), y]  # output, mask_index, embedding_sum


def _rows(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """table[ids]; an id outside the table fails, as in onnxruntime."""
    flat = ids.reshape(-1)
    if flat.device != table.device:
        flat = flat.to(table.device)
    # index_select checks on the CPU; on a GPU a bad index is a device assert that spoils the
    # context, so look first (one sync, once per run: the embedding starts the model)
    if flat.device.type != "cpu" and flat.numel() and bool(((flat < 0) | (flat >= table.shape[0])).any()):
        raise IndexError(f"EmbedLayerNormalization: index out of range of a table of {table.shape[0]} rows")
    return torch.index_select(table, 0, flat).reshape(*ids.shape, table.shape[1])


_EMBED_THREAD_MIN = 1 << 16  # elements below which a second thread costs more than it saves


def _embed_ln_native(ids, seg_ids, word, pos, seg, gamma, beta, epsilon: float, with_sum: bool):
    """EmbedLayerNormalization in one C call (csrc/elementwise.c embed_ln_f32) for float32 CPU tables
    and positions 0 .. S-1: (output, the embedding sum or None), or None where it does not serve
    (and the torch path runs, which also reports a bad id or a sequence longer than the table)."""
    run = embed_ln_bound(word, pos, seg, gamma, beta, epsilon)
    return None if run is None else run(ids, seg_ids, with_sum)


def embed_ln_bound(word, pos, seg, gamma, beta, epsilon: float):
    """The C pass with its tables checked once: ``f(ids, seg_ids, with_sum)`` -> (output, sum or None),
    or None for ids it does not serve; None where the tables themselves are not served (QEmbedLayer-
    Normalization binds its dequantized tables so)."""
    f32 = torch.float32
    tables = [word, pos, gamma, beta] + ([seg] if seg is not None else [])
    if any(type(t) is not torch.Tensor or t.device.type != "cpu" or t.dtype != f32 or not t.is_contiguous()
           for t in tables) or word.dim() != 2 or pos.dim() != 2 or gamma.dim() != 1 or beta.dim() != 1:
        return None
    h = word.shape[1]
    if pos.shape[1] != h or gamma.shape[0] != h or beta.shape[0] != h or (seg is not None and (
            seg.dim() != 2 or seg.shape[1] != h)):
        return None
    fn = native.function("elementwise", "embed_ln_f32", "ppiiiipipipippdppi", ctypes.c_int, fallbacks="embed_ln")
    if fn is None:
        return None
    consts = (word.data_ptr(), word.shape[0], pos.data_ptr(), pos.shape[0], None if seg is None else seg.data_ptr(),
              0 if seg is None else seg.shape[0], gamma.data_ptr(), beta.data_ptr(), float(epsilon))
    npos = pos.shape[0]

    def run(ids, seg_ids, with_sum: bool):
        if ids.device.type != "cpu" or ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 2 \
                or not ids.is_contiguous() or ids.shape[1] > npos \
                or (seg is None) != (seg_ids is None) or (seg_ids is not None and (
                    seg_ids.dtype != ids.dtype or seg_ids.shape != ids.shape or not seg_ids.is_contiguous())):
            return None  # (a segment table without segment ids adds its row 0: the torch path)
        b, s = ids.shape
        y = torch.empty(b, s, h)
        total = torch.empty(b, s, h) if with_sum else None
        n = b * s * h
        if n and fn(ids.data_ptr(), None if seg_ids is None else seg_ids.data_ptr(), int(ids.dtype == torch.int64),
                    b * s, s, h, *consts, y.data_ptr(), None if total is None else total.data_ptr(),
                    torch.get_num_threads() if n >= _EMBED_THREAD_MIN else 1):
            return None  # an id outside its table: the torch path raises onnxruntime's error
        native.count("embed_ln_native_calls")
        return y, total

    run.tables = tables  # the tables whose addresses it holds stay alive with it
    return run


def _mask_index(mask, input_ids):
    """The count of ones per row (other values do not count), zeros without a mask."""
    if mask is None:
        return torch.zeros(input_ids.shape[0], dtype=torch.int32, device=input_ids.device)
    return (mask == 1).sum(1, dtype=torch.int32)


def bound_embed_kernel(run, full, n: int, with_segments: bool):
    """The bound form of (Q)EmbedLayerNormalization around ``run`` (embed_ln_bound of its tables):
    ids, segment ids and mask from their positions, the mask index as the op gives it; ``full``
    (the op with its attributes) for whatever ``run`` does not serve."""

    def kernel(*args, out=None):
        ids = args[0]
        seg_ids = args[1] if len(args) > 1 else None
        mask = args[7] if len(args) > 7 else None
        got = run(ids, seg_ids, _wants(out, n, 2)) if with_segments == (seg_ids is not None) else None
        if got is None:
            return full(*args, out=out)
        mask_index = _mask_index(mask, ids) if _wants(out, n, 1) else None
        return _emit([got[0], mask_index, got[1]], out, n)

    return kernel


@op("EmbedLayerNormalization", 1, MS, infer=_embed_infer)
def _embed_layer_norm(input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma, beta,
                      mask=None, position_ids=None, *, epsilon=1e-12, mask_index_type=1, _n_outputs=1, out=None):
    b, s = input_ids.shape
    ct = _compute_type(word_embedding.dtype)
    got = _embed_ln_native(input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma,
                           beta, epsilon, _wants(out, _n_outputs, 2)) if position_ids is None else None
    if got is not None:
        y, total = got
        mask_index = _mask_index(mask, input_ids) if _wants(out, _n_outputs, 1) else None
        return _emit([y, mask_index, total], out, _n_outputs)
    if position_ids is None:
        if s > position_embedding.shape[0]:
            raise ValueError(f"EmbedLayerNormalization: sequence length {s} exceeds the "
                             f"{position_embedding.shape[0]} rows of position_embedding")
        pos = position_embedding[:s]
    else:
        pos = _rows(position_embedding, position_ids)  # (1, S, H) broadcasts over the batch
    e = _as(_rows(word_embedding, input_ids), ct) + _as(pos, ct)
    if segment_embedding is not None:
        # without segment_ids onnxruntime adds segment row 0 to every token
        seg = segment_ids if segment_ids is not None else torch.zeros_like(input_ids)
        e = e + _as(_rows(segment_embedding, seg), ct)
    elif segment_ids is not None:
        raise ValueError("EmbedLayerNormalization: segment_ids given without a segment_embedding")
    h = (word_embedding.shape[1],)
    y = _as(F.layer_norm(e, h, _as(gamma, ct), _as(beta, ct), epsilon), word_embedding.dtype)
    mask_index = _mask_index(mask, input_ids) if _wants(out, _n_outputs, 1) else None
    total = e.to(word_embedding.dtype) if _wants(out, _n_outputs, 2) else None
    return _emit([y, mask_index, total], out, _n_outputs)


@binder("EmbedLayerNormalization", MS)
def _bind_embed_layer_norm(consts, attrs):
    """EmbedLayerNormalization of constant tables and no position_ids: the C pass bound to them
    (embed_ln_bound), where the op checks five tables every call."""
    c = list(consts) + [None] * (9 - len(consts))
    if any(t is COMPUTED for t in c[2:7]) or any(c[i] is None for i in (2, 3, 5, 6)) or c[8] is not None:
        return None
    run = embed_ln_bound(c[2], c[3], c[4], c[5], c[6], attrs.get("epsilon", 1e-12))
    if run is None:
        return None
    return bound_embed_kernel(run, partial(_embed_layer_norm, **attrs), attrs.get("_n_outputs", 1), c[4] is not None)


# activations --------------------------------------------------------------------------------
def _bias_infer(op_type: str, required: bool):
    def infer(shapes, values, **_attrs):
        x, bias = shapes[0], _opt(shapes, 1)
        if bias is not None or required:
            if len(x) < 1:
                raise ShapeError(f"{op_type}: input must have rank >= 1 to take a bias, got a scalar")
            _check_vector(bias, x[-1], op_type, "bias")
        return [tuple(x)]
    return infer


def _gelu(x, approximate: str, out):
    if out is None:
        return F.gelu(x, approximate=approximate)
    return torch._C._nn.gelu(x, approximate=approximate, out=out)


@op("Gelu", 1, MS, infer=same_as_first, notes="erf GELU")
def _ms_gelu(x, *, out=None):
    return _gelu(x, "none", out)


@op("FastGelu", 1, MS, infer=_bias_infer("FastGelu", False), notes="tanh GELU of x + bias")
def _fast_gelu(x, bias=None, *, out=None):
    if bias is not None:
        x = torch.add(x, bias) if out is None else torch.add(x, bias, out=out)
    return _gelu(x, "tanh", out)


@op("BiasGelu", 1, MS, infer=_bias_infer("BiasGelu", True), notes="erf GELU of a + b")
def _bias_gelu(a, b, *, out=None):
    x = torch.add(a, b) if out is None else torch.add(a, b, out=out)
    return _gelu(x, "none", out)


@op("QuickGelu", 1, MS, infer=same_as_first, notes="x * sigmoid(alpha * x)")
def _quick_gelu(x, *, alpha=1.702, out=None):
    # onnxruntime: MlasComputeLogistic(alpha * x), then the product (ort_math: its bits on the CPU)
    return torch.mul(x, ort_math.sigmoid(x * alpha), out=out)


# BiasAdd, BiasSplitGelu (CUDA only in onnxruntime) ------------------------------------------
def _bias_add_infer(shapes, values, **_attrs):
    x, bias, skip = shapes[0], shapes[1], shapes[2]
    if len(x) != 3:
        raise ShapeError(f"BiasAdd: input must be (batch, seq, channels), got {_fmt(x)}")
    _check_vector(bias, x[2], "BiasAdd", "bias")
    if len(skip) != 3 or any(_known_differ(a, b) for a, b in zip(skip, x)):
        raise ShapeError(f"BiasAdd: skip must have the input's shape {_fmt(x)}, got {_fmt(skip)}")
    return [tuple(x)]


@op("BiasAdd", 1, MS, infer=_bias_add_infer, notes="x + bias + skip (onnxruntime: CUDA only)")
def _bias_add(x, bias, skip, *, out=None):
    r = torch.add(x, bias, out=out)
    return r.add_(skip)


def _bias_split_gelu_infer(shapes, values, **_attrs):
    x, bias = shapes[0], shapes[1]
    if len(x) != 3:
        raise ShapeError(f"BiasSplitGelu: input must be (batch, seq, 2 * half), got {_fmt(x)}")
    _check_vector(bias, x[2], "BiasSplitGelu", "bias")
    if isinstance(x[2], int) and x[2] % 2:
        raise ShapeError(f"BiasSplitGelu: the last dim must be even to split in halves, got {_fmt(x)}")
    return [(x[0], x[1], x[2] // 2)]


@op("BiasSplitGelu", 1, MS, infer=_bias_split_gelu_infer,
    notes="left * gelu(right), halves of x + bias (onnxruntime: CUDA only)")
def _bias_split_gelu(x, bias, *, out=None):
    # as onnxruntime's CUDA kernel: the bias add rounds to the input type, the rest is float32
    v = (x + bias).to(_compute_type(x.dtype))
    left, right = v.chunk(2, dim=-1)
    r = left * F.gelu(right)
    return r.to(x.dtype) if out is None else out.copy_(r)


# FusedMatMul --------------------------------------------------------------------------------
def _operand(shape: tuple, trans: int, trans_batch: int) -> tuple:
    """The matrix operand's shape after the transposes: transBatch moves dim 0 to the row
    position (b1..bn, d0, dlast), then trans swaps the last two."""
    if len(shape) < 2:
        return tuple(shape)
    if trans_batch:
        shape = tuple(shape[1:-1]) + (shape[0], shape[-1])
    return tuple(shape[:-2]) + (shape[-1], shape[-2]) if trans else tuple(shape)


def _fused_matmul_infer(shapes, values, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0, **_attrs):
    a, b = shapes[0], shapes[1]
    if (transBatchA or transBatchB) and (len(a) != len(b) or len(a) < 3):
        raise ShapeError(f"FusedMatMul: transBatchA/transBatchB need inputs of one rank >= 3, got {_fmt(a)} "
                         f"and {_fmt(b)}")
    return [_matmul_shape(_operand(a, transA, transBatchA), _operand(b, transB, transBatchB), "FusedMatMul")]


def _transposed(t: torch.Tensor, trans: int, trans_batch: int) -> torch.Tensor:
    if t.dim() < 2:
        return t
    if trans_batch:
        r = t.dim()
        t = t.permute(*range(1, r - 1), 0, r - 1)
    return t.transpose(-1, -2) if trans else t


@op("FusedMatMul", 1, MS, infer=_fused_matmul_infer,
    notes="alpha * op(A) @ op(B); transBatch moves dim 0 next to the last")
def _fused_matmul(a, b, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0, out=None):
    r = _matmul(_transposed(a, transA, transBatchA), _transposed(b, transB, transBatchB), out=out)
    return r if alpha == 1.0 else r.mul_(alpha)
