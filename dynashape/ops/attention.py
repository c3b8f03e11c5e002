"""Attention family: Attention (23, 24, 25), RotaryEmbedding (23), LinearAttention (27),
FlexAttention (ai.onnx.preview 1), CausalConvWithState (27), Swish (24), SwiGLU (28),
TensorScatter (24).

Precision. The references compute in the input type, op by op: an fp16 multiply or softmax step
rounds its result to fp16. Our kernels compute in float32 (float64 when a float64 type is
involved) and round to the narrow type at the same points the spec's graph does (scaled Q and K,
the QK product, softcap, the biased scores, the softmax steps, Y), so half inputs accumulate in
float32 and still land on the reference's values. For float32 inputs every rounding is a no-op.

Multi-output ops take ``_n_outputs`` (set at load from the node) to know how many outputs the
node asks for; absent optional outputs are not computed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from .registry import op
from .shapes import norm_axis, same_as_first

_HALF = (torch.float16, torch.bfloat16)
_NEG_INF = float("-inf")


# helpers ------------------------------------------------------------------------------------
def _emit(results, out, n: int):
    """The first ``n`` results, written into ``out`` where it has buffers; a tensor for n == 1."""
    res = list(results[:n])
    if isinstance(out, torch.Tensor):
        return out.copy_(res[0])
    if out is None:
        return res[0] if n == 1 else tuple(res)
    return tuple(r if r is None or o is None else o.copy_(r) for o, r in zip(out, res))


def _compute_dtype(*dtypes) -> torch.dtype:
    """float64 when any of ``dtypes`` is, else float32 (half types accumulate in float32)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _round(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded to ``dtype`` and kept in its own (wider) type: what an op computed in
    ``dtype`` would have produced, without leaving the compute type."""
    return t if t.dtype == dtype else t.to(dtype).to(t.dtype)


def _as_scalar(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype``, as a Python float (the references cast scales to T)."""
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


def _split_heads(x: torch.Tensor, heads: int, what: str) -> torch.Tensor:
    """(B, S, H*D) -> (B, H, S, D)."""
    b, s, hd = x.shape
    if heads is None or heads <= 0 or hd % heads:
        raise ShapeError(f"{what}: hidden size {hd} does not split into {heads} heads")
    return x.reshape(b, s, heads, hd // heads).transpose(1, 2)


def _div_heads(dim, heads, what: str):
    if heads is None or heads <= 0:
        raise ShapeError(f"{what}: 3-D inputs need a positive number of heads, got {heads}")
    if isinstance(dim, int) and dim % heads:
        raise ShapeError(f"{what}: hidden size {dim} does not split into {heads} heads")
    return dim // heads


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, Hq, S, D) -> (B, Hkv, Hq/Hkv * S, D): the query heads that share a KV head stacked
    along the sequence, so one matmul against the un-repeated K or V serves GQA."""
    b, hq, s, d = x.shape
    return x.reshape(b, kv_heads, (hq // kv_heads) * s, d)


def _softmax(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax over the last dim as computed in ``dtype`` (x holds values of ``dtype`` in a wider
    compute type). An all -inf row gives zeros here; in ``dtype`` itself torch's kernel serves."""
    if x.dtype == dtype:
        return torch.softmax(x, -1)
    # max, subtract, exp, sum and divide each round to ``dtype``, as the op graph does
    m = x.amax(-1, keepdim=True)
    m = torch.where(torch.isneginf(m), 0.0, m)
    e = _round(torch.exp(_round(x - m, dtype)), dtype)
    s = _round(e.sum(-1, keepdim=True), dtype)
    return _round(e / torch.where(s == 0, 1.0, s), dtype)


# Attention ----------------------------------------------------------------------------------
def _attention_infer(shapes, values, *, q_num_heads=None, kv_num_heads=None, **_attrs):
    q, k, v = shapes[:3]
    pk = shapes[4] if len(shapes) > 4 else None
    if not len(q) == len(k) == len(v) or len(q) not in (3, 4):
        raise ShapeError(f"Attention: Q, K, V must all be 3-D or all 4-D, got ranks {len(q)}, {len(k)}, {len(v)}")
    if len(q) == 3:
        b, sq, skv = q[0], q[1], k[1]
        hq, hkv = q_num_heads, kv_num_heads
        _div_heads(q[2], hq, "Attention Q")
        dk, dv = _div_heads(k[2], hkv, "Attention K"), _div_heads(v[2], hkv, "Attention V")
        y = (b, sq, hq * dv)
    else:
        b, hq, sq = q[0], q[1], q[2]
        hkv, skv, dk, dv = k[1], k[2], k[3], v[3]
        y = (b, hq, sq, dv)
    total = skv if pk is None else pk[2] + skv
    return [y, (b, hkv, total, dk), (b, hkv, total, dv), (b, hq, sq, total)]


def _attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
               is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
               softcap=0.0, softmax_precision=None, left_window_size=-1, right_window_size=-1,
               n_outputs=1):
    t1, t2 = Q.dtype, V.dtype
    three_d = Q.dim() == 3
    if not Q.dim() == K.dim() == V.dim() or Q.dim() not in (3, 4):
        raise ShapeError(f"Attention: Q, K, V must all be 3-D or all 4-D, got {Q.dim()}, {K.dim()}, {V.dim()}")
    if three_d:
        Q = _split_heads(Q, q_num_heads, "Attention Q")
        K = _split_heads(K, kv_num_heads, "Attention K")
        V = _split_heads(V, kv_num_heads, "Attention V")
    else:
        for name, want, got in (("q_num_heads", q_num_heads, Q.shape[1]), ("kv_num_heads", kv_num_heads, K.shape[1])):
            if want is not None and want != got:
                raise ShapeError(f"Attention: {name}={want} does not match the 4-D input's {got} heads")
    if (past_key is None) != (past_value is None):
        raise ShapeError("Attention: past_key and past_value must be given together")
    if past_key is not None and nonpad_kv_seqlen is not None:
        raise ShapeError("Attention: nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if past_key is not None:
        K = torch.cat((past_key, K), 2)
        V = torch.cat((past_value, V), 2)
    b, hq, sq, dk = Q.shape
    hkv, total = K.shape[1], K.shape[2]
    if V.shape[1] != hkv or hq % hkv:
        raise ShapeError(f"Attention: {hq} query heads cannot share {hkv} key and {V.shape[1]} value heads")

    # Types: sd is the type of the biased scores (the float mask's type promotes with T1), sp the
    # softmax's, ct the one everything is computed in.
    float_mask = attn_mask is not None and attn_mask.dtype.is_floating_point
    sd = torch.promote_types(t1, attn_mask.dtype) if float_mask else t1
    sp = torch_dtype(softmax_precision) if softmax_precision is not None else sd
    ct = _compute_dtype(t1, t2, sd, sp)

    # QK^T with Q and K each scaled by sqrt(scale), the scale rounded to T1 as the graph casts it
    s = _as_scalar(math.sqrt(scale if scale is not None else 1.0 / math.sqrt(dk)), t1)
    q = _round(Q.to(ct) * s, t1)
    k = _round(K.to(ct) * s, t1)
    qk = _round(torch.matmul(_grouped(q, hkv), k.transpose(-1, -2)), t1).reshape(b, hq, sq, total)
    raw_qk = qk
    if softcap > 0:
        qk = _round(_round(torch.tanh(_round(qk / softcap, t1)), t1) * softcap, t1)

    bias = _attention_bias(attn_mask, nonpad_kv_seqlen, past_key, is_causal, left_window_size,
                           right_window_size, sq, total, sd, ct, Q.device)
    scores = qk if bias is None else _round(qk + bias, sd)
    probs = _softmax(_round(scores, sp), sp)
    if bias is not None:
        # a query row with every key masked attends nothing: zeros, not softmax's NaN
        masked_row = torch.isneginf(bias.amax(-1, keepdim=True))
        probs = torch.where(masked_row, 0.0, probs)
    probs = _round(probs, t1)

    y = torch.matmul(_grouped(probs, hkv), V.to(ct)).reshape(b, hq, sq, -1)
    y = (y.transpose(1, 2).reshape(b, sq, -1) if three_d else y).to(t1)
    if past_key is None and n_outputs > 1:
        # present_key/value must not alias the inputs K, V (nor be views of them)
        K, V = K.clone(memory_format=torch.contiguous_format), V.clone(memory_format=torch.contiguous_format)
    results = [y, K, V, None]
    if n_outputs > 3:
        mode = qk_matmul_output_mode
        if mode not in (0, 1, 2, 3):
            raise ShapeError(f"Attention: qk_matmul_output_mode must be 0..3, got {mode}")
        extra = (raw_qk, qk, scores, probs)[mode]
        results[3] = extra.to(t1)
    return results


def _attention_bias(attn_mask, nonpad, past_key, is_causal, left, right, sq, total, sd, ct, device):
    """The additive bias (in ct, holding values of sd), broadcastable to (B, Hq, Sq, total), or
    None when nothing masks. Structural masks (causal, window, padding) combine as -inf where
    a key is disallowed."""
    bias = None
    if attn_mask is not None:
        m = attn_mask
        pad = total - m.shape[-1]
        if pad < 0:
            raise ShapeError(f"Attention: attn_mask's last dim {m.shape[-1]} exceeds the {total} keys")
        if m.dtype == torch.bool:
            m = F.pad(m, (0, pad), value=False) if pad else m
            bias = torch.where(m, 0.0, _NEG_INF).to(ct)
        else:
            # an integer mask is read as additive values of the scores' type
            m = m.to(ct) if m.dtype.is_floating_point else _round(m.to(ct), sd)
            bias = F.pad(m, (0, pad), value=_NEG_INF) if pad else m
    if not is_causal and left < 0 and right < 0 and nonpad is None:
        return bias
    i = torch.arange(sq, device=device).reshape(sq, 1)
    j = torch.arange(total, device=device)
    # queries sit after the keys that precede them: offset = past length, or per batch
    # nonpad_kv_seqlen - Sq for an external cache
    if past_key is not None:
        pos = i + past_key.shape[2]
    elif nonpad is not None:
        nonpad = nonpad.to(device).reshape(-1, 1, 1, 1)
        pos = (nonpad - sq) + i  # (B, 1, Sq, 1)
    else:
        pos = i
    allowed = torch.ones((), dtype=torch.bool, device=device)
    if is_causal:
        allowed = allowed & (j <= pos)
    if left >= 0:
        allowed = allowed & (pos - j <= left)
    if right >= 0:
        allowed = allowed & (j - pos <= right)
    if nonpad is not None:
        allowed = allowed & (j < nonpad)
    if bias is None:
        return torch.where(allowed, 0.0, _NEG_INF).to(ct)
    return torch.where(allowed, bias, _NEG_INF)


def _attention_kernel(version: int):
    if version == 23:
        def kernel(Q, K, V, attn_mask=None, past_key=None, past_value=None, *, is_causal=0, kv_num_heads=None,
                   q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None,
                   _n_outputs=1, out=None):
            return _emit(_attention(Q, K, V, attn_mask, past_key, past_value, None, is_causal=is_causal,
                                    kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                                    qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                                    softmax_precision=softmax_precision, n_outputs=_n_outputs),
                         out, _n_outputs)
    elif version == 24:
        def kernel(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
                   kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                   softmax_precision=None, _n_outputs=1, out=None):
            return _emit(_attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                                    kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                                    qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                                    softmax_precision=softmax_precision, n_outputs=_n_outputs),
                         out, _n_outputs)
    else:
        def kernel(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
                   kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
                   softmax_precision=None, left_window_size=-1, right_window_size=-1, _n_outputs=1, out=None):
            for name, w in (("left_window_size", left_window_size), ("right_window_size", right_window_size)):
                if w < -1:
                    raise ShapeError(f"Attention: {name} must be -1 or nonnegative, got {w}")
            return _emit(_attention(Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal=is_causal,
                                    kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                                    qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                                    softmax_precision=softmax_precision, left_window_size=left_window_size,
                                    right_window_size=right_window_size, n_outputs=_n_outputs),
                         out, _n_outputs)
    return kernel


