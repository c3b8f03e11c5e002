"""onnxruntime's attention contrib ops (domain ``com.microsoft``), with its CPU kernels' semantics:
Attention, MultiHeadAttention and RotaryEmbedding, and the helpers GroupQueryAttention
(contrib_gqa.py) and QAttention (contrib_qattention.py) share with them.

DecoderMaskedMultiHeadAttention and PackedAttention have CUDA kernels only in onnxruntime and are
not implemented. Where onnxruntime's CPU kernel refuses an input form (MultiHeadAttention's packed
QKV or KV, Attention's rotary and shared past/present buffer) we raise NotImplementedError too:
there is no CPU behaviour to match.

Masks. Attention and MultiHeadAttention turn a padding mask into an *additive* ``mask_filter_value``
(-10000 by default), so a row whose keys are all padded still attends (the shift cancels in the
softmax), and a causal mask into float's lowest value, exactly as onnxruntime does.

Precision. onnxruntime's CPU kernels compute half inputs in float32 and round the output once; on
the CPU we do the same. On CUDA, half inputs stay half in scaled_dot_product_attention, whose
kernels accumulate and take the softmax in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from . import cpu_attention
from .attention import _emit, _grouped, _rotary
from .fused import SDPA_GQA
from .registry import op
from .shapes import same_as_first

MS = "com.microsoft"
_HALF = (torch.float16, torch.bfloat16)

# helpers ------------------------------------------------------------------------------------
def _compute_type(x: torch.Tensor, fused: bool) -> torch.dtype:
    """float32 for half inputs on the CPU (as onnxruntime computes them), and on CUDA too unless
    the computation is one SDPA call (which accumulates in float32 itself)."""
    if x.dtype in _HALF and (x.device.type == "cpu" or not fused):
        return torch.float32
    return x.dtype


def _heads(x: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """(B, S, N*H) -> (B, N, S, H)."""
    b, s, d = x.shape
    if n <= 0 or d % n:
        raise ShapeError(f"{what}: hidden size {d} does not split into {n} heads")
    return x.reshape(b, s, n, d // n).transpose(1, 2)


def _merge_heads(y: torch.Tensor) -> torch.Tensor:
    """(B, N, S, H) -> (B, S, N*H)."""
    b, n, s, h = y.shape
    return y.transpose(1, 2).reshape(b, s, n * h)


def _attend(q, k, v, bias, scale: float, *, softcap: float = 0.0, sink=None):
    """softmax(q k^T * scale (softcapped) + bias (+ a sink logit)) v, per head; q (B, N, S, H),
    k and v (B, Nk, T, H) with N a multiple of Nk (grouped heads share their K/V head). ``bias``
    is additive, broadcastable to (B, N, S, T), in the compute type. Returns (B, N, S, Hv)."""
    b, n, s, _ = q.shape
    nk, t, hv = k.shape[1], k.shape[2], v.shape[3]
    if n % nk or v.shape[1] != nk or v.shape[2] != t:
        raise ShapeError(f"attention: {n} query heads cannot share K {tuple(k.shape)} and V {tuple(v.shape)}")
    if t == 0 or s == 0:  # no keys: nothing to attend (onnxruntime writes zeros)
        return q.new_zeros((b, n, s, hv))
    if softcap <= 0 and sink is None:
        r = cpu_attention.attention(q, k, v, bias, scale)  # small heads on the CPU: one C call
        if r is not None:
            return r
        kw = {}
        if nk != n:
            if SDPA_GQA:
                kw["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(n // nk, 1), v.repeat_interleave(n // nk, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, **kw)
    scores = torch.matmul(_grouped(q, nk), k.transpose(-1, -2)).reshape(b, n, s, t) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    probs = _softmax(scores, sink)
    return torch.matmul(_grouped(probs, nk), v).reshape(b, n, s, hv)


def _softmax(scores, sink=None):
    """Softmax over the last dim; a per-head ``sink`` (N,) adds one more logit to each row's
    denominator that attends nothing (smooth softmax, gpt-oss's attention sinks)."""
    if sink is None:
        return torch.softmax(scores, -1)
    sink = sink.reshape(1, -1, 1, 1)
    m = torch.maximum(scores.amax(-1, keepdim=True), sink)
    e = torch.exp(scores - m)
    return e / (e.sum(-1, keepdim=True) + torch.exp(sink - m))


def _padding_bias(mask, b: int, s: int, past: int, total: int, fill: float, what: str, *, dummy_ok: bool):
    """onnxruntime's mask_index / key_padding_mask as an additive (B, 1, S or 1, T) float32 bias:
    ``fill`` (mask_filter_value) where a key is masked, 0 elsewhere; None for no mask."""
    if mask is None:
        return None
    dev, shape = mask.device, tuple(mask.shape)
    zero = 0.0  # torch.where of two numbers: float32, on the condition's device
    if mask.dim() == 1 and shape[0] in (b, 2 * b):
        # key lengths (right padding), then start positions (left padding) when there are 2B
        if b and shape[0] == b and dev.type == "cpu" and int(mask.min()) >= total:
            return None  # no key left out (an unpadded batch): no bias to add, the unmasked kernel
        j = torch.arange(total, device=dev)
        keep = j < mask[:b].reshape(b, 1).to(torch.int64)
        if shape[0] == 2 * b:
            keep = keep & (j >= mask[b:].reshape(b, 1).to(torch.int64))
        return torch.where(keep, zero, fill).reshape(b, 1, 1, total)
    if mask.dim() == 2:
        if shape == (b, total):
            return torch.where(mask > 0, zero, fill).reshape(b, 1, 1, total)
        if dummy_ok and shape[1] == 1 and shape[0] in (1, b):
            return None  # one value per row: the same shift for every key, no mask at all
        raise ShapeError(f"{what}: a 2-D mask must be (batch, total sequence length) = {(b, total)}, got {shape}")
    if mask.dim() == 3:
        if shape != (b, s, total):
            raise ShapeError(f"{what}: a 3-D mask must be (batch, sequence, total sequence) = {(b, s, total)}, "
                             f"got {shape}")
        return torch.where(mask > 0, zero, fill).reshape(b, 1, s, total)
    if mask.dim() == 4:
        # Megatron's (B, 1, M, M) causal-style mask (onnxruntime's CUDA kernel; its CPU kernel has none):
        # the queries' rows start after the past
        if shape[0] != b or shape[1] != 1 or shape[2] != shape[3] or shape[3] < past + s:
            raise ShapeError(f"{what}: a 4-D mask must be (batch, 1, max length, max length) with max length >= "
                             f"{past + s}, got {shape}")
        m = mask[:, :, past:past + s, :total]
        return torch.where(m > 0, zero, fill)
    raise ShapeError(f"{what}: mask of shape {shape} is none of (B), (2B), (B, T), (B, S, T), (B, 1, M, M) "
                     f"with B={b}, S={s}, T={total}")


def _key_lengths(mask, b: int, fill: float):
    """(mask_index as int32 key lengths, fill) for _core where the mask is one length per batch row
    of a CPU batch (right padding); else None (_padding_bias decides)."""
    if mask is None or mask.dim() != 1 or mask.shape[0] != b or mask.device.type != "cpu" or not b \
            or mask.dtype != torch.int32:
        return None
    return mask if mask.is_contiguous() else mask.contiguous(), fill


def _causal(bias, s: int, past: int, total: int, device):
    """Keys after a query's own position (past + s) set to float's lowest, over a padding bias.
    onnxruntime leaves the last query row unmasked: the same for self-attention, whose last row
    sees every key anyway, but with more keys than past + queries (cross attention) it sees them all."""
    i = torch.arange(s, device=device).reshape(s, 1)
    future = (torch.arange(total, device=device) > i + past) & (i < s - 1)
    low = torch.finfo(torch.float32).min
    return torch.where(future, low, torch.zeros((), device=device) if bias is None else bias)


def _attention_bias(attention_bias, b: int, n: int, s: int, total: int, what: str):
    if attention_bias is None:
        return None
    shape = tuple(attention_bias.shape)
    if len(shape) != 4 or shape[0] not in (1, b) or shape[1] not in (1, n) or shape[2] != s or shape[3] != total:
        raise ShapeError(f"{what}: attention_bias must be (batch or 1, num_heads or 1, {s}, {total}), got {shape}")
    return attention_bias


def _core(q, k, v, mask_bias, attention_bias, scale: float, out_dtype, lengths=None):
    """The attention of Attention and MultiHeadAttention: q (B, N, S, H), k/v (B, N, T, H)
    in their input type; both biases added to the scaled scores. Returns (B, S, N*Hv).
    ``lengths`` (what _key_lengths gives, instead of ``mask_bias``): the C kernel masks keys by
    their batch row's length; where it does not serve, the bias those lengths make. On the CPU the
    C kernel writes the heads side by side (no copy to merge them) at every size."""
    ct = _compute_type(q, fused=True)
    bias = None
    for extra in (attention_bias, mask_bias):
        if extra is not None:
            bias = _as(extra, ct) if bias is None else bias + _as(extra, ct)
    lens, fill = (None, 0.0) if lengths is None or bias is not None else lengths
    if ct == torch.float32 and q.dtype == k.dtype == v.dtype == ct:
        y = cpu_attention.attention(q, k, v, bias, scale, lens=lens, fill=fill, merged=True)
        if y is not None:
            return _as(y, out_dtype)
    if lengths is not None:  # the bias those lengths make, as the mask_index they came from
        b, s, t = q.shape[0], q.shape[2], k.shape[2]
        pad = _padding_bias(lengths[0], b, s, t - s, t, lengths[1], "mask_index", dummy_ok=True)
        if pad is not None:
            bias = _as(pad, ct) if bias is None else bias + _as(pad, ct)
    y = _attend(_as(q, ct), _as(k, ct), _as(v, ct), bias, scale)
    return _as(_merge_heads(y), out_dtype)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, without a call where it is already (``to`` costs ~1 us even then)."""
    return t if t.dtype == dtype else t.to(dtype)


def _scale(scale: float, head_size: int) -> float:
    return scale if scale else head_size ** -0.5


# Attention ----------------------------------------------------------------------------------
def _qkv_sizes(weights_cols, qkv_hidden_sizes, what: str):
    if qkv_hidden_sizes:
        if len(qkv_hidden_sizes) != 3:
            raise ShapeError(f"{what}: qkv_hidden_sizes must have 3 values, got {list(qkv_hidden_sizes)}")
        return tuple(qkv_hidden_sizes)
    d = weights_cols // 3
    return d, d, d


def _ms_attention_infer(shapes, values, *, num_heads, qkv_hidden_sizes=None, **_attrs):
    x, w = shapes[0], shapes[1]
    past = shapes[4] if len(shapes) > 4 else None
    if len(x) != 3 or len(w) != 2:
        raise ShapeError(f"Attention: input must be 3-D and weights 2-D, got ranks {len(x)}, {len(w)}")
    dq, dk, dv = _qkv_sizes(w[1], qkv_hidden_sizes, "Attention")
    if past is not None:
        present = (2, x[0], num_heads, past[3] + x[1], past[4])
    else:
        present = (2, x[0], num_heads, x[1], dk // num_heads)
    return [(x[0], x[1], dv), present]


@op("Attention", 1, domain=MS, infer=_ms_attention_infer,
    notes="onnxruntime's CPU semantics; mask_index (B), (2B), (B, T), (B, S, T) and (B, 1, M, M) as CUDA reads it; "
          "do_rotary and past_present_share_buffer are refused (onnxruntime's CPU kernel refuses them too)")
def _ms_attention(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,
                  past_sequence_length=None, *, num_heads, qkv_hidden_sizes=None, unidirectional=0,
                  mask_filter_value=-10000.0, scale=0.0, do_rotary=0, rotary_embedding_dim=0,
                  past_present_share_buffer=0, _n_outputs=1, out=None):
    if do_rotary:
        raise NotImplementedError("Attention (com.microsoft): do_rotary is not supported (onnxruntime's CPU kernel "
                                  "refuses it too); use MultiHeadAttention with RotaryEmbedding")
    if past_present_share_buffer or past_sequence_length is not None:
        raise NotImplementedError("Attention (com.microsoft): a past/present shared buffer (past_sequence_length) "
                                  "is not supported (onnxruntime's CPU kernel refuses it too)")
    if input.dim() != 3 or weights.dim() != 2 or weights.shape[0] != input.shape[2]:
        raise ShapeError(f"Attention: input (B, S, D) {tuple(input.shape)} does not match weights (D, Dqkv) "
                         f"{tuple(weights.shape)}")
    dq, dk, dv = _qkv_sizes(weights.shape[1], qkv_hidden_sizes, "Attention")
    if dq + dk + dv != weights.shape[1] or dq != dk:
        raise ShapeError(f"Attention: qkv_hidden_sizes {(dq, dk, dv)} must have Q and K equal and sum to the "
                         f"weights' {weights.shape[1]} columns")
    if bias is not None and tuple(bias.shape) != (weights.shape[1],):
        raise ShapeError(f"Attention: bias shape {tuple(bias.shape)} != ({weights.shape[1]},)")
    b, s, _ = input.shape
    ct = _compute_type(input, fused=False)
    qkv = torch.matmul(input.to(ct), weights.to(ct))
    if bias is not None:
        qkv = qkv + bias.to(ct)
    q, k, v = qkv.split((dq, dk, dv), -1)  # kept in the compute type: onnxruntime rounds only the outputs
    q, k, v = (_heads(x, num_heads, f"Attention {name}") for x, name in ((q, "Q"), (k, "K"), (v, "V")))
    p = 0
    if past is not None:
        if dk != dv:
            raise ShapeError(f"Attention: a past state needs K and V of one hidden size, got {dk} and {dv}")
        if attention_bias is not None:
            raise ShapeError("Attention: cannot have both past and attention_bias (as onnxruntime)")
        hs = dk // num_heads
        if past.dim() != 5 or past.shape[0] != 2 or past.shape[1] != b or past.shape[2] != num_heads \
                or past.shape[4] != hs:
            raise ShapeError(f"Attention: past must be (2, {b}, {num_heads}, P, {hs}), got {tuple(past.shape)}")
        p = past.shape[3]
        k, v = torch.cat((past[0].to(ct), k), 2), torch.cat((past[1].to(ct), v), 2)
    total = p + s
    causal = unidirectional and s > 1
    lengths = None if causal else _key_lengths(mask_index, b, mask_filter_value)
    bias_m = None if lengths is not None else \
        _padding_bias(mask_index, b, s, p, total, mask_filter_value, "Attention mask_index", dummy_ok=True)
    if causal:
        bias_m = _causal(bias_m, s, p, total, input.device)
    ab = _attention_bias(attention_bias, b, num_heads, s, total, "Attention")
    y = _core(q, k, v, bias_m, ab, _scale(scale, dk // num_heads), input.dtype, lengths)
    present = torch.stack((k, v)).to(input.dtype) if _n_outputs > 1 else None
    return _emit((y, present), out, _n_outputs)


# MultiHeadAttention -------------------------------------------------------------------------
def _mha_infer(shapes, values, *, num_heads, **_attrs):
    q = shapes[0]
    k = shapes[1] if len(shapes) > 1 else None
    v = shapes[2] if len(shapes) > 2 else None
    pk = shapes[6] if len(shapes) > 6 else None
    if len(q) != 3 or k is None or v is None or len(k) not in (3, 4) or len(v) != len(k):
        raise NotImplementedError("MultiHeadAttention: only separate 3-D query with 3-D (B, L, D) or 4-D (B, N, L, H) "
                                  "key and value (onnxruntime's CPU kernel has no packed QKV or KV either)")
    if len(k) == 3:
        length, dv = k[1], v[2]
    else:
        length, dv = k[2], v[3] * num_heads
    total = length if pk is None else pk[2] + length
    b, s = q[0], q[1]
    return [(b, s, dv), (b, num_heads, total, q[2] // num_heads), (b, num_heads, total, dv // num_heads),
            (b, num_heads, s, total)]


@op("MultiHeadAttention", 1, domain=MS, infer=_mha_infer,
    notes="onnxruntime's CPU semantics: separate Q/K/V (K/V also BNSH), past/present, key_padding_mask (B), (B, T), "
          "(B, S, T); packed QKV/KV, past_sequence_length and cache_indirection are refused (as on onnxruntime's CPU)")
def _mha(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None, past_key=None,
         past_value=None, past_sequence_length=None, cache_indirection=None, *, num_heads, mask_filter_value=-10000.0,
         scale=0.0, unidirectional=0, _n_outputs=1, out=None):
    if query.dim() != 3 or key is None or value is None or key.dim() == 5:
        raise NotImplementedError("MultiHeadAttention: packed QKV or KV is not supported (onnxruntime's CPU kernel "
                                  "does not implement it either); give query (B, S, D), key and value")
    if past_sequence_length is not None or cache_indirection is not None:
        raise NotImplementedError("MultiHeadAttention: past_sequence_length / cache_indirection (a shared past/present "
                                  "buffer, beam search) are not supported")
    b, s, d = query.shape
    if d % num_heads:
        raise ShapeError(f"MultiHeadAttention: query hidden size {d} does not split into {num_heads} heads")
    h = d // num_heads
    ct = _compute_type(query, fused=False)  # onnxruntime adds the bias to half inputs in float32
    q = query
    if bias is not None:
        if bias.dim() != 1:
            raise ShapeError(f"MultiHeadAttention: bias must be 1-D, got shape {tuple(bias.shape)}")
        q = q.to(ct) + bias[:d].to(ct)
    q = _heads(q, num_heads, "MultiHeadAttention query")
    if key.dim() == 4:  # (B, N, L, H): keys and values already projected and split (cross attention)
        if value.dim() != 4 or key.shape[:3] != (b, num_heads, value.shape[2]) or value.shape[:2] != (b, num_heads) \
                or key.shape[3] != h:
            raise ShapeError(f"MultiHeadAttention: BNSH key {tuple(key.shape)} and value {tuple(value.shape)} must be "
                             f"({b}, {num_heads}, L, {h}) and ({b}, {num_heads}, L, Hv)")
        if past_key is not None or past_value is not None:
            raise ShapeError("MultiHeadAttention: BNSH key and value take no past_key/past_value")
        k, v = key, value  # their bias is taken as zero, as onnxruntime does
    else:
        if key.dim() != 3 or value.dim() != 3 or key.shape[0] != b or value.shape[:2] != key.shape[:2] \
                or key.shape[2] != d or value.shape[2] % num_heads:
            raise ShapeError(f"MultiHeadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} must be "
                             f"({b}, L, {d}) and ({b}, L, N*Hv)")
        if bias is not None:
            if bias.shape[0] != 2 * d + value.shape[2]:
                raise ShapeError(f"MultiHeadAttention: bias length {bias.shape[0]} != {2 * d + value.shape[2]}")
            key, value = key.to(ct) + bias[d:2 * d].to(ct), value.to(ct) + bias[2 * d:].to(ct)
        k, v = _heads(key, num_heads, "MultiHeadAttention key"), _heads(value, num_heads, "MultiHeadAttention value")
    if (past_key is None) != (past_value is None):
        raise ShapeError("MultiHeadAttention: past_key and past_value must be given together")
    p = 0
    if past_key is not None:
        if past_key.dim() != 4 or tuple(past_key.shape[:2]) != (b, num_heads) or past_key.shape[3] != h \
                or past_value.dim() != 4 or tuple(past_value.shape[:3]) != tuple(past_key.shape[:3]) \
                or past_value.shape[3] != v.shape[3]:
            raise ShapeError(f"MultiHeadAttention: past_key {tuple(past_key.shape)} and past_value "
                             f"{tuple(past_value.shape)} must be ({b}, {num_heads}, P, {h}) and ({b}, {num_heads}, P, "
                             f"{v.shape[3]})")
        p = past_key.shape[2]
        k, v = torch.cat((past_key.to(k.dtype), k), 2), torch.cat((past_value.to(v.dtype), v), 2)
    total = k.shape[2]
    if key_padding_mask is not None and key_padding_mask.dim() == 1 and key_padding_mask.shape[0] == 3 * b + 2:
        raise NotImplementedError("MultiHeadAttention: a (3B + 2) key_padding_mask is CUDA-only in onnxruntime")
    if key_padding_mask is not None and (key_padding_mask.dim() == 4 or tuple(key_padding_mask.shape) == (2 * b,)):
        raise ShapeError(f"MultiHeadAttention: key_padding_mask must be ({b},), ({b}, {total}) or ({b}, {s}, {total}), "
                         f"got {tuple(key_padding_mask.shape)}")
    bias_m = _padding_bias(key_padding_mask, b, s, p, total, mask_filter_value, "MultiHeadAttention key_padding_mask",
                           dummy_ok=False)
    if unidirectional and s > 1:
        bias_m = _causal(bias_m, s, p, total, query.device)
    ab = _attention_bias(attention_bias, b, num_heads, s, total, "MultiHeadAttention")
    sc = _scale(scale, h)
    y = _core(q, k, v, bias_m, ab, sc, query.dtype)
    results = [y, None, None, None]
    if _n_outputs > 1:
        # present must not alias key/value (a BNSH key is returned as is otherwise)
        results[1] = k.to(query.dtype) if k.dtype != query.dtype or past_key is not None else k.contiguous().clone()
        results[2] = v.to(query.dtype) if v.dtype != query.dtype or past_key is not None else v.contiguous().clone()
    if _n_outputs > 3:  # the scaled Q*K' plus biases, before the softmax
        qk = torch.matmul(q.to(ct), k.to(ct).transpose(-1, -2)) * sc
        for extra in (ab, bias_m):
            if extra is not None:
                qk = qk + extra.to(ct)
        results[3] = qk.to(query.dtype)
    return _emit(results, out, _n_outputs)


# RotaryEmbedding ----------------------------------------------------------------------------
def _positions(position_ids, b: int, s: int, what: str):
    """(B, S) positions from (B, S) ids or one offset (the positions offset, offset + 1, ...)."""
    if position_ids.numel() == 1:
        start = position_ids.reshape(1, 1).to(torch.int64)
        return (start + torch.arange(s, device=position_ids.device)).expand(b, s)
    if tuple(position_ids.shape) != (b, s):
        raise ShapeError(f"{what}: position_ids must be (batch, sequence) = {(b, s)} or one offset, "
                         f"got {tuple(position_ids.shape)}")
    return position_ids.to(torch.int64)


def _rotate(x, pos, cos_cache, sin_cache, num_heads: int, rotary_dim: int, interleaved: int):
    """``x`` (B, S, N*H) or (B, N, S, H) with its first ``rotary_dim`` of each head rotated by the
    angles of the positions ``pos`` (B, S); computed in float32 for half types, rounded once."""
    ct = torch.float32 if x.dtype in _HALF else x.dtype
    pos = pos.to(cos_cache.device)
    cos, sin = cos_cache[pos].to(ct), sin_cache[pos].to(ct)  # (B, S, rd/2)
    y = _rotary(x.to(ct), cos, sin, None, interleaved=interleaved, num_heads=num_heads,
                rotary_embedding_dim=rotary_dim)
    return y.to(x.dtype)


@op("RotaryEmbedding", 1, domain=MS, infer=same_as_first, writes_out=False,
    notes="input (B, S, D) or (B, N, S, H); position_ids (B, S) or one offset; partial rotary, interleaved")
def _ms_rotary(input, position_ids, cos_cache, sin_cache, *, interleaved=0, num_heads=0, rotary_embedding_dim=0,
               scale=1.0, is_packed_batching=0, out=None):
    # is_packed_batching and scale change nothing in onnxruntime's CPU kernel either
    if input.dim() not in (3, 4):
        raise ShapeError(f"RotaryEmbedding: input must be 3-D or 4-D, got rank {input.dim()}")
    if cos_cache.dim() != 2 or tuple(cos_cache.shape) != tuple(sin_cache.shape):
        raise ShapeError(f"RotaryEmbedding: cos_cache {tuple(cos_cache.shape)} and sin_cache "
                         f"{tuple(sin_cache.shape)} must be one (max_position, rotary_dim / 2) shape")
    if rotary_embedding_dim > 0 and num_heads <= 0:
        raise ShapeError("RotaryEmbedding: num_heads must be given with rotary_embedding_dim")
    if input.dim() == 3:
        b, s, hidden = input.shape
    else:
        b, n4, s, h4 = input.shape
        hidden = n4 * h4
    head = hidden // num_heads if rotary_embedding_dim > 0 else 2 * cos_cache.shape[1]
    rd = rotary_embedding_dim or head
    heads = num_heads or (hidden // head if head else 0)
    if head <= 0 or heads * head != hidden or rd > head or rd % 2 or cos_cache.shape[1] != rd // 2:
        raise ShapeError(f"RotaryEmbedding: hidden size {hidden}, num_heads {num_heads}, rotary_embedding_dim "
                         f"{rotary_embedding_dim} and cos_cache {tuple(cos_cache.shape)} do not fit (the cache "
                         f"holds rotary_dim / 2 = {rd // 2} values a position)")
    if input.dim() == 4 and input.shape[3] != head:
        raise ShapeError(f"RotaryEmbedding: head size {input.shape[3]} != {head} from the cos cache")
    pos = _positions(position_ids, b, s, "RotaryEmbedding")
    return _rotate(input, pos, cos_cache, sin_cache, heads, rd, interleaved)
