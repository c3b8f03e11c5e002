"""ONNX element types and their torch / numpy counterparts."""

from __future__ import annotations

import numpy as np
import onnx
import torch

TP = onnx.TensorProto

_TORCH = {
    TP.FLOAT: torch.float32, TP.DOUBLE: torch.float64, TP.FLOAT16: torch.float16,
    TP.BFLOAT16: torch.bfloat16, TP.INT8: torch.int8, TP.INT16: torch.int16, TP.INT32: torch.int32,
    TP.INT64: torch.int64, TP.UINT8: torch.uint8, TP.BOOL: torch.bool,
    TP.UINT16: torch.uint16, TP.UINT32: torch.uint32, TP.UINT64: torch.uint64,
    TP.COMPLEX64: torch.complex64, TP.COMPLEX128: torch.complex128,
    TP.FLOAT8E4M3FN: torch.float8_e4m3fn, TP.FLOAT8E5M2: torch.float8_e5m2,
    TP.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz, TP.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}
_FROM_NP = {
    np.dtype(np.float32): TP.FLOAT, np.dtype(np.float64): TP.DOUBLE, np.dtype(np.float16): TP.FLOAT16,
    np.dtype(np.int8): TP.INT8, np.dtype(np.int16): TP.INT16, np.dtype(np.int32): TP.INT32,
    np.dtype(np.int64): TP.INT64, np.dtype(np.uint8): TP.UINT8, np.dtype(np.uint16): TP.UINT16,
    np.dtype(np.uint32): TP.UINT32, np.dtype(np.uint64): TP.UINT64, np.dtype(np.bool_): TP.BOOL,
    np.dtype(np.complex64): TP.COMPLEX64, np.dtype(np.complex128): TP.COMPLEX128,
    np.dtype(object): TP.STRING, np.dtype(np.str_): TP.STRING,
}


def torch_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype of an ONNX element type (KeyError for strings and unknown types)."""
    return _TORCH[elem_type]


def np_dtype(elem_type: int) -> np.dtype:
    if elem_type == TP.STRING:
        return np.dtype(object)
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def onnx_elem_type(x) -> int:
    """Element type of a torch dtype, numpy dtype, tensor or array."""
    if isinstance(x, torch.Tensor):
        x = x.dtype
    elif isinstance(x, np.ndarray):
        x = x.dtype
    if isinstance(x, torch.dtype):
        return _FROM_TORCH[x]
    dt = np.dtype(x)
    if dt.kind in "US":
        return TP.STRING
    if dt in _FROM_NP:
        return _FROM_NP[dt]
    return onnx.helper.np_dtype_to_tensor_dtype(dt)  # ml_dtypes types (bfloat16, float8, int4)


def elem_type_name(elem_type: int) -> str:
    return TP.DataType.Name(elem_type).lower() if elem_type else "unknown"


_VIEW_AS = {TP.BFLOAT16: (np.uint16, torch.bfloat16), TP.FLOAT8E4M3FN: (np.uint8, torch.float8_e4m3fn),
            TP.FLOAT8E5M2: (np.uint8, torch.float8_e5m2), TP.FLOAT8E4M3FNUZ: (np.uint8, torch.float8_e4m3fnuz),
            TP.FLOAT8E5M2FNUZ: (np.uint8, torch.float8_e5m2fnuz)}


def to_torch(array: np.ndarray, elem_type: int | None = None):
    """A numpy array as a CPU torch tensor; strings (and types torch lacks) stay numpy."""
    if elem_type is None:
        elem_type = onnx_elem_type(array)
    if elem_type == TP.STRING or array.dtype == object:
        return np.asarray(array, dtype=object)
    if elem_type in _VIEW_AS:
        raw, tdt = _VIEW_AS[elem_type]
        return torch.from_numpy(np.ascontiguousarray(array).view(raw).copy()).view(tdt)
    if elem_type not in _TORCH:  # int4 / uint4 / float4: no torch dtype, the host handles them
        return np.asarray(array)
    return torch.from_numpy(np.array(array, copy=True))


def to_numpy(t) -> np.ndarray:
    """A tensor as a numpy array with the ONNX-matching dtype (bf16 / fp8 through ml_dtypes)."""
    if isinstance(t, np.ndarray):
        return t
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    for et, (raw, tdt) in _VIEW_AS.items():
        if t.dtype == tdt:
            return t.view(torch.uint16 if raw is np.uint16 else torch.uint8).numpy().view(np_dtype(et))
    return t.numpy()