for _v in (23, 24, 25):
    op("Attention", _v, infer=_attention_infer)(_attention_kernel(_v))


# RotaryEmbedding ----------------------------------------------------------------------------
@op("RotaryEmbedding", 23, infer=same_as_first, writes_out=False)
def _rotary(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0, rotary_embedding_dim=0,
            out=None):
    if x.dim() == 4:
        xs = x.transpose(1, 2)  # (B, S, H, D)
    elif x.dim() == 3:
        if num_heads <= 0 or x.shape[2] % num_heads:
            raise ShapeError(f"RotaryEmbedding: hidden size {x.shape[2]} does not split into {num_heads} heads")
        xs = x.reshape(x.shape[0], x.shape[1], num_heads, -1)
    else:
        raise ShapeError(f"RotaryEmbedding: input must be 3-D or 4-D, got rank {x.dim()}")
    d = xs.shape[-1]
    rd = rotary_embedding_dim or d
    if rd > d or rd % 2:
        raise ShapeError(f"RotaryEmbedding: rotary_embedding_dim {rd} must be even and at most head size {d}")
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    if cos_cache.shape[-1] != rd // 2 or sin_cache.shape[-1] != rd // 2:
        raise ShapeError(f"RotaryEmbedding: cos/sin caches' last dims {cos_cache.shape[-1]}, {sin_cache.shape[-1]} "
                         f"must be rotary_embedding_dim / 2 = {rd // 2}")
    cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)  # (B, S, 1, rd/2)
    rot = xs[..., :rd]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else rot.chunk(2, -1)
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    rotated = torch.stack((real, imag), -1).flatten(-2) if interleaved else torch.cat((real, imag), -1)
    y = torch.cat((rotated, xs[..., rd:]), -1)
    return y.transpose(1, 2) if x.dim() == 4 else y.reshape(x.shape)


