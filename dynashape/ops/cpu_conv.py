"""2-D convolutions on the CPU where torch's call costs more than the arithmetic.

torch's CPU convolution (oneDNN) costs ~35 us a call before any arithmetic (measured here with
2 threads: a depthwise 3x3 of 8 channels at 24x96, 0.17M multiply-adds, 37 us). The
squeeze-and-excitation blocks of MobileNet-style networks (the OCR, orientation and detection
models PyPI packages ship) apply two 1x1 convolutions to a 1x1 image after a global pool: a
matrix product of the (N, C) rows, which ``addmm`` does in ~5 us (PaddleOCR's direction
classifier has 18 of them a call: 42 us each as convolutions). Everything else is torch's conv2d.

A depthwise convolution in C was tried twice against oneDNN at repeated shapes and dropped (it
won only below ~3M multiply-adds, by ~20 us a layer). At a shape new to the convolution it is kept
(``csrc/depthwise.c``): there oneDNN first builds a primitive (0.1-0.3 ms), which the C loop does
not need; PP-OCRv4 det at 96-160 pixel images, each new: 15-19 -> 10-14 ms a call.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from . import cpu_conv_dense, native, ort_math
from .weight_cache import WeightCache


def conv2d(x, w, b, stride, padding, dilation, groups):
    """torch.conv2d(x, w, b, stride, padding, dilation, groups); a 1x1 convolution of a 1x1 image
    as a matrix product on the CPU."""
    if serves(x, w, b, padding, groups):
        return pooled_1x1(x, w, b)
    return torch.conv2d(x, w, b, stride, padding, dilation, groups)


def serves(x, w, b, padding, groups) -> bool:
    """A CPU float 1x1 convolution of a 1x1 image, one group, no padding."""
    return (x.device.type == "cpu" and x.dim() == 4 and x.shape[2] == x.shape[3] == 1 and x.dtype == w.dtype
            and _one_by_one(w, b, padding, groups))


def _one_by_one(w, b, padding, groups) -> bool:
    """A float 1x1 weight of one group, no padding, the bias of its dtype."""
    return (groups == 1 and w.dim() == 4 and w.shape[2] == w.shape[3] == 1 and not _padded(padding)
            and (b is None or b.dtype == w.dtype) and w.dtype.is_floating_point)


def pooled_1x1(x, w, b):
    """The convolution ``serves`` takes, as the product of the (N, C) rows with W (O, C) transposed
    (stride and dilation do not matter for a 1x1 kernel on a 1x1 image). The product reads W as a
    [C, O] copy made once (``_ROWS_BY_W``): at a few rows it streams the weight row by row, where the
    transposed view had MKL read it column-wise, 280 -> 167 us for PP-LCNet's last convolution (512 ->
    1280, its weight out of cache as it is at that point of a call) and 55 -> 46 us in cache, on a
    2-core EPYC. The copy is held beside the weight: one more copy of each such weight (squeeze-excite
    and classifier-head convolutions)."""
    rows = x.reshape(x.shape[0], x.shape[1])
    o, c = w.shape[0], w.shape[1]
    wt = _ROWS_BY_W.get(w, lambda: w.detach().reshape(o, c).t().contiguous())
    y = torch.addmm(b, rows, wt) if b is not None else torch.mm(rows, wt)
    return y.reshape(x.shape[0], o, 1, 1)


_ROWS_BY_W = WeightCache()  # a pooled 1x1 convolution's weight as [C, O], for pooled_1x1


def _padded(padding) -> bool:
    if isinstance(padding, str):
        return padding != "valid"
    return any(padding) if isinstance(padding, (tuple, list)) else bool(padding)


# the activations oneDNN applies inside a convolution (its post-ops, as torch names them), and what
# they are, for a call oneDNN does not take: (y, scalars, algorithm) -> activation(y)
ACTIVATIONS = {
    "none": lambda y, s, a: y,
    "relu": lambda y, s, a: torch.relu(y),
    "sigmoid": lambda y, s, a: ort_math.sigmoid(y),
    "tanh": lambda y, s, a: ort_math.tanh(y),
    "hardswish": lambda y, s, a: F.hardswish(y),
    "hardsigmoid": lambda y, s, a: F.hardsigmoid(y),
    "swish": lambda y, s, a: ort_math.silu(y),
    "gelu": lambda y, s, a: F.gelu(y, approximate="tanh" if a == "tanh" else "none"),
    "leaky_relu": lambda y, s, a: F.leaky_relu(y, s[0]),
    "hardtanh": lambda y, s, a: torch.clamp(y, s[0], s[1]),
}

# the same, over a fresh result of ours in place (the product's: no second tensor to allocate and
# fault in); GELU has no in-place form and takes ACTIVATIONS'
IN_PLACE = {
    "none": lambda y, s, a: y,
    "relu": lambda y, s, a: y.relu_(),
    "sigmoid": lambda y, s, a: ort_math.sigmoid(y, out=y),
    "tanh": lambda y, s, a: ort_math.tanh(y, out=y),
    "hardswish": lambda y, s, a: F.hardswish(y, inplace=True),
    "hardsigmoid": lambda y, s, a: F.hardsigmoid(y, inplace=True),
    "swish": lambda y, s, a: ort_math.silu(y, out=y),
    "leaky_relu": lambda y, s, a: F.leaky_relu_(y, s[0]),
    "hardtanh": lambda y, s, a: y.clamp_(s[0], s[1]),
}

# computed after the convolution by ort_math (onnxruntime's functions, bit for bit), not inside it,
# where the model quantizes (``exact``: a value a rounding step reads must have onnxruntime's bits);
# in a float model oneDNN's post-op applies them (one pass over the output fewer: YOLOv8n's SiLUs
# 10-30% of its CPU time)
ORT_ACTIVATIONS = frozenset({"sigmoid", "tanh", "swish"})
# torch's in-place forms for a fresh product's result where the model does not need onnxruntime's bits
FAST_IN_PLACE = {"sigmoid": lambda y, s, a: y.sigmoid_(), "tanh": lambda y, s, a: y.tanh_(),
                 "swish": lambda y, s, a: F.silu(y, inplace=True)}


def onednn_fuses() -> bool:
    """Whether torch has oneDNN's convolution with a post-op (``_convolution_pointwise``)."""
    mk = getattr(torch.ops, "mkldnn", None)
    return torch.backends.mkldnn.is_available() and mk is not None and hasattr(mk, "_convolution_pointwise")


