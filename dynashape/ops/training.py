"""Training ops: the ai.onnx.preview.training optimizers (Momentum, Adagrad, Adam) and the random
generators (RandomUniform, RandomNormal, RandomUniformLike, RandomNormalLike, Bernoulli).

Optimizers take R (learning rate, scalar), T (update count, int64 scalar), then n tensors to
optimize, their n gradients and their n state tensors per kind of state (Momentum: V; Adagrad: H;
Adam: V then H). They output the n new tensors, then the n new states of each kind. Every
coefficient that depends on T is computed on the device (no .item()), so a step costs no sync.

Random ops draw from torch's default generator, or, when the node has a ``seed`` attribute, from
a generator seeded with it at every call: a seeded node gives the same draw on every run (as the
onnx reference evaluator does). The draws cannot match another runtime's bit for bit (numpy's or
onnxruntime's generator). The compiler never folds these ops (compile/constant_folding.py).
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from .registry import op
from .shapes import broadcast, same_as_first

TRAINING = "ai.onnx.preview.training"
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# Optimizers ---------------------------------------------------------------------------------
def _groups(op_type: str, tensors, kinds: int) -> list:
    """Split X1..Xn, G1..Gn, S1..Sn, ... into ``kinds`` lists of n."""
    if not tensors or len(tensors) % kinds:
        raise ShapeError(f"{op_type}: expected {kinds} groups of n tensors after R and T "
                         f"(X, G and the states), got {len(tensors)} inputs")
    n = len(tensors) // kinds
    return [tensors[k * n:(k + 1) * n] for k in range(kinds)]


def _optimizer_infer(op_type: str, kinds: int):
    """Every output of tensor i has the broadcast shape of X_i, G_i and its states."""
    def infer(shapes, values, **_attrs):
        groups = _groups(op_type, shapes[2:], kinds)
        per_tensor = [broadcast(list(same))[0] for same in zip(*groups)]
        return per_tensor * (kinds - 1)
    return infer


def _put_all(out, results: list) -> tuple:
    if out is None:
        return tuple(results)
    return tuple(r if o is None else o.copy_(r) for o, r in zip(out, results))


def _scalar(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.reshape(()).to(like.dtype)


@op("Momentum", 1, domain=TRAINING, infer=_optimizer_infer("Momentum", 3))
def _momentum(r, t, *tensors, alpha=None, beta=None, mode=None, norm_coefficient=None, out=None):
    if alpha is None or beta is None or mode is None or norm_coefficient is None:
        raise ValueError("Momentum: attributes alpha, beta, mode and norm_coefficient are required")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _groups("Momentum", tensors, 3)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        lr = _scalar(r, x)
        # the first update (T == 0) takes the whole gradient: beta counts from the second on
        b = torch.where(t.reshape(()) > 0, beta, 1.0).to(x.dtype)
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + b * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        new_x.append(x - lr * step)
        new_v.append(v_new)
    return _put_all(out, new_x + new_v)


@op("Adagrad", 1, domain=TRAINING, infer=_optimizer_infer("Adagrad", 3))
def _adagrad(r, t, *tensors, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0, out=None):
    xs, gs, hs = _groups("Adagrad", tensors, 3)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        lr = _scalar(r, x) / (1 + _scalar(t, x) * decay_factor)
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        new_x.append(x - lr * g_reg / (h_new.sqrt() + epsilon))
        new_h.append(h_new)
    return _put_all(out, new_x + new_h)


@op("Adam", 1, domain=TRAINING, infer=_optimizer_infer("Adam", 4))
def _adam(r, t, *tensors, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
          norm_coefficient_post=0.0, out=None):
    xs, gs, vs, hs = _groups("Adam", tensors, 4)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        # bias correction in float64 (alpha**T and beta**T approach 1 as T grows); none at T == 0
        t64 = t.reshape(()).to(torch.float64)
        corrected = torch.sqrt(1 - beta ** t64) / (1 - alpha ** t64)
        lr = _scalar(r, x) * torch.where(t64 > 0, corrected, 1.0).to(x.dtype)
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - lr * v_new / (h_new.sqrt() + epsilon)
        new_x.append((1 - norm_coefficient_post) * x_new)
        new_v.append(v_new)
        new_h.append(h_new)
    return _put_all(out, new_x + new_v + new_h)


# Random generators --------------------------------------------------------------------------
def _generator(seed, device: torch.device) -> torch.Generator | None:
    # ``seed`` is a FLOAT attribute: its integer part seeds the generator
    return None if seed is None else torch.Generator(device=device).manual_seed(int(seed))


def _float_dtype(op_type: str, dtype, like: torch.dtype | None) -> torch.dtype:
    dt = like if dtype is None else torch_dtype(int(dtype))
    if dt not in _FLOATS:
        raise ValueError(f"{op_type}: output must be a floating type, got {dt} "
                         f"({'the input type' if dtype is None else 'attribute dtype'})")
    return dt


def _target(shape, dt: torch.dtype, device, out) -> torch.Tensor:
    return out if out is not None else torch.empty(tuple(shape), dtype=dt, device=device)


def _shape_attr_infer(shapes, values, *, shape=None, **_attrs):
    if shape is None:
        raise ShapeError("the 'shape' attribute is required")
    return [tuple(int(d) for d in shape)]


@op("RandomUniform", (1, 22), infer=_shape_attr_infer)
def _random_uniform(*, shape=None, dtype=1, high=1.0, low=0.0, seed=None, _device=None, out=None):
    dt = _float_dtype("RandomUniform", dtype, None)
    res = _target(shape, dt, _device, out)
    return res.uniform_(low, high, generator=_generator(seed, res.device))


@op("RandomNormal", (1, 22), infer=_shape_attr_infer)
def _random_normal(*, shape=None, dtype=1, mean=0.0, scale=1.0, seed=None, _device=None, out=None):
    dt = _float_dtype("RandomNormal", dtype, None)
    res = _target(shape, dt, _device, out)
    return res.normal_(mean, scale, generator=_generator(seed, res.device))


def _like_dtype(x):
    # the input may be any type, strings included (a host array): only its shape matters
    return x.dtype if isinstance(x, torch.Tensor) else None


@op("RandomUniformLike", (1, 22), infer=same_as_first)
def _random_uniform_like(x, *, dtype=None, high=1.0, low=0.0, seed=None, _device=None, out=None):
    dt = _float_dtype("RandomUniformLike", dtype, _like_dtype(x))
    res = _target(x.shape, dt, _device, out)
    return res.uniform_(low, high, generator=_generator(seed, res.device))


@op("RandomNormalLike", (1, 22), infer=same_as_first)
def _random_normal_like(x, *, dtype=None, mean=0.0, scale=1.0, seed=None, _device=None, out=None):
    dt = _float_dtype("RandomNormalLike", dtype, _like_dtype(x))
    res = _target(x.shape, dt, _device, out)
    return res.normal_(mean, scale, generator=_generator(seed, res.device))


@op("Bernoulli", (15, 22), infer=same_as_first)
def _bernoulli(p, *, dtype=None, seed=None, out=None):
    # draws in float32 at least: torch's bernoulli has no half kernels on every device
    pf = p if p.dtype in (torch.float32, torch.float64) else p.float()
    r = torch.bernoulli(pf, generator=_generator(seed, p.device))
    r = r.to(p.dtype if dtype is None else torch_dtype(int(dtype)))
    return r if out is None else out.copy_(r)
