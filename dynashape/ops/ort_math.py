"""onnxruntime's float32 Sigmoid and Tanh on the CPU, bit for bit (csrc/ort_math.h says why and how).

``sigmoid``, ``tanh`` and ``silu`` (x * sigmoid(x)) serve the Sigmoid / Tanh ops, the fused Silu and
the CPU conv epilogues: a float32 CPU tensor goes to csrc/elementwise.c (one pass, OpenMP threads);
where the C cannot be built, the same formula runs in torch ops (each fused multiply-add as a
float64 product and sum rounded once to float32: exact products, and a sum whose double rounding
differs from the fused one only when the float64 result falls exactly on a float32 halfway point,
which the polynomial's terms here never reached in the tests' millions of values). Other devices,
dtypes and traced tensors (a static impl's build) get torch's own functions.
"""

from __future__ import annotations

import torch

from . import native

_LOGISTIC_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
               2.48287947061529e-01)
_LOGISTIC_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
               1.16817656904453e-01, 9.93151921023180e-01)
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)


def _f32(c: float) -> float:
    """The float32 constant MLAS stores, as a Python float."""
    return float(torch.tensor(c, dtype=torch.float32))


def _poly(v2: torch.Tensor, coeffs) -> torch.Tensor:
    """Horner's rule, each step fma(v2, acc, c) rounded once to float32 (see the module's note)."""
    c = [_f32(k) for k in coeffs]
    w = v2.double()
    acc = (w * c[0] + c[1]).float()
    for k in c[2:]:
        acc = (w * acc.double() + k).float()
    return acc


def logistic_reference(x: torch.Tensor) -> torch.Tensor:
    v = x.float().clamp(-18.0, 18.0)  # clamp passes NaN through, as MLAS's min / max order does
    v2 = v * v
    r = (v * _poly(v2, _LOGISTIC_P)) / _poly(v2, _LOGISTIC_Q) + 0.5
    return torch.where(r < 0, torch.zeros_like(r), r)


def tanh_reference(x: torch.Tensor) -> torch.Tensor:
    v = x.float().clamp(-9.0, 9.0)
    v2 = v * v
    return (v * _poly(v2, _TANH_P)) / _poly(v2, _TANH_Q)


_C = {"sigmoid": "logistic_f32", "tanh": "tanh_f32", "silu": "silu_f32"}
_REF = {"sigmoid": logistic_reference, "tanh": tanh_reference,
        "silu": lambda x: x * logistic_reference(x)}
_TORCH = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": torch.nn.functional.silu}


# elements below which one thread does the pass: ~1 ns an element, so a small tensor (a recurrent
# model's gates: 128 to 512 at batch 1) is done before a second OpenMP thread would wake, and on a
# busy machine waiting for it cost up to milliseconds a call (silero-vad's six gates a call)
THREAD_MIN_ELEMENTS = 1 << 14


def _apply(kind: str, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if type(x) is not torch.Tensor or x.device.type != "cpu" or x.dtype != torch.float32:
        y = _TORCH[kind](x)
        return y if out is None else out.copy_(y)
    if out is not None and out.shape != x.shape:  # torch's out= resizes (and warns); a copy would not
        return torch.tanh(x, out=out) if kind == "tanh" else out.resize_(x.shape).copy_(_apply(kind, x, None))
    fn = native.function("elementwise", _C[kind], "ppii", fallbacks=f"ort_{kind}")
    if fn is None:
        y = _REF[kind](x)
        return y if out is None else out.copy_(y)
    # elementwise: any dense layout runs over its storage as it lies (a channels-last conv output
    # stays channels-last), an output of the same strides is written directly
    xc = x if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last) else x.contiguous()
    direct = out is not None and out.dtype == torch.float32 and out.stride() == xc.stride()
    y = out if direct else torch.empty_like(xc)
    n = xc.numel()
    fn(xc.data_ptr(), y.data_ptr(), n, torch.get_num_threads() if n >= THREAD_MIN_ELEMENTS else 1)
    native.count(f"ort_{kind}_native_calls")
    if out is not None and not direct:
        return out.copy_(y)
    return y


def sigmoid(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    return _apply("sigmoid", x, out)


def tanh(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    return _apply("tanh", x, out)


def silu(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    return _apply("silu", x, out)
