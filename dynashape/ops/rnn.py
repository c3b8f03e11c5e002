"""Recurrent layers: RNN, GRU, LSTM (opsets 7, 14, 22).

One shared shape: the input projection X*W^T + biases is computed for every time step at once
(one batched matmul), then a time loop does the recurrent matmul and the gates. The directions
of a bidirectional layer run in the same loop as a batch of two: the reverse direction reads
its input flipped in time, so step s of the loop is time s forward and time T-1-s backward,
and one ``baddbmm`` serves both directions per step.

``sequence_lens`` is a per-batch-entry mask: a step at or past an entry's length leaves its
state unchanged and writes zeros to Y. Backward, the masked steps come first (the tail of the
padded sequence), so the state stays at initial_h until the entry's last valid element, which
is exactly "reverse each sequence within its own length". As onnxruntime does, an entry of
length 0 gets zeros for Y_h (and Y_c).

``layout`` (opset 14 on) 1 means batch-major X, Y, initial/final states; the kernels transpose
to time-major and back. ``clip`` bounds the pre-activation of every gate, as onnxruntime does
(the LSTM cell state C fed to h() is not clipped there, and not here).
"""

from __future__ import annotations

import ctypes
import inspect
from functools import wraps

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from . import native, ort_math
from .norm import _put
from .registry import op
from .weight_cache import WeightCache

# Activation functions --------------------------------------------------------------------
# name (lowercase) -> (function of (x, alpha, beta), uses alpha, uses beta, default alpha, default beta).
# Defaults are those of the ONNX ops of the same name (Affine and ScaledTanh: the identity scale).
_ACTS = {
    "relu": (lambda x, a, b: torch.relu(x), False, False, 0.0, 0.0),
    # onnxruntime's own sigmoid and tanh on the CPU (ort_math.py; its LSTMs call them; its GRU
    # writes its own gates, which no function here matches to the bit)
    "tanh": (lambda x, a, b: ort_math.tanh(x), False, False, 0.0, 0.0),
    "sigmoid": (lambda x, a, b: ort_math.sigmoid(x), False, False, 0.0, 0.0),
    "affine": (lambda x, a, b: x * a + b, True, True, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: F.leaky_relu(x, a), True, False, 0.01, 0.0),
    "thresholdedrelu": (lambda x, a, b: torch.where(x > a, x, torch.zeros((), dtype=x.dtype, device=x.device)),
                        True, False, 1.0, 0.0),
    "scaledtanh": (lambda x, a, b: torch.tanh(x * b) * a, True, True, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: (x * a + b).clamp(0, 1), True, True, 0.2, 0.5),
    "elu": (lambda x, a, b: F.elu(x, a), True, False, 1.0, 0.0),
    "softsign": (lambda x, a, b: x / (1 + x.abs()), False, False, 0.0, 0.0),
    "softplus": (lambda x, a, b: F.softplus(x), False, False, 0.0, 0.0),
}


def _activations(names, alphas, betas, defaults: list[str], num_dir: int) -> list[list[tuple]]:
    """Per direction, the list of (fn, alpha, beta) the gates use.

    alpha/beta values are consumed in the order of the activations, each activation taking
    one only if it uses it (so [LeakyRelu, Tanh, Elu] with alphas [0.1, 0.5] gives Elu 0.5),
    as onnxruntime reads them; a missing one takes the op's default.
    """
    per_dir = len(defaults)
    names = list(names) if names else defaults * num_dir
    if num_dir == 2 and len(names) == per_dir:
        names = names * 2  # one set given for a bidirectional layer: the same for both directions
    if len(names) != per_dir * num_dir:
        raise ValueError(f"activations: expected {per_dir * num_dir} names for {num_dir} direction(s), "
                         f"got {names}")
    alphas, betas = list(alphas or []), list(betas or [])
    parsed = []
    for name in names:
        key = name.lower()
        if key not in _ACTS:
            raise ValueError(f"unsupported activation {name!r}; supported: {sorted(_ACTS)}")
        fn, use_a, use_b, da, db = _ACTS[key]
        a = (alphas.pop(0) if alphas else da) if use_a else da
        b = (betas.pop(0) if betas else db) if use_b else db
        parsed.append((key, fn, float(a), float(b)))
    return [parsed[d * per_dir:(d + 1) * per_dir] for d in range(num_dir)]


