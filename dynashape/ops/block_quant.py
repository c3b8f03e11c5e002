"""Block-quantized weights (domain ``com.microsoft``): MatMulNBits and GatherBlockQuantized.

* MatMulNBits: the weights are unpacked and dequantized once, cached by tensor identity, and one
  float matmul runs per call. accuracy_level 4 with 4-bit weights in blocks of 32 and float32 A
  on the CPU (what onnxruntime-genai's builder makes) is onnxruntime's int8-activation kernel to
  the bit (nbits_int8.py: its quantization of A, lanes, fused multiply-adds and order); other
  level-4 cases quantize A to int8 per block the same way, then run the float matmul.
* GatherBlockQuantized: gather first, then (q - zero point) * scale per block of the gathered rows.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import torch

from ..errors import ShapeError
from . import native, nbits_f32, nbits_int8, nbits_triton
from .qlinear_arith import DOMAIN, _put
from .registry import COMPUTED, binder, op
from .shapes import norm_axis


# ---- MatMulNBits --------------------------------------------------------------------------------
def _nbits_infer(shapes, values, *, K, N, **_attrs):
    a = shapes[0]
    if len(a) < 1:
        raise ShapeError("MatMulNBits: A must have rank >= 1")
    if isinstance(a[-1], int) and a[-1] != K:
        raise ShapeError(f"MatMulNBits: A's last dim is {a[-1]}, attribute K is {K}")
    return [tuple(a[:-1]) + (N,)]


def _unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Values stored ``bits`` at a time along the last axis, lowest bits first, as uint8."""
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    v = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return v.reshape(*packed.shape[:-1], packed.shape[-1] * per)[..., :count]


_DEQUANT: OrderedDict = OrderedDict()  # key -> (source tensors, dequantized weight)
_DEQUANT_BYTES = [0]
_DEQUANT_BUDGET = 8 << 30


def _ident(t: torch.Tensor | None):
    return None if t is None else (t.data_ptr(), t._version, tuple(t.shape), t.dtype, str(t.device))


def _cached_weight(key, sources, build) -> torch.Tensor:
    """The dequantized weight of ``key`` (the weight tensors' identities: data pointer and version
    counter), built on first use. An entry keeps its source tensors alive, so that their memory
    cannot come back under another tensor with the same pointer and a fresh version while it exists."""
    hit = _DEQUANT.get(key)
    if hit is not None:
        _DEQUANT.move_to_end(key)
        return hit[1]
    w = build()
    _DEQUANT[key] = (sources, w)
    _DEQUANT_BYTES[0] += _nbytes(w)
    while _DEQUANT_BYTES[0] > _DEQUANT_BUDGET and len(_DEQUANT) > 1:
        _, (_, old) = _DEQUANT.popitem(last=False)
        _DEQUANT_BYTES[0] -= _nbytes(old)
    return w


def _nbytes(w) -> int:
    """A cached weight's size: a tensor, or nbits_int8.PackedB (several, counted by itself)."""
    return w.nbytes if isinstance(w, (nbits_int8.PackedB, nbits_f32.PackedF32)) else w.numel() * w.element_size()


