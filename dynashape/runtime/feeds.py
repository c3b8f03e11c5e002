"""Checking and converting the feeds of run(): typed errors before any state is touched."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import (
    InputRankError,
    InputShapeError,
    InputTypeError,
    MemoryLimitError,
    MissingInputError,
    SymbolDisagreementError,
    UnknownInputError,
)
from ..ir import Value, elem_type_name, onnx_elem_type
from ..shape import PartialShape


@dataclass
class InputSpec:
    name: str
    elem_type: int
    shape: PartialShape | None
    kind: str
    # per axis (axis, min, max or None, symbol of a dynamic dim or None): checked on every call,
    # so worked out once
    dims: tuple = ()

    @staticmethod
    def of(v: Value) -> InputSpec:
        dims = () if v.shape is None else tuple(
            (a, d.min, d.max, None if d.is_static else d.symbol) for a, d in enumerate(v.shape))
        return InputSpec(v.name, v.elem_type, v.shape, v.kind, dims)


class FeedChecker:
    """prepare_feeds for one model, with what does not change between calls worked out once."""

    def __init__(self, specs: list[InputSpec], device: torch.device, max_buffer_bytes: int | None = None) -> None:
        self.specs, self.device = specs, device
        self.copy_limit = CopyLimit(max_buffer_bytes)
        self.by_name = {s.name: s for s in specs}
        # a feed that is a tensor of this dtype needs no element-type lookup
        self.dtypes = {s.name: _torch_dtype(s.elem_type) for s in specs}
        # nor an array of this (native-order) numpy dtype: the types numpy holds as torch does
        self.np_dtypes = {s.name: np.dtype(_NUMPY_HELD[s.elem_type]) for s in specs
                          if s.kind == "tensor" and s.elem_type in _NUMPY_HELD}

    def __call__(self, feeds) -> tuple[dict, bool]:
        if not isinstance(feeds, dict) or not feeds or len(feeds) != len(self.specs):
            return prepare_feeds(feeds, self.specs, self.device, self.by_name, self.copy_limit)
        first = next(iter(feeds.values()))
        if type(first) is np.ndarray:
            return self._arrays(feeds)
        out: dict = {}
        symbols: dict[str, tuple[str, int, int]] = {}
        by_name, dtypes, device = self.by_name, self.dtypes, self.device
        for name, x in feeds.items():
            s = by_name.get(name)
            # the common case: a tensor of the right dtype where the session runs; else the full path
            if s is None or type(x) is not torch.Tensor or x.dtype != dtypes[name] or s.kind != "tensor" \
                    or x.device != device:
                return prepare_feeds(feeds, self.specs, self.device, self.by_name, self.copy_limit)
            _check_shape(s, x.shape, symbols)
            out[name] = x
        return out, False

    def _arrays(self, feeds: dict) -> tuple[dict, bool]:
        """The common numpy case: every feed an array of its input's dtype, writeable, with no
        negative stride (what torch.from_numpy shares as it is); else the full path."""
        out: dict = {}
        symbols: dict[str, tuple[str, int, int]] = {}
        by_name, np_dtypes = self.by_name, self.np_dtypes
        for name, x in feeds.items():
            s = by_name.get(name)
            if s is None or type(x) is not np.ndarray or x.dtype != np_dtypes.get(name):
                return prepare_feeds(feeds, self.specs, self.device, self.by_name, self.copy_limit)
            flags = x.flags
            if not flags.writeable or (not flags.c_contiguous and any(st < 0 for st in x.strides)):
                return prepare_feeds(feeds, self.specs, self.device, self.by_name, self.copy_limit)
            _check_shape(s, x.shape, symbols)
            out[name] = torch.from_numpy(x)  # a host tensor: a device session stages it (_to_tensor)
        return out, True


# ONNX element types whose numpy arrays torch.from_numpy takes as the tensors the session holds
_NUMPY_HELD = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
               9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def _torch_dtype(elem_type: int):
    from ..ir.dtypes import torch_dtype
    try:
        return torch_dtype(elem_type)
    except KeyError:
        return None


def prepare_feeds(feeds, specs: list[InputSpec], device: torch.device,
                  by_name: dict | None = None, copy_limit: CopyLimit | None = None) -> tuple[dict, bool]:
    """Validate feeds against the declared inputs; returns (tensors by name, numpy_mode)."""
    copy_limit = copy_limit or CopyLimit(None)
    if not isinstance(feeds, Mapping):
        raise InputTypeError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
    by_name = by_name or {s.name: s for s in specs}
    for name in feeds:
        if name not in by_name:
            raise UnknownInputError(name, list(by_name))
    missing = [s.name for s in specs if s.name not in feeds]
    if missing:
        raise MissingInputError(missing, list(feeds))
    out: dict = {}
    numpy_mode = True
    symbols: dict[str, tuple[str, int, int]] = {}
    for s in specs:
        x = feeds[s.name]
        if s.kind == "optional" and x is None:
            out[s.name] = None  # an empty optional
            continue
        if s.kind != "tensor" and isinstance(x, list):
            # a sequence (or an optional holding one): each element is checked and converted
            items = [_element(s, i, t, device, copy_limit) for i, t in enumerate(x)]
            numpy_mode = numpy_mode and not any(isinstance(t, torch.Tensor) for t in x)
            out[s.name] = items
            continue
        if isinstance(x, (list, tuple, int, float, bool)):
            x = _from_python(s, x)  # as onnxruntime takes them: an array of the input's element type
        if isinstance(x, torch.Tensor):
            numpy_mode = False
        elif isinstance(x, (np.ndarray, np.generic)):
            x = np.asarray(x)
            copy_limit.check(x, f"input {s.name!r}")
            x = _native(x)
        else:
            raise InputTypeError(f"input {s.name!r}: expected a numpy array or torch tensor of "
                                 f"{elem_type_name(s.elem_type)}, got {type(x).__name__}")
        _check_dtype(s, x, f"input {s.name!r}")
        _check_shape(s, tuple(x.shape), symbols)
        out[s.name] = _to_tensor(x, device, staged=True)
    return out, numpy_mode


def _from_python(s: InputSpec, x) -> np.ndarray:
    """A list, tuple or Python number fed for a tensor input, as an array of its element type."""
    dtype = object if s.elem_type == 8 else _NUMPY_HELD.get(s.elem_type)
    try:
        return np.asarray(x, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise InputTypeError(f"input {s.name!r}: a {type(x).__name__} that is not an array of "
                             f"{elem_type_name(s.elem_type)}: {e}") from e


def _element(s: InputSpec, i: int, x, device: torch.device, copy_limit: CopyLimit):
    """Element i of a sequence input: an array of the sequence's element type (any shape)."""
    if not isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        raise InputTypeError(f"input {s.name!r} element {i}: expected a numpy array or torch tensor, "
                             f"got {type(x).__name__}")
    if not isinstance(x, torch.Tensor):
        x = np.asarray(x)
        copy_limit.check(x, f"input {s.name!r} element {i}")
        x = _native(x)
    _check_dtype(s, x, f"input {s.name!r} element {i}")
    return _to_tensor(x, device)