# LinearAttention ----------------------------------------------------------------------------
def _linear_attention_infer(shapes, values, *, q_num_heads=None, kv_num_heads=None, **_attrs):
    q, k, v = shapes[:3]
    if not len(q) == len(k) == len(v) == 3:
        raise ShapeError("LinearAttention: query, key and value must be 3-D (B, T, H*D)")
    dk = _div_heads(q[2], q_num_heads, "LinearAttention query")
    dv = _div_heads(v[2], kv_num_heads, "LinearAttention value")
    return [(q[0], q[1], q_num_heads * dv), (q[0], kv_num_heads, dk, dv)]


@op("LinearAttention", 27, infer=_linear_attention_infer)
def _linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64, kv_num_heads=None,
                      q_num_heads=None, scale=0.0, update_rule="gated_delta", _n_outputs=2, out=None):
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ShapeError(f"LinearAttention: unknown update_rule {update_rule!r}")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise ShapeError(f"LinearAttention: q_num_heads {q_num_heads} must be a positive multiple of "
                         f"kv_num_heads {kv_num_heads}")
    gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise ShapeError(f"LinearAttention: update_rule {update_rule!r} takes "
                         f"{'a' if gated else 'no'} decay and {'a' if delta else 'no'} beta input")
    ct = torch.float32  # the recurrence runs in float32 whatever the input type
    b, t, _ = query.shape
    q = _split_heads(query.to(ct), q_num_heads, "LinearAttention query")  # (B, Hq, T, dk)
    k = _split_heads(key.to(ct), kv_num_heads, "LinearAttention key")  # (B, Hkv, T, dk)
    v = _split_heads(value.to(ct), kv_num_heads, "LinearAttention value")  # (B, Hkv, T, dv)
    dk, dv, group = q.shape[-1], v.shape[-1], q_num_heads // kv_num_heads
    if k.shape[-1] != dk:
        raise ShapeError(f"LinearAttention: key head size {k.shape[-1]} != query head size {dk}")
    if decay is not None:
        if decay.shape[-1] not in (kv_num_heads, kv_num_heads * dk):
            raise ShapeError(f"LinearAttention: decay's last dim {decay.shape[-1]} must be kv_num_heads or "
                             f"kv_num_heads * d_k")
        # per head (B, Hkv, T, 1) or per key dim (B, Hkv, T, dk); exp'd once, as the update uses it
        g = torch.exp(decay.to(ct).reshape(b, t, kv_num_heads, -1).transpose(1, 2))
    if beta is not None:
        if beta.shape[-1] not in (kv_num_heads, 1):
            raise ShapeError(f"LinearAttention: beta's last dim {beta.shape[-1]} must be kv_num_heads or 1")
        bt = beta.to(ct).reshape(b, t, -1, 1).transpose(1, 2)  # (B, Hkv or 1, T, 1)
    if past_state is not None:
        if tuple(past_state.shape) != (b, kv_num_heads, dk, dv):
            raise ShapeError(f"LinearAttention: past_state shape {tuple(past_state.shape)} != "
                             f"{(b, kv_num_heads, dk, dv)}")
        state = past_state.to(ct)
    else:
        state = torch.zeros((b, kv_num_heads, dk, dv), dtype=ct, device=query.device)
    s = scale if scale else 1.0 / math.sqrt(dk)
    # read through grouped queries: (B, Hkv, group, T, dk), each group's heads read their KV state
    qg = q.reshape(b, kv_num_heads, group, t, dk)
    outs = []
    for i in range(t):  # the recurrence, token by token, as the spec defines it
        if gated:
            state = state * g[:, :, i, :].unsqueeze(-1)
        vt = v[:, :, i, :]
        kt = k[:, :, i, :]
        if delta:
            retrieved = torch.einsum("bhdm,bhd->bhm", state, kt)
            vt = bt[:, :, i, :] * (vt - retrieved)
        state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        outs.append(torch.einsum("bhgd,bhdm->bhgm", qg[:, :, :, i, :], state) * s)
    o = torch.stack(outs, 3) if outs else torch.zeros((b, kv_num_heads, group, 0, dv), dtype=ct, device=q.device)
    y = o.reshape(b, q_num_heads, t, dv).transpose(1, 2).reshape(b, t, q_num_heads * dv).to(query.dtype)
    present = state.to(past_state.dtype if past_state is not None else query.dtype)
    return _emit((y, present), out, _n_outputs)


