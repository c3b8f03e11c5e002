"""Signal processing ops: DFT, STFT, the Hann / Hamming / Blackman windows, MelWeightMatrix.

ONNX carries complex values as real tensors whose last dim holds (real, imaginary) (size 2) or
only the real part (size 1); the kernels turn them into torch complex tensors for torch.fft and
back.
"""

from __future__ import annotations

import math

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from .registry import op
from .shapes import first_item

# torch.fft has no CPU kernels for these: they are transformed in float32 and cast back
_HALF = (torch.float16, torch.bfloat16)


def _int_of(t) -> int:
    return int(first_item(t))


def _opt(items, i):
    """Item i of a shape function's shapes or values; trailing absent inputs are left out."""
    return items[i] if i < len(items) else None


def _opt_int(values, i) -> int | None:
    v = _opt(values, i)
    return None if v is None else _int_of(v)


def _as_signal(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] (real) or [..., 2] (real, imag) as a real or complex tensor of one rank less."""
    if x.dtype in _HALF:
        x = x.float()
    if x.shape[-1] == 1:
        return x.squeeze(-1)
    if x.shape[-1] == 2:
        return torch.view_as_complex(x.contiguous())
    raise ShapeError(f"the last dim holds (real, imag) and must be 1 or 2, got shape {tuple(x.shape)}")


def _emit(y: torch.Tensor, dtype: torch.dtype, out):
    """A complex result as [..., 2], a real one as [..., 1], in the op's dtype."""
    # ifft of a real signal comes back as a lazy conjugate, which view_as_real refuses
    r = torch.view_as_real(y.resolve_conj()) if y.is_complex() else y.unsqueeze(-1)
    return r.to(dtype) if out is None else out.copy_(r)


# ---- DFT ----------------------------------------------------------------------------------------
def _dft_axis(axis: int, rank: int) -> int:
    # the last dim holds the complex parts and is no signal axis
    if not (-rank <= axis <= rank - 2) or axis == -1:
        raise ShapeError(f"DFT axis {axis} is out of range for an input of rank {rank}: the last dim is "
                         "the complex one")
    return axis % rank


def _dft_shape(shape, n, axis, inverse, onesided) -> tuple:
    if isinstance(shape[-1], int) and shape[-1] not in (1, 2):
        raise ShapeError(f"DFT: the last dim holds (real, imag) and must be 1 or 2, got shape {tuple(shape)}")
    a = _dft_axis(axis, len(shape))
    if n is None:  # IRFFT rebuilds an even-length signal from its one-sided spectrum
        n = (shape[a] - 1) * 2 if inverse and onesided else shape[a]
    out = list(shape)
    if onesided and not inverse:
        out[a], out[-1] = n // 2 + 1, 2
    else:
        out[a], out[-1] = n, 1 if onesided else 2
    return tuple(out)


