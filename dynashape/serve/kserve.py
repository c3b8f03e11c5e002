"""The KServe v2 (Open Inference Protocol) JSON tensor encoding, both ways.

A tensor is ``{"name", "shape", "datatype", "data"}`` with ``data`` the row-major flat list (a
nested list is accepted too). Triton Inference Server, KServe and Seldon speak it, so their
clients work against ``dynashape serve`` unchanged.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputTypeError

TO_NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
            "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
            "FP32": np.float32, "FP64": np.float64}
FROM_NUMPY = {np.dtype(v): k for k, v in TO_NUMPY.items()}
# the model's declared element types (NodeArg.type) as KServe datatypes, for metadata
FROM_ONNX = {"tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(int8)": "INT8", "tensor(int16)": "INT16",
             "tensor(int32)": "INT32", "tensor(int64)": "INT64", "tensor(float16)": "FP16",
             "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(bfloat16)": "BF16"}


def decode_inputs(body: dict) -> dict[str, np.ndarray]:
    """Feeds from an inference request body; a malformed tensor raises InputTypeError naming it."""
    tensors = body.get("inputs") if isinstance(body, dict) else None
    if not isinstance(tensors, list) or not tensors:
        raise InputTypeError('request body: expected {"inputs": [{"name", "shape", "datatype", "data"}, ...]}')
    feeds = {}
    for t in tensors:
        name = t.get("name") if isinstance(t, dict) else None
        if not isinstance(name, str):
            raise InputTypeError(f"request body: every input needs a name, got {t!r:.80}")
        kind = TO_NUMPY.get(t.get("datatype"))
        if kind is None:
            raise InputTypeError(f"input {name!r}: datatype {t.get('datatype')!r} is not one of {', '.join(TO_NUMPY)}")
        shape = t.get("shape")
        try:
            a = np.asarray(t.get("data"), dtype=kind)
            feeds[name] = a.reshape(shape)
        except (TypeError, ValueError) as e:
            raise InputTypeError(f"input {name!r}: data does not fit shape {shape} as {t.get('datatype')}: {e}") from e
    return feeds


def encode_outputs(model: str, outputs: dict[str, np.ndarray], request_id: str | None = None) -> dict:
    body = {"model_name": model, "outputs": []}
    if request_id is not None:
        body["id"] = request_id
    for name, a in outputs.items():
        a = np.asarray(a)
        kind = FROM_NUMPY.get(a.dtype)
        if kind is None:  # bfloat16 and other dtypes JSON has no name for: sent as FP32 values
            a, kind = a.astype(np.float32), "FP32"
        body["outputs"].append({"name": name, "shape": list(a.shape), "datatype": kind, "data": a.ravel().tolist()})
    return body


def metadata(model: str, inputs, outputs) -> dict:
    """Model metadata: dynamic dims as -1, as the protocol writes them."""
    def tensor(a):
        return {"name": a.name, "datatype": FROM_ONNX.get(a.type, a.type),
                "shape": [d if isinstance(d, int) else -1 for d in a.shape]}
    return {"name": model, "platform": "dynashape", "inputs": [tensor(a) for a in inputs],
            "outputs": [tensor(a) for a in outputs]}
