"""onnxruntime's quantized recurrent contrib op (domain ``com.microsoft``): DynamicQuantizeLSTM.

An LSTM (the ONNX op's attributes, inputs and outputs) whose weights come quantized:
W (D, input, 4*hidden) and R (D, hidden, 4*hidden), int8 or uint8 -- transposed with respect to
ONNX LSTM's W (D, 4*hidden, input) -- with W_scale / W_zero_point and R_scale / R_zero_point per
direction (D,) or per direction and column (D, 4*hidden). onnxruntime (deep_cpu_lstm's quantized
ComputeGemm) does not dequantize the weights: it quantizes each GEMM's float operand dynamically
to uint8 (DynamicQuantizeLinear's scale and zero point), multiplies in integers and scales the
int32 result by a_scale * w_scale in float32. This kernel does the same, with the same
granularity:

* the input projection quantizes all of X at once (the first max(sequence_lens) steps, every
  batch entry): one scale for the whole sequence, shared by both directions;
* the recurrent projection quantizes h_{t-1} per step and per direction, over all batch entries
  together (entries past their length contribute zeros, as onnxruntime's previous-output buffer
  holds). onnxruntime splits the batch across threads when it has more than 4 entries (or at
  least 2 with hidden <= 256) and quantizes each slice on its own: with one intra-op thread (or
  small batches) it matches this kernel; with several, its results move by quantization noise.

Pre-activations are (X-part + h-part) + (Wb + Rb), clipped, then onnxruntime's gate arithmetic
(i, o, f, c order; c = f * c + i * g; h = o * h(c)). A reverse direction reverses each sequence
within its own length (onnxruntime's ReverseSequence), so its steps past an entry's length come
last, as forward. The integer products are exact (integer_gemm.py); with
linalg.set_u8s8_saturation(True) they saturate as onnxruntime's AVX2 kernels do. On the CPU the
sigmoid and tanh are MLAS's own (ort_math.py), bit for bit: h is quantized for the next step, so
one ulp of a gate could move a scale and with it every later step (torch's functions, a few ulps
off, left outputs 1e-4 to 1e-3 away after tens of steps).

On the CPU, the default gates run as one C call per layer (csrc/dq_lstm.c through native.py:
the same integers and float order, the torch loop below was ~25 calls a step); the torch loop
serves everything else (CUDA, peepholes, clip, other activations, the saturation emulation,
non-finite values) and wherever the C cannot be built.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from ..errors import ShapeError
from . import native, ort_math
from .integer_gemm import PreparedB, _use_int_mm, int8_product, int_product, saturation_correction
from .norm import _put
from .quant import dynamic_qparams
from .registry import op
from .rnn import _activations, _num_dir, lstm_cell
from .u8s8 import u8s8_saturation
from .weight_cache import WeightCache

MS = "com.microsoft"


def _dq_lstm_infer(shapes, values, *, direction="forward", hidden_size=None, **_attrs):
    x, r = shapes[0], shapes[2]
    if len(x) != 3 or len(r) != 3:
        raise ShapeError(f"DynamicQuantizeLSTM: X and R must be 3-D, got shapes {tuple(x)} and {tuple(r)}")
    d = _num_dir(direction)
    h = hidden_size if hidden_size is not None else r[1]
    t, b = x[0], x[1]
    return [(t, d, b, h), (d, b, h), (d, b, h)]


# ---- weights ---------------------------------------------------------------------------------
_WEIGHTS = WeightCache()


class _QWeights:
    """A quantized weight (D, K, 4H) ready for the product: centered float32 with its chunk plan
    (batched over directions), the per-direction ones for the saturation switch, and the scales."""

    def __init__(self, w: torch.Tensor, w_scale: torch.Tensor, w_zp: torch.Tensor | None):
        d, n = w.shape[0], w.shape[2]
        zp = None
        if w_zp is not None:
            zp = w_zp.reshape(d, 1, -1 if w_zp.numel() != d else 1)
        self.prep = PreparedB(w, zp)  # (PreparedB holds w.detach(), not w: see _QWeights.raw)
        self.per_dir = [PreparedB(w[i], None if zp is None else zp[i]) for i in range(d)]
        if w_scale.numel() not in (d, d * n):
            raise ShapeError(f"DynamicQuantizeLSTM: a weight scale of shape {tuple(w_scale.shape)} is neither one per "
                             f"direction ({d}) nor one per direction and column ({d}, {n})")
        self.scale = w_scale.to(torch.float32).reshape(d, 1, -1)  # (D, 1, 1) or (D, 1, 4H)
        self.scale_values = self.scale.reshape(-1).tolist() if w_scale.numel() == d else None
        self.signed = w.dtype == torch.int8
        # W's storage without its Python object: the cache keeps this and drops it when W dies
        self.raw, self.zp = w.detach(), zp
        self._native: dict[bool, tuple] = {}  # per layout (int8 or not): dq_lstm.c's form

    def native(self, int8: bool) -> tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """R for dq_lstm.c: (k's per group, the blocks, their column sums or None, the scale per
        column float32 (D, 4H)). Blocks of 16 hidden units, each the 64 columns of their four
        gates, k in groups (4 int8 values where ``int8`` and R is int8 without zero point, else
        2 int16 values of R - R_zero_point): (D, blocks, K / group, 64, group), zero-padded."""
        if int8 not in self._native:
            d, k, n4 = self.raw.shape
            n = n4 // 4
            grp = 4 if int8 and self.signed and (self.zp is None or not self.zp.any()) else 2
            w = self.raw if grp == 4 else self.raw.to(torch.int16)
            if grp == 2 and self.zp is not None:
                w = w - self.zp.to(torch.int16)
            w = torch.nn.functional.pad(w.reshape(d, k, 4, n), (0, -n % 16, 0, 0, 0, -k % grp))
            nb = w.shape[-1] // 16
            w = w.reshape(d, w.shape[1], 4, nb, 16).permute(0, 3, 1, 2, 4).reshape(d, nb, -1, grp, 64)
            blocks = w.transpose(3, 4).contiguous()  # (D, blocks, K / group, 64, group)
            colsum = blocks.sum((2, 4), dtype=torch.int32).contiguous() if grp == 4 else None
            self._native[int8] = (grp, blocks, colsum, self.scale.reshape(d, -1).expand(d, n4).contiguous())
        return self._native[int8]


def _weights(w, w_scale, w_zp) -> _QWeights:
    ids = (id(w_scale), w_scale._version, None if w_zp is None else (id(w_zp), w_zp._version))
    return _WEIGHTS.get(w, lambda: _QWeights(w, w_scale, w_zp), tag=ids)


# ---- dynamic quantization, one scale per direction -------------------------------------------------
def _qparams(lo: list[float], hi: list[float]) -> tuple[list[float], list[int]]:
    """DynamicQuantizeLinear's scale and zero point for each (lo, hi) (quant.dynamic_qparams)."""
    scales, zps = [], []
    for a, b in zip(lo, hi):
        qp = dynamic_qparams(a, b)
        if qp is None:  # inf / nan: what the formula gives
            lo32, hi32 = np.float32(min(a, 0.0)), np.float32(max(b, 0.0))
            with np.errstate(all="ignore"):
                qp = (float(np.float32(hi32 - lo32) / np.float32(255)), 0)
        scales.append(qp[0])
        zps.append(qp[1])
    return scales, zps