def conv2d_act(x, w, b, stride, padding, dilation, groups, activation, scalars, algorithm, exact: bool = True):
    """activation(conv2d(x, w, b, ...)): on the CPU oneDNN applies the activation to each block of
    the output while it is still in registers (one pass over the output fewer)."""
    if serves(x, w, b, padding, groups):
        return ACTIVATIONS[activation](pooled_1x1(x, w, b), scalars, algorithm)
    if (type(x) is torch.Tensor and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 4
            and w.dtype == x.dtype and (b is None or b.dtype == x.dtype)):
        if exact and activation in ORT_ACTIVATIONS:  # oneDNN's own sigmoid / tanh are not onnxruntime's bits
            y = torch.ops.mkldnn._convolution_pointwise(x, w, b, padding, stride, dilation, groups, "none", [], "")
            return ACTIVATIONS[activation](y, scalars, algorithm)
        return torch.ops.mkldnn._convolution_pointwise(x, w, b, padding, stride, dilation, groups, activation,
                                                       scalars, algorithm)
    return ACTIVATIONS[activation](torch.conv2d(x, w, b, stride, padding, dilation, groups), scalars, algorithm)


# oneDNN's convolution costs ~28 us a call before any arithmetic (an 8 -> 8 1x1 of a 4x4 image, packed
# weight, 1 or 2 threads); the product of a 1x1's pixel rows by the weight (MKL) ~3 us: below ~2M
# multiply-adds the product and then the activation were faster (1 x 64 x 6 x 24 -> 64 with
# HardSwish 25 against 52 us, 1 x 96 x 3 x 12: 14 against 56), above ~4M oneDNN (12.8M: 150-190
# against 175-230)
SMALL_PRODUCT = 1 << 21