# FlexAttention ------------------------------------------------------------------------------
def _flex_infer(shapes, values, **_attrs):
    q, k, v = shapes[:3]
    if not len(q) == len(k) == len(v) == 4:
        raise ShapeError("FlexAttention: Q, K and V must be 4-D")
    return [(q[0], q[1], q[2], v[3])]


@op("FlexAttention", 1, domain="ai.onnx.preview", infer=_flex_infer, writes_out=False)
def _flex_attention(Q, K, V, *, prob_mod=None, score_mod=None, scale=None, softmax_precision=None, out=None):
    b, hq, sq, e = Q.shape
    hkv, skv = K.shape[1], K.shape[2]
    if V.shape[1] != hkv or V.shape[2] != skv or K.shape[3] != e or hq % hkv:
        raise ShapeError(f"FlexAttention: incompatible Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}")
    if softmax_precision is not None:
        sp = torch_dtype(softmax_precision)
    else:  # float32 for the narrow types, double stays double
        sp = torch.float64 if Q.dtype == torch.float64 else torch.float32
    t1 = Q.dtype
    ct = _compute_dtype(t1, sp)
    # Q and K each scaled by sqrt(scale); the factor is computed in float32, then cast to T1
    s = _as_scalar(math.sqrt(_as_scalar(scale if scale is not None else 1.0 / math.sqrt(e), torch.float32)), t1)
    q = _round(Q.to(ct) * s, t1)
    k = _round(K.to(ct) * s, t1)
    scores = _round(_round(torch.matmul(_grouped(q, hkv), k.transpose(-1, -2)), t1), sp).reshape(b, hq, sq, skv)
    if score_mod is not None:
        scores = _round(_mod_output(score_mod, scores.to(sp), "score_mod").to(ct), sp)
    m = scores.amax(-1, keepdim=True)
    ex = _round(torch.exp(_round(scores - m, sp)), sp)
    probs = _round(ex / _round(ex.sum(-1, keepdim=True), sp), sp)
    if prob_mod is not None:
        probs = _round(_mod_output(prob_mod, probs.to(sp), "prob_mod").to(ct), sp)
    y = torch.matmul(_grouped(probs, hkv), _round(V.to(ct), sp)).reshape(b, hq, sq, -1)
    return y.to(V.dtype)