class CopyLimit:
    """The size check of a feed the session copies (read-only, a broadcast view, another byte
    order, strings, ml_dtypes): a ``np.broadcast_to`` view of 2^40 elements holds no memory until
    it is copied, and the copy itself would fail with numpy's MemoryError, naming nothing. Its
    dense size is refused beyond ``max_buffer_bytes`` (else what the machine holds) before any
    copy. A feed shared as it is (``torch.from_numpy``) allocates nothing and is not checked."""

    def __init__(self, max_buffer_bytes: int | None) -> None:
        self.max_buffer_bytes = max_buffer_bytes
        self._host: int | None = None

    def limit(self) -> tuple[int, str]:
        if self.max_buffer_bytes is not None:
            return self.max_buffer_bytes, "max_buffer_bytes"
        if self._host is None:
            from ..memory.engine import host_total
            self._host = host_total()
        return self._host, "what this machine holds"

    def check(self, x: np.ndarray, what: str) -> None:
        if _shared(x):
            return
        n = x.dtype.itemsize
        for d in x.shape:
            n *= int(d)  # Python ints: no overflow
        limit, src = self.limit()
        if n <= limit:
            return
        raise MemoryLimitError(f"{what} of shape {list(x.shape)} ({x.dtype}) needs {n} bytes once copied, more "
                               f"than {src} ({limit} bytes); nothing was copied")