# oneDNN makes a primitive (its kernels JIT-compiled for the problem, shapes included) for every
# input shape a convolution meets; it costs 0.1-0.3 ms a convolution (oneDNN's verbose create
# times, 2 threads, the OCR and YOLO models' convolutions at 96-640 pixel images), as much as
# the arithmetic of most of them, and none of oneDNN's convolutions takes a shape at run time.
# A 1x1 of stride 1 is a product of the pixel rows by the weight, which MKL runs at any shape
# with nothing to build; at a repeated shape oneDNN's fused call was 0-47% faster (1x1 of
# 10-90M multiply-adds with HardSwish: 0.14-0.61 ms against 0.18-0.65 for the product and the
# activation). So such a 1x1 runs as the product at a shape new to it, and through oneDNN once
# the shape comes back: a primitive only for a shape that repeats (``NEW_SHAPE_PRODUCTS`` counts
# the calls the product took for that reason). The shapes are remembered up to SEEN_SHAPES a
# convolution (oneDNN's own primitive cache holds 1024), then forgotten all at once. Only below
# NEW_SHAPE_PRODUCT_MAX multiply-adds: above, the product's extra time passes the primitive's
# (PP-OCRv4 rec's 1x1s at batches up to 47: its new sizes' first calls took 6-9% more process
# CPU time with every 1x1 a product there, 2 runs each; at 36M the product lost 0.01-0.06 ms).
SEEN_SHAPES = 1024
NEW_SHAPE_PRODUCT_MAX = 1 << 25
NEW_SHAPE_PRODUCTS = "conv_1x1_new_shape_products"

# the image side the weight is reordered for (``PackedWeight.representative``)
REPRESENTATIVE_SIDE = 32


