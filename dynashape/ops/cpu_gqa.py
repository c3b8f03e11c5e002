"""GroupQueryAttention on the CPU as onnxruntime computes it, bit for bit, for float32 (its rotary
and its attention in csrc/elementwise.c: ort_rope_f32, ort_gqa_attn_f32), and the present buffers
both this path and contrib_gqa.py's torch path fill as onnxruntime lays them out.
"""

from __future__ import annotations

import array
import ctypes
import glob
import os

import torch

from . import native
from .contrib_attention import _heads


def _gqa_present(past, new, start, length: int):
    """(B, Nk, length, H): the past's first ``start[b]`` positions of each batch row, the new
    tokens at [start[b], start[b] + S), zeros elsewhere (onnxruntime's separate present buffer)."""
    b, nk, s, h = new.shape
    if past is None or past.shape[2] == 0:
        if s == length:
            return new.contiguous()
        present = new.new_zeros((b, nk, length, h))
    elif past.shape[2] + s == length and type(start) is torch.Tensor and start.device.type == "cpu" \
            and bool((start == past.shape[2]).all()):
        return torch.cat([past, new], 2)  # every row's past is whole (a decode step): one copy
    else:
        present = new.new_zeros((b, nk, length, h))
        n = min(past.shape[2], length)
        keep = torch.arange(n, device=new.device) < start.reshape(b, 1)
        present[:, :, :n] = torch.where(keep.reshape(b, 1, n, 1), past[:, :, :n], 0)
    idx = (start.reshape(b, 1) + torch.arange(s, device=new.device)).reshape(b, 1, s, 1).expand(b, nk, s, h)
    return present.scatter_(2, idx, new)


def _l2_bytes() -> int:
    """The CPU's level-2 cache size in bytes (what onnxruntime's GQA sizes its key blocks by), or 0."""
    global _L2
    if _L2 is None:
        _L2 = 0
        for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
            try:
                with open(os.path.join(d, "level")) as fl, open(os.path.join(d, "type")) as ft, \
                        open(os.path.join(d, "size")) as fs:
                    level, kind, size = fl.read().strip(), ft.read().strip(), fs.read().strip()
            except OSError:
                continue
            if level == "2" and kind in ("Unified", "Data") and size:
                unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1].upper(), 1)
                try:
                    _L2 = int(size.rstrip("KMGkmg")) * unit
                except ValueError:
                    _L2 = 0
                break
    return _L2


_L2 = None
_F32 = torch.float32


def _f32_cpu(*ts) -> bool:
    return all(type(t) is torch.Tensor and t.dtype is _F32 and t.device.type == "cpu" for t in ts)


def _threads(b: int, n: int, work_per_head: int) -> tuple[int, int]:
    """(threads of ours, onnxruntime's intra-op count) for the attention C call. onnxruntime's decode
    splits the keys across its threads where they outnumber batch x heads (its "flash decoding",
    another summation order): the thread count decides its bits, and ours is the count to match (a
    session's intra_op_num_threads sets torch's for the call)."""
    ort_threads = torch.get_num_threads()
    return (min(ort_threads, b * n) if b * n * work_per_head >= 1 << 16 else 1), ort_threads


def _ort_gqa(q, k, v, past_key, past_value, seqlens, start, present_len: int, cos_cache, sin_cache, n: int,
             nk: int, h: int, scale: float, window: int, do_rotary: int, interleaved: int, first_prompt: bool):
    """(output, present_key, present_value) as onnxruntime computes GroupQueryAttention on this CPU
    (csrc/elementwise.c ort_rope_f32 and ort_gqa_attn_f32 say how), or None where that path does not
    serve: not float32 on the CPU, a traced tensor, interleaved rotary, rotary halves MLAS's kernel
    reads otherwise (neither below 8 nor a multiple of 8), no AVX-512F build, an unknown L2 size;
    contrib_gqa.py's torch path serves those."""
    b, s = q.shape[0], q.shape[1]
    if not _f32_cpu(q, k, v) or (past_key is not None and not _f32_cpu(past_key, past_value)) or not b or not s:
        return None
    l2 = _l2_bytes()
    if not l2 or q.stride(2) != 1 or k.stride(2) != 1:
        return None
    rope = native.function("elementwise", "ort_rope_f32", "piiiiippipp", fallbacks="ort_gqa")
    attn = native.function("elementwise", "ort_gqa_attn_f32", "pppppdp", ctypes.c_int64, fallbacks="ort_gqa")
    if rope is None or attn is None:
        return None
    pos = (start.reshape(b, 1) + torch.arange(s)).reshape(-1).contiguous()
    if do_rotary:
        if interleaved or not _f32_cpu(cos_cache, sin_cache) or cos_cache.dim() != 2 \
                or tuple(sin_cache.shape) != tuple(cos_cache.shape):
            return None
        half = cos_cache.shape[1]
        if 2 * half > h or (half > 8 and half % 8) or int(pos.max()) >= cos_cache.shape[0]:
            return None
        cos_c, sin_c = cos_cache.contiguous(), sin_cache.contiguous()

        def rotate(x, heads):
            if x.stride(0) != s * x.stride(1):
                x = x.contiguous()
            y = torch.empty((b, s, heads * h), dtype=_F32)
            rope(x.data_ptr(), x.stride(1), b * s, heads, h, 2 * half, cos_c.data_ptr(), sin_c.data_ptr(), half,
                 pos.data_ptr(), y.data_ptr())
            return y

        q, k = rotate(q, n), rotate(k, nk)
    qc = q.contiguous()
    kh, vh = _heads(k, nk, "GroupQueryAttention"), _heads(v, nk, "GroupQueryAttention")
    present_k = _gqa_present(past_key, kh, start, present_len).contiguous()
    present_v = _gqa_present(past_value, vh, start, present_len).contiguous()
    lens = seqlens.to(torch.int64).contiguous()
    y = torch.empty((b, s, n * h), dtype=_F32)
    threads, ort_threads = _threads(b, n, s * int(lens.max()) * h)
    params = array.array("q", (b, n, nk, s, h, present_len, int(first_prompt), window, l2 // (32 * h), threads,
                               ort_threads))
    if attn(params.buffer_info()[0], qc.data_ptr(), present_k.data_ptr(), present_v.data_ptr(), lens.data_ptr(),
            float(scale), y.data_ptr()):
        return None
    native.count("ort_gqa_native_calls")
    return y, present_k, present_v