def _shared(x: np.ndarray) -> bool:
    """Whether ``_to_tensor`` takes ``x`` as it is, without a copy (ml_dtypes' types are of kind
    "V": they are converted)."""
    if not x.dtype.isnative or x.dtype.kind in "OUSV" or not x.flags.writeable:
        return False
    return not any(st < 0 for st in x.strides)


def _native(x: np.ndarray) -> np.ndarray:
    """An array in this machine's byte order (a big-endian ``>f4`` feed is read by value)."""
    if x.dtype.isnative or x.dtype.kind in "OUSV":
        return x
    return x.astype(x.dtype.newbyteorder("="))


def _check_dtype(s: InputSpec, x, what: str) -> None:
    et = onnx_elem_type(x)
    if s.elem_type and et != s.elem_type:
        raise InputTypeError(f"{what}: dtype {elem_type_name(et)} given, {elem_type_name(s.elem_type)} expected")


def _check_shape(s: InputSpec, shape: tuple[int, ...], symbols: dict) -> None:
    if s.shape is None:
        return
    if len(shape) != len(s.dims):  # (one entry per axis: PartialShape's len is a Python call)
        raise InputRankError(f"input {s.name!r}: rank {len(shape)} given (shape {list(shape)}), rank "
                             f"{len(s.shape)} expected (shape {s.shape})")
    for (axis, lo, hi, symbol), v in zip(s.dims, shape):
        if v < lo or (hi is not None and v > hi):
            d = s.shape[axis]
            sym = f" ({d.symbol!r})" if d.symbol else ""
            raise InputShapeError(f"input {s.name!r} axis {axis}{sym}: size {v} is outside the declared "
                                  f"range {d.range_str()}")
        if symbol:
            seen = symbols.setdefault(symbol, (s.name, axis, v))
            if seen[2] != v:
                raise SymbolDisagreementError(f"input {s.name!r} axis {axis} is {v} but input {seen[0]!r} axis "
                                              f"{seen[1]} is {seen[2]}; both are dimension {symbol!r}", symbol)


def _to_tensor(x, device: torch.device, staged: bool = False):
    """``staged``: a host tensor for a device session is left on the host; the Network copies it
    into a device buffer of its own (sized by the predictor) instead of a fresh one per run."""
    if isinstance(x, torch.Tensor):
        return x if x.device == device or staged else x.to(device)
    if x.dtype == object or x.dtype.kind in "US":
        return x.astype(object)  # strings stay on the host as numpy
    et = onnx_elem_type(x)
    if et in _ML_DTYPES:
        from ..ir.dtypes import to_torch
        t = to_torch(x, et)  # int4 & co. become int8 / uint8 / float8 tensors (see ir.dtypes)
    else:
        if not x.flags.writeable or any(st < 0 for st in x.strides):
            x = x.copy()
        t = torch.from_numpy(x)
    return t if device.type == "cpu" or staged else t.to(device, non_blocking=False)


# ml_dtypes arrays: bfloat16, the float8 types (17-20, 24), the 4- and 2-bit types (21-23, 25, 26)
# and the float6 types (27, 28)
_ML_DTYPES = {16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28}