class PackedWeight:
    """One convolution's constant weight reordered once into oneDNN's blocked layout, for every input
    size.

    A convolution given the weight as the model has it reorders it into oneDNN's blocked layout at
    every call: at small images that is most of the call (measured on this project's CPU, 2
    threads, with a HardSwish post-op: a 512 -> 512 1x1 at 7x7, 465 us against 162 with the
    weight reordered once; depthwise 5x5 of 256 channels at 14x14, 77 against 48). oneDNN's weight
    layouts do not depend on the image's size, but which one a convolution picks does, a little:
    its blocking of the output channels (Acdb16a/32a/48a/64a for the brgemm kernels of an AVX-512
    CPU) follows the number of pixels. Over the sizes measured (oneDNN verbose, 2 threads, channels-
    last inputs of 2x7 to 640x640 pixels, batches 1-5) each convolution picked one layout everywhere
    but at feature maps of a few hundred pixels or less, where some took a smaller block; a weight
    reordered for a 32x32 image of batch 1 served every convolution call of PP-OCRv4 det, rec, the PP
    mobile classifier and YOLOv8n over 11 calls at new sizes (96-640, batches 1-47) but 5 of 429, 8
    of 366, 0 of 297 and 30 of 643 (``benchmarks/conv_weight_reorders.py``, Xeon with AVX-512, 2
    threads), which oneDNN then reorders itself; with a copy per input shape it reordered all of
    them (every size was new). So: one copy per weight, made at its first call
    (an explicit reorder, counted as ``conv_weight_reorders`` in native.counters()), none per input
    shape, and no copies budget to keep. A write to the weight (its version) makes it again. (The
    pick depends on the thread count too: under another torch.get_num_threads() oneDNN reorders
    where it differs, as for a size.)"""

    def __init__(self, w: torch.Tensor, padding, stride, dilation, groups: int) -> None:
        self.w, self.version = w.detach(), w._version
        self.args = (list(padding), list(stride), list(dilation), groups)
        self.packed: torch.Tensor | None = None
        self.raw_rate: float | None = None  # seconds per multiply-add of a call with the weight as given
        self.raw_rows: list[tuple[int, int]] = []  # row counts where the reordered copy was found slow

    def representative(self) -> list[int]:
        """The input size the layout is picked for: batch 1, the weight's input channels, a
        REPRESENTATIVE_SIDE square, or the kernel's dilated extent where that is larger."""
        cin = self.w.shape[1] * self.args[3]
        sides = [max(REPRESENTATIVE_SIDE, (k - 1) * d + 1) for k, d in zip(self.w.shape[2:], self.args[2])]
        return [1, cin, *sides]

    def get(self) -> torch.Tensor:
        """The reordered weight, made at the first call and again after a write to the weight."""
        if self.packed is None or self.w._version != self.version:
            self.version = self.w._version
            self.packed = torch.ops.mkldnn._reorder_convolution_weight(self.w.contiguous(), *self.args,
                                                                       self.representative())
            native.count("conv_weight_reorders")
        return self.packed

    # Where oneDNN picks another layout than the copy's, it reorders the copy again in the call, and
    # from a blocked layout that is slow: measured here (2 threads, a GELU post-op) a 192 -> 384 1x1
    # at 15x10 and 20x20 pixels took 1.7-1.9 ms with the copy against 0.13-0.28 with the weight as the
    # model has it, a 384 -> 768 one 6.4 ms against 0.23 with a copy made for 8x8; elsewhere the copy
    # was 1.1-1.6x faster. Which sizes miss is not monotonic, and oneDNN's layouts cannot be read from
    # Python; so each call is timed (two clock reads) and a call SLOW_FACTOR slower than the weight as
    # given would have been (its rate, taken at the convolution's first call) sends the row counts
    # within a factor of 2 of it to the weight as given: one slow call per such range at most.
    # PP-OCRv6 det at 480x320 took 151 ms a call against OpenVINO's 40 before this.
    SLOW_FACTOR = 3.0
    SLOW_FLOOR_S = 1e-4  # below this a call's time is oneDNN's overhead, not a layout's
    MAX_RANGES = 16  # then every call takes the weight as given

    def weight_for(self, rows: int) -> tuple[torch.Tensor, bool]:
        """The weight a call of ``rows`` output rows (batch x pixels) takes, and whether it is the
        reordered copy: the weight as given for the first call (its rate timed) and for row counts
        where the copy was found slow."""
        if self.raw_rate is None or len(self.raw_rows) >= self.MAX_RANGES or any(
                lo <= rows <= hi for lo, hi in self.raw_rows):
            return self.w, False
        return self.get(), True

    def timed(self, rows: int, macs: int, seconds: float, packed: bool) -> None:
        """What a call took: the first sets the rate of the weight as given; a call with the copy
        much slower than that rate marks its row counts (counted as ``conv_packed_weight_misses``)."""
        if not packed:
            if self.raw_rate is None and macs > 0:
                self.raw_rate = seconds / macs
            return
        if seconds > self.SLOW_FLOOR_S and seconds > self.SLOW_FACTOR * self.raw_rate * macs:
            self.raw_rows.append((rows // 2, rows * 2))
            native.count("conv_packed_weight_misses")


def _first_sight(seen: set, shape, counted: str | None = NEW_SHAPE_PRODUCTS) -> bool:
    """Whether ``shape`` is new to the convolution that keeps ``seen`` (then remembered, and the
    call counted as ``counted``)."""
    if shape in seen:
        return False
    if len(seen) >= SEEN_SHAPES:
        seen.clear()
    seen.add(shape)
    if counted:
        native.count(counted)
    return True


# the activations the C depthwise pass applies (csrc/depthwise.c)
DEPTHWISE_ACTS = {"none": 0, "relu": 1, "hardswish": 2}
NEW_SHAPE_DEPTHWISE = "conv_depthwise_new_shape_c"


def _depthwise(x, w, b, stride, padding, act: int, cache: list):
    """A depthwise convolution of channels-last ``x`` in C (csrc/depthwise.c), or None where the C
    kernel cannot be built (counted as ``depthwise_torch_fallbacks``: oneDNN serves)."""
    fn = native.function("depthwise", "dw_conv_nhwc", "ppppiiiiiiiiiiiiii", fallbacks="depthwise")
    if fn is None:
        return None
    if cache[0] != w._version:
        cache[:] = [w._version, w.detach()[:, 0].permute(1, 2, 0).contiguous()]  # [kh][kw][c]
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    (sh, sw), (ph, pw) = stride, padding
    ho, wo = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    y = torch.empty((n, c, ho, wo), dtype=x.dtype, memory_format=torch.channels_last)
    bc = b.contiguous() if b is not None else None
    fn(x.data_ptr(), y.data_ptr(), cache[1].data_ptr(), bc.data_ptr() if bc is not None else None, n, h, wd, c, kh, kw,
       sh, sw, ph, pw, ho, wo, act, torch.get_num_threads())
    native.count(NEW_SHAPE_DEPTHWISE)
    return y


# a dense convolution at a shape that comes back, from this many multiply-adds, is oneDNN's: there
# its primitive exists and its kernels are faster than the tile's on large layers (in the models,
# repeated shapes, one process, the two paths alternated: PP-OCRv4 rec at 16x3x48x320, its 240 ->
# 240 1x1s of 0.9G multiply-adds, 143 ms with oneDNN's against 163; YOLOv8n at 640x640 49 against
# 51); below, the tile is faster in the model (YOLOv8n 320x320: 16.2 against 18.1 ms; 160x224: 7.9
# against 8.7; PP-OCRv4 det 320x480: 24.8 against 26.2), where oneDNN's call costs 30-90 us before
# any arithmetic and the weights of many layers pass through the caches in turn
DENSE_ONEDNN_MACS = 1 << 27
# ... and at a shape new to it from this many: oneDNN's primitive costs 0.6-2 ms to build, the tile
# loses 5-25% of the kernel's time on large layers (PP-OCRv4 rec's 240 -> 240 1x1 at 36x12x152,
# 3.8G multiply-adds: 34 ms against 27-28 ms, the first call included)
DENSE_NEW_SHAPE_MACS = 1 << 29
# a depthwise convolution's tile (cpu_conv_dense.DepthwiseConv) at a shape that comes back, below
# this many multiply-adds (on AVX-512): 1.3-3.6x oneDNN's call at 0.1-2M (PP-LCNet's layers at small
# crops: oneDNN's call costs ~40 us before any arithmetic), 0.95x at 2.6M, 0.3-0.7x from 5M up
# where the tile's widened copy and its reloads of each input vector per tap cost more (2 threads)
DEPTHWISE_TILE_MACS = 1 << 21
# ... and at a shape new to the convolution below this many; above, up to NEW_SHAPE_PRODUCT_MAX, the
# plain C loop (csrc/depthwise.c, ``_depthwise``), which reads the image in place where the tile
# copies it into a zero border with whole blocks of channels (on an AMD EPYC Zen 4, 2 threads, the
# tile took 221-617 us on PP-LCNet's layers at batches 8-24, oneDNN's warm kernel 143-215). PP
# mobile cls at a new batch (1-47) every call, 24 calls, 3 runs each: 508 ms (453-529) with 4M
# against 610 (553-716) with the tile up to 32M, 522 with 2M, 555 with depthwise.c at every new
# shape; PP-OCRv4 det the same (674-808 against 685-785), PP-OCRv4 rec 2.5% faster
DEPTHWISE_NEW_SHAPE_MACS = 1 << 22


def affine_in_place(affine: tuple[float, float] | None):
    """``y -> scale * y + shift`` written over ``y`` in one pass (the identity for None)."""
    if affine is None:
        return lambda y: y
    scale, shift = affine
    shift_t = torch.tensor(shift, dtype=torch.float32)
    return lambda y: torch.add(shift_t, y, alpha=scale, out=y)


def bound_conv2d_act(w, b, stride, padding, dilation, groups, activation, scalars, algorithm, exact: bool = True,
                     affine: tuple[float, float] | None = None):
    """conv2d_act for one convolution's constant weight and bias: the weight reordered once for every
    input shape (``PackedWeight``); then ``scale * y + shift`` where ``affine`` is given (the C tile
    applies it to its registers, the other paths over their result)."""
    if not (onednn_fuses() and w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 4
            and (b is None or b.dtype == w.dtype)):
        return None
    packed = PackedWeight(w, padding, stride, dilation, groups)
    pooled = _one_by_one(w, b, padding, groups)  # on a 1x1 image: squeeze-excitation blocks' (serves)
    pointwise = pooled and all(v == 1 for v in stride)  # a 1x1 of stride 1: a product of the pixels' rows
    cin, cout = w.shape[1], w.shape[0]
    rows_by_w = [-1, None]  # (the weight's version, its [cin, cout] view or copy), made when first used
    act = ACTIVATIONS[activation]
    act_ = IN_PLACE.get(activation, act) if exact else FAST_IN_PLACE.get(activation, IN_PLACE.get(activation, act))
    ort_epilogue = exact and activation in ORT_ACTIVATIONS
    fused = torch.ops.mkldnn._convolution_pointwise
    seen: set = set()  # the input shapes oneDNN has run (or will run at their next call)
    explicit = len(padding) == 2 and not isinstance(padding, str)  # symmetric pads, no auto_pad string
    one_per_channel = groups > 1 and w.shape[1] == 1 and w.shape[0] == groups  # depthwise
    dw_act = DEPTHWISE_ACTS.get(activation)
    depthwise = dw_act is not None and one_per_channel and all(d == 1 for d in dilation) and explicit
    dw_weight = [-1, None]  # (the weight's version, its [kh][kw][c] copy), made when first used
    # the C tiles (cpu_conv_dense): activations of theirs, onnxruntime's bits not asked for
    tile_act = cpu_conv_dense.ACTS.get(activation) if not ort_epilogue and explicit else None
    dense = tile_act is not None and groups == 1
    alpha = float(scalars[0]) if activation == "leaky_relu" and scalars else 0.0
    tile = cpu_conv_dense.DenseConv(w, b, stride, padding, dilation, tile_act, alpha, affine) if dense else None
    dw_tile = (cpu_conv_dense.DepthwiseConv(w, b, stride, padding, dilation, tile_act, alpha, affine)
               if tile_act is not None and one_per_channel else None)
    taps = w.shape[2] * w.shape[3]
    post = affine_in_place(affine)
    macs_per_input = cout * taps  # a call's multiply-adds: x.numel() * this / strides

    def kernel(x, w_, b_=None, out=None):
        if w_ is not w or b_ is not b or type(x) is not torch.Tensor or x.dtype != torch.float32 or x.dim() != 4 \
                or x.device.type != "cpu" or (pooled and x.shape[2] == x.shape[3] == 1):
            return post(conv2d_act(x, w_, b_, stride, padding, dilation, groups, activation, scalars, algorithm,
                                   exact))
        macs = x.numel() * macs_per_input // (stride[0] * stride[1])  # this call's multiply-adds
        if dense and ((cpu_conv_dense.everywhere() and macs < DENSE_ONEDNN_MACS)
                      or (macs < DENSE_NEW_SHAPE_MACS and _first_sight(seen, x.shape, None))):
            y = tile(x)
            if y is not None:
                return y
        if pointwise and x.is_contiguous(memory_format=torch.channels_last) and (
                x.numel() * cout < SMALL_PRODUCT
                or (x.numel() * cout < NEW_SHAPE_PRODUCT_MAX and _first_sight(seen, x.shape))):
            n, _, h, wd = x.shape
            rows = x.permute(0, 2, 3, 1).reshape(-1, cin)  # channels-last: a view
            if rows_by_w[0] != w._version:
                rows_by_w[:] = [w._version, w.detach().reshape(cout, cin).t()]
            wt = rows_by_w[1]
            y = torch.addmm(b, rows, wt) if b is not None else torch.mm(rows, wt)
            return post(act_(y, scalars, algorithm)).view(n, h, wd, cout).permute(0, 3, 1, 2)
        if dw_tile is not None and x.shape[1] == groups:
            dw_macs = x.numel() * taps // (stride[0] * stride[1])
            if (cpu_conv_dense.everywhere() and dw_macs < DEPTHWISE_TILE_MACS) or (
                    dw_macs < DEPTHWISE_NEW_SHAPE_MACS and _first_sight(seen, x.shape, None)):
                y = dw_tile(x)
                if y is not None:
                    return y
        if depthwise and x.is_contiguous(memory_format=torch.channels_last) and x.shape[1] == groups \
                and x.numel() * w.shape[2] * w.shape[3] < NEW_SHAPE_PRODUCT_MAX and _first_sight(seen, x.shape, None):
            y = _depthwise(x, w, b, stride, padding, dw_act, dw_weight)
            if y is not None:
                return post(y)
        rows = x.shape[0] * x.shape[2] * x.shape[3]
        wp, is_packed = packed.weight_for(rows)
        if not is_packed and not x.is_contiguous(memory_format=torch.channels_last):
            # oneDNN lays its result out as its input with the weight as given, channels-last with the
            # copy: the later convolutions' channels-last paths must find the same layout either way
            x = x.contiguous(memory_format=torch.channels_last)
        t0 = time.perf_counter()
        if ort_epilogue:
            y = fused(x, wp, b, padding, stride, dilation, groups, "none", [], "")
        else:
            y = fused(x, wp, b, padding, stride, dilation, groups, activation, scalars, algorithm)
        packed.timed(rows, macs, time.perf_counter() - t0, is_packed)
        return post(act(y, scalars, algorithm)) if ort_epilogue else post(y)
    return kernel


def patch_transpose(x, w, b, kernel, stride, dilation, pads, output_padding, groups) -> torch.Tensor | None:
    """A CPU float32 2-D ConvTranspose whose kernel equals its stride (no overlap, no pads, one
    group): each input pixel writes its own kh x kw patch of the output, the product of the pixel
    rows by the weight (Cin, Cout*kh*kw) with the patches laid out after it (channels-last) and the
    bias added in that copy. torch's conv_transpose2d (oneDNN) makes a primitive and reorders the
    weight for every input shape: PP-OCRv4 det's two 2x2 upsamplings cost 1.5 ms more at a new size
    than at a repeated one (this project's 2-core CPU); the product builds nothing. Its calls are
    counted as ``conv_transpose_products``; None where it does not apply (torch's then)."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != x.dtype or x.dim() != 4 or groups != 1
            or list(kernel) != list(stride) or any(d != 1 for d in dilation) or any(pads)
            or any(output_padding) or (b is not None and b.dtype != x.dtype) or x.requires_grad):
        return None
    n, cin, h, wd = x.shape
    cout, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    rows = x.permute(0, 2, 3, 1).reshape(-1, cin)  # a view of a channels-last input
    y = torch.mm(rows, w.reshape(cin, cout * kh * kw))
    patches = y.view(n, h, wd, cout, kh, kw).permute(0, 1, 4, 2, 5, 3)  # (n, h, kh, w, kw, cout)
    out = torch.empty((n, h, kh, wd, kw, cout), dtype=x.dtype)
    if b is not None:
        torch.add(patches, b, out=out)
    else:
        out.copy_(patches)
    native.count("conv_transpose_products")
    return out.view(n, h * kh, wd * kw, cout).permute(0, 3, 1, 2)
