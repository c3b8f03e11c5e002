"""onnxruntime's quantized BERT contrib ops (domain ``com.microsoft``), what
``onnxruntime.quantization.quantize_dynamic`` writes into a BERT its transformers optimizer fused:
QAttention and QEmbedLayerNormalization. Semantics follow onnxruntime's CPU kernels
(contrib_ops/cpu/quantization/attention_quant.cc and qembed_layer_norm.cc).

QAttention. ``input`` is already quantized (a DynamicQuantizeLinear in front of it gives the
uint8 values, their scale and zero point). The projection is the exact integer product
(input - input_zero_point) @ (weight - weight_zero_point) (integer_gemm.qmatmul: exact, and with
linalg.set_u8s8_saturation(True) saturated as onnxruntime's AVX2 uint8 x int8 kernels without
VNNI do), then, as MLAS's scale-bias output processor, float32(acc) * float32(input_scale *
weight_scale) + bias, per tensor or per column. The attention that follows is com.microsoft
Attention's (contrib_attention's helpers): masks, past / present, unidirectional and
mask_filter_value behave identically. onnxruntime's CPU kernel takes uint8 inputs only; int8
inputs are computed the same exact way. As that kernel, do_rotary is ignored (it reads the
attribute and applies no rotary) and past_present_share_buffer refused (it fails for want of a
past_sequence_length input, which QAttention lacks).

QEmbedLayerNormalization. EmbedLayerNormalization over tables, gamma and beta stored as 8-bit
integers with per-tensor scales and zero points: they are dequantized ((q - zero point) * scale in
float32, as onnxruntime) once, cached by the tensors' identities (constant initializers are the same
tensors every call), and the float op runs. As onnxruntime's kernel, the segment table counts only
when segment_ids are given, positions are 0 .. S-1 (there is no position_ids input), and the
outputs are the normalized embedding and the mask index (the count of ones of each mask row).
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial

import torch

from ..errors import ShapeError
from . import qgemm
from .attention import _emit
from .contrib_attention import _causal, _core, _key_lengths, _padding_bias, _scale
from .contrib_transformer import _embed_infer, _embed_layer_norm, bound_embed_kernel, embed_ln_bound
from .integer_gemm import _saturates, prepared_b, qmatmul
from .registry import COMPUTED, binder, op

MS = "com.microsoft"
_EIGHT_BIT = (torch.uint8, torch.int8)


def _fmt(dims) -> str:
    items = [int.__repr__(d) if isinstance(d, int) else str(d) for d in dims]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _is_one(shape) -> bool:
    """Whether a shape holds one element (a scalar or a 1-element vector); unknown dims pass."""
    return shape is None or all(not isinstance(d, int) or d == 1 for d in shape)


def _check_param(shape, n, what: str, per_column: bool) -> None:
    """A scale or zero point of one element, or (per_column) one per weight column (n,)."""
    if shape is None or _is_one(shape):
        return
    if per_column and len(shape) == 1 and (not isinstance(shape[0], int) or not isinstance(n, int)
                                           or shape[0] == n):
        return
    want = f"one value or one per weight column {_fmt((n,))}" if per_column else "one value"
    raise ShapeError(f"{what} must be {want}, got shape {_fmt(shape)}")


# QAttention ---------------------------------------------------------------------------------------
def _qattention_infer(shapes, values, *, num_heads, **_attrs):
    x, w, bias = shapes[0], shapes[1], shapes[2]
    past = shapes[8] if len(shapes) > 8 else None
    for i, name in ((2, "bias"), (3, "input_scale"), (4, "weight_scale")):
        if len(shapes) <= i or shapes[i] is None:
            raise ShapeError(f"QAttention: {name} is required")
    if len(x) != 3 or len(w) != 2:
        raise ShapeError(f"QAttention: input must be (batch, seq, input hidden) and weight (input hidden, "
                         f"3 * hidden), got {_fmt(x)} and {_fmt(w)}")
    if isinstance(x[2], int) and isinstance(w[0], int) and x[2] != w[0]:
        raise ShapeError(f"QAttention: input {_fmt(x)} does not match weight {_fmt(w)}: their input hidden "
                         f"sizes differ")
    n3 = w[1]
    if isinstance(n3, int) and (n3 % 3 or n3 // 3 % num_heads or n3 == 0):
        raise ShapeError(f"QAttention: weight columns {n3} must be 3 * hidden size with the hidden size a "
                         f"multiple of num_heads {num_heads}")
    if len(bias) != 1 or (isinstance(bias[0], int) and isinstance(n3, int) and bias[0] != n3):
        raise ShapeError(f"QAttention: bias must have shape {_fmt((n3,))}, got {_fmt(bias)}")
    _check_param(shapes[3], n3, "QAttention input_scale", False)
    _check_param(shapes[4], n3, "QAttention weight_scale", True)
    if len(shapes) > 6:
        _check_param(shapes[6], n3, "QAttention input_zero_point", False)
    if len(shapes) > 7:
        _check_param(shapes[7], n3, "QAttention weight_zero_point", True)
    hidden = n3 // 3
    head = hidden // num_heads
    if past is not None:
        if len(past) != 5:
            raise ShapeError(f"QAttention: past must be (2, batch, num_heads, past length, head size), got "
                             f"{_fmt(past)}")
        present = (2, x[0], num_heads, past[3] + x[1], head)
    else:
        present = (2, x[0], num_heads, x[1], head)
    return [(x[0], x[1], hidden), present]


def _one_value(t: torch.Tensor | None, what: str) -> torch.Tensor | None:
    if t is None:
        return None
    if t.dim() == 0:
        return t
    if t.numel() != 1:
        raise ShapeError(f"{what} must be a scalar or a 1-element tensor, got shape {tuple(t.shape)}")
    return t.reshape(())


def _per_column(t: torch.Tensor | None, n: int, what: str) -> torch.Tensor | None:
    if t is None or t.dim() == 0:
        return t
    if t.numel() == 1:
        return t.reshape(())
    if t.dim() == 1 and t.shape[0] == n:
        return t
    raise ShapeError(f"{what} must be one value or one per weight column ({n},), got shape {tuple(t.shape)}")


def _projection(input, weight, bias, input_scale, weight_scale, input_zero_point, weight_zero_point):
    """float32(exact (input - zi) @ (weight - zw)) * float32(input_scale * weight_scale) + bias, in
    float32 (MLAS's scale-bias output processor): (B, S, 3 * hidden)."""
    n3 = weight.shape[1]
    zi = _one_value(input_zero_point, "QAttention input_zero_point")
    zw = _per_column(weight_zero_point, n3, "QAttention weight_zero_point")
    if zi is not None and zi.dtype != input.dtype:
        raise ShapeError(f"QAttention: input_zero_point's type {zi.dtype} differs from the input's {input.dtype}")
    if zw is not None and zw.dtype != weight.dtype:
        raise ShapeError(f"QAttention: weight_zero_point's type {zw.dtype} differs from the weight's {weight.dtype}")
    xs = _one_value(input_scale, "QAttention input_scale")
    ws = _per_column(weight_scale, n3, "QAttention weight_scale")
    if input.device.type == "cpu" and xs.device.type == "cpu" and not _saturates(input, weight):
        # one call: the product, then fma(float32(acc), float32(xs * ws), bias) as addcmul below;
        # the weight's scale as it comes (a constant: qgemm keeps its epilogue per tensor, which a
        # fresh view each call would miss)
        r = qgemm.product(input, qgemm.byte_kind(input), prepared_b(weight, zw),
                          a_scale=input_scale.item() if input_scale.dtype == torch.float32
                          else float(xs.to(torch.float32)), a_zp=0 if zi is None else int(zi.item()),
                          b_scale=weight_scale, bias=bias, fused=True)
        if r is not None:
            return r
    xs = xs.to(torch.float32)
    acc = qmatmul(input, weight, zi, zw)  # float32 or float64 holding the exact integers
    mult = ws.to(torch.float32) * xs  # onnxruntime's dequant_scales, float32
    return torch.addcmul(bias.to(torch.float32), acc.to(torch.float32), mult)


@op("QAttention", 1, domain=MS, infer=_qattention_infer,
    notes="onnxruntime's CPU semantics: exact integer projection (u8s8 saturation switch honoured), "
          "per-tensor or per-column weight scale / zero point, then Attention's masks, past/present, "
          "unidirectional; int8 input too (onnxruntime's CPU kernel: uint8 only); do_rotary is ignored and "
          "past_present_share_buffer refused, as by onnxruntime's CPU kernel")
def _qattention(input, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None,
                weight_zero_point=None, past=None, *, num_heads, unidirectional=0, do_rotary=0,
                past_present_share_buffer=0, mask_filter_value=-10000.0, scale=0.0, _n_outputs=1, out=None):
    what = "QAttention"
    # do_rotary: onnxruntime's CPU kernel reads the attribute and applies no rotary: ignored here too
    if past_present_share_buffer:
        raise NotImplementedError(f"{what} (com.microsoft): a past/present shared buffer is not supported "
                                  f"(onnxruntime's CPU kernel refuses it too: QAttention has no "
                                  f"past_sequence_length input)")
    for t, name in ((bias, "bias"), (input_scale, "input_scale"), (weight_scale, "weight_scale")):
        if t is None:
            raise ShapeError(f"{what}: {name} is required")
    if input.dtype not in _EIGHT_BIT or weight.dtype not in _EIGHT_BIT:
        raise ShapeError(f"{what}: input and weight must be uint8 or int8, got {input.dtype} and {weight.dtype}")
    if input.dim() != 3 or weight.dim() != 2 or weight.shape[0] != input.shape[2]:
        raise ShapeError(f"{what}: input (B, S, D) {tuple(input.shape)} does not match weight (D, 3 * hidden) "
                         f"{tuple(weight.shape)}")
    n3 = weight.shape[1]
    hidden = n3 // 3
    if n3 == 0 or n3 % 3 or hidden % num_heads:
        raise ShapeError(f"{what}: weight columns {n3} must be 3 * hidden size with the hidden size a multiple "
                         f"of num_heads {num_heads}")
    if tuple(bias.shape) != (n3,):
        raise ShapeError(f"{what}: bias shape {tuple(bias.shape)} != ({n3},)")
    b, s, _ = input.shape
    out_dtype = bias.dtype
    qkv = _projection(input, weight, bias, input_scale, weight_scale, input_zero_point, weight_zero_point)
    hs = hidden // num_heads
    # (B, S, 3 * hidden) -> three (B, N, S, H) views: the strides split() and a reshape into heads give
    q, k, v = qkv.reshape(b, s, 3, num_heads, hs).permute(2, 0, 3, 1, 4).unbind(0)
    p = 0
    if past is not None:
        if past.dim() != 5 or past.shape[0] != 2 or past.shape[1] != b or past.shape[2] != num_heads \
                or past.shape[4] != hs:
            raise ShapeError(f"{what}: past must be (2, {b}, {num_heads}, P, {hs}), got {tuple(past.shape)}")
        p = past.shape[3]
        k, v = torch.cat((past[0].to(k.dtype), k), 2), torch.cat((past[1].to(v.dtype), v), 2)
    total = p + s
    causal = unidirectional and s > 1
    lengths = None if causal else _key_lengths(mask_index, b, mask_filter_value)
    bias_m = None if lengths is not None else \
        _padding_bias(mask_index, b, s, p, total, mask_filter_value, f"{what} mask_index", dummy_ok=True)
    if causal:
        bias_m = _causal(bias_m, s, p, total, input.device)
    y = _core(q, k, v, bias_m, None, _scale(scale, hs), out_dtype, lengths)
    present = torch.stack((k, v)).to(out_dtype) if _n_outputs > 1 else None
    return _emit((y, present), out, _n_outputs)


# QEmbedLayerNormalization -------------------------------------------------------------------------
_TABLES = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")
_SEGMENT_ALL = ("segment_ids, segment_embedding, segment_embedding_scale and segment_embedding_zero_point must "
                "all be given or all be absent (as onnxruntime)")


def _qembed_infer(shapes, values, **_attrs):
    def at(i):
        return shapes[i] if i < len(shapes) else None

    what = "QEmbedLayerNormalization"
    if len({at(i) is None for i in (1, 4, 10, 15)}) != 1:
        raise ShapeError(f"{what}: {_SEGMENT_ALL}")
    for k, name in enumerate(_TABLES):
        table = at(2 + k)
        if table is None:
            continue
        for i, kind in ((8 + k, "scale"), (13 + k, "zero_point")):
            p = at(i)
            if p is None and not (name == "segment_embedding" or kind == "zero_point"):
                raise ShapeError(f"{what}: {name}_{kind} is required")
            if p is not None and not _is_one(p):
                raise ShapeError(f"{what}: {name}_{kind} must be one value (per-tensor quantization), got "
                                 f"{_fmt(p)}")
    y, mask_index, _ = _embed_infer(list(shapes[:8]) + [None], values)
    return [y, mask_index]


_DEQUANT: OrderedDict = OrderedDict()  # key -> (source tensors, dequantized table)
_DEQUANT_BYTES = [0]
_DEQUANT_BUDGET = 2 << 30


def _ident(t: torch.Tensor | None):
    """The tensor object and its version: an entry holds its sources, so while it is kept no other
    object can have their ids (a key of pointers, shapes and devices cost ~3 us a table a call)."""
    return None if t is None else (id(t), t._version)


def _dequantized(q: torch.Tensor, scale: torch.Tensor | None, zero_point: torch.Tensor | None,
                 what: str) -> torch.Tensor:
    """(q - zero point) * scale in the scale's type (float32), cached by the three tensors'
    identities (object and version counter). An entry keeps its sources alive, so that their ids
    cannot come back under another tensor while it is cached."""
    key = (_ident(q), _ident(scale), _ident(zero_point))
    hit = _DEQUANT.get(key)
    if hit is not None:  # the same three tensors, unwritten: checked when the entry was made
        _DEQUANT.move_to_end(key)
        return hit[1]
    if q.dtype not in _EIGHT_BIT:
        raise ShapeError(f"QEmbedLayerNormalization: {what} must be uint8 or int8, got {q.dtype}")
    if scale is None:
        raise ShapeError(f"QEmbedLayerNormalization: {what}_scale is required")
    if scale.numel() != 1 or (zero_point is not None and zero_point.numel() != 1):
        raise ShapeError(f"QEmbedLayerNormalization: {what}'s scale and zero point must be one value each "
                         f"(per-tensor quantization), got shapes {tuple(scale.shape)} and "
                         f"{None if zero_point is None else tuple(zero_point.shape)}")
    if zero_point is not None and zero_point.dtype != q.dtype:
        raise ShapeError(f"QEmbedLayerNormalization: {what}_zero_point's type {zero_point.dtype} differs from "
                         f"{what}'s {q.dtype}")
    dt = scale.dtype if scale.dtype.is_floating_point else torch.float32
    v = q.to(torch.float32)
    if zero_point is not None:
        v = v - zero_point.reshape(()).to(device=q.device, dtype=torch.float32)
    w = (v * scale.reshape(()).to(device=q.device, dtype=torch.float32)).to(dt)
    _DEQUANT[key] = ((q, scale, zero_point), w)
    _DEQUANT_BYTES[0] += w.numel() * w.element_size()
    while _DEQUANT_BYTES[0] > _DEQUANT_BUDGET and len(_DEQUANT) > 1:
        _, (_, old) = _DEQUANT.popitem(last=False)
        _DEQUANT_BYTES[0] -= old.numel() * old.element_size()
    return w


@op("QEmbedLayerNormalization", 1, domain=MS, infer=_qembed_infer,
    notes="8-bit tables, gamma and beta with per-tensor scales / zero points, dequantized once (cached) and run "
          "as EmbedLayerNormalization; no position_ids (positions 0 .. S-1, as onnxruntime)")
def _qembed_layer_norm(input_ids, segment_ids=None, word_embedding=None, position_embedding=None,
                       segment_embedding=None, gamma=None, beta=None, mask=None, word_embedding_scale=None,
                       position_embedding_scale=None, segment_embedding_scale=None, gamma_scale=None,
                       beta_scale=None, word_embedding_zero_point=None, position_embedding_zero_point=None,
                       segment_embedding_zero_point=None, gamma_zero_point=None, beta_zero_point=None, *,
                       epsilon=1e-12, _n_outputs=2, out=None):
    what = "QEmbedLayerNormalization"
    for t, name in ((word_embedding, "word_embedding"), (position_embedding, "position_embedding"),
                    (gamma, "gamma"), (beta, "beta")):
        if t is None:
            raise ShapeError(f"{what}: {name} is required")
    word = _dequantized(word_embedding, word_embedding_scale, word_embedding_zero_point, "word_embedding")
    pos = _dequantized(position_embedding, position_embedding_scale, position_embedding_zero_point,
                       "position_embedding")
    g = _dequantized(gamma, gamma_scale, gamma_zero_point, "gamma")
    bt = _dequantized(beta, beta_scale, beta_zero_point, "beta")
    segment = (segment_ids, segment_embedding, segment_embedding_scale, segment_embedding_zero_point)
    if len({t is None for t in segment}) != 1:
        raise ShapeError(f"{what}: {_SEGMENT_ALL}")
    seg = None
    if segment_ids is not None:
        seg = _dequantized(segment_embedding, segment_embedding_scale, segment_embedding_zero_point,
                           "segment_embedding")
    return _embed_layer_norm(input_ids, segment_ids, word, pos, seg, g, bt, mask, None, epsilon=epsilon,
                             _n_outputs=min(_n_outputs, 2), out=out)


@binder("QEmbedLayerNormalization", MS)
def _bind_qembed_layer_norm(consts, attrs):
    """QEmbedLayerNormalization of constant tables, scales and zero points: the tables dequantized
    and checked once, the C embedding pass bound to them (contrib_transformer.embed_ln_bound), where
    the op looks five tables up by identity and checks them every call. The op itself elsewhere."""
    c = list(consts) + [None] * (18 - len(consts))
    params = c[2:7] + c[8:18]
    if any(t is COMPUTED for t in params) or any(c[i] is None for i in (2, 3, 5, 6)):
        return None
    try:
        tables = ((2, "word_embedding"), (3, "position_embedding"), (5, "gamma"), (6, "beta"))
        word, pos, g, bt = (_dequantized(c[i], c[6 + i], c[11 + i], name) for i, name in tables)
        seg = None if c[4] is None else _dequantized(c[4], c[10], c[15], "segment_embedding")
    except ShapeError:
        return None  # the op raises it at the first call
    run = embed_ln_bound(word, pos, seg, g, bt, attrs.get("epsilon", 1e-12))
    if run is None:
        return None
    return bound_embed_kernel(run, partial(_qembed_layer_norm, **attrs), min(attrs.get("_n_outputs", 2), 2),
                              seg is not None)
