"""Products by a constant matrix on CPU through oneDNN with the weight in its packed layout.

torch's CPU ``F.linear`` / ``matmul`` go to MKL, which on the AMD CPU measured here runs a
fraction of its speed (2 threads, 768 -> 3072: 4 rows 503 us against 110 through oneDNN with a
packed weight, 1 row 178 against 81, 256 rows 6.4 ms against 5.3; one row with the weight read
from memory at 12-16 GB/s against 20-23; ``benchmarks/packed_linear.py``). On Intel CPUs MKL
keeps its fast paths and this stays off (``available``). oneDNN wants the weight reordered into
its blocked layout once (OpenVINO's reordered-weights cache; the update_weights step): the
packed copy is made at load (``pack``) and kept beside the plain one, which the interpreter, the
unfused nodes and the static impls' traces still read. One packed layout serves every row count
(packed for 2 or more rows; the layout packed for 1 row is 2-3x slower at 4).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from . import native
from .fused import _linear_infer
from .registry import op
from .weight_cache import WeightCache

DOMAIN = "com.dynashape"
_PACKED = WeightCache()  # per weight and transposed or not: its packed copy
# products by a packable weight that a trace (a static impl's build) saw as plain products: a CPU
# build leaves such a region to the specialised source, which keeps the packed product (inductor's
# own call would be MKL's again)
traced_packable = 0
ROWS_HINT = 64  # the row count the layout is chosen for: any of 2.. gave the same layout
# oneDNN's call costs ~15 us more than MKL's: below 2^18 weights (256 x 1024) MKL's product is as
# fast or faster at every row count measured (1-256); up to 2^19 a single row still is
MIN_WEIGHT = 1 << 18
MIN_WEIGHT_ONE_ROW = 1 << 19
# oneDNN makes a primitive (JIT code) for every new (rows, in, out, bias): 0.1-0.8 ms, 3-7x the
# product itself (768 x 768 at 3-128 rows). A row count's first product takes MKL's path; oneDNN
# from its second on (as static impls are built when a key comes back): a shape seen once pays no
# compiling, and the first call at a new shape stays near its steady time
_SEEN: set[tuple] = set()
MAX_SEEN = 4096


def cpu_vendor() -> str:
    """The CPU's vendor id as Linux reports it (``GenuineIntel``, ``AuthenticAMD``, ...), or ""."""
    return native.cpuinfo("vendor_id")


def available() -> bool:
    """Whether products by constant weights go through oneDNN's packed linear here.
    DYNASHAPE_CPU_PACKED_WEIGHTS: "1" on, "0" off, "auto" (default) on except on Intel CPUs, where
    MKL keeps its fast paths: on a Xeon of the device machine (2 threads) oneDNN's packed product
    took 0.6-1.7x MKL's time over the same shapes, slower at one row; on the AMD EPYC measured,
    MKL's took 1.2-6x oneDNN's (``benchmarks/results/packed_linear_*_2026-11-26.json``)."""
    mode = os.environ.get("DYNASHAPE_CPU_PACKED_WEIGHTS", "auto").lower()
    if mode == "0" or (mode == "auto" and cpu_vendor() == "GenuineIntel"):
        return False
    mk = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and mk is not None and hasattr(mk, "_reorder_linear_weight")
            and hasattr(mk, "_linear_pointwise"))


def packable(w: torch.Tensor) -> bool:
    return w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2 and w.numel() >= MIN_WEIGHT


def pack(w: torch.Tensor, transposed: bool) -> torch.Tensor:
    """oneDNN's packed copy of ``w`` ([out, in], or [in, out] when ``transposed``), made once."""
    def make():
        return torch.ops.mkldnn._reorder_linear_weight((w.t() if transposed else w).contiguous(), ROWS_HINT)
    return _PACKED.get(w, make, slot=bool(transposed))


def _seen_before(x: torch.Tensor, weight: torch.Tensor, bias) -> bool:
    """Whether a product of these rows by a weight of this shape ran before (else it is noted)."""
    key = (x.numel() // max(1, x.shape[-1]), tuple(weight.shape), bias is not None)
    if key in _SEEN:
        return True
    if len(_SEEN) >= MAX_SEEN:
        _SEEN.clear()
    _SEEN.add(key)
    return False


def _onednn(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _infer(shapes, values, *, transposed=0):
    w = shapes[1]
    return _linear_infer(shapes, values) if not transposed else _linear_infer([shapes[0], (w[1], w[0])], values)


@op("PackedLinear", 1, DOMAIN, infer=_infer, writes_out=False,
    notes="x @ W.T + bias on CPU through oneDNN with the constant weight packed once (cpu_packed_linear)")
def _packed_linear(x, weight, bias=None, *, transposed=0, out=None):
    if type(x) is torch.Tensor and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 2 and (
            weight.numel() >= MIN_WEIGHT_ONE_ROW or x.numel() > x.shape[-1]) and _seen_before(x, weight, bias):
        return _onednn(x, pack(weight, bool(transposed)), bias)
    # a trace (fake or functional tensors: a static impl's build), one row by a mid-sized weight, or
    # another input: the plain product
    if type(x) is not torch.Tensor and packable(weight):
        global traced_packable
        traced_packable += 1
    return F.linear(x, weight.t() if transposed else weight, bias)
