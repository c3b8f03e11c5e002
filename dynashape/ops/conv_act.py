"""A convolution and the ReLU after it (with the residual add between them) as one op
(``compile/fuse_conv_relu.py``).

``ConvRelu(x, w, b) = relu(conv(x, w, b))`` and ``ConvAddRelu(x, w, b, z) = relu(conv(x, w, b) + z)``
with ``z`` of the convolution's shape: every bottleneck of a ResNet ends in the second. On CUDA,
cuDNN's fused kernels (``torch.cudnn_convolution_relu`` / ``_add_relu``) apply the epilogue while
the convolution's output is still in registers: the separate ReLU and Add kernels, and their round
trips through memory, are gone. Measured on an H100 over ResNet-50's 19 distinct fp32 convolutions
(TF32 off, captured in CUDA graphs; ``benchmarks/conv_fusion.py``): at batch 16 conv + ReLU 2.26 ms
against 1.96 fused, conv + add + ReLU 2.44 against 2.04; batch 1 0.70 / 0.62 and 0.73 / 0.63; the
values equal to within 2e-6. Elsewhere (CPU, 1-D and 3-D convolutions, other dtypes) the
convolution and then its epilogue in place, which is what the replaced nodes computed.

cuDNN builds (compiles) a fused kernel's plan at its first call for a shape: tens of milliseconds
per convolution. Measured with ResNet-50 on the H100, the first call at a new batch took 16-42x
its steady time with the fused kernels on the dynamic path (1.2x without), while the dynamic
path's steady time gained nothing from them (it is bound by the host). So only static impl
builds take them (``fused_epilogues()``, entered by ``impls/static.py``): a build pays the plan
once per signature, off the call path by default, and its CUDA graph replays the fused kernels.
"""

from __future__ import annotations

import threading

import torch

from . import cpu_conv, tuned_conv
from .conv import _conv_infer, bind_conv1d, conv_plan
from .fused import DOMAIN, CannotServe
from .registry import binder, op
from .specialise import thread_setting

_CUDNN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_LOCAL = threading.local()


def fused_epilogues():
    """Inside (this thread): ConvRelu / ConvAddRelu take cuDNN's fused kernels where they can."""
    return thread_setting(_LOCAL, "on", True)


def _cudnn(x, w, b) -> bool:
    return (getattr(_LOCAL, "on", False) and x.is_cuda and x.dim() == 4 and x.dtype in _CUDNN_DTYPES
            and w.dtype == x.dtype and (b is None or b.dtype == x.dtype) and torch.backends.cudnn.is_available()
            and torch.backends.cudnn.enabled)


def _conv_relu_infer(shapes, values, **attrs):
    return _conv_infer(shapes[:2], values[:2], **attrs)


@op("ConvRelu", 1, DOMAIN, infer=_conv_relu_infer, writes_out=False,
    notes="relu(conv(x, w, b)), cuDNN's fused kernel on CUDA (fuse_conv_relu)")
def _conv_relu(x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
               strides=None, out=None):
    fn, x, s, p, d = conv_plan(x, w, kernel_shape, strides, dilations, pads, auto_pad)

    def own():
        if _cudnn(x, w, b):
            return torch.cudnn_convolution_relu(x, w, b, s, p, d, group)
        return fn(x, w, b, s, p, d, group).relu_()
    if tuned_conv.serves(x, w, group, d):  # a static impl's build: the form timed fastest for the shape
        return tuned_conv.conv2d(x, w, b, s, p, d, group, relu=True, cudnn=own)
    return own()


def _conv_add_relu_infer(shapes, values, **attrs):
    (y,) = _conv_infer(shapes[:2], values[:2], **attrs)
    z = tuple(shapes[3])
    if len(z) != len(y) or any(a != b for a, b in zip(y, z)):  # a residual that broadcasts: the nodes serve
        raise CannotServe("a residual of another shape than the convolution")
    return [y]