def _dir_qparams(v: torch.Tensor) -> tuple[list[float], list[int]]:
    """DynamicQuantizeLinear's scale and zero point of each direction of a non-empty v (D, ...)."""
    d = v.shape[0]
    if d == 1:
        lo, hi = torch.aminmax(v)
        return _qparams([lo.item()], [hi.item()])
    lo, hi = torch.aminmax(v.reshape(d, -1), dim=1)
    return _qparams(lo.tolist(), hi.tolist())


def _quantize(v: torch.Tensor) -> tuple[torch.Tensor, list[float], list[int]]:
    """v (D, ...) quantized per direction as DynamicQuantizeLinear: (q - zp as float32, the
    scales, the zero points)."""
    d = v.shape[0]
    if v.reshape(d, -1).shape[1] == 0:
        return v.to(torch.float32), [1.0] * d, [0] * d
    scales, zps = _dir_qparams(v)
    if d == 1:
        # CUDA divides by a host scalar as a multiplication by its reciprocal: a device tensor there
        div = scales[0] if v.device.type == "cpu" else torch.full((), scales[0], device=v.device)
        return torch.div(v, div).round_().clamp_(-zps[0], 255 - zps[0]), scales, zps
    if v.device.type == "cpu":
        q = torch.empty_like(v, dtype=torch.float32)
        for i in range(d):  # per direction with host scalars: cheaper than making small tensors
            torch.div(v[i], scales[i], out=q[i])
    else:
        q = torch.div(v, torch.tensor(scales, dtype=torch.float32, device=v.device).view((d,) + (1,) * (v.dim() - 1)))
    q.round_()
    for i in range(d):
        q[i].clamp_(-zps[i], 255 - zps[i])
    return q, scales, zps


