"""Dense float32 convolutions on the CPU in C (``csrc/conv_nhwc.c``), for any input size with nothing
built per size.

Why not oneDNN, torch's CPU convolution: it builds a primitive (kernels JIT-compiled for the
shapes) for every input size a convolution meets, 0.6-3.6 ms a layer on this project's 2-core
Xeon, and then costs 30-90 us a call before any arithmetic. A detection or OCR service sees a new
image size on most calls, and small images where the fixed cost is most of the work (YOLOv8n at
96x96: 7.8 ms a call against onnxruntime's 1.9 before this path; its MLAS kernels take any shape).
The C tile (a register block of output pixels x 32 output channels fed by broadcast input values,
the form of MLAS's and XNNPACK's direct convolutions) needs only its weight packed once; on an
AVX-512 CPU it runs within 5-12% of oneDNN's kernels on large layers and faster on small ones
(``benchmarks/conv_dense.py``). Which path serves a call is ``ops/cpu_conv.py``'s choice
(``bound_conv2d_act``): the tile at a shape new to the convolution and, on AVX-512, at small ones;
oneDNN for large shapes that come back.

Per call the Python side does what a shape needs once per shape: the C arguments of each input
shape (and thread count) are kept in one int64 array, so a call is a dictionary lookup, the output's
allocation and one foreign call (~5 us of host time where the first form took ~12).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import native

# the activations the tile applies (csrc/conv_nhwc.c ``act``): the float models' ones (onnxruntime's
# bits are not asked of them; under ``exact`` ORT_ACTIVATIONS take oneDNN's path and ort_math)
ACTS = {"none": 0, "relu": 1, "hardswish": 2, "swish": 3, "sigmoid": 4, "leaky_relu": 5}
COUNTER = "conv_dense_c"
# channels up to which a [n][c][h][w] image is read as it is (a network's input: 1-4 channels), its
# channels gathered into pixels by the padded copy the tile makes anyway; wider ones are transposed
# to channels-last first (a gather over many planes per pixel is slower than torch's transposition)
PLANAR_MAX_C = 8
DEPTHWISE_COUNTER = "conv_depthwise_c"
_LANES = 16


@functools.cache
def everywhere() -> bool:
    """Whether the tile serves a convolution's small shapes when they come back, not only the shapes
    new to it: on an AVX-512 CPU (its 32 vector registers hold the 24 accumulators of a 12-pixel
    tile). With 16 registers the tile is a quarter of that and oneDNN's kernels are faster at any
    shape that comes back."""
    return "avx512f" in native.cpuinfo("flags").split()


def pixel_stride(x) -> int | None:
    """The floats between two pixels of ``x`` where its pixels are rows of channels in memory
    (channels-last, or a channel slice of a channels-last image: YOLO's C2f blocks split their
    channels in two), else None."""
    n, c, h, w = x.shape
    s0, s1, s2, s3 = x.stride()
    if (s1 != 1 and c > 1) or s3 < c or (s2 != w * s3 and h > 1) or (s0 != h * w * s3 and n > 1):
        return None
    return s3


class DenseConv:
    """One convolution's tile: its weight packed ([oc / 16][kh][kw][c][16], made at the first call
    and again after a write to the weight), its bias, and the C arguments per input shape."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, stride, padding, dilation, act: int,
                 alpha: float = 0.0, affine: tuple[float, float] | None = None) -> None:
        self.w, self.version, self.packed = w.detach(), -1, None
        self.b = b.detach().contiguous() if b is not None else None
        self.conv = tuple(stride) + tuple(padding) + tuple(dilation)
        self.act, self.affine = act, int(affine is not None)
        scale, shift = affine if affine is not None else (1.0, 0.0)
        self.floats = (ctypes.c_double * 3)(alpha, scale, shift)
        self.floats_ptr = ctypes.addressof(self.floats)
        self.b_ptr = self.b.data_ptr() if self.b is not None else None
        self.packed_ptr = 0
        self.plans: dict = {}

    RUN, COUNTER = 0, COUNTER  # its C function in _functions(), its counter
    PLANAR = True  # takes a [n][c][h][w] image as it is (conv_nhwc.c ``padded``), channels up to PLANAR_MAX_C

    def weight(self) -> int:
        """The packed weight's address (packed at the first call and again after a write to the
        weight)."""
        if self.packed is None or self.w._version != self.version:
            self.packed = self._pack(self.w.contiguous())
            self.version = self.w._version
            self.packed_ptr = self.packed.data_ptr()
        return self.packed_ptr

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        oc, c, kh, kw = w.shape
        packed = torch.empty(-(-oc // _LANES) * kh * kw * c * _LANES, dtype=torch.float32)
        _functions()[1](w.data_ptr(), packed.data_ptr(), oc, c, kh, kw)
        return packed

    def _plan(self, x, xs: int, threads: int, planar: int = 0):
        n, c, h, wd = x.shape
        oc, _, kh, kw = self.w.shape
        sh, sw, ph, pw, dh, dw = self.conv
        ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        args = (ctypes.c_int64 * 21)(n, h, wd, c, xs, oc, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, oc, self.act,
                                     threads, self.affine, planar)
        if len(self.plans) >= 256:  # sizes that never repeat: forget them all at once
            self.plans.clear()
        plan = self.plans[(x.shape, xs, threads, planar)] = ((n, oc, ho, wo), (ho * wo * oc, 1, wo * oc, oc),
                                                             ctypes.addressof(args), args)
        return plan

    def __call__(self, x):
        """The convolution, activation and affine of ``x`` (float32, 4-D, on the CPU), channels-last; None
        where the C kernel cannot be built (counted as ``conv_dense_torch_fallbacks``) or its
        padded copy could not be allocated: the caller's oneDNN path serves."""
        fns = _functions() if native.enabled() else None
        if fns is None:
            native.count("conv_dense_torch_fallbacks")
            return None
        wp = self.weight()
        xs = pixel_stride(x)
        planar = 0
        if xs is None:
            if self.PLANAR and x.shape[1] <= PLANAR_MAX_C and x.is_contiguous():
                planar, xs = 1, x.shape[1]  # the C side gathers the channels as it pads: no transposition
            else:
                x = x.contiguous(memory_format=torch.channels_last)
                xs = x.shape[1]
        threads = torch.get_num_threads()
        plan = self.plans.get((x.shape, xs, threads, planar)) or self._plan(x, xs, threads, planar)
        y = torch.empty_strided(plan[0], plan[1], dtype=torch.float32)
        if fns[self.RUN](x.data_ptr(), y.data_ptr(), wp, self.b_ptr, plan[2], self.floats_ptr):
            return None
        native.count(self.COUNTER)
        return y


class DepthwiseConv(DenseConv):
    """A depthwise convolution's tile (one group per channel, ``w`` of [c, 1, kh, kw]): the channels
    are the vector lanes, a tile is 8 pixels of 16 channels (csrc/conv_nhwc.c ``dw_nhwc_run``); the
    weight packed as [kh][kw][c rounded up to 16]."""

    RUN, COUNTER, PLANAR = 2, DEPTHWISE_COUNTER, False

    def _pack(self, w: torch.Tensor) -> torch.Tensor:
        c, _, kh, kw = w.shape
        packed = torch.empty(kh * kw * (-(-c // _LANES) * _LANES), dtype=torch.float32)
        _functions()[3](w.data_ptr(), packed.data_ptr(), c, kh, kw)
        return packed


_FNS: list = []


def _functions():
    """(conv_nhwc_run, conv_nhwc_pack, dw_nhwc_run, dw_nhwc_pack) of the built library, found once a
    process; None where it cannot be built."""
    if not _FNS:
        fns = (native.function("conv_nhwc", "conv_nhwc_run", "pppppp", ctypes.c_int64),
               native.function("conv_nhwc", "conv_nhwc_pack", "ppiiii"),
               native.function("conv_nhwc", "dw_nhwc_run", "pppppp", ctypes.c_int64),
               native.function("conv_nhwc", "dw_nhwc_pack", "ppiii"))
        _FNS.append(None if None in fns else fns)
    return _FNS[0]
