"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization,
RMSNormalization, LRN, MeanVarianceNormalization, and Dropout.

Ops with optional extra outputs (BatchNormalization, LayerNormalization, Dropout) get ``out`` as a
tensor when the node has one output and a tuple when it has several (``None`` when folding):
that is how the kernel tells how many outputs the node asks for. Their shape
functions describe every optional output; the runtime keeps as many as the node has.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from . import add_layer_norm
from .registry import op
from .shapes import norm_axis, same_as_first

_HALF = (torch.float16, torch.bfloat16)
# The shape functions give the optional outputs' shapes too (1) — the runtime trims them to the
# node's outputs.
SECONDARY = 1


def _put(out, results):
    """Write results into ``out`` where it has a buffer; return what the runtime wants: a tensor
    for a one-output node (``out`` a tensor), else a tuple with the rest fresh."""
    if isinstance(out, torch.Tensor):
        return out.copy_(results[0])
    if out is None:
        return tuple(results)
    res = list(results)
    for i, o in enumerate(out[:len(res)]):
        if o is not None and res[i] is not None:
            res[i] = o.copy_(res[i])
    return tuple(res)


def _channel_view(t: torch.Tensor, rank: int) -> torch.Tensor:
    """A per-channel (C,) vector shaped to broadcast over (N, C, d1, ...)."""
    return t.reshape(1, -1, *([1] * (rank - 2)))


# BatchNormalization -------------------------------------------------------------------------
def _bn_infer(shapes, values, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0,
              consumed_inputs=None):
    x = shapes[0]
    if len(x) < 2:
        raise ShapeError(f"BatchNormalization: input must have rank >= 2, got shape {tuple(x)}")
    # Y; the others (by opset running mean/var, or mean, var, saved mean, saved var) are (C,)
    return [tuple(x)] + [(x[1],)] * SECONDARY


def _bn_affine(mean, var, scale, bias, eps, rank, dtype, spatial=1):
    """y = x * a + b with a = scale / sqrt(var + eps) and b = bias - mean * a, shaped to broadcast."""
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    a = scale.to(ct) * torch.rsqrt(var.to(ct) + eps)
    b = bias.to(ct) - mean.to(ct) * a
    if spatial:
        return _channel_view(a, rank).to(dtype), _channel_view(b, rank).to(dtype)
    return a.unsqueeze(0).to(dtype), b.unsqueeze(0).to(dtype)  # spatial=0 (opset < 9): per element


def _batchnorm(x, scale, bias, mean, var, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0,
               consumed_inputs=None, out=None):
    rank = x.dim()
    # opset 14+: training_mode; before, extra outputs (out a tuple) meant training (6 also has is_test)
    training = bool(training_mode) or (isinstance(out, tuple) and not is_test)
    if not training:
        a, b = _bn_affine(mean, var, scale, bias, epsilon, rank, x.dtype, spatial)
        if isinstance(out, torch.Tensor):
            return torch.addcmul(b, x, a, out=out)  # one pass, straight into the buffer
        y = torch.addcmul(b, x, a)
        return _put(out, [y, mean, var]) if out is not None else y
    dims = [0] + list(range(2, rank))
    xf = x if x.dtype == torch.float64 else x.to(torch.float32)
    bvar, bmean = torch.var_mean(xf, dims, correction=0)
    a, b = _bn_affine(bmean, bvar, scale, bias, epsilon, rank, x.dtype)
    y = torch.addcmul(b, x, a)
    run_mean = (mean * momentum + bmean * (1 - momentum)).to(mean.dtype)
    run_var = (var * momentum + bvar * (1 - momentum)).to(var.dtype)
    if training_mode:  # opset 14+: Y, running_mean, running_var
        return _put(out, [y, run_mean, run_var])
    # opsets 6 to 13: Y, mean, var (running), saved_mean, saved_var (batch)
    return _put(out, [y, run_mean, run_var, bmean.to(mean.dtype), bvar.to(var.dtype)])


op("BatchNormalization", (6, 7, 9, 14, 15), infer=_bn_infer)(_batchnorm)