def _qproduct(q: torch.Tensor, scales: list[float], zps: list[int], w: _QWeights) -> torch.Tensor:
    """float32(exact (q) @ (W - Wz)) * (a_scale * w_scale) per direction: q (D, M, K) -> (D, M, 4H)."""
    amax = max(max(z, 255 - z) for z in zps)
    acc = None
    if not (u8s8_saturation() and w.signed):  # torch._int_mm where it is fast: one direction at a time
        parts = [int8_product(q[i], zps[i], pd, centered=True) for i, pd in enumerate(w.per_dir)]
        if all(p is not None for p in parts):
            acc = torch.stack(parts)
    if acc is None:
        acc = int_product(q, w.prep, amax)
    if u8s8_saturation() and w.signed:
        acc = acc.double()
        for i, pd in enumerate(w.per_dir):
            c = saturation_correction((q[i] + zps[i]).to(torch.uint8), pd)
            if c is not None:
                acc[i] += c
    if acc.dtype != torch.float32:
        acc = acc.to(torch.float32)
    if w.scale_values is not None:  # per direction: a_scale * w_scale in float32, on the host
        for i, (a, b) in enumerate(zip(scales, w.scale_values)):
            acc[i].mul_(float(np.float32(a) * np.float32(b)))
        return acc
    sc = torch.tensor(scales, dtype=torch.float32, device=acc.device).view(-1, 1, 1)
    return acc.mul_(sc * w.scale)


class _Recurrent:
    """One step's recurrent part on the CPU, written into g: (h_{t-1} quantized per direction) @ R,
    scaled, plus the step's input projection, in as few torch calls as the arithmetic allows (a
    step is ~20 calls of a few microseconds each: their number is the step's cost). The integers
    are the ones ``_quantize`` / ``_qproduct`` make: with torch._int_mm, the quantized h is shifted
    to int8 (q + zp - 128) and the shift taken back through R's column sums."""

    @staticmethod
    def make(rq: _QWeights, nd: int, batch: int, n: int, dev: torch.device) -> _Recurrent | None:
        if dev.type != "cpu" or not batch or not n or rq.scale_values is None or (u8s8_saturation() and rq.signed):
            return None  # the general path: CUDA's device scales, per-column scales, saturation
        ops = None
        if _use_int_mm(dev, batch, n, 4 * n):
            ops = [pd.int8() for pd in rq.per_dir]
            if any(o is None or o[2] is not None for o in ops):  # a weight zero point: the general path
                ops = None
        return _Recurrent(rq, nd, batch, n, ops)

    def __init__(self, rq: _QWeights, nd: int, batch: int, n: int, ops):
        self.rq, self.nd, self.ops = rq, nd, ops
        self.t = torch.empty(nd, batch, n)

    def __call__(self, h_in: torch.Tensor, proj_s: torch.Tensor, g: torch.Tensor) -> None:
        nd, t, rq = self.nd, self.t, self.rq
        scales, zps = _dir_qparams(h_in)
        for i in range(nd):
            torch.div(h_in[i], scales[i], out=t[i])
        t.round_()
        sc = [float(np.float32(a) * np.float32(b)) for a, b in zip(scales, rq.scale_values)]
        if self.ops is not None:
            for i in range(nd):
                t[i].add_(zps[i] - 128)
            a8 = t.clamp_(-128, 127).to(torch.int8)
            for i, (b8, colsum, _zb) in enumerate(self.ops):
                p = torch._int_mm(a8[i], b8)
                if zps[i] != 128:
                    p.sub_(colsum, alpha=zps[i] - 128)
                torch.mul(p, sc[i], out=g[i])
        else:
            for i in range(nd):
                t[i].clamp_(-zps[i], 255 - zps[i])
            acc = int_product(t, rq.prep, max(max(z, 255 - z) for z in zps))
            if acc.dtype != torch.float32:
                acc = acc.to(torch.float32)
            for i in range(nd):
                torch.mul(acc[i], sc[i], out=g[i])
        g += proj_s