def _mod_output(graph, x: torch.Tensor, what: str) -> torch.Tensor:
    outs = graph(x)
    if len(outs) != 1 or tuple(outs[0].shape) != tuple(x.shape):
        raise ShapeError(f"FlexAttention: {what} must return one tensor of shape {tuple(x.shape)}")
    return outs[0]


# CausalConvWithState ------------------------------------------------------------------------
def _causal_conv_infer(shapes, values, **_attrs):
    x, w = shapes[0], shapes[1]
    if len(x) != 3 or len(w) != 3:
        raise ShapeError("CausalConvWithState: input and weight must be 3-D")
    return [tuple(x), (x[0], x[1], w[2] - 1)]


@op("CausalConvWithState", 27, infer=_causal_conv_infer)
def _causal_conv(x, weight, bias=None, past_state=None, *, activation="none", _n_outputs=2, out=None):
    if activation not in ("none", "silu", "swish"):
        raise ShapeError(f"CausalConvWithState: unknown activation {activation!r}")
    b, c, _ = x.shape
    k = weight.shape[2]
    if tuple(weight.shape) != (c, 1, k):
        raise ShapeError(f"CausalConvWithState: weight shape {tuple(weight.shape)} must be ({c}, 1, k)")
    if past_state is None:
        past_state = torch.zeros((b, c, k - 1), dtype=x.dtype, device=x.device)
    elif tuple(past_state.shape) != (b, c, k - 1):
        raise ShapeError(f"CausalConvWithState: past_state shape {tuple(past_state.shape)} != {(b, c, k - 1)}")
    padded = torch.cat((past_state, x), 2)
    ct = _compute_dtype(x.dtype)
    y = F.conv1d(padded.to(ct), weight.to(ct), None if bias is None else bias.to(ct), groups=c)
    y = _round(y, x.dtype)
    if activation != "none":
        y = y * torch.sigmoid(y)
    present = padded[:, :, padded.shape[2] - (k - 1):]
    return _emit((y.to(x.dtype), present), out, _n_outputs)