def _dft(x, n, axis, inverse, onesided, out):
    a = _dft_axis(axis, x.dim())
    s = _as_signal(x)
    if n is None:
        n = 2 * (s.shape[a] - 1) if inverse and onesided else s.shape[a]
    if inverse:
        y = torch.fft.irfft(s, n, dim=a) if onesided else torch.fft.ifft(s, n, dim=a)
    elif onesided and not s.is_complex():
        y = torch.fft.rfft(s, n, dim=a)
    else:
        y = torch.fft.fft(s, n, dim=a)
        if onesided:  # a complex signal has no symmetric spectrum: its first half is returned
            y = y.narrow(a, 0, n // 2 + 1)
    return _emit(y, x.dtype, out)


def _dft17_infer(shapes, values, *, axis=1, inverse=0, onesided=0):
    return [_dft_shape(shapes[0], _opt_int(values, 1), axis, inverse, onesided)]


def _dft20_infer(shapes, values, *, inverse=0, onesided=0):
    axis = _opt_int(values, 2)
    return [_dft_shape(shapes[0], _opt_int(values, 1), -2 if axis is None else axis, inverse, onesided)]


@op("DFT", 17, infer=_dft17_infer, shape_deps=(1,))
def _dft17(x, dft_length=None, *, axis=1, inverse=0, onesided=0, out=None):
    n = None if dft_length is None else _int_of(dft_length)
    return _dft(x, n, axis, inverse, onesided, out)


@op("DFT", 20, infer=_dft20_infer, shape_deps=(1, 2))
def _dft20(x, dft_length=None, axis=None, *, inverse=0, onesided=0, out=None):
    n = None if dft_length is None else _int_of(dft_length)
    return _dft(x, n, -2 if axis is None else _int_of(axis), inverse, onesided, out)


# ---- STFT ---------------------------------------------------------------------------------------
def _frame_length(signal_shape, window_shape, frame_length) -> int:
    if frame_length is not None:
        n = _int_of(frame_length)
        if window_shape is not None and window_shape[0] != n:
            raise ShapeError(f"STFT: window of length {window_shape[0]} for frame_length {n}; they must match")
        return n
    return window_shape[0] if window_shape is not None else signal_shape[1]


def _stft_infer(shapes, values, *, onesided=1):
    sig = shapes[0]
    if len(sig) != 3:
        raise ShapeError(f"STFT: the signal must be [batch, length, 1 or 2], got shape {tuple(sig)}")
    step = _int_of(values[1])
    n = _frame_length(sig, _opt(shapes, 2), _opt(values, 3))
    frames = (sig[1] - n) // step + 1
    return [(sig[0], frames, n // 2 + 1 if onesided else n, 2)]


@op("STFT", 17, infer=_stft_infer, shape_deps=(1, 3))
def _stft(signal, frame_step, window=None, frame_length=None, *, onesided=1, out=None):
    n = _frame_length(signal.shape, None if window is None else window.shape, frame_length)
    s = _as_signal(signal)  # (batch, length)
    frames = s.unfold(1, n, _int_of(frame_step))  # (batch, frames, n), a view
    if window is not None:
        frames = frames * window.to(frames.real.dtype)
    if onesided and not frames.is_complex():
        y = torch.fft.rfft(frames, dim=-1)
    else:
        y = torch.fft.fft(frames, dim=-1)
        if onesided:
            y = y.narrow(-1, 0, n // 2 + 1)
    return _emit(y, signal.dtype, out)


# ---- windows ------------------------------------------------------------------------------------
def _window_infer(shapes, values, **_attrs):
    return [(_int_of(values[0]),)]


def _cosine_window(size, coeffs, periodic, output_datatype, device, out):
    """sum_k (-1)^k a_k cos(2 pi k n / N) for n < size, with N = size (periodic: the first size
    points of a window of size + 1) or size - 1 (symmetric)."""
    n = _int_of(size)
    if out is not None:
        device = out.device
    denom = n if periodic else n - 1
    if denom == 0:  # a symmetric window of one point is that point's peak, as in torch and scipy
        w = torch.ones(n, dtype=torch.float64, device=device)
    else:
        x = torch.arange(n, dtype=torch.float64, device=device) * (2 * math.pi / denom)
        w = torch.full_like(x, coeffs[0])
        for k, a in enumerate(coeffs[1:], 1):
            w += (-a if k % 2 else a) * torch.cos(k * x)
    return w.to(torch_dtype(output_datatype)) if out is None else out.copy_(w)


@op("HannWindow", 17, infer=_window_infer, shape_deps=(0,))
def _hann(size, *, periodic=1, output_datatype=1, _device=None, out=None):
    return _cosine_window(size, (0.5, 0.5), periodic, output_datatype, _device, out)


@op("HammingWindow", 17, infer=_window_infer, shape_deps=(0,))
def _hamming(size, *, periodic=1, output_datatype=1, _device=None, out=None):
    return _cosine_window(size, (25 / 46, 21 / 46), periodic, output_datatype, _device, out)


@op("BlackmanWindow", 17, infer=_window_infer, shape_deps=(0,))
def _blackman(size, *, periodic=1, output_datatype=1, _device=None, out=None):
    return _cosine_window(size, (0.42, 0.5, 0.08), periodic, output_datatype, _device, out)


# ---- MelWeightMatrix ----------------------------------------------------------------------------
def _mel_infer(shapes, values, **_attrs):
    return [(_int_of(values[1]) // 2 + 1, _int_of(values[0]))]


def _hz_to_mel(f: float) -> float:
    return 2595 * math.log1p(f / 700) / math.log(10)


@op("MelWeightMatrix", 17, infer=_mel_infer, shape_deps=(0, 1))
def _mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                       output_datatype=1, _device=None, out=None):
    n_mel, n_fft, rate = _int_of(num_mel_bins), _int_of(dft_length), _int_of(sample_rate)
    lo, hi = _hz_to_mel(float(lower_edge_hertz.reshape(-1)[0])), _hz_to_mel(float(upper_edge_hertz.reshape(-1)[0]))
    # n_mel + 2 edges, evenly spaced on the mel scale. The step divides by the number of edges,
    # not the number of gaps, like onnxruntime and onnx's reference: the top edge stays below
    # upper_edge_hertz.
    mel = torch.arange(n_mel + 2, dtype=torch.float64) * ((hi - lo) / (n_mel + 2)) + lo
    hz = 700 * torch.expm1(mel / 2595 * math.log(10))
    # the spectrogram bin of each edge (floor division, rounded like the references')
    edges = torch.div((n_fft + 1) * hz, rate, rounding_mode="floor").to(torch.int64)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]  # one triangle per mel bin (column)
    j = torch.arange(n_fft // 2 + 1, dtype=torch.int64)[:, None]
    # rising side left..center (a single 1 at the center when left == center), falling side
    # center..right (exclusive); both are 1 at the center
    rise = torch.where(center > left, (j - left) / (center - left).clamp_min(1), 1.0)
    fall = (right - j) / (right - center).clamp_min(1)
    w = torch.where((j >= left) & (j <= center), rise, torch.zeros((), dtype=torch.float64))
    w = torch.where((j >= center) & (j < right), fall, w)
    if out is not None:
        return out.copy_(w)
    return w.to(device=_device, dtype=torch_dtype(output_datatype))