@op("ConvAddRelu", 1, DOMAIN, infer=_conv_add_relu_infer, writes_out=False,
    notes="relu(conv(x, w, b) + z), cuDNN's fused kernel on CUDA (fuse_conv_relu)")
def _conv_add_relu(x, w, b=None, z=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   pads=None, strides=None, out=None):
    fn, x, s, p, d = conv_plan(x, w, kernel_shape, strides, dilations, pads, auto_pad)

    def own():
        if _cudnn(x, w, b) and z.dtype == x.dtype:
            return torch.cudnn_convolution_add_relu(x, w, z, 1.0, b, s, p, d, group)
        return fn(x, w, b, s, p, d, group).add_(z).relu_()
    if tuned_conv.serves(x, w, group, d) and z.dtype == x.dtype:
        return tuned_conv.conv2d(x, w, b, s, p, d, group, relu=True, z=z, cudnn=own)
    return own()


def _conv_act_infer(shapes, values, activation=None, act_scalars=None, act_algorithm=None, act_exact=None,
                    post_affine=None, **attrs):
    return _conv_infer(shapes[:2], values[:2], **attrs)


@op("ConvAct", 1, DOMAIN, infer=_conv_act_infer, writes_out=False,
    notes="activation(conv(x, w, b)), then scale * y + shift where post_affine is set, of a 2-D float "
          "convolution: oneDNN's post-op or the C tile on the CPU (fuse_conv_activation)")
def _conv_act(x, w, b=None, *, activation="relu", act_scalars=(), act_algorithm="", act_exact=1, post_affine=None,
              auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None, out=None):
    fn, x, s, p, d = conv_plan(x, w, kernel_shape, strides, dilations, pads, auto_pad)
    scalars = [float(v) for v in act_scalars]
    post = cpu_conv.affine_in_place(tuple(post_affine) if post_affine else None)
    if x.dim() != 4:
        return post(cpu_conv.ACTIVATIONS[activation](fn(x, w, b, s, p, d, group), scalars, act_algorithm))
    return post(cpu_conv.conv2d_act(x, w, b, s, p, d, group, activation, scalars, act_algorithm, bool(act_exact)))


@binder("ConvAct", DOMAIN)
def _bind_conv_act(consts, attrs):
    """The 2-D convolution's parameters read once and its weight reordered once per input shape
    (explicit symmetric pads: the generated CPU runner then calls oneDNN's fused convolution
    straight)."""
    w = consts[1]
    if isinstance(w, torch.Tensor) and w.dim() == 3:  # a 1-D convolution and its Relu (fuse_conv_activation)
        return _bind_conv1d_relu(consts, attrs)
    pads = list(attrs.get("pads") or [0, 0, 0, 0])
    if not isinstance(w, torch.Tensor) or w.dim() != 4 or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "") \
            or len(pads) != 4 or pads[:2] != pads[2:]:
        return None
    s, p = list(attrs.get("strides") or [1, 1]), pads[:2]
    d, g = list(attrs.get("dilations") or [1, 1]), attrs.get("group", 1)
    act, alg = attrs["activation"], attrs.get("act_algorithm", "")
    scalars = [float(v) for v in attrs.get("act_scalars") or ()]
    b = consts[2] if len(consts) > 2 and isinstance(consts[2], torch.Tensor) else None
    if len(consts) > 2 and consts[2] is not None and b is None:
        return None  # a computed bias
    affine = attrs.get("post_affine")
    return cpu_conv.bound_conv2d_act(w, b, s, p, d, g, act, scalars, alg, bool(attrs.get("act_exact", 1)),
                                     tuple(affine) if affine else None)


def _bind_conv1d_relu(consts, attrs):
    """ConvAct of a 1-D convolution (a Relu only, no affine): the C kernel with the Relu as it stores
    (ops/conv.py ``bound_conv1d``)."""
    if attrs.get("activation") != "relu" or attrs.get("post_affine"):
        return None
    return bind_conv1d(consts, attrs, relu=True)