# Swish, SwiGLU ------------------------------------------------------------------------------
def _swish(x: torch.Tensor, alpha: float) -> torch.Tensor:
    if x.dtype in _HALF:  # one rounding at the end; the gate computed in float32
        xf = x.float()
        return (xf * _round(torch.sigmoid(xf * alpha), x.dtype)).to(x.dtype)
    return x * torch.sigmoid(x * alpha)


@op("Swish", 24, infer=same_as_first, writes_out=False)
def _swish_op(x, *, alpha=1.0, out=None):
    return _swish(x, alpha)


def _swiglu_infer(shapes, values, **_attrs):
    if tuple(shapes[0]) != tuple(shapes[1]) and all(isinstance(d, int) for d in (*shapes[0], *shapes[1])):
        raise ShapeError(f"SwiGLU: A and B must have the same shape, got {shapes[0]} and {shapes[1]}")
    return [shapes[0]]


@op("SwiGLU", 28, infer=_swiglu_infer, writes_out=False)
def _swiglu(a, b, *, alpha=1.0, out=None):
    if a.shape != b.shape:
        raise ShapeError(f"SwiGLU: A and B must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    return _swish(a, alpha) * b


# TensorScatter ------------------------------------------------------------------------------
@op("TensorScatter", 24, infer=same_as_first)
def _tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear", out=None):
    rank = past_cache.dim()
    ax = norm_axis(axis, rank)
    if ax == 0:
        raise ShapeError("TensorScatter: axis cannot be the batch dimension")
    if mode not in ("linear", "circular"):
        raise ShapeError(f"TensorScatter: unknown mode {mode!r}")
    if update.dim() != rank or any(update.shape[i] != past_cache.shape[i] for i in range(rank) if i != ax) \
            or update.shape[ax] > past_cache.shape[ax]:
        raise ShapeError(f"TensorScatter: update shape {tuple(update.shape)} does not fit cache "
                         f"{tuple(past_cache.shape)} along axis {ax}")
    r = past_cache.clone() if out is None else out.copy_(past_cache)
    seq, max_len = update.shape[ax], past_cache.shape[ax]
    if seq == 0:
        return r
    pos = torch.arange(seq, device=past_cache.device)
    if write_indices is not None:
        pos = write_indices.to(past_cache.device).reshape(-1, 1) + pos  # (B, seq)
    else:
        pos = pos.unsqueeze(0)
    if mode == "circular":
        pos = pos % max_len
    elif bool(((pos < 0) | (pos >= max_len)).any()):  # a host check: scatter would not bound-check on a GPU
        raise ShapeError(f"TensorScatter: linear writes of {seq} positions leave the cache of {max_len}")
    # one index per update element: the batch's position along ``axis``, broadcast elsewhere
    idx = pos.reshape(pos.shape[0], *([1] * (ax - 1)), seq, *([1] * (rank - ax - 1))).expand(update.shape)
    return r.scatter_(ax, idx, update)