def _act(acts: list[list[tuple]], k: int, x: torch.Tensor, clip) -> torch.Tensor:
    """Gate k's activation on x (directions on dim 0), after clipping its input."""
    if clip is not None:
        x = x.clamp(-clip, clip)
    first = acts[0][k]
    if all(a[k][0] == first[0] and a[k][2:] == first[2:] for a in acts):
        return first[1](x, first[2], first[3])
    return torch.stack([a[k][1](x[d], a[k][2], a[k][3]) for d, a in enumerate(acts)])


# Shapes ----------------------------------------------------------------------------------
_NUM_DIR = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _num_dir(direction: str) -> int:
    if direction not in _NUM_DIR:
        raise ShapeError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    return _NUM_DIR[direction]


def _rnn_infer(n_states: int):
    def infer(shapes, values, *, direction="forward", hidden_size=None, layout=0, **_attrs):
        x, r = shapes[0], shapes[2]
        if len(x) != 3 or len(r) != 3:
            raise ShapeError(f"X and R must be 3-D, got shapes {tuple(x)} and {tuple(r)}")
        d = _num_dir(direction)
        h = hidden_size if hidden_size is not None else r[2]
        if layout:
            b, t = x[0], x[1]
            return [(b, t, d, h)] + [(b, d, h)] * n_states
        t, b = x[0], x[1]
        return [(t, d, b, h)] + [(d, b, h)] * n_states
    return infer


# The shared loop ----------------------------------------------------------------------------
class _Setup:
    """Inputs brought to time-major, per-direction, time-ordered form."""

    def __init__(self, x, w, r, b, sequence_lens, initial_states, direction, layout, gates):
        if layout:
            x = x.transpose(0, 1)
            initial_states = [None if s is None else s.transpose(0, 1) for s in initial_states]
        self.num_dir = _num_dir(direction)
        self.reverse = direction == "reverse"
        self.t, self.batch = x.shape[0], x.shape[1]
        self.hidden = r.shape[2]
        self.dtype, self.device = x.dtype, x.device
        gh = gates * self.hidden
        if w.shape[0] != self.num_dir or w.shape[1] != gh or r.shape[1] != gh:
            raise ShapeError(f"W {tuple(w.shape)} / R {tuple(r.shape)} do not match {self.num_dir} direction(s) "
                             f"of {gates} gates of hidden size {self.hidden}")
        # step s of direction d reads time s (forward) or T-1-s (backward)
        if self.num_dir == 2:
            xs = torch.stack([x, x.flip(0)])
        else:
            xs = (x.flip(0) if self.reverse else x).unsqueeze(0)
        self.xs = xs  # (D, T, B, I)
        self.wb = b[:, :gh] if b is not None else None
        self.rb = b[:, gh:] if b is not None else None
        self.rt = r.transpose(1, 2)  # (D, H, G*H)
        self.w = w
        self.states = [self._state(s) for s in initial_states]
        self.lens = None
        self.mask = None
        if sequence_lens is not None:
            self.lens = sequence_lens.to(device=self.device, dtype=torch.int64)
            m = torch.arange(self.t, device=self.device).unsqueeze(1) < self.lens.unsqueeze(0)  # (T, B)
            m = m.unsqueeze(-1)
            self.mask = torch.stack([m, m.flip(0)]) if self.num_dir == 2 else (
                m.flip(0) if self.reverse else m).unsqueeze(0)  # (D, T, B, 1) in step order

    def _state(self, s):
        if s is None:
            return torch.zeros(self.num_dir, self.batch, self.hidden, dtype=self.dtype, device=self.device)
        return s.to(self.dtype)

    def project(self, bias):
        """X*W^T + bias for all steps: (D, T, B, G*H)."""
        d, t, b, i = self.xs.shape
        x2 = self.xs.reshape(d, t * b, i)
        wt = self.w.transpose(1, 2)
        p = torch.bmm(x2, wt) if bias is None else torch.baddbmm(bias.unsqueeze(1), x2, wt)
        return p.reshape(d, t, b, -1)

    def keep(self, s, new, old):
        """The state after step s: new where the step is inside the sequence, else old."""
        return new if self.mask is None else torch.where(self.mask[:, s], new, old)

    def emit(self, s, h):
        return h if self.mask is None else torch.where(self.mask[:, s], h, torch.zeros_like(h))

    def finish(self, ys, finals, layout, out):
        """Stack the per-step outputs into Y (T, D, B, H), undo the time flip, apply layout."""
        if ys:
            y = torch.stack(ys)
        else:
            y = torch.empty(0, self.num_dir, self.batch, self.hidden, dtype=self.dtype, device=self.device)
        if self.num_dir == 2:
            y = torch.stack([y[:, 0], y[:, 1].flip(0)], 1)
        elif self.reverse:
            y = y.flip(0)
        if self.lens is not None:
            # onnxruntime's convention: an empty sequence has zero final states
            nz = (self.lens > 0).reshape(1, -1, 1)
            finals = [torch.where(nz, f, torch.zeros_like(f)) for f in finals]
        if layout:
            y = y.permute(2, 0, 1, 3)
            finals = [f.transpose(0, 1) for f in finals]
        return _put(out, [y, *finals])


