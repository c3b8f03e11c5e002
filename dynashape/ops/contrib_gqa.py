"""onnxruntime's GroupQueryAttention contrib op (domain ``com.microsoft``), with its CPU kernel's
semantics: the checks, the rotary, the present buffers and the masked attention in torch ops.
Where the inputs allow it, the float32 CPU path of cpu_gqa.py runs instead and gives onnxruntime's
bits; this torch path serves everything else (other devices and types, biases, softcap, sinks).

Masks. Keys outside the causal range or the local window get probability 0 (-inf), not
Attention's additive mask_filter_value.
"""

from __future__ import annotations

import functools

import torch

from ..errors import ShapeError
from ..shape import Dimension
from .attention import _emit, _grouped
from .contrib_attention import MS, _attend, _compute_type, _heads, _merge_heads, _positions, _rotate, _scale, _softmax
from .cpu_gqa import DecodeStep, _gqa_present, _ort_gqa
from .registry import binder, op


def _scalar(v):
    """The one element of a shape-dependency value (a tensor, or a symbolic value at compile time)."""
    return v.reshape(()).item()


def _gqa_infer(shapes, values, *, num_heads, kv_num_heads, **_attrs):
    q = shapes[0]
    key = shapes[1] if len(shapes) > 1 else None
    past = shapes[3] if len(shapes) > 3 else None
    if len(q) != 3:
        raise ShapeError(f"GroupQueryAttention: query must be 3-D, got shape {tuple(q)}")
    head = q[2] // num_heads if key is not None else q[2] // (num_heads + 2 * kv_num_heads)
    b, s = q[0], q[1]
    total = values[6] if len(values) > 6 else None
    past_len = past[2] if past is not None else 0
    if total is None:
        present_len = total_len = Dimension.dynamic()
    else:
        total_len = _scalar(total)
        # present holds max(past buffer, total): a past buffer larger than the total is kept whole
        both_ints = isinstance(past_len, int) and isinstance(total_len, int)
        present_len = max(total_len, past_len) if both_ints else Dimension.dynamic()
    present = (b, kv_num_heads, present_len, head)
    return [(b, s, num_heads * head), present, present, (b, num_heads, s, total_len)]


@op("GroupQueryAttention", 1, domain=MS, infer=_gqa_infer, shape_deps=(6,),
    notes="onnxruntime's CPU semantics: prompt, decode and batch-1 continued prompt, packed QKV, rotary, "
          "local window, softcap, smooth softmax / head_sink, attention_bias, position_ids, qk_output; quantized "
          "KV caches, q/k norms and query_seqlens are refused; float32 on an AVX-512F CPU gives onnxruntime's bits "
          "(non-interleaved rotary, no bias, softcap or sink)")
