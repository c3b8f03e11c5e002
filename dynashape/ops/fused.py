"""Fused ops (domain ``com.dynashape``): what the fusion passes rewrite exported patterns into.

Each is one torch call where the exported graph had several nodes, so the generated code makes
one dispatch instead of five to ten. Their shape functions raise ``CannotServe`` for a shape the
fused kernel does not handle; the shape program then runs the nodes the pass replaced (they are
kept on the fused node) for that signature: the design notes' unfusion.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..shape.symint import NeedsConcrete
from . import cpu_attention, native, ort_math, small_work, split_tf32, tuned_gemm
from .elementwise import SIXTH, hardsigmoid, hardswish
from .registry import op
from .shapes import broadcast, same_as_first

DOMAIN = "com.dynashape"


def _sdpa_has_gqa() -> bool:
    """torch >= 2.5 repeats grouped key/value heads itself; before, the pass keeps the repeat."""
    q = torch.zeros(1, 2, 1, 4)
    kv = torch.zeros(1, 1, 1, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


SDPA_GQA = _sdpa_has_gqa()


class CannotServe(NeedsConcrete):
    """The fused kernel cannot compute this signature: run the unfused nodes instead."""


# ---- normalisation ------------------------------------------------------------------------------
@op("RMSNorm", 1, DOMAIN, infer=same_as_first, writes_out=False,
    notes="x * rsqrt(mean(x^2, last axis) + eps) * weight (fuse_norms)")
def _rms_norm(x, weight=None, *, epsilon=1e-5, out=None):
    y = _rms_norm_native(x, weight, epsilon)
    return y if y is not None else F.rms_norm(x, (x.shape[-1],), weight, epsilon)


_RMS_THREAD_MIN = 1 << 16  # elements below which a second thread costs more than it saves


def _rms_norm_native(x, weight, epsilon: float):
    """RMSNorm of contiguous float32 CPU rows in one C call (csrc/elementwise.c rms_norm_f32;
    F.rms_norm is six kernels on the CPU), or None (a trace's fake tensors, another dtype or device)."""
    if type(x) is not torch.Tensor or x.device.type != "cpu" or x.dtype != torch.float32 or not x.dim() \
            or not x.is_contiguous() or (weight is not None and (
                type(weight) is not torch.Tensor or weight.dtype != torch.float32 or weight.device.type != "cpu"
                or weight.shape != x.shape[-1:] or not weight.is_contiguous())):
        return None
    fn = native.function("elementwise", "rms_norm_f32", "ppiidpi", fallbacks="rms_norm")
    if fn is None:
        return None
    h = x.shape[-1]
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        fn(x.data_ptr(), None if weight is None else weight.data_ptr(), n // h, h, float(epsilon), y.data_ptr(),
           torch.get_num_threads() if n >= _RMS_THREAD_MIN else 1)
    native.count("rms_norm_native_calls")
    return y


@op("LayerNorm", 1, DOMAIN, infer=same_as_first, writes_out=False,
    notes="(x - mean) / sqrt(var + eps) * weight + bias over the last axis (fuse_norms)")
def _layer_norm(x, weight=None, bias=None, *, epsilon=1e-5, out=None):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, epsilon)


# ---- activations -------------------------------------------------------------------------------
@op("Gelu", 1, DOMAIN, infer=same_as_first, notes="erf or tanh GELU (fuse_activations)")
def _gelu(x, *, approximate="none", out=None):
    if out is None:
        return F.gelu(x, approximate=approximate)
    return torch._C._nn.gelu(x, approximate=approximate, out=out)


@op("Silu", 1, DOMAIN, infer=same_as_first, notes="x * sigmoid(x) (fuse_activations)")
def _silu(x, *, out=None):
    return ort_math.silu(x, out=out)  # the unfused Sigmoid's bits on the CPU, then the product


op("HardSwish", 1, DOMAIN, infer=same_as_first,
   notes="x * clip(x + 3, 0, 6) / 6 written out (fuse_activations); the ONNX HardSwish's kernel")(hardswish)


@op("HardSigmoid", 1, DOMAIN, infer=same_as_first,
    notes="clip(x + 3, 0, 6) / 6 written out (fuse_activations)")
def _hardsigmoid_sixth(x, *, out=None):
    return hardsigmoid(x, alpha=SIXTH, beta=0.5, out=out)  # the ONNX HardSigmoid's kernel at 1/6, 0.5


# ---- linear --------------------------------------------------------------------------------------
def _linear_infer(shapes, values):
    x, w = shapes[0], shapes[1]
    if len(x) < 1 or x[-1] != w[1]:
        raise ShapeError(f"Linear: input {tuple(x)} does not match weight {tuple(w)} (out, in)")
    return [tuple(x[:-1]) + (w[0],)]


@op("Linear", 1, DOMAIN, infer=_linear_infer, writes_out=False,
    notes="x @ weight.T + bias, weight kept (out, in) as torch lays it out (fuse_linear)")