def _no_layout(fn):
    """The opset-7 form of a kernel: the same, without the ``layout`` attribute (added in 14)."""
    @wraps(fn)
    def kernel(*args, **kw):
        return fn(*args, layout=0, **kw)
    sig = inspect.signature(fn)
    kernel.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "layout"])
    return kernel


# torch's own recurrent kernels ------------------------------------------------------------
# torch.lstm / torch.gru / torch.rnn_tanh run the whole sequence in C++ (2-7x faster than the
# loop below at T = 1..100 on CPU) for the common configuration: default activations, no clip,
# no peepholes, no sequence_lens, forward or bidirectional, GRU with linear_before_reset (what
# PyTorch exports). Their weights are the ONNX ones with the gates reordered, made once per
# weight tensor (update_weights: the model's constant weights are the same tensors every call).
_TORCH_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2), "RNN": (0,)}  # torch's gates as ONNX gate indices
_PARAMS: dict[tuple, tuple] = {}
_PARAMS_MAX = 64


def _torch_params(kind: str, w, r, b, num_dir: int) -> list[torch.Tensor]:
    key = (kind, id(w), id(r), id(b))
    hit = _PARAMS.get(key)
    if hit is not None and hit[0] is w and hit[1] is r and hit[2] is b:
        return hit[3]
    order = _TORCH_ORDER[kind]
    g = len(order)

    def gates(m):  # (G*H, ...) in ONNX order -> torch order
        parts = m.chunk(g, 0)
        return torch.cat([parts[i] for i in order], 0).contiguous()

    params = []
    for d in range(num_dir):
        params += [gates(w[d]), gates(r[d])]
        if b is not None:
            wb, rb = b[d].chunk(2, 0)
            params += [gates(wb), gates(rb)]
    if len(_PARAMS) >= _PARAMS_MAX:
        _PARAMS.pop(next(iter(_PARAMS)))
    _PARAMS[key] = (w, r, b, params)
    return params


def _fused_ok(X, sequence_lens, activations, alphas, betas, clip, direction, defaults) -> bool:
    if sequence_lens is not None or clip is not None or alphas or betas or direction == "reverse":
        return False
    if X.dtype not in (torch.float32, torch.float64):
        return False
    return not activations or [a.lower() for a in activations] in (
        [d.lower() for d in defaults], [d.lower() for d in defaults] * 2)


def _fused(kind: str, X, W, R, B, states, direction, layout, out):
    """Y (T, D, B, H) and the final states through torch's kernel (time-major inside)."""
    d = _num_dir(direction)
    x = X.transpose(0, 1) if layout else X
    t, batch, h = x.shape[0], x.shape[1], R.shape[2]
    if W.shape[0] != d or R.shape[0] != d:
        raise ShapeError(f"W {tuple(W.shape)} / R {tuple(R.shape)} do not match {d} direction(s)")
    hx = []
    for s in states:
        if s is None:
            s = torch.zeros(d, batch, h, dtype=x.dtype, device=x.device)
        elif layout:
            s = s.transpose(0, 1)
        hx.append(s.to(x.dtype).contiguous())
    params = _torch_params(kind, W, R, B, d)
    # On CPU, oneDNN's RNN reorders the weights on every call, which pays from a few steps on
    # (torch 2.13, 2 threads: LSTM H=512 bidirectional T=30 4.7 ms against aten's own C++ loop's
    # 8.9; H=256 T=24 batch 4 1.2 against 4.5; H=64 T=20 0.19 against 0.50); aten's loop is faster
    # for one or two steps of one or two rows (a decoder step, a VAD chunk: H=64 T=1 0.04 against
    # 0.13). oneDNN also builds a primitive for every new (T, batch), which a small model feels on
    # its first call at a shape: below H=256 the loop keeps sequences up to 8 steps as before.
    # The switch is torch's global flag, set back at once.
    short = t * batch <= 4 if h >= 256 else t < 8
    native = x.device.type == "cpu" and short and torch._C._get_mkldnn_enabled()
    if native:
        torch._C._set_mkldnn_enabled(False)
    try:
        if kind == "LSTM":
            y, hn, cn = torch.lstm(x, hx, params, B is not None, 1, 0.0, False, d == 2, False)
            finals = [hn, cn]
        else:
            fn = torch.gru if kind == "GRU" else torch.rnn_tanh
            y, hn = fn(x, hx[0], params, B is not None, 1, 0.0, False, d == 2, False)
            finals = [hn]
    finally:
        if native:
            torch._C._set_mkldnn_enabled(True)
    y = y.view(t, batch, d, h).permute(0, 2, 1, 3)  # (T, B, D*H) -> (T, D, B, H)
    if layout:
        y = y.permute(2, 0, 1, 3)
        finals = [f.transpose(0, 1) for f in finals]
    return _put(out, [y, *finals])