def _gqa(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None, total_sequence_length=None,
         cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
         v_scale=None, q_norm_weight=None, k_norm_weight=None, query_seqlens=None, *, num_heads, kv_num_heads,
         scale=0.0, softcap=0.0, local_window_size=-1, do_rotary=0, rotary_interleaved=0, smooth_softmax=-1,
         qk_output=0, causal=1, k_quant_type="NONE", v_quant_type="NONE", kv_cache_bit_width=0, _n_outputs=3,
         out=None):
    what = "GroupQueryAttention"
    if k_quant_type != "NONE" or v_quant_type != "NONE" or kv_cache_bit_width or k_scale is not None \
            or v_scale is not None:
        raise NotImplementedError(f"{what}: quantized KV caches are not supported")
    if q_norm_weight is not None or k_norm_weight is not None or query_seqlens is not None:
        raise NotImplementedError(f"{what}: q_norm_weight, k_norm_weight and query_seqlens are not supported")
    if not causal and local_window_size != -1:
        raise ShapeError(f"{what}: local_window_size must be -1 when causal is 0 (as onnxruntime)")
    if num_heads <= 0 or kv_num_heads <= 0 or num_heads % kv_num_heads:
        raise ShapeError(f"{what}: num_heads {num_heads} must be a positive multiple of kv_num_heads {kv_num_heads}")
    if query.dim() != 3:
        raise ShapeError(f"{what}: query must be 3-D, got shape {tuple(query.shape)}")
    b, s, d = query.shape
    if key is None:
        if value is not None:
            raise ShapeError(f"{what}: key and value must both be given, or both absent (packed QKV)")
        if d % (num_heads + 2 * kv_num_heads):
            raise ShapeError(f"{what}: packed QKV hidden size {d} does not split into {num_heads} + 2 * "
                             f"{kv_num_heads} heads")
        h = d // (num_heads + 2 * kv_num_heads)
        q, k, v = query.split((num_heads * h, kv_num_heads * h, kv_num_heads * h), -1)
    else:
        if value is None or key.dim() != 3 or tuple(key.shape) != tuple(value.shape) or key.shape[:2] != (b, s) \
                or d % num_heads or key.shape[2] != kv_num_heads * (d // num_heads):
            raise ShapeError(f"{what}: key {tuple(key.shape)} and value "
                             f"{None if value is None else tuple(value.shape)} must be ({b}, {s}, "
                             f"{kv_num_heads} * head size {d // max(num_heads, 1)})")
        h = d // num_heads
        q, k, v = query, key, value
    if (past_key is None) != (past_value is None):
        raise ShapeError(f"{what}: past_key and past_value must both be given or both absent")
    past_len = 0
    if past_key is not None:
        if past_key.dim() != 4 or tuple(past_key.shape) != tuple(past_value.shape) or past_key.shape[0] != b \
                or past_key.shape[1] != kv_num_heads or past_key.shape[3] != h:
            raise ShapeError(f"{what}: past_key {tuple(past_key.shape)} and past_value {tuple(past_value.shape)} "
                             f"must both be ({b}, {kv_num_heads}, P, {h})")
        past_len = past_key.shape[2]
    if seqlens_k is None or total_sequence_length is None or total_sequence_length.numel() != 1:
        raise ShapeError(f"{what}: seqlens_k and a one-element total_sequence_length are required")
    if seqlens_k.numel() != b:
        raise ShapeError(f"{what}: seqlens_k must be ({b},), got {tuple(seqlens_k.shape)}")
    total = int(total_sequence_length.reshape(()).item())
    first_prompt = s == total
    if not first_prompt and s > 1 and b != 1:
        raise ShapeError(f"{what}: a continued prompt ({s} new tokens after a past) needs batch size 1, got {b}")
    if past_key is not None and total != past_len + s and total > past_len:
        raise ShapeError(f"{what}: total_sequence_length {total} must be the past's {past_len} + {s} new tokens, or at "
                         f"most the past buffer's length")
    present_len = max(total, past_len)
    dev = query.device
    # checked where it costs no device sync (on a GPU an index out of range fails in the scatter)
    if seqlens_k.device.type == "cpu" and b and not bool(((seqlens_k >= 0) & (seqlens_k < present_len)).all()):
        raise ShapeError(f"{what}: seqlens_k {seqlens_k.tolist()} must lie in [0, {present_len})")
    seqlens = seqlens_k.to(dev).reshape(b).to(torch.int64) + 1  # each row's total length
    # where each row's new tokens go: 0 on the first prompt (padding after them), else after its past
    start = torch.zeros_like(seqlens) if first_prompt else seqlens - s

    want_qk = _n_outputs > 3 and qk_output in (1, 2)
    if attention_bias is None and softcap <= 0 and head_sink is None and smooth_softmax != 1 and not want_qk \
            and position_ids is None and local_window_size != 0 and causal:
        got = _ort_gqa(q, k, v, past_key, past_value, seqlens, start, present_len, cos_cache, sin_cache,
                       num_heads, kv_num_heads, h, _scale(scale, h), local_window_size,
                       do_rotary, rotary_interleaved, first_prompt)
        if got is not None:
            results = [*got, None]
            if _n_outputs > 3:  # onnxruntime leaves the buffer unwritten
                results[3] = query.new_zeros((b, num_heads, s, total))
            return _emit(results, out, _n_outputs)

    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise ShapeError(f"{what}: do_rotary needs cos_cache and sin_cache")
        rd = 2 * cos_cache.shape[1]
        if rd > h or tuple(sin_cache.shape) != tuple(cos_cache.shape):
            raise ShapeError(f"{what}: cos/sin caches {tuple(cos_cache.shape)} must hold at most head size / 2 = "
                             f"{h // 2} values a position")
        if position_ids is not None and not first_prompt:
            pos = position_ids.reshape(b, s)
        elif position_ids is not None:  # onnxruntime reads a prompt's positions as one offset
            pos = _positions(position_ids.reshape(-1)[:1], b, s, what)
        else:
            pos = start.reshape(b, 1) + torch.arange(s, device=dev)
        q = _rotate(q, pos, cos_cache, sin_cache, num_heads, rd, rotary_interleaved)
        k = _rotate(k, pos, cos_cache, sin_cache, kv_num_heads, rd, rotary_interleaved)
    qh, kh, vh = _heads(q, num_heads, what), _heads(k, kv_num_heads, what), _heads(v, kv_num_heads, what)
    present_k = _gqa_present(past_key, kh, start, present_len)
    present_v = _gqa_present(past_value, vh, start, present_len)

    # keys a query sees: up to its own position (capped at its row's length), within the window;
    # its whole row without causality
    ends = seqlens.reshape(b, 1, 1)
    if causal:
        ends = torch.minimum(start.reshape(b, 1, 1) + torch.arange(s, device=dev).reshape(1, s, 1) + 1, ends)
    j = torch.arange(total, device=dev)
    allowed = j < ends
    if local_window_size >= 0:
        allowed = allowed & (j >= ends - local_window_size)
    allowed = allowed.unsqueeze(1)  # (B, 1, S, T)
    fused = softcap <= 0 and head_sink is None and smooth_softmax != 1 and not want_qk
    ct = _compute_type(query, fused)
    neg = torch.tensor(float("-inf"), dtype=ct, device=dev)
    if attention_bias is not None:
        ab = attention_bias
        if ab.dim() != 4 or ab.shape[0] not in (1, b) or ab.shape[1] not in (1, num_heads) or ab.shape[2] != s \
                or ab.shape[3] < total:
            raise ShapeError(f"{what}: attention_bias must be (batch or 1, num_heads or 1, {s}, {total}), "
                             f"got {tuple(ab.shape)}")
        bias = torch.where(allowed, ab[..., :total].to(ct), neg)
    else:
        bias = torch.where(allowed, torch.zeros((), dtype=ct, device=dev), neg)
    sink = None
    if head_sink is not None:
        sink = head_sink.to(dev, torch.float32).reshape(num_heads)
    elif smooth_softmax == 1:
        sink = torch.zeros(num_heads, dtype=torch.float32, device=dev)
    sc = _scale(scale, h)
    kt, vt = present_k[:, :, :total].to(ct), present_v[:, :, :total].to(ct)
    if local_window_size == 0:  # a window of no key: nothing attended, zeros (as onnxruntime)
        y = qh.new_zeros(qh.shape)
    else:
        y = _attend(qh.to(ct), kt, vt, bias, sc, softcap=softcap, sink=sink)
    results = [_merge_heads(y).to(query.dtype), present_k, present_v, None]
    if _n_outputs > 3 and not want_qk:  # onnxruntime leaves the buffer unwritten
        results[3] = query.new_zeros((b, num_heads, s, total))
    if want_qk:
        scores = torch.matmul(_grouped(qh.to(ct), kv_num_heads), kt.transpose(-1, -2)).reshape(b, num_heads, s, total)
        scores = scores * sc
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores + bias
        if qk_output == 2:
            scores = _softmax(scores, sink)
        results[3] = torch.where(allowed, scores, 0).to(query.dtype)
    return _emit(results, out, _n_outputs)


@binder("GroupQueryAttention", MS)
def _bind_gqa(consts, attrs):
    """A decode step (one new token over pasts that every row fills whole), float32 on the CPU: the
    checks such a step needs, then onnxruntime's kernel (cpu_gqa._ort_gqa) with what the op would
    hand it. The op's general checks took ~40% of its host time a call in the builder's int4 Llama
    (two a step); every other call, and any input the fast checks do not expect, goes to the op."""
    plain = functools.partial(_gqa, **attrs)
    c = list(consts) + [None] * (17 - len(consts))
    n, nk = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
    window, rotary = attrs.get("local_window_size", -1), attrs.get("do_rotary", 0)
    if any(x is not None for x in c[9:]) or n <= 0 or nk <= 0 or n % nk or attrs.get("_n_outputs", 3) > 3 \
            or attrs.get("softcap", 0.0) > 0 or attrs.get("smooth_softmax", -1) == 1 or attrs.get("qk_output", 0) \
            or not attrs.get("causal", 1) or attrs.get("rotary_interleaved", 0) or window == 0 \
            or attrs.get("k_quant_type", "NONE") != "NONE" or attrs.get("v_quant_type", "NONE") != "NONE" \
            or attrs.get("kv_cache_bit_width", 0):
        return None
    cos, sin = c[7], c[8]
    if rotary and not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)):
        return None
    scale, n_out = attrs.get("scale", 0.0), attrs.get("_n_outputs", 3)
    step = DecodeStep(n, nk, cos, sin, functools.partial(_scale, scale), window, rotary)

    def kernel(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
               total_sequence_length=None, *rest, out=None):
        args = (query, key, value, past_key, past_value, seqlens_k, total_sequence_length, *rest)
        if past_key is None or past_value is None or type(query) is not torch.Tensor or query.dim() != 3 \
                or query.shape[1] != 1 or type(seqlens_k) is not torch.Tensor or seqlens_k.device.type != "cpu" \
                or past_key.dim() != 4 or total_sequence_length is None:
            return plain(*args, out=out)
        b, _, d = query.shape
        p = past_key.shape[2]
        h = d // (n + 2 * nk) if key is None else d // n
        if key is not None and (key.shape != (b, 1, nk * h) or value is None or value.shape != key.shape):
            return plain(*args, out=out)
        # every row's past is whole (seqlens_k = p, the total p + 1): read as Python ints, not
        # compared on tensors (each a few microseconds a call)
        if past_key.shape != (b, nk, p, h) or past_value.shape != past_key.shape or p < 1 \
                or seqlens_k.numel() != b or total_sequence_length.numel() != 1 \
                or int(total_sequence_length) != p + 1 or any(x != p for x in seqlens_k.tolist()):
            return plain(*args, out=out)
        got = step(query, key, value, past_key, past_value, p, out if isinstance(out, (tuple, list)) else None)
        if got is None:
            return plain(*args, out=out)
        if isinstance(out, (tuple, list)) and n_out == 3 and all(o is r for o, r in zip(out, got)):
            return tuple(out)  # written in place
        return _emit([*got, None], out, n_out)

    return kernel