# ---- the kernel ----------------------------------------------------------------------------------
@op("DynamicQuantizeLSTM", 1, MS, infer=_dq_lstm_infer)
def _dynamic_quantize_lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
                           W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None, *,
                           activation_alpha=None, activation_beta=None, activations=None, clip=None,
                           direction="forward", hidden_size=None, input_forget=0, out=None):
    nd = _num_dir(direction)
    if X.dim() != 3 or W.dim() != 3 or R.dim() != 3:
        raise ShapeError(f"DynamicQuantizeLSTM: X, W and R must be 3-D, got {tuple(X.shape)}, {tuple(W.shape)}, "
                         f"{tuple(R.shape)}")
    t, batch, _ = X.shape
    n = R.shape[1]
    if W.shape[0] != nd or R.shape[0] != nd or W.shape[2] != 4 * n or R.shape[2] != 4 * n or W.shape[1] != X.shape[2]:
        raise ShapeError(f"DynamicQuantizeLSTM: W {tuple(W.shape)} / R {tuple(R.shape)} do not match {nd} direction(s) "
                         f"of hidden size {n} over input {tuple(X.shape)}")
    if W_scale is None or R_scale is None:
        raise ShapeError("DynamicQuantizeLSTM: W_scale and R_scale are required")
    dev = X.device
    x = X.to(torch.float32)
    wq, rq = _weights(W, W_scale, W_zero_point), _weights(R, R_scale, R_zero_point)
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], nd)

    # the steps each entry takes, and the reverse direction's time order (each sequence reversed
    # within its own length)
    lens = None
    if sequence_lens is not None:
        lens = sequence_lens.to(device=dev, dtype=torch.int64).clamp(0, t)
        steps = int(lens.max()) if batch else 0
    else:
        steps = t
    plain = P is None and not input_forget and clip is None and all(
        [a[0] for a in acts_d] == ["sigmoid", "tanh", "tanh"] for acts_d in acts)
    if plain:  # the default gates (sigmoid, tanh, tanh; no clip, peepholes or coupled input-forget)
        done = _native_layer(x, wq, rq, B, lens, initial_h, initial_c, direction, steps)
        if done is not None:
            return _put(out, done)
    if lens is None:
        rev = torch.arange(t - 1, -1, -1, device=dev).unsqueeze(1).expand(t, batch)
    else:
        tt = torch.arange(t, device=dev).unsqueeze(1)
        rev = torch.where(tt < lens.unsqueeze(0), lens.unsqueeze(0) - 1 - tt, tt)  # (T, B), an involution
    orders = [None if (direction == "forward" or (direction == "bidirectional" and d == 0)) else rev
              for d in range(nd)]

    # input projection: X quantized once (its first ``steps`` steps), one product per direction
    xq, xs, xz = _quantize(x[:steps].unsqueeze(0))
    xq = xq[0]
    xd = torch.stack([xq if o is None else xq.gather(0, o[:steps].unsqueeze(-1).expand_as(xq)) for o in orders])
    proj = _qproduct(xd.reshape(nd, steps * batch, -1), xs * nd, xz * nd, wq).reshape(nd, steps, batch, -1)
    bias = None
    if B is not None:
        b32 = B.to(torch.float32)
        bias = (b32[:, :4 * n] + b32[:, 4 * n:]).unsqueeze(1)  # (D, 1, 4H): Wb + Rb, as onnxruntime adds them

    pi = pf = po = None
    if P is not None:
        pp = P.to(torch.float32).unsqueeze(1)  # (D, 1, 3H): i, o, f
        pi, po, pf = pp[..., :n], pp[..., n:2 * n], pp[..., 2 * n:]
    h = torch.zeros(nd, batch, n, device=dev) if initial_h is None else initial_h.to(torch.float32)
    c = torch.zeros(nd, batch, n, device=dev) if initial_c is None else initial_c.to(torch.float32)
    y, h, c = _torch_steps(proj, bias, rq, lens, h, c, t, plain, acts, clip, (pi, po, pf), input_forget)
    parts = [y[:, d] if o is None else y[:, d].gather(0, o.unsqueeze(-1).expand(t, batch, n))
             for d, o in enumerate(orders)]
    y = torch.stack(parts, 1)  # (T, D, B, H) in time order
    if lens is not None:  # onnxruntime: an empty sequence has zero final states
        nz, zero = (lens > 0).reshape(1, -1, 1), torch.zeros((), device=dev)
        h, c = torch.where(nz, h, zero), torch.where(nz, c, zero)
    return _put(out, [y, h, c])