# RNN ---------------------------------------------------------------------------------------
def _rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
         activations=None, clip=None, direction="forward", hidden_size=None, layout=0, out=None):
    if _fused_ok(X, sequence_lens, activations, activation_alpha, activation_beta, clip, direction, ["Tanh"]):
        return _fused("RNN", X, W, R, B, [initial_h], direction, layout, out)
    st = _Setup(X, W, R, B, sequence_lens, [initial_h], direction, layout, 1)
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], st.num_dir)
    bias = None if B is None else st.wb + st.rb
    proj = st.project(bias)
    h = st.states[0]
    ys = []
    for s in range(st.t):
        h_new = _act(acts, 0, torch.baddbmm(proj[:, s], h, st.rt), clip)
        ys.append(st.emit(s, h_new))
        h = st.keep(s, h_new, h)
    return st.finish(ys, [h], layout, out)


# GRU ---------------------------------------------------------------------------------------
def _gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
         activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0,
         out=None):
    if clip is None and not activation_alpha and not activation_beta and _default_gru_gates(activations):
        done = _native_gru(X, W, R, B, sequence_lens, initial_h, direction, layout, linear_before_reset, out)
        if done is not None:
            return _put(out, done)
    if linear_before_reset and _fused_ok(X, sequence_lens, activations, activation_alpha, activation_beta, clip,
                                         direction, ["Sigmoid", "Tanh"]):
        return _fused("GRU", X, W, R, B, [initial_h], direction, layout, out)
    st = _Setup(X, W, R, B, sequence_lens, [initial_h], direction, layout, 3)
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], st.num_dir)
    n = st.hidden
    bias = rbh = None
    if B is not None:
        if linear_before_reset:
            # Rbh sits inside r * (H*Rh^T + Rbh): only the z and r recurrent biases fold into the projection
            bias = st.wb + torch.cat([st.rb[:, :2 * n], torch.zeros_like(st.rb[:, 2 * n:])], 1)
            rbh = st.rb[:, 2 * n:].unsqueeze(1)
        else:
            bias = st.wb + st.rb
    proj = st.project(bias)
    rt_zr, rt_h = st.rt[:, :, :2 * n], st.rt[:, :, 2 * n:]
    h = st.states[0]
    ys = []
    for s in range(st.t):
        p = proj[:, s]
        if linear_before_reset:
            rec = torch.bmm(h, st.rt)
            z = _act(acts, 0, p[..., :n] + rec[..., :n], clip)
            r = _act(acts, 0, p[..., n:2 * n] + rec[..., n:2 * n], clip)
            rh = rec[..., 2 * n:] if rbh is None else rec[..., 2 * n:] + rbh
            hh = _act(acts, 1, p[..., 2 * n:] + r * rh, clip)
        else:
            zr = torch.baddbmm(p[..., :2 * n], h, rt_zr)
            z = _act(acts, 0, zr[..., :n], clip)
            r = _act(acts, 0, zr[..., n:], clip)
            hh = _act(acts, 1, torch.baddbmm(p[..., 2 * n:], r * h, rt_h), clip)
        h_new = hh + z * (h - hh)  # (1 - z) * hh + z * h
        ys.append(st.emit(s, h_new))
        h = st.keep(s, h_new, h)
    return st.finish(ys, [h], layout, out)


