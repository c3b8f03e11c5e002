"""The forms of a 2-D convolution a static impl times (``specialise.py``): cuDNN, or matrix products.

cuDNN's fp32 kernels (TF32 off) tile a convolution over its output, so one of a ResNet's late
layers at a small batch runs on a handful of thread blocks over a long reduction. The same
convolution as a cuBLAS product splits that reduction. Measured on an H200 over ResNet-50's 19
distinct convolutions in CUDA graphs, operands cold (``benchmarks/conv_forms.py``): at batch 1,
512 -> 512 3x3 at 7x7 162 us in cuDNN (benchmark mode) against 25.8 as a product over its
unfolded windows, 2048 -> 512 1x1 at 7x7 74.4 against 10.2; the 19 together 880 us against 296
taking the faster of each; at batch 16 the products win on the 1x1 convolutions by 6-38% and
cuDNN keeps the 3x3 ones. So a static impl times the forms per shape and keeps the fastest.

Forms, for ``y = relu?(conv(x, w) + bias (+ z))`` over an NCHW input, groups 1, dilation 1:
- ``cudnn``: the op's own call (cuDNN, its fused epilogue where the op has one);
- ``gemm`` (1x1 kernels without padding): ``W [out, in]`` times each image's ``[in, H*W]``
  (strided inputs sampled first);
- ``unfold``: ``W [out, in*kh*kw]`` times each image's unfolded windows ``[in*kh*kw, L]`` (one
  strided copy of the padded input, ``windows``);
- ``winograd`` (3x3, stride 1, float32): Winograd's F(2x2, 3x3), 2.25x fewer multiplies
  (``winograd.py``);
- ``gemm_merged`` / ``unfold_merged`` (batch > 1): the images side by side as one product
  ``[.., B*L]`` (one large product instead of B small ones), the result put back in NCHW;
- ``..._split`` of each product form (float32, where the session's ``fp32_products`` allows split
  products, ``split_tf32.eligible``): the product as three bfloat16 products of the operands' parts
  with float32 accumulation (``split_tf32.weight_left_product``), float32's accuracy (each
  convolution within 1-6e-6 of float64 on ResNet-50's) on the tensor cores. Measured on an H200
  over ResNet-50's 19 distinct convolutions (``benchmarks/conv_split.py``): 1x1 convolutions and
  strided 3x3 ones 1.2-2.2x faster than the fastest other form from batch 8 (Winograd keeps the 3x3
  stride-1 ones), the 19 together 2.26 against 2.85 ms at batch 32, 0.78 against 0.98 at batch 8.
  (cuDNN's own TF32 convolution over the parts concatenated along the input channels, which
  ``torch._convolution`` allows per call, gained 0-5%: cuDNN's TF32 kernels are slow at these shapes.)
The product is rounded to the dtype, then the bias, the residual and the ReLU are applied,
as the op's unfused epilogue does (one pass on CUDA: ``conv_epilogue.py``).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import conv_epilogue, split_tf32, winograd
from .conv_epilogue import bias_add_relu
from .specialise import active, choose

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FORMS = ("cudnn", "gemm", "gemm_merged", "winograd", "unfold", "unfold_merged", "gemm_split", "gemm_merged_split",
         "unfold_split", "unfold_merged_split")
MAX_UNFOLD = 64 << 20  # bytes of unfolded windows a form may allocate
SPLIT = os.environ.get("DYNASHAPE_CONV_SPLIT", "1") != "0"  # the "_split" forms offered (0: not; A/B runs)


def serves(x: torch.Tensor, w: torch.Tensor, groups: int, dilation) -> bool:
    """Whether a convolution takes a timed form: inside a static impl's build, on CUDA, 2-D,
    one group, no dilation, an NCHW input. (On the dynamic path the prior's forms cut a new
    batch's first call, whose cuDNN plans cost ResNet-50 ~70 ms on an H200, to ~33 ms, but a
    repeated call took 12-23 ms against cuDNN's 5-7: benchmarks/first_call_profile.py. Not taken.)"""
    return (active() and x.is_cuda and x.dim() == 4 and w.dim() == 4 and groups == 1
            and all(d == 1 for d in dilation) and x.dtype in DTYPES and w.dtype == x.dtype
            and x.is_contiguous())


_MAJOR: dict[int | None, int] = {}  # device index -> compute capability's major


def _major(device: torch.device) -> int:
    got = _MAJOR.get(device.index)
    if got is None:
        got = _MAJOR[device.index] = torch.cuda.get_device_capability(device)[0]
    return got


def forms(x: torch.Tensor, w: torch.Tensor, stride, padding) -> tuple[str, ...]:
    b, c, kh, kw = x.shape[0], x.shape[1], w.shape[2], w.shape[3]
    out: list[str] = ["cudnn"]
    products: list[str] = []
    if kh == kw == 1 and not any(padding):
        products = ["gemm", "gemm_merged"] if b > 1 else ["gemm"]
    else:
        if winograd.serves(x, w, stride, padding):
            out.append("winograd")
        ho, wo = _out_hw(x, w, stride, padding)
        if b * c * kh * kw * ho * wo * x.element_size() <= MAX_UNFOLD:
            products = ["unfold", "unfold_merged"] if b > 1 else ["unfold"]
    out += products
    if splits(x, w):
        out += [f + "_split" for f in products]
    return tuple(out)


def splits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the product forms may run as split bfloat16 products: float32 operands where the
    session's ``fp32_products`` allows it, neither TF32 switch on (then TF32 is what was asked for)."""
    return (SPLIT and split_tf32.BF16 and x.dtype == torch.float32 and split_tf32.eligible(x, w)
            and not torch.backends.cudnn.allow_tf32)


def _out_hw(x, w, stride, padding) -> tuple[int, int]:
    """Output height and width of a convolution without dilation over symmetric padding."""
    return tuple((x.shape[2 + i] + 2 * padding[i] - w.shape[2 + i]) // stride[i] + 1 for i in (0, 1))


def conv2d_op(x, w, b, stride, padding, dilation, groups):
    """torch's conv2d; inside a static impl's build, the form timed fastest (the generated code's
    line for a CUDA Conv)."""
    if serves(x, w, groups, dilation):
        return conv2d(x, w, b, stride, padding, dilation, groups)
    return torch.conv2d(x, w, b, stride, padding, dilation, groups)


def conv2d(x, w, b, stride, padding, dilation, groups, relu: bool = False, z=None, cudnn=None):
    """The convolution (then ``+ z``, then ReLU) in the form timed fastest for its key;
    ``cudnn()`` is the op's own call (torch's conv2d when not given)."""
    stride, padding = tuple(stride), tuple(padding)
    if cudnn is None:
        def cudnn():
            return _epilogue(torch.conv2d(x, w, b, stride, padding, dilation, groups), z, relu)
    fs = forms(x, w, stride, padding)
    key = ("conv", tuple(x.shape), tuple(w.shape), stride, padding, x.dtype, b is not None, relu, z is not None,
           torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, x.device.index,
           split_tf32.MODE.get())
    form = choose(key, fs, lambda f: _run(f, x, w, b, stride, padding, relu, z, cudnn),
                  prior=guess(x, w, stride, padding, (b is not None, z is not None, relu)))
    return _run(form, x, w, b, stride, padding, relu, z, cudnn)


def guess(x: torch.Tensor, w: torch.Tensor, stride, padding, epilogue: tuple[bool, bool, bool]) -> str | None:
    """The form a build that times nothing takes (a region's first graph, built at once): the
    form that won at this geometry on an H200 (``benchmarks/conv_forms.py``, ResNet-50's
    convolutions at batch 1, 8 and 16, results/conv_forms_winograd_h200_2026-11-26.json), on
    GPUs of that generation (compute capability 9); None elsewhere (the op's own call).
    - 3x3, stride 1: Winograd won at every batch and size, 1.2-5.6x cuDNN's time (a late layer at
      batch 16: 64 against 204 us).
    - 1x1: one product per image won or tied (within 5%) but for two cases: wide inputs
      (in >= 4x out) over few positions (<= 14x14) at batch >= 8, where the images side by side
      won (2048 -> 512 at 7x7, batch 8: 45 against 80 us), and 64 -> 256 at 56x56, batch 16
      (cuDNN 83 against 97: the rule does not carve that one out).
    - 3x3, stride 2: unfolded windows at batch 1 (34-37 against 46-164 us); from batch 8 the
      images' windows side by side over inputs of <= 28x28 (86-150 against 110-218), cuDNN over
      larger ones. Other kernels (a 7x7 stem) were not measured: cuDNN.
    - Where the product forms may split (``splits``; measured with them, benchmarks/conv_split.py,
      results/conv_split_bf16_h200_2026-11-29.json), from batch 8 over inputs of <= 28x28: 1x1 as
      split products, per image at 28x28 (1.3-1.8x the float32 forms' speed), side by side below
      (1.3-2.2x); 3x3 stride 2 as the images' windows side by side, split (1.4-1.9x).
    A form only where its Triton kernels for this ``epilogue`` (has a bias, a residual, a ReLU)
    are compiled in this process (a session's load compiles them: ``warm``), else cuDNN: a
    build must not wait for a compile (~1.2 s for a ResNet-50's on an empty Triton cache).
    A tuned rebuild times every form later and its choice replaces the guess.
    DYNASHAPE_FORM_PRIORS=0 turns the guess off (A/B measurements)."""
    if x.dtype != torch.float32 or not priors_on() or _major(x.device) != 9:
        return None
    form = rule(tuple(x.shape), tuple(w.shape), tuple(stride), splits(x, w))
    if form == "winograd":
        return form if winograd.ready(*epilogue) else "cudnn"
    if form is not None and form.startswith(("gemm", "unfold")):  # their epilogue is a Triton kernel
        ho, wo = _out_hw(x, w, stride, padding)
        return form if conv_epilogue.ready(x.dtype, *epilogue, ho * wo) else "cudnn"
    return form


def rule(x_shape: tuple, w_shape: tuple, stride: tuple, split: bool = False) -> str | None:
    """``guess``'s rule over an NCHW input's and a weight's shapes, with ``split`` where the product
    forms may split (the forms it names may not all serve the convolution: ``choose`` then takes the
    op's own call)."""
    n, cin, h, wd = x_shape
    cout, k = w_shape[0], tuple(w_shape[2:])
    if k == (3, 3) and stride == (1, 1):
        return "winograd"
    if split and n >= 8 and h * wd <= 28 * 28:
        if k == (1, 1):
            return "gemm_merged_split" if h * wd <= 14 * 14 else "gemm_split"
        if k == (3, 3) and stride == (2, 2):
            return "unfold_merged_split"
    if k == (1, 1):
        merged = n >= 8 and cin >= 4 * cout and h * wd <= 14 * 14
        return "gemm_merged" if merged else "gemm"
    if k == (3, 3) and stride == (2, 2):
        if n == 1:
            return "unfold"
        return "unfold_merged" if n >= 8 and h * wd <= 28 * 28 else "cudnn"
    return None


def priors_on() -> bool:
    return os.environ.get("DYNASHAPE_FORM_PRIORS", "1") != "0"


_EPILOGUES = {"Conv": (False, False), "ConvRelu": (False, True), "ConvAddRelu": (True, True)}  # (HAS_Z, RELU)


def epilogues(graph) -> tuple[set, set]:
    """The epilogues (has a bias, a residual, a ReLU) of ``graph``'s float32 2-D convolutions of one
    group by a constant weight: of all of them, and of the 3x3 stride-1 ones (Winograd's)."""
    every, three = set(), set()
    for n in graph.nodes:
        if n.op_type not in _EPILOGUES or n.domain not in ("", "ai.onnx", "com.dynashape") or len(n.inputs) < 2:
            continue
        w = n.inputs[1]
        if w is None or not w.is_const or w.const.dtype != torch.float32 or w.const.dim() != 4 \
                or n.attrs.get("group", 1) != 1:
            continue
        epi = (len(n.inputs) > 2 and n.inputs[2] is not None, *_EPILOGUES[n.op_type])
        every.add(epi)
        if tuple(w.const.shape[2:]) == (3, 3) and all(s == 1 for s in n.attrs.get("strides", (1, 1))):
            three.add(epi)
    return every, three


def warm(device: torch.device, graph) -> None:
    """Compile now (a session's load) the Triton kernels the prior's forms of ``graph``'s
    convolutions run: Winograd's transforms and the product forms' epilogue (on GPUs the prior
    serves: compute capability 9)."""
    if device.type != "cuda" or _major(device) != 9:
        return
    every, three = epilogues(graph)
    winograd.warm(device, three)
    conv_epilogue.warm(device, every)


def windows(x, k, stride, padding, merged: bool = False) -> torch.Tensor:
    """The unfolded windows of ``x`` [n, c, h, w] for a ``k`` kernel: ``[n, c*kh*kw, L]``, or with
    ``merged`` the images side by side ``[c*kh*kw, n*L]``; in (c, kh, kw) order, as ``F.unfold``
    and ``w.reshape(out, -1)``. One strided copy over the padded input (``F.unfold`` on CUDA
    launches an im2col kernel per image: 16 launches at batch 16, then a copy to merge them)."""
    ph, pw = padding
    xp = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    n, c, hp, wp = xp.shape
    (kh, kw), (sh, sw) = k, stride
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    sn, sc, sy, sx = xp.stride()
    if merged:
        v = xp.as_strided((c, kh, kw, n, ho, wo), (sc, sy, sx, sn, sy * sh, sx * sw))
        return v.reshape(c * kh * kw, n * ho * wo)
    v = xp.as_strided((n, c, kh, kw, ho, wo), (sn, sc, sy, sx, sy * sh, sx * sw))
    return v.reshape(n, c * kh * kw, ho * wo)


def _epilogue(y, z, relu):
    """The residual and the ReLU after a convolution's own call, in place on its NCHW output."""
    if z is None and not relu:
        return y
    n, c = y.shape[:2]
    flat = y.view(n, c, -1)
    bias_add_relu(flat, None, None if z is None else z.reshape(n, c, -1), relu, out=flat)
    return y


def _run(form, x, w, b, stride, padding, relu, z, cudnn):
    if form == "cudnn":
        return cudnn()
    if form == "winograd":
        return winograd.conv3x3(x, w, b, padding, relu, z)
    n, cout = x.shape[0], w.shape[0]
    merged, split = "_merged" in form, form.endswith("_split")
    if form.startswith("gemm"):
        xs = x if stride == (1, 1) else x[:, :, ::stride[0], ::stride[1]]
        ho, wo = xs.shape[2], xs.shape[3]
        cols = xs.reshape(n, xs.shape[1], ho * wo)  # a copy only when strided
    else:
        ho, wo = _out_hw(x, w, stride, padding)
        cols = windows(x, tuple(w.shape[2:]), stride, padding, merged=merged)
    w2 = w.reshape(cout, -1)
    if merged:  # the images side by side: [K, n*L], one product, back to NCHW
        if form.startswith("gemm"):
            cols = cols.transpose(0, 1).reshape(cols.shape[1], n * ho * wo)
        prod = split_tf32.weight_left_product(w, cols) if split else torch.mm(w2, cols)
        src = prod.view(cout, n, ho * wo).transpose(0, 1)  # [n, cout, L], strided
        y = torch.empty(n, cout, ho, wo, dtype=x.dtype, device=x.device)
    else:
        if split:
            src = split_tf32.weight_left_product(w, cols)
        else:
            src = torch.mm(w2, cols[0]).unsqueeze(0) if n == 1 else torch.matmul(w2, cols)  # [n, cout, L]
        y = src.view(n, cout, ho, wo)  # the epilogue in place
    zf = None if z is None else z.reshape(n, cout, ho * wo)
    bias_add_relu(src, b, zf, relu, out=y.view(n, cout, ho * wo))
    return y