def _torch_steps(proj, bias, rq, lens, h, c, t, plain, acts, clip, peep, input_forget):
    """The recurrence in torch calls, one step at a time: (y (T, D, B, H) in step order, h, c)."""
    nd, steps, batch, n4 = proj.shape
    n, dev = n4 // 4, proj.device
    mask = None
    if lens is not None:
        mask = (torch.arange(t, device=dev).unsqueeze(1) < lens.unsqueeze(0)).unsqueeze(-1)  # (T, B, 1)
    rec = _Recurrent.make(rq, nd, batch, n, dev)
    y = torch.zeros(t, nd, batch, n, device=dev)  # in step order; steps past max(lens) stay zero
    g = torch.empty(nd, batch, 4 * n, device=dev)
    zero = torch.zeros((), device=dev)
    h_in = h  # what the recurrent product reads: the previous step's output (zeros past an entry's length)
    for s in range(steps):
        ys = y[s]
        if rec is not None:
            rec(h_in, proj[:, s], g)
        else:
            hq, hs, hz = _quantize(h_in)
            torch.add(proj[:, s], _qproduct(hq, hs, hz, rq), out=g)
        if bias is not None:
            g += bias
        if plain:
            g_iof, g_c = g.split((3 * n, n), -1)
            i, o, f = ort_math.sigmoid(g_iof).split(n, -1)
            c_new = f * c
            c_new += i * ort_math.tanh(g_c)
            h_new = torch.mul(o, ort_math.tanh(c_new), out=ys) if mask is None else o * ort_math.tanh(c_new)
        else:
            h_new, c_new = lstm_cell(g, c, n, acts, clip, peep, input_forget)
            if mask is None:
                ys.copy_(h_new)
        if mask is None:
            h, c = h_new, c_new
        else:
            m = mask[s]
            torch.where(m, h_new, zero, out=ys)
            h, c = torch.where(m, h_new, h), torch.where(m, c_new, c)
        h_in = ys
    return y, h, c


def _native_layer(x, wq, rq, B, lens, initial_h, initial_c, direction, steps):
    """The layer in ops/csrc/dq_lstm.c (X quantized once, each step's input and recurrent products,
    the gates, the reverse order, the outputs' layout; the two directions of a bidirectional layer
    on two threads when torch has two): [Y, Y_h, Y_c], or None where it does not serve (not the
    CPU, saturating weights, no compiler, a non-finite X or h) and the torch path runs instead
    (counted in native.counters())."""
    t, batch, ni = x.shape
    nd, n = rq.raw.shape[0], rq.raw.shape[1]
    if x.device.type != "cpu" or not (steps and batch and n and ni) or (u8s8_saturation() and (rq.signed or wq.signed)):
        return None
    kernel = _kernel()
    if kernel is None:
        return None
    int8 = _int8_weights()
    wg, wblocks, wcolsum, wscale = wq.native(int8)
    rg, rblocks, rcolsum, rscale = rq.native(int8)
    x = x.contiguous()
    bias = None
    if B is not None:
        b32 = B.to(torch.float32)
        bias = (b32[:, :4 * n] + b32[:, 4 * n:]).contiguous()  # Wb + Rb, as onnxruntime adds them
    if lens is not None:
        lens = lens.contiguous()
    h = torch.zeros(nd, batch, n) if initial_h is None else initial_h.to(torch.float32, copy=True).contiguous()
    c = torch.zeros(nd, batch, n) if initial_c is None else initial_c.to(torch.float32, copy=True).contiguous()
    y = torch.zeros(t, nd, batch, n)
    reverse = (ctypes.c_int64 * nd)(*[int(direction == "reverse" or (direction == "bidirectional" and d == 1))
                                       for d in range(nd)])
    threads = torch.get_num_threads() if steps * batch * 4 * n * (n + ni) >= _THREAD_MIN_WORK else 1

    def ptr(v):
        return None if v is None else v.data_ptr()

    rc = kernel(nd, threads, t, steps, batch, ni, n, ptr(x), wg, wblocks.shape[2], ptr(wblocks), ptr(wcolsum),
                ptr(wscale), rg, rblocks.shape[2], ptr(rblocks), ptr(rcolsum), ptr(rscale), ptr(bias), ptr(lens),
                reverse, ptr(h), ptr(c), ptr(y))
    if rc:
        native.count("dq_lstm_torch_fallbacks")
        return None
    native.count("dq_lstm_native_calls")
    return [y, h, c]


def _kernel():
    return native.function("dq_lstm", "dq_lstm", "iiiiiiipiipppiippppppppp", ctypes.c_int, fallbacks="dq_lstm")


def _int8_weights() -> bool:
    """Whether this CPU's build multiplies int8 weights as u8 x s8 (dq_lstm_int8_weights)."""
    lib = native.library("dq_lstm")
    return bool(lib is not None and lib.dq_lstm_int8_weights())


_THREAD_MIN_WORK = 1 << 20  # multiply-adds below which a second thread costs more than it saves