# LSTM --------------------------------------------------------------------------------------
def lstm_cell(g, c, n: int, acts, clip, peepholes=(None, None, None), input_forget=0):
    """(h', c') from the gates ``g`` (order i, o, f, c, last axis) and the cell state: ONNX LSTM's
    step with any activations, peepholes (pi, po, pf) and input_forget (shared with
    DynamicQuantizeLSTM)."""
    pi, po, pf = peepholes
    gi, go, gf, gc = g[..., :n], g[..., n:2 * n], g[..., 2 * n:3 * n], g[..., 3 * n:]
    i = _act(acts, 0, gi if pi is None else gi + pi * c, clip)
    f = 1 - i if input_forget else _act(acts, 0, gf if pf is None else gf + pf * c, clip)
    c_new = f * c + i * _act(acts, 1, gc, clip)
    o = _act(acts, 0, go if po is None else go + po * c_new, clip)
    return o * _act(acts, 2, c_new, None), c_new


def _lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *, activation_alpha=None,
          activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0,
          layout=0, out=None):
    if (P is None and not input_forget and clip is None and not activation_alpha and not activation_beta
            and _default_gates(activations)):
        done = _native_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, direction, layout, out)
        if done is not None:
            return _put(out, done)
    if P is None and not input_forget and _fused_ok(X, sequence_lens, activations, activation_alpha, activation_beta,
                                                    clip, direction, ["Sigmoid", "Tanh", "Tanh"]):
        return _fused("LSTM", X, W, R, B, [initial_h, initial_c], direction, layout, out)
    st = _Setup(X, W, R, B, sequence_lens, [initial_h, initial_c], direction, layout, 4)
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], st.num_dir)
    n = st.hidden
    proj = st.project(None if B is None else st.wb + st.rb)
    pi = pf = po = None
    if P is not None:
        pp = P.to(st.dtype).unsqueeze(1)  # (D, 1, 3H): peepholes of the gates i, o, f
        pi, po, pf = pp[..., :n], pp[..., n:2 * n], pp[..., 2 * n:]
    h, c = st.states
    ys = []
    for s in range(st.t):
        g = torch.baddbmm(proj[:, s], h, st.rt)  # gates in the order i, o, f, c
        h_new, c_new = lstm_cell(g, c, n, acts, clip, (pi, po, pf), input_forget)
        ys.append(st.emit(s, h_new))
        h = st.keep(s, h_new, h)
        c = st.keep(s, c_new, c)
    return st.finish(ys, [h, c], layout, out)


# LSTM in C (csrc/lstm.c) -------------------------------------------------------------------
_LSTM_FORMS = WeightCache()  # per W, R or B: its blocks for lstm.c
_THREAD_MIN_WORK = 1 << 20  # multiply-adds below which a second thread costs more than it saves


def _default_gates(activations) -> bool:
    return not activations or [a.lower() for a in activations] in (["sigmoid", "tanh", "tanh"],
                                                                    ["sigmoid", "tanh", "tanh"] * 2)


def _gate_blocks(v: torch.Tensor, n: int) -> torch.Tensor:
    """(D, 4H[, K]) in ONNX's gate order (i, o, f, c) -> lstm.c's blocks of 16 units x 4 gates, the
    64 columns last: (D, blocks[, K], 64), zero-padded to whole blocks. From ``v.detach()``: the
    cache keeps this, which must not hold the weight (weight_cache.py)."""
    d, rest = v.shape[0], tuple(v.shape[2:])
    v = v.detach().to(torch.float32).reshape(d, 4, n, *rest)
    if n % 16:
        v = torch.cat([v, v.new_zeros(d, 4, -n % 16, *rest)], 2)
    v = v.reshape(d, 4, -1, 16, *rest)
    v = v.permute(0, 2, 4, 1, 3) if rest else v.permute(0, 2, 1, 3)  # (D, blocks[, K], 4, 16)
    return v.reshape(*v.shape[:-2], 64).contiguous()


def _into(out, i: int, shape: tuple) -> torch.Tensor | None:
    """``out[i]`` where the C kernel can write it as it is: contiguous float32 of ``shape``."""
    o = out[i] if isinstance(out, (tuple, list)) and len(out) > i else None
    if o is None or o.dtype != torch.float32 or tuple(o.shape) != shape or not o.is_contiguous():
        return None
    return o


