"""Attention of small float32 heads on the CPU in one C call (csrc/attention.c says why).

``attention(q, k, v, bias, scale)`` answers None where it does not serve (not the CPU or not
float32, a mask that is not additive float32, work outside [MIN_WORK, MAX_WORK] or a head larger
than MAX_HEAD, a row whose scores are all masked, where torch's kernel decides what it gives)
and the caller's torch path runs; where it would serve but cannot be built, the fallback is
counted (``attention_torch_fallbacks``).
"""

from __future__ import annotations

import array
import ctypes

import torch

from . import native

# multiply-adds (2 * B * N * S * T * D) up to which the C kernel is used (measured against torch's
# scaled_dot_product_attention up to 2.7e8 with 2 threads on the 2-core AMD EPYC: a tiny BERT's
# 8x4x32x16 86 -> 53 us, BERT-base's 8x12x128x64 4.0 -> 2.9 ms; benchmarks/cpu_attention.py);
# beyond what was measured, torch's
MAX_WORK = 1 << 30
# K's head (D x T floats, transposed once) that every four query rows read: beyond ~96 KB torch's
# blocked kernel won or tied (1 x 8 x 512 x 64: 4.8 against 3.7 ms in one run, 3.4 against 4.5 in
# another; 384 tokens 2.6 against 3.3)
MAX_HEAD = 3 << 13
# The multiply-adds from which it is used. Measured first (4 x 4 x 16 x 16, 0.13M: torch 16
# against 22 us) it was 2^18; measured again after the four-row blocking, through the fused
# Attention op (2 threads, this 2-core AMD EPYC), the kernel was as fast or faster at every small
# size: 1 x 4 x 12 x 12 x 16 11.6 against torch's 14.2 us, 4 x 4 x 16 x 16 x 16 15.6 against 21.3,
# 1 x 4 x 1 x 64 x 16 11.0 against 10.8; with K read transposed or an additive mask (T5's position
# bias) 13-17 against 28-54
MIN_WORK = 0
_THREAD_MIN_WORK = 1 << 16


def _kernel():
    return native.function("attention", "attention_f32", "pppppdppd", ctypes.c_int, fallbacks="attention")


# the C call's parameters per layout of the operands (shapes, strides, dtypes, threads): a model
# calls its attentions with the same few layouts, and working them out took ~8 of ~13 us a call
_PLANS: dict = {}
_PLANS_MAX = 512


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              scale: float, *, lens: torch.Tensor | None = None, fill: float = 0.0,
              merged: bool = False) -> torch.Tensor | None:
    """softmax(q k^T * scale + bias) v for q (B, N, S, D), k (B, Nk, T, D), v (B, Nk, T, Dv) with
    Nk dividing N (grouped heads), bias additive and broadcastable to (B, N, S, T) (or all of them
    without B); None where it does not serve (the module docstring). ``lens`` (int32 (B,), no
    ``bias``): keys from lens[b] on get ``fill`` added (a right-padded mask_index). ``merged``: the
    result as (B, S, N * Dv), the heads side by side, written so by the kernel (4-D q only)."""
    if lens is not None or type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor \
            or (bias is not None and type(bias) is not torch.Tensor) or q.dim() != 4:
        return _attention(q, k, v, bias, scale, lens=lens, fill=fill, merged=merged)
    key = (q.shape, q.stride(), q.dtype, q.is_cpu, k.shape, k.stride(), k.dtype, k.is_cpu, v.shape, v.stride(),
           v.dtype, v.is_cpu, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.is_cpu),
           merged, torch.get_num_threads(), MAX_WORK, MIN_WORK, MAX_HEAD)  # (the limits: tests move them)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(q, k, v, bias, merged)
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = plan
    if plan is False:
        return None
    return _call(plan, q, k, v, bias, scale, None, 0.0)


def _plan(q, k, v, bias, merged: bool):
    """(the kernel, its parameters, the result's shape, whether q / v are made contiguous first)
    for operands laid out as these, or False where the kernel does not serve them."""
    if not q.is_cpu or not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (q.dtype == k.dtype == v.dtype == torch.float32) or (bias is not None and bias.dtype != torch.float32):
        return False
    b, n, s, d = q.shape
    nk, t, dv = k.shape[1], k.shape[2], v.shape[3]
    if (k.shape[0] != b or v.shape[0] != b or v.shape[1] != nk or v.shape[2] != t or k.shape[3] != d or nk == 0
            or n % nk or not (b and n and s and t and d and dv)):
        return False
    work = 2 * b * n * s * t * d
    if work > MAX_WORK or work < MIN_WORK or d * t > MAX_HEAD:
        return False
    if bias is not None:
        if bias.dim() > 4:
            return False
        try:
            bias = bias.expand(b, n, s, t)  # broadcast dims get stride 0 (the same data pointer)
        except RuntimeError:
            return False
    fn = _kernel()
    if fn is None:
        return False
    q_contig, v_contig = q.stride(3) != 1, v.stride(3) != 1
    qs = _contiguous_strides(q.shape) if q_contig else q.stride()
    vs = _contiguous_strides(v.shape) if v_contig else v.stride()
    if merged:
        out_shape = (b, s, n * dv)
        ostrides = (s * n * dv, dv, n * dv)  # (B, N, S, Dv) as the kernel walks it
    else:
        out_shape = (b, n, s, dv)
        ostrides = (n * s * dv, s * dv, dv)
    threads = torch.get_num_threads() if work >= _THREAD_MIN_WORK and b * n > 1 else 1
    ms = (0, 0, 0, 0) if bias is None else bias.stride()
    params = array.array("q", (b, n, s, t, d, dv, n // nk, *qs[:3], *k.stride(), *vs[:3], *ms, *ostrides, threads))
    return fn, params, out_shape, q_contig, v_contig


def _contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for dim in reversed(shape):
        out.append(acc)
        acc *= dim
    return tuple(reversed(out))


def _attention(q, k, v, bias, scale, *, lens=None, fill: float = 0.0, merged: bool = False):
    """The general path (3-D operands, ``lens``): planned every call."""
    if not q.is_cpu or not (q.dim() == k.dim() == v.dim() and q.dim() in (3, 4)):
        return None
    if q.dim() == 3:
        if (bias is not None and bias.dim() > 3) or lens is not None or merged:
            return None
        r = _attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), bias, scale)
        return None if r is None else r.squeeze(0)
    plan = _plan(q, k, v, bias, merged)
    if plan is False or (lens is not None and (bias is not None or lens.dtype != torch.int32
                                                 or lens.shape != (q.shape[0],) or not lens.is_contiguous())):
        return None
    return _call(plan, q, k, v, bias, scale, lens, fill)


def _call(plan, q, k, v, bias, scale: float, lens, fill: float):
    fn, params, out_shape, q_contig, v_contig = plan
    if q_contig:
        q = q.contiguous()
    if v_contig:
        v = v.contiguous()
    out = torch.empty(out_shape)
    if fn(params.buffer_info()[0], q.data_ptr(), k.data_ptr(), v.data_ptr(), None if bias is None else bias.data_ptr(),
          float(scale), out.data_ptr(), None if lens is None else lens.data_ptr(), float(fill)):
        return None  # a row whose every score is masked: torch's kernel decides what it gives
    native.count("attention_native_calls")
    return out