@small_work.when_small(small_work.linear_work)
def _linear(x, weight, bias=None, *, out=None):
    if tuned_gemm.serves(x, weight) and x.shape[-1] == weight.shape[1]:  # a static impl's build
        y = tuned_gemm.product(x.reshape(-1, x.shape[-1]), weight, True, bias)
        return y.view(*x.shape[:-1], weight.shape[0])
    if split_tf32.eligible(x, weight) and split_tf32.worth(x.numel() // weight.shape[1], *weight.shape):
        y = split_tf32.product(x.reshape(-1, weight.shape[1]), weight, True, bias)
        return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


# ---- attention -----------------------------------------------------------------------------------
def _attention_infer(shapes, values, *, scale=1.0, mask_kind="none", k_transposed=0, gqa=0, nan_to_zero=0,
                     heads_last=0):
    q, k, v = shapes[0], shapes[1], shapes[2]
    if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
        raise CannotServe("attention of other ranks")
    k_len, k_dim = (k[-1], k[-2]) if k_transposed else (k[-2], k[-1])
    if q[-1] != k_dim or v[-2] != k_len:
        raise CannotServe("attention of mismatched head dims or lengths")
    if gqa and (k[-3] != v[-3] or q[-3] != k[-3] * gqa or q[:-3] != k[:-3]):
        # the graph repeats each kv head gqa times: a query with another head count is not grouped
        # attention (the graph broadcasts or refuses it): the replaced nodes say which
        raise CannotServe("query heads that are not the kv heads times the repeat")
    lead = broadcast([tuple(q[:-2]), tuple(v[:-2])])[0] if not gqa else tuple(q[:-2])
    scores = tuple(lead) + (q[-2], k_len)
    if len(shapes) > 3 and shapes[3] is not None:
        try:
            grown = broadcast([shapes[3], scores])[0]
        except ShapeError as e:
            raise CannotServe(f"a mask that does not broadcast: {e}") from e
        if len(grown) != len(scores) or any(a != b for a, b in zip(grown, scores)):
            raise CannotServe("a mask that enlarges the scores")
    return [tuple(lead) + (q[-2], v[-1])]


def folded_gqa(q, k, v, mask, scale):
    """Grouped-query attention with each KV head's queries folded into one sequence: q (B, H, S, D)
    read as (B, KVH, G*S, D) over k, v (B, KVH, L, D), no head of the keys and values repeated.
    With ``enable_gqa`` on CUDA in float32 torch takes its math path, which repeats every key and
    value G times first (measured on an H200, a paged decode step of a 12-layer model with 4 KV heads
    for 12: ~2/3 of the step's GPU time in the repeats and the GEMVs over them); folded, the
    memory-efficient kernel serves it. The same numbers: each query row attends on its own, and a
    mask row is the query's (given as rows of S, of 1, per head or for all). None where the shapes
    are not that (the caller runs the plain call)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return None
    b, h, s, d = q.shape
    kvh = k.shape[1]
    if kvh == h or h % kvh or v.shape[1] != kvh:
        return None
    g = h // kvh
    m = mask
    if mask is not None:
        if mask.dim() != 4 or mask.shape[1] not in (1, h) or mask.shape[2] not in (1, s):
            return None
        if mask.shape[1] == h or mask.shape[2] != 1:  # a row per query: laid out as the folded queries
            mb, mh, _, length = mask.shape
            m = mask.expand(mb, mh, s, length)
            m = (m.reshape(mb, kvh, g * s, length) if mh == h
                 else m.unsqueeze(2).expand(mb, 1, g, s, length).reshape(mb, 1, g * s, length))
    r = F.scaled_dot_product_attention(q.reshape(b, kvh, g * s, d), k, v, attn_mask=m, scale=scale)
    return r.reshape(b, h, s, v.shape[-1])


@op("Attention", 1, DOMAIN, infer=_attention_infer, writes_out=False,
    notes="softmax(q @ k.T * scale + mask) @ v as scaled_dot_product_attention (fuse_attention)")
def _attention(q, k, v, mask=None, *, scale=1.0, mask_kind="none", k_transposed=0, gqa=0, nan_to_zero=0,
               heads_last=0, out=None):
    if k_transposed:
        k = k.transpose(-2, -1)
    if mask is not None and mask_kind == "drop":
        mask = torch.logical_not(mask)  # Where(mask, -inf, scores): True means masked out
    kw = {"enable_gqa": True} if gqa else {}
    r = None
    if mask is None or mask.dtype == torch.float32:  # (a boolean mask: torch's kernel)
        if heads_last and q.dim() == 4:
            # (B, N, S, Dv) laid out as (B, S, N, Dv): the Transpose(0, 2, 1, 3) after it is
            # contiguous, the Reshape merging the heads a view (fuse_attention's heads_last)
            r = cpu_attention.attention(q, k, v, mask, scale, merged=True)
            if r is not None:
                b, n, s = q.shape[:3]
                r = r.view(b, s, n, -1).transpose(1, 2)
        else:
            r = cpu_attention.attention(q, k, v, mask, scale)
    if r is None and gqa and q.dim() == 4 and q.shape[2] == 1:
        # decode steps only: on an H200 the memory-efficient kernel gave a query row whose every key
        # is masked (a left-padded prompt's padding) other numbers than eager's, which a test compares
        r = folded_gqa(q, k, v, mask, scale)
    if r is None:
        r = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, **kw)
    if nan_to_zero:  # the exported graph turns the NaN of a fully masked row into 0
        r = torch.nan_to_num(r, nan=0.0, posinf=float("inf"), neginf=float("-inf"))
    return r