def _native_shapes(X, W, R, B, gates: int, direction, layout):
    """(directions, X as [T, batch, in], T, batch, in, hidden) of a float32 CPU recurrence whose
    weights have ``gates`` gate blocks, or None where the C kernels do not serve it (the torch path
    then says what does not match)."""
    if X.device.type != "cpu" or not (X.dtype == W.dtype == R.dtype == torch.float32):
        return None
    nd = _num_dir(direction)
    x = X.transpose(0, 1) if layout else X
    t, batch, ni = x.shape
    n = R.shape[-1]
    if tuple(W.shape) != (nd, gates * n, ni) or tuple(R.shape) != (nd, gates * n, n) or (
            B is not None and tuple(B.shape) != (nd, 2 * gates * n)) or not (t and batch and n and ni):
        return None
    return nd, x, t, batch, ni, n


def _native_lstm(X, W, R, B, sequence_lens, initial_h, initial_c, direction, layout, out=None):
    """[Y, Y_h, Y_c] of a float32 CPU LSTM with the default gates through csrc/lstm.c, or None where
    it does not serve (another device or dtype, shapes the torch path refuses, no compiler: then
    torch's, counted in native.counters()). The kernel writes ``out``'s buffers where they fit
    (the layout-0 forms: a run's states and outputs without a copy each; the caller's ``_put``
    then finds them in place)."""
    shapes = _native_shapes(X, W, R, B, 4, direction, layout)
    if shapes is None:
        return None
    nd, x, t, batch, ni, n = shapes
    fn = native.function("lstm", "lstm_f32", "iiiiiiippppppppp", fallbacks="lstm")
    if fn is None:
        return None
    w = _LSTM_FORMS.get(W, lambda: _gate_blocks(W, n))
    r = _LSTM_FORMS.get(R, lambda: _gate_blocks(R, n))
    bias = None if B is None else _LSTM_FORMS.get(
        B, lambda: _gate_blocks(B.detach()[:, :4 * n].float() + B.detach()[:, 4 * n:].float(), n))
    lens = None
    steps = t
    if sequence_lens is not None:
        lens = sequence_lens.to(torch.int64).clamp(0, t).contiguous()
        steps = int(lens.max())
    states = []
    for i, s in ((1, initial_h), (2, initial_c)):
        o = None if layout else _into(out, i, (nd, batch, n))
        if s is None:
            states.append(torch.zeros(nd, batch, n) if o is None else o.zero_())
        else:
            s = s.transpose(0, 1) if layout else s
            states.append(s.to(torch.float32, copy=True).contiguous() if o is None else o.copy_(s))
    h, c = states
    y = None if layout or lens is not None else _into(out, 0, (t, nd, batch, n))
    if y is None:  # (every step's rows are written unless sequence lengths leave some out)
        y = torch.zeros(t, nd, batch, n) if lens is not None else torch.empty(t, nd, batch, n)
    reverse = (ctypes.c_int64 * nd)(*[int(direction == "reverse" or d == 1) for d in range(nd)])
    threads = torch.get_num_threads() if steps * batch * 4 * n * (n + ni) >= _THREAD_MIN_WORK else 1
    x = x.contiguous()
    if steps:
        fn(nd, threads, t, steps, batch, ni, n, x.data_ptr(), w.data_ptr(), r.data_ptr(),
           None if bias is None else bias.data_ptr(), None if lens is None else lens.data_ptr(), reverse,
           h.data_ptr(), c.data_ptr(), y.data_ptr())
    elif lens is not None:  # every sequence empty: zero final states, as onnxruntime's
        h.zero_(), c.zero_()
    native.count("lstm_native_calls")
    if layout:
        return [y.permute(2, 0, 1, 3), h.transpose(0, 1), c.transpose(0, 1)]
    return [y, h, c]


