"""onnxruntime's module-level surface beyond the session: the functions packages call at import
(telemetry switches, logger severity, build info, seeds), ``OrtValue``, and the ``capi`` modules
whose names packages import (``onnxruntime.capi.onnxruntime_pybind11_state``'s exceptions).

``install()`` makes ``import onnxruntime`` (and those ``capi`` paths) give dynashape, so that a
package written for onnxruntime runs unchanged; ``python -m dynashape.ort_module script.py ARGS``
runs a script so. Each function does the nearest right thing here: dynashape sends no telemetry,
its logger is Python's ``logging`` under ``dynashape``, its random ops draw from torch's generator.
"""

from __future__ import annotations

import logging
import platform
import sys
import types

import numpy as np
import torch

from . import errors
from .ir import elem_type_name, onnx_elem_type

# onnxruntime's severities 0 verbose, 1 info, 2 warning, 3 error, 4 fatal, as logging levels
_SEVERITY = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING, 3: logging.ERROR, 4: logging.CRITICAL}


def disable_telemetry_events() -> None:
    """Nothing to disable: dynashape sends no telemetry."""


def enable_telemetry_events() -> None:
    """Nothing to enable: dynashape sends no telemetry."""


def set_default_logger_severity(severity: int) -> None:
    """The level of dynashape's logger (onnxruntime's 0 verbose .. 4 fatal)."""
    if severity not in _SEVERITY:
        raise errors.OptionsError(f"set_default_logger_severity: {severity!r}, expected 0-4 (0 verbose .. 4 fatal)")
    logging.getLogger("dynashape").setLevel(_SEVERITY[severity])


def set_default_logger_verbosity(verbosity: int) -> None:
    """onnxruntime's VLOG level applies to severity 0 only; dynashape's verbose logs are DEBUG."""
    if not isinstance(verbosity, int) or verbosity < 0:
        raise errors.OptionsError(f"set_default_logger_verbosity: {verbosity!r}, expected an int >= 0")


def get_version_string() -> str:
    from . import __version__
    return __version__


def get_build_info() -> str:
    return (f"dynashape {get_version_string()}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda or 'none'}, Python {platform.python_version()}")


def set_seed(seed: int) -> None:
    """The seed of the random ops (RandomNormal, Multinomial, Dropout in training mode ...): torch's."""
    torch.manual_seed(int(seed))


def has_collective_ops() -> bool:
    return False


def preload_dlls(*args, **kwargs) -> None:
    """onnxruntime loads CUDA's libraries early with it; torch loads its own."""


class OrtValue:
    """onnxruntime.OrtValue over a torch tensor (accepted as a feed wherever a tensor is)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    @staticmethod
    def ortvalue_from_numpy(array, device_type: str = "cpu", device_id: int = 0) -> OrtValue:
        t = torch.from_numpy(np.ascontiguousarray(array))
        return OrtValue(t if device_type == "cpu" else t.to(_device(device_type, device_id)))

    @staticmethod
    def ortvalue_from_shape_and_type(shape, element_type=np.float32, device_type: str = "cpu",
                                     device_id: int = 0) -> OrtValue:
        dtype = torch.from_numpy(np.zeros(0, dtype=element_type)).dtype
        return OrtValue(torch.empty(tuple(shape), dtype=dtype, device=_device(device_type, device_id)))

    def numpy(self) -> np.ndarray:
        return self._tensor.detach().cpu().numpy()

    def shape(self) -> list[int]:
        return list(self._tensor.shape)

    def data_type(self) -> str:
        return f"tensor({elem_type_name(onnx_elem_type(self._tensor))})"  # onnxruntime's spelling, as NodeArg's

    def element_type(self):
        return torch.empty(0, dtype=self._tensor.dtype).numpy().dtype.type  # no copy of the data

    def device_name(self) -> str:
        return "cuda" if self._tensor.is_cuda else "cpu"

    def is_tensor(self) -> bool:
        return True

    def data_ptr(self) -> int:
        return self._tensor.data_ptr()

    def as_tensor(self) -> torch.Tensor:
        return self._tensor


def _device(device_type: str, device_id: int) -> torch.device:
    if device_type not in ("cpu", "cuda"):
        raise errors.OptionsError(f"OrtValue: device_type {device_type!r}, expected 'cpu' or 'cuda'")
    return torch.device("cpu") if device_type == "cpu" else torch.device("cuda", device_id)


def unwrap(feeds):
    """Feeds with each OrtValue replaced by its tensor."""
    if isinstance(feeds, dict) and any(type(v) is OrtValue for v in feeds.values()):
        return {k: v._tensor if type(v) is OrtValue else v for k, v in feeds.items()}
    return feeds


def pybind_state() -> types.ModuleType:
    """``onnxruntime.capi.onnxruntime_pybind11_state``: its exception names as dynashape's errors
    (an ``except InvalidArgument`` around a run with bad feeds catches dynashape's InputError)."""
    import dynashape
    m = types.ModuleType("onnxruntime.capi.onnxruntime_pybind11_state")
    m.Fail = m.RuntimeException = m.EngineError = m.EPFail = errors.DynashapeError
    m.InvalidArgument = errors.InputError
    m.NoSuchFile = m.NoModel = m.InvalidProtobuf = m.InvalidGraph = m.ModelLoaded = errors.InvalidModelError
    m.NotImplemented = errors.UnsupportedOpError
    for name in ("get_available_providers", "get_all_providers", "get_device", "SessionOptions", "RunOptions",
                 "GraphOptimizationLevel", "ExecutionMode", "ModelMetadata"):
        setattr(m, name, getattr(dynashape, name))
    for name in ("set_default_logger_severity", "set_default_logger_verbosity", "disable_telemetry_events",
                 "enable_telemetry_events", "get_build_info", "set_seed", "OrtValue"):
        setattr(m, name, globals()[name])
    return m


def install() -> None:
    """``import onnxruntime`` gives dynashape from now on in this process (and the capi modules)."""
    import dynashape
    state = pybind_state()
    capi = types.ModuleType("onnxruntime.capi")
    collection = types.ModuleType("onnxruntime.capi.onnxruntime_inference_collection")
    for name in ("InferenceSession", "IOBinding", "SessionOptions", "RunOptions"):
        setattr(collection, name, getattr(dynashape, name))
    collection.OrtValue = OrtValue
    capi.onnxruntime_pybind11_state = capi._pybind_state = state
    capi.onnxruntime_inference_collection = collection
    dynashape.capi = capi
    sys.modules.update({"onnxruntime": dynashape, "onnxruntime.capi": capi,
                        "onnxruntime.capi.onnxruntime_pybind11_state": state,
                        "onnxruntime.capi._pybind_state": state,
                        "onnxruntime.capi.onnxruntime_inference_collection": collection})


def main(argv: list[str] | None = None) -> int:
    """``python -m dynashape.ort_module script.py ARGS``: the script, with onnxruntime being dynashape."""
    import runpy
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m dynashape.ort_module script.py [args...]  (or -m module [args...])", file=sys.stderr)
        return 2
    install()
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