def _nbits_packed(b, scales, zero_points, k, n, bits, block_size) -> nbits_int8.PackedB:
    """The weight as onnxruntime's int8-activation kernel reads it (nbits_int8.py)."""
    nb = -(-k // block_size)
    raw = _unpack_bits(b.reshape(n, nb, -1), bits, block_size)
    zp = None if zero_points is None else _unpack_bits(zero_points.reshape(n, -1), bits, nb)
    return nbits_int8.PackedB(raw, scales, zp)


def _int8_weight(b, scales, zero_points, k: int, n: int) -> nbits_int8.PackedB:
    """The weight packed for onnxruntime's int8 kernel, cached by the tensors' identity (the op's path
    and its bound form share the entry)."""
    return _cached_weight(("int8", _ident(b), _ident(scales), _ident(zero_points), k, n), (b, scales, zero_points),
                          lambda: _nbits_packed(b, scales, zero_points, k, n, 4, nbits_int8.BLOCK))


def _f32_weight(b, scales, zero_points, k: int, n: int, block_size: int) -> nbits_f32.PackedF32:
    """The weight packed for the CPU's float32 kernel, cached by the tensors' identity (shared as above)."""
    return _cached_weight(("f32", _ident(b), _ident(scales), _ident(zero_points), k, n, block_size),
                          (b, scales, zero_points), lambda: _nbits_packed_f32(b, scales, zero_points, k, n, block_size))


def _nbits_packed_f32(b, scales, zero_points, k, n, block_size) -> nbits_f32.PackedF32:
    """A 4-bit weight as the CPU's float32 kernel reads it (nbits_f32.py): its bytes as stored, the
    zero points as float32 (4-bit packed ones unpacked, 8 where none is given: None)."""
    nb = -(-k // block_size)
    z = zero_points
    if z is not None:
        z = _unpack_bits(z.reshape(n, -1), 4, nb) if z.dtype == torch.uint8 else z.reshape(n, nb)
    return nbits_f32.PackedF32(b.reshape(n, nb, block_size // 2).to(torch.uint8), scales, z, block_size)


def _nbits_weight(b, scales, zero_points, g_idx, k, n, bits, block_size, dtype) -> torch.Tensor:
    """(N, K) weights: (q - zero point) * scale per block of K."""
    nb = -(-k // block_size)
    q = _unpack_bits(b.reshape(n, nb, -1), bits, block_size).reshape(n, nb * block_size)[:, :k]
    s = scales.reshape(n, nb).to(torch.float32)
    if zero_points is None:
        z = torch.full((n, nb), float(1 << (bits - 1)), device=b.device)
    elif zero_points.dtype == torch.uint8:
        z = _unpack_bits(zero_points.reshape(n, -1), bits, nb).to(torch.float32)
    else:
        z = zero_points.reshape(n, nb).to(torch.float32)
    if g_idx is not None:
        blk = g_idx.to(torch.int64).reshape(-1)
        if blk.numel() != k:
            raise ShapeError(f"MatMulNBits: g_idx must have K={k} elements, got {blk.numel()}")
        sk, zk = s[:, blk], z[:, blk]
    else:
        sk = s.repeat_interleave(block_size, dim=1)[:, :k]
        zk = z.repeat_interleave(block_size, dim=1)[:, :k]
    return ((q.to(torch.float32) - zk) * sk).to(dtype)


def _int8_blocks(a: torch.Tensor, block_size: int) -> torch.Tensor:
    """A as onnxruntime's CompInt8 path sees it: per row and block of K, q = round(a * 127 / amax)
    (half to even), a = q * amax / 127."""
    k = a.shape[-1]
    nb = -(-k // block_size)
    af = torch.nn.functional.pad(a.to(torch.float32), (0, nb * block_size - k))
    blocks = af.reshape(*a.shape[:-1], nb, block_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127.0
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv)
    return (q * scale).reshape(*a.shape[:-1], nb * block_size)[..., :k]


@op("MatMulNBits", 1, DOMAIN, infer=_nbits_infer,
    notes="bits 2, 4, 8; on CUDA 4 bits read packed by a Triton kernel (a decode step's few rows; larger A with "
          "float16/bfloat16 where DYNASHAPE_NBITS_PACKED=1); on the CPU 4 bits and float32 A read packed by a C "
          "kernel; elsewhere "
          "weights dequantized once and cached by tensor identity, one float matmul; "
          "accuracy_level 4 quantizes A per block to int8 as onnxruntime, and with 4 bits, blocks of 32 "
          "and float32 A on the CPU gives its bits (its AVX-512 VNNI kernel's order); no weight_prepacked")
def _matmul_nbits(a, b, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                  accuracy_level=0, weight_prepacked=0, out=None):
    what = "MatMulNBits"
    if weight_prepacked:
        raise ShapeError(f"{what}: weight_prepacked={weight_prepacked} (an execution provider's layout) is not "
                         f"supported; only 0")
    if bits not in (2, 4, 8):
        raise ShapeError(f"{what}: bits must be 2, 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ShapeError(f"{what}: block_size must be a power of 2 >= 16, got {block_size}")
    if a.shape[-1] != K:
        raise ShapeError(f"{what}: A's last dim is {a.shape[-1]}, attribute K is {K}")
    nb = -(-K // block_size)
    shape = (*a.shape[:-1], N)
    if b.numel() == 0:  # an omitted projection: zeros, or the bias
        y = torch.zeros(shape, dtype=a.dtype, device=a.device)
        return _put(out, y if bias is None else y + bias.to(a.dtype))
    if b.numel() != N * nb * (block_size * bits // 8):
        raise ShapeError(f"{what}: B of shape {tuple(b.shape)} does not hold N={N} x {nb} blocks of "
                         f"{block_size * bits // 8} bytes (K={K}, block_size={block_size}, bits={bits})")
    if scales.numel() != N * nb:
        raise ShapeError(f"{what}: scales of shape {tuple(scales.shape)} must hold N x k_blocks = {N} x {nb}")
    if (accuracy_level == 4 and bits == 4 and block_size == nbits_int8.BLOCK and g_idx is None
            and a.device.type == "cpu" and a.dtype == torch.float32
            and (zero_points is None or zero_points.dtype == torch.uint8)):
        # onnxruntime's int8-activation kernel, its roundings in its order (a one-ulp difference
        # here flips an int8 activation of the next product and drifts a decode loop)
        return _put(out, nbits_int8.matmul(a, _int8_weight(b, scales, zero_points, K, N), bias, out))
    if nbits_triton.serves(a, bits, block_size, g_idx, K) and (
            zero_points is None or zero_points.dtype == torch.uint8 or zero_points.numel() == N * nb):
        # CUDA: the packed weight read as it is, no dequantized copy (nbits_triton.py)
        x = _int8_blocks(a, block_size).to(a.dtype) if accuracy_level == 4 else a
        native.count("nbits_packed_cuda_calls")
        return _put(out, nbits_triton.matmul(x, b, scales, zero_points, bias, K, N, block_size))
    if nbits_triton.serves_rows(a, bits, block_size, g_idx, zero_points):
        # CUDA, a decode step's few rows: one kernel reads the packed weight (the level-4 int8 blocks of A
        # made in it), where the dequantized copy took a product and ~8 kernels for A's blocks
        native.count("nbits_rows_cuda_calls")
        return _put(out, nbits_triton.rows(a, b, scales, zero_points, bias, K, N, block_size, accuracy_level == 4,
                                           out))
    level4 = accuracy_level == 4 and g_idx is None and (zero_points is None or zero_points.dtype == torch.uint8)
    if bits == 4 and g_idx is None and a.device.type == "cpu" and a.dtype == torch.float32 and a.numel() > 0 \
            and nbits_f32.available():
        # the CPU in float32: the packed weight read as it is (nbits_f32.py), no dequantized copy
        w = _f32_weight(b, scales, zero_points, K, N, block_size)
        if nbits_f32.serves(a, w):
            return _put(out, nbits_f32.matmul(_int8_blocks(a, block_size) if level4 else a, w, bias, out))
    # matmuls in float32 on the CPU (its half-precision GEMM is slow), in A's type elsewhere
    dtype = torch.float32 if a.device.type == "cpu" else a.dtype
    key = (_ident(b), _ident(scales), _ident(zero_points), _ident(g_idx), K, N, bits, block_size, dtype)
    w = _cached_weight(key, (b, scales, zero_points, g_idx),
                       lambda: _nbits_weight(b, scales, zero_points, g_idx, K, N, bits, block_size, dtype))
    x = _int8_blocks(a, block_size) if level4 else a
    y = torch.matmul(x.to(dtype), w.t())
    if bias is not None:
        y = y + bias.to(dtype)
    return _put(out, y.to(a.dtype))


@binder("MatMulNBits", DOMAIN)
def _bind_matmul_nbits(consts, attrs):
    """MatMulNBits with a 4-bit constant weight on the CPU: onnxruntime's int8-activation path (accuracy
    level 4, blocks of 32), or the float32 kernel's (nbits_f32.py: the other levels and block sizes):
    its checks and the packed weight done once. The op checks its inputs and
    builds the cache key on every call (~15 us of a call's ~35 in a CPU decode step, 11 products a
    step in the builder's 2-layer Llama); the bound form goes to nbits_int8.matmul straight, and to
    the op itself where a call is not its case."""
    c = list(consts) + [None] * (6 - len(consts))
    b, scales, zp, g_idx, bias = c[1], c[2], c[3], c[4], c[5]
    k, n, bits, block = attrs.get("K"), attrs.get("N"), attrs.get("bits", 4), attrs.get("block_size")
    if bits != 4 or not isinstance(block, int) or block < 16 or block & (block - 1) or attrs.get("weight_prepacked"):
        return None
    if any(t is COMPUTED for t in (b, scales, zp, g_idx, bias)) or g_idx is not None or b is None or scales is None \
            or b.device.type != "cpu":
        return None
    nb = -(-k // block)
    if b.numel() != n * nb * (block * bits // 8) or scales.numel() != n * nb:
        return None  # (the op raises its error at the call)
    level4 = attrs.get("accuracy_level", 0) == 4 and (zp is None or zp.dtype == torch.uint8)
    b32 = None if bias is None else bias.to(torch.float32).contiguous()
    plain = functools.partial(_matmul_nbits, **attrs)
    if level4 and block == nbits_int8.BLOCK:
        if native.library("nbits_int8") is None:
            return None  # (the op's torch path, counted there)
        w = _int8_weight(b, scales, zp, k, n)

        def kernel(a, b_, scales_, zero_points=None, g_idx_=None, bias_=None, *, out=None):
            if type(a) is not torch.Tensor or a.dtype != torch.float32 or a.device.type != "cpu" or a.shape[-1] != k:
                return plain(a, b_, scales_, zero_points, g_idx_, bias_, out=out)
            return _put(out, nbits_int8.matmul(a, w, b32, out))
    else:  # float32 products (nbits_f32.py), A's int8 blocks first at level 4
        if not nbits_f32.available():
            return None  # (the op's torch path)
        w = _f32_weight(b, scales, zp, k, n, block)

        def kernel(a, b_, scales_, zero_points=None, g_idx_=None, bias_=None, *, out=None):
            if not nbits_f32.serves(a, w) or a.shape[-1] != k:
                return plain(a, b_, scales_, zero_points, g_idx_, bias_, out=out)
            return _put(out, nbits_f32.matmul(_int8_blocks(a, block) if level4 else a, w, b32, out))

    kernel.packed = w  # (keeps the packed weight with the kernel)
    return kernel


# ---- GatherBlockQuantized -----------------------------------------------------------------------
def _gbq_components(data_shape, scales_shape, zp_shape, bits, gather_axis, quantize_axis, block_size) -> int:
    """How many values a data element holds: 8 // bits for uint8 data packed along the last
    axis, else 1. The element type does not reach the kernel (a UINT4 is held in uint8 as a
    UINT8 is), so the shapes decide: packing is possible only for bits < 8, gather_axis 0 and
    the last axis quantized, and the scales (and zero points) must count the blocks of the
    unpacked row."""
    rank = len(data_shape)
    if bits >= 8 or block_size <= 0 or rank < 2 or gather_axis != 0 or quantize_axis != rank - 1:
        return 1
    comp = 8 // bits
    d, s = data_shape[-1], scales_shape[-1]
    if not all(isinstance(v, int) for v in (d, s)):
        return comp
    if bits == 2:  # no 2-bit type is held: uint8 data
        return comp
    packed_blocks, plain_blocks = -(-(d * comp) // block_size), -(-d // block_size)
    if packed_blocks != plain_blocks:
        return comp if s == packed_blocks else 1
    packed_zp = -(-s // comp)
    if zp_shape is not None and isinstance(zp_shape[-1], int) and packed_zp != s:
        return comp if zp_shape[-1] == packed_zp else 1
    return comp  # rows of at most half a block: nothing tells, take onnxruntime's usual uint8 layout


def _gbq_infer(shapes, values, *, bits=4, block_size=128, gather_axis=0, quantize_axis=1):
    data, idx = shapes[0], shapes[1]
    rank = len(data)
    ga, qa = norm_axis(gather_axis, rank, "gather_axis"), norm_axis(quantize_axis, rank, "quantize_axis")
    comp = _gbq_components(data, shapes[2], shapes[3] if len(shapes) > 3 else None, bits, ga, qa, block_size)
    out = list(data[:ga]) + list(idx) + list(data[ga + 1:])
    if comp > 1:
        out[-1] = out[-1] * comp
    return [tuple(out)]


@op("GatherBlockQuantized", 1, DOMAIN, infer=_gbq_infer,
    notes="int4, uint4, uint8 (2, 4, 8 bits packed), float8; uint8 vs uint4 told apart by the scales' shape")
def _gather_block_quantized(data, indices, scales, zero_points=None, *, bits=4, block_size=128, gather_axis=0,
                            quantize_axis=1, out=None):
    what = "GatherBlockQuantized"
    rank = data.dim()
    ga, qa = norm_axis(gather_axis, rank, "gather_axis"), norm_axis(quantize_axis, rank, "quantize_axis")
    if scales.dim() != rank:
        raise ShapeError(f"{what}: data {tuple(data.shape)} and scales {tuple(scales.shape)} must have one rank")
    is_float = data.dtype.is_floating_point
    comp = 1 if is_float else _gbq_components(tuple(data.shape), tuple(scales.shape),
                                              None if zero_points is None else tuple(zero_points.shape),
                                              bits, ga, qa, block_size)
    if is_float and zero_points is not None:
        raise ShapeError(f"{what}: zero_points must not be given for float8 / float4 data")
    if not is_float and data.dtype not in (torch.int8, torch.uint8):
        raise ShapeError(f"{what}: data must be int4, uint4, uint8 or a float8 / float4 type, got {data.dtype}")
    qdim = data.shape[qa] * comp
    block = qdim if (is_float and block_size == 0) else block_size
    if block <= 0:
        raise ShapeError(f"{what}: block_size must be positive for integer data, got {block_size}")
    nblocks = -(-qdim // block)
    for i in range(rank):
        want = nblocks if i == qa else data.shape[i]
        if scales.shape[i] != want and not (is_float and i != qa and scales.shape[i] == 1):
            raise ShapeError(f"{what}: scales of shape {tuple(scales.shape)} do not fit data {tuple(data.shape)} "
                             f"quantized in blocks of {block} along axis {qa}")
    n = data.shape[ga]
    idx = indices.to(torch.int64).to(data.device)
    valid = (idx >= -n) & (idx < n)
    flat = torch.where(idx < 0, idx + n, idx).clamp(0, max(n - 1, 0)).reshape(-1)
    q = torch.index_select(data, ga, flat)
    if comp > 1:
        q = _unpack_bits(q.view(torch.uint8), bits, qdim)
    q = q.to(torch.float32) if is_float else q.to(torch.int32)

    def along(p, packed: bool):
        """A per-block parameter gathered like data and spread to one value per element."""
        if p.shape[ga] != 1 or n == 1:
            p = torch.index_select(p, ga, torch.div(flat, block, rounding_mode="floor") if ga == qa else flat)
        if packed:  # uint8 zero points packed like the data
            p = _unpack_bits(p, bits, nblocks)
        if ga != qa:
            p = p.repeat_interleave(block, dim=qa).narrow(qa, 0, qdim)
        return p

    s = along(scales, False).to(torch.float32)
    if is_float:
        v = q * s
    else:
        if zero_points is not None:
            z = along(zero_points, comp > 1).to(torch.int32)
        else:
            # 2**(bits-1) for UINT8 data; 0 for INT4 / UINT4 (a uint8 tensor unpacked with bits 4)
            uint8_data = data.dtype == torch.uint8 and (comp > 1 or bits != 4)
            z = torch.tensor(1 << (bits - 1) if uint8_data else 0, dtype=torch.int32, device=data.device)
        v = (q - z).to(torch.float32) * s
    shape = list(data.shape[:ga]) + list(indices.shape) + list(data.shape[ga + 1:])
    if comp > 1:
        shape[-1] = shape[-1] * comp
    v = v.reshape(shape)
    if not bool(valid.all()):
        mask = valid.reshape(list(indices.shape) + [1] * (rank - 1 - ga))
        v = torch.where(mask, v, torch.zeros((), dtype=v.dtype, device=v.device))
    dt = scales.dtype if scales.dtype.is_floating_point else torch.float32
    return _put(out, v.to(dt))