# GRU in C (csrc/gru.c) -----------------------------------------------------------------------
_GRU_FORMS = WeightCache()  # per W or R: its transpose for gru.c; per B: its float32 copy
# multiply-adds of a layer up to which gru.c runs it where torch's own kernel could (linear_before_reset,
# forward or bidirectional, no sequence_lens): one C call against torch.gru's calls a step or oneDNN's
# primitive per new (T, batch); above, torch's threaded kernel. Measured with gru.c's register tiles
# (2 threads, the 2-core AMD EPYC): a bidirectional layer, its directions on a thread each, took
# 0.08-0.52x torch.gru's time at every size tried (5M-3.8G multiply-adds; in 512, hidden 256, 100 x 32:
# 71 against 99 ms); one direction on one thread against torch's two 0.47-0.91x up to 57M, 0.94-1.3x
# from 118M. Every other configuration goes to gru.c whatever its size: the alternative is rnn.py's loop
# of ~10 torch calls a step.
_GRU_NATIVE_MAX_WORK = 1 << 26
_GRU_NATIVE_MAX_WORK_BIDIRECTIONAL = 1 << 32
# a bidirectional layer's directions on two threads from this many multiply-adds (one fork a call; a
# smaller layer's two directions take ~0.1 ms on one thread, about what waking a second one can cost
# on a busy machine)
_GRU_THREAD_MIN_WORK = 1 << 22


def _default_gru_gates(activations) -> bool:
    return not activations or [a.lower() for a in activations] in (["sigmoid", "tanh"], ["sigmoid", "tanh"] * 2)


def _native_gru(X, W, R, B, sequence_lens, initial_h, direction, layout, lbr, out=None):
    """[Y, Y_h] of a float32 CPU GRU with the default gates through csrc/gru.c, or None where it
    does not serve (another device or dtype, shapes the torch path refuses, a large layer torch's
    kernel runs better, no compiler: then torch's, counted in native.counters())."""
    shapes = _native_shapes(X, W, R, B, 3, direction, layout)
    if shapes is None:
        return None
    nd, x, t, batch, ni, n = shapes
    work = t * batch * nd * 3 * n * (n + ni)
    # (measured at 2 threads: with more, torch's kernel has more, and a direction here one)
    most = _GRU_NATIVE_MAX_WORK_BIDIRECTIONAL if nd == 2 and torch.get_num_threads() <= 2 else _GRU_NATIVE_MAX_WORK
    if lbr and sequence_lens is None and direction != "reverse" and work > most and X.dtype == torch.float32:
        native.count("gru_torch_large")  # torch's kernel: the faster one here, not a fallback
        return None
    fn = native.function("gru", "gru_f32", "iiiiiiipppppppp", fallbacks="gru")
    if fn is None:
        return None
    wt = _GRU_FORMS.get(W, lambda: W.detach().transpose(1, 2).contiguous())
    rt = _GRU_FORMS.get(R, lambda: R.detach().transpose(1, 2).contiguous())
    bias = None if B is None else _GRU_FORMS.get(B, lambda: B.detach().to(torch.float32, copy=True).contiguous())
    lens = None if sequence_lens is None else sequence_lens.to(torch.int64).clamp(0, t).contiguous()
    o = None if layout else _into(out, 1, (nd, batch, n))
    if initial_h is None:
        h = torch.zeros(nd, batch, n) if o is None else o.zero_()
    else:
        s = initial_h.transpose(0, 1) if layout else initial_h
        h = s.to(torch.float32, copy=True).contiguous() if o is None else o.copy_(s)
    y = None if layout or lens is not None else _into(out, 0, (t, nd, batch, n))
    if y is None:  # (every step's rows are written unless sequence lengths leave some out)
        y = torch.zeros(t, nd, batch, n) if lens is not None else torch.empty(t, nd, batch, n)
    reverse = (ctypes.c_int64 * nd)(*[int(direction == "reverse" or d == 1) for d in range(nd)])
    threads = 2 if nd == 2 and work >= _GRU_THREAD_MIN_WORK and torch.get_num_threads() >= 2 else 1
    x = x.contiguous()
    fn(nd, threads, t, batch, ni, n, int(bool(lbr)), x.data_ptr(), wt.data_ptr(), rt.data_ptr(),
       None if bias is None else bias.data_ptr(),
       None if lens is None else lens.data_ptr(), reverse, h.data_ptr(), y.data_ptr())
    native.count("gru_native_calls")
    if layout:
        return [y.permute(2, 0, 1, 3), h.transpose(0, 1)]
    return [y, h]


for _name, _fn, _n_states in (("RNN", _rnn, 1), ("GRU", _gru, 1), ("LSTM", _lstm, 2)):
    _infer = _rnn_infer(_n_states)
    op(_name, 7, infer=_infer)(_no_layout(_fn))
    op(_name, 14, infer=_infer)(_fn)
    op(_name, 22, infer=_infer)(_fn)