# InstanceNormalization ----------------------------------------------------------------------
@op("InstanceNormalization", (1, 6, 22), infer=same_as_first, writes_out=False)
def _instancenorm(x, scale, bias, *, epsilon=1e-5, consumed_inputs=None, out=None):
    # group_norm with one group per channel is instance norm, and unlike F.instance_norm it
    # accepts a single spatial element (1x1 maps)
    c = x.shape[1]
    if x.dtype in _HALF:  # accumulate in float32, as the references do
        return F.group_norm(x.float(), c, scale.float(), bias.float(), epsilon).to(x.dtype)
    return F.group_norm(x, c, scale, bias, epsilon)


# LayerNormalization -------------------------------------------------------------------------
def _ln_infer(shapes, values, *, axis=-1, epsilon=1e-5, stash_type=1):
    x = shapes[0]
    a = norm_axis(axis, len(x))
    stat = tuple(x[:a]) + (1,) * (len(x) - a)
    return [tuple(x)] + [stat] * (2 * SECONDARY)


@op("LayerNormalization", 17, infer=_ln_infer)
def _layernorm(x, scale, bias=None, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    a = norm_axis(axis, x.dim())
    shape = tuple(x.shape[a:])
    # scale and bias broadcast to the normalized shape; torch wants exactly that shape
    w = scale if tuple(scale.shape) == shape else scale.expand(shape)
    b = bias if bias is None or tuple(bias.shape) == shape else bias.expand(shape)
    if isinstance(out, torch.Tensor) and not (stash_type == 1 and x.dtype in _HALF):
        if x.is_cuda and a == x.dim() - 1 and add_layer_norm.serves(x):
            # one kernel writing the plan's buffer, where torch's takes its own and a copy
            return add_layer_norm.add_layer_norm(x, None, w, b, epsilon, out)
        return out.copy_(F.layer_norm(x, shape, w, b, epsilon))  # Y only (torch has no out= variant)
    xs = x.float() if stash_type == 1 else x
    dims = list(range(a, x.dim()))
    var, mean = torch.var_mean(xs, dims, correction=0, keepdim=True)
    inv = torch.rsqrt(var + epsilon)
    y = ((xs - mean) * inv).to(x.dtype) * w
    if b is not None:
        y = y + b
    return _put(out, [y, mean, inv])


# GroupNormalization -------------------------------------------------------------------------
def _groupnorm(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1, per_group: bool):
    c = x.shape[1]
    if c % num_groups:
        raise ShapeError(f"GroupNormalization: {c} channels do not split into {num_groups} groups")
    if per_group:  # opset 18: scale and bias per group; expand to per channel
        scale = scale.repeat_interleave(c // num_groups)
        bias = bias.repeat_interleave(c // num_groups)
    if stash_type == 1 and x.dtype in _HALF:
        return F.group_norm(x.float(), num_groups, scale.float(), bias.float(), epsilon).to(x.dtype)
    return F.group_norm(x, num_groups, scale.to(x.dtype), bias.to(x.dtype), epsilon)


@op("GroupNormalization", 18, infer=same_as_first, writes_out=False)
def _groupnorm18(x, scale, bias, *, epsilon=1e-5, num_groups, out=None):
    return _groupnorm(x, scale, bias, epsilon=epsilon, num_groups=num_groups, per_group=True)


@op("GroupNormalization", 21, infer=same_as_first, writes_out=False)
def _groupnorm21(x, scale, bias, *, epsilon=1e-5, num_groups, stash_type=1, out=None):
    return _groupnorm(x, scale, bias, epsilon=epsilon, num_groups=num_groups, stash_type=stash_type,
                      per_group=False)


# RMSNormalization ---------------------------------------------------------------------------
@op("RMSNormalization", 23, infer=same_as_first, writes_out=False)
def _rmsnorm(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    a = norm_axis(axis, x.dim())
    xs = x.float() if stash_type == 1 and x.dtype != torch.float64 else x
    ms = xs.pow(2).mean(list(range(a, x.dim())), keepdim=True)
    return (xs * torch.rsqrt(ms + epsilon)).to(x.dtype) * scale


# LRN ----------------------------------------------------------------------------------------
@op("LRN", (1, 13), infer=same_as_first, writes_out=False)
def _lrn(x, *, alpha=1e-4, beta=0.75, bias=1.0, size, out=None):
    # ONNX's channel window is [c - floor((size-1)/2), c + ceil((size-1)/2)]; torch's
    # local_response_norm centres even sizes the other way, so the window sum is done here
    n, c = x.shape[:2]
    sq = (x * x).reshape(n, 1, c, -1)
    sq = F.pad(sq, [0, 0, (size - 1) // 2, size // 2])
    s = F.avg_pool2d(sq, (size, 1), stride=1).reshape(x.shape)  # mean over the window = sum / size
    return x / (bias + alpha * s).pow(beta)


# MeanVarianceNormalization ------------------------------------------------------------------
@op("MeanVarianceNormalization", (9, 13), infer=same_as_first, writes_out=False)
def _mvn(x, *, axes=(0, 2, 3), out=None):
    dims = [norm_axis(a, x.dim()) for a in axes]
    mean = x.mean(dims, keepdim=True)
    # as the ONNX function body: variance as E(x^2) - E(x)^2, then (x - mean) / (std + 1e-9)
    var = (x * x).mean(dims, keepdim=True) - mean * mean
    return (x - mean) / (var.clamp_min(0).sqrt() + 1e-9)


# Dropout ------------------------------------------------------------------------------------
def _dropout_infer(shapes, values, **_attrs):
    return [tuple(shapes[0])] * (1 + SECONDARY)


def _dropout_apply(x, ratio: float, training: bool, out, seed=None, keep: float | None = None):
    if not training or ratio == 0.0:
        if isinstance(out, torch.Tensor):
            return out.copy_(x)  # the buffer must hold its own copy: x may be reused by its producer
        mask = torch.ones(x.shape, dtype=torch.bool, device=x.device)
        if out is None:
            return x.clone(), mask
        return _put(out, [x, mask])
    gen = None if seed is None else torch.Generator(device=x.device).manual_seed(int(seed))
    mask = torch.rand(x.shape, device=x.device, generator=gen) >= ratio
    kept = x * mask.to(x.dtype) / (1.0 - ratio if keep is None else keep)
    return _put(out, [kept, mask])


@op("Dropout", (1, 6, 7, 10), infer=_dropout_infer)
def _dropout_attr(x, *, ratio=0.5, is_test=0, consumed_inputs=None, out=None):
    # before opset 12 the op is a training op only where the model says so (is_test=0 in 1 and 6);
    # runtimes treat it as inference, as onnxruntime does
    return _dropout_apply(x, ratio, False, out)


@op("Dropout", (12, 13, 22), infer=_dropout_infer)
def _dropout(x, ratio=None, training_mode=None, *, seed=None, out=None):
    r = 0.5 if ratio is None else float(ratio.reshape(()).item())
    training = training_mode is not None and bool(training_mode.reshape(()).item())
    # 1 - ratio in the ratio's own type, as onnxruntime and the spec's arithmetic do: a float32
    # ratio of 0.1 gives 1 - 0.1f = 0.9f, not 1 - 0.1f in double, and a float64 x divided by the
    # two differs in its last bits
    keep = None if ratio is None or not training else float((1 - ratio.reshape(())).item())
    return _dropout_apply(x, r, training, out, seed, keep)


# LpNormalization ----------------------------------------------------------------------------
@op("LpNormalization", (1, 22), infer=same_as_first)
def _lp_normalization(x, *, axis=-1, p=2, out=None):
    if p not in (1, 2):
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")
    a = norm_axis(axis, x.dim())
    norm = torch.linalg.vector_norm(x, ord=p, dim=a, keepdim=True)
    # a zero vector stays zero (0/0 taken as 0), as the ONNX spec's examples say
    r = torch.where(norm == 0, torch.zeros((), dtype=x.dtype, device=x.device), x / norm)
    return r if out is None else out.copy_(r)


# Shrink -------------------------------------------------------------------------------------
@op("Shrink", 9, infer=same_as_first)
def _shrink(x, *, bias=0.0, lambd=0.5, out=None):
    # y = x + bias below -lambd, x - bias above lambd, 0 between. Integer inputs compute in
    # float and convert back (truncating), as a C++ static_cast of the float result does.
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if x.is_floating_point():
        r = torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero))
    else:
        xf = x.double()
        r = torch.where(xf < -lambd, xf + bias, torch.where(xf > lambd, xf - bias, 0.0)).to(x.dtype)
    return r if out is None else out.copy_(r)