class DecodeStep:
    """``_ort_gqa`` for a decode step whose rows all hold ``p`` past positions and take one token
    (contrib_gqa.py's bound kernel): the rotary, the presents and the attention in one C call
    (csrc/elementwise.c ort_gqa_decode_f32), the same bits, written into the runtime's buffers where
    they fit. What does not change between calls (the function, the caches, the cache sizes) is
    bound once: on a 2-core machine each torch call around the C one costs a few microseconds, and
    a decode step makes one of these per layer. ``__call__`` is None where this path does not serve."""

    def __init__(self, n: int, nk: int, cos_cache, sin_cache, scale_of, window: int, do_rotary: int) -> None:
        self.n, self.nk, self.scale_of, self.window = n, nk, scale_of, window
        self.fn = native.function("elementwise", "ort_gqa_decode_f32", "ppipipipppppppdp", ctypes.c_int64,
                                  fallbacks="ort_gqa")
        self.l2 = _l2_bytes()
        self.half = self.rows = 0
        self.cos = self.sin = 0
        self.ok = self.fn is not None and self.l2 > 0
        if do_rotary:
            if not _f32_cpu(cos_cache, sin_cache) or cos_cache.dim() != 2 or not cos_cache.is_contiguous() \
                    or not sin_cache.is_contiguous() or tuple(sin_cache.shape) != tuple(cos_cache.shape):
                self.ok = False
                return
            self.half, self.rows = cos_cache.shape[1], cos_cache.shape[0]
            self.cos, self.sin = cos_cache.data_ptr(), sin_cache.data_ptr()
            self.caches = (cos_cache, sin_cache)  # (their memory stays while the pointers are held)

    def __call__(self, query, key, value, past_key, past_value, p: int, out):
        """``query`` (B, 1, D): packed q|k|v when ``key`` is None; the pasts (B, Nk, p, H)."""
        n, nk = self.n, self.nk
        b, _, d = query.shape
        h = d // (n + 2 * nk) if key is None else d // n
        if not self.ok or query.dtype is not _F32 or past_key.dtype is not _F32 or past_value.dtype is not _F32 \
                or query.stride(2) != 1 or not past_key.is_contiguous() or not past_value.is_contiguous() \
                or (self.half and (2 * self.half > h or (self.half > 8 and self.half % 8) or p >= self.rows)):
            return None
        base, row = query.data_ptr(), query.stride(0)
        if key is None:
            if d != (n + 2 * nk) * h:
                return None
            qp, kp, vp, ks, vs = base, base + 4 * n * h, base + 4 * (n + nk) * h, row, row
        else:
            if not _f32_cpu(key, value) or key.stride(2) != 1 or value.stride(2) != 1 or d != n * h:
                return None
            qp, kp, vp, ks, vs = base, key.data_ptr(), value.data_ptr(), key.stride(0), value.stride(0)
        y, present_k, present_v = (out[i] if out is not None and len(out) > i else None for i in range(3))
        y = native.buffer(y, (b, 1, n * h), _F32)
        present_k = native.buffer(present_k, (b, nk, p + 1, h), _F32)
        present_v = native.buffer(present_v, (b, nk, p + 1, h), _F32)
        qrot = torch.empty((b, n * h), dtype=_F32)
        threads, ort_threads = _threads(b, n, (p + 1) * h)
        params = array.array("q", (b, n, nk, h, p, 1 if self.half else 0, 2 * self.half, self.half, 0, self.window,
                                   self.l2 // (32 * h), threads, ort_threads))
        if self.fn(params.buffer_info()[0], qp, row, kp, ks, vp, vs, past_key.data_ptr(), past_value.data_ptr(),
                   self.cos, self.sin, present_k.data_ptr(), present_v.data_ptr(), qrot.data_ptr(),
                   self.scale_of(h), y.data_ptr()):
            return None
        native.count("ort_gqa_native_calls")
        return y, present_k, present_v
