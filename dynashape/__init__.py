"""dynashape: run ONNX models with dynamic shapes on torch kernels, on CPU and CUDA."""

from . import errors
from .api import InferenceSession, InferRequest, NodeArg
from .compat import (
    ExecutionMode,
    GraphOptimizationLevel,
    IOBinding,
    ModelMetadata,
    RunOptions,
    SessionOptions,
    get_all_providers,
    get_available_providers,
    get_device,
)
from .custom_ops import register_op
from .ort_module import (
    OrtValue,
    disable_telemetry_events,
    enable_telemetry_events,
    get_build_info,
    get_version_string,
    has_collective_ops,
    preload_dlls,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_seed,
)
from .queue import AsyncInferQueue
from .shape import Dimension, PartialShape

__all__ = ["InferenceSession", "InferRequest", "NodeArg", "Dimension", "PartialShape", "errors",
           "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode", "IOBinding", "ModelMetadata",
           "get_available_providers", "get_all_providers", "get_device", "AsyncInferQueue", "register_op",
           "OrtValue", "disable_telemetry_events", "enable_telemetry_events", "get_build_info", "get_version_string",
           "has_collective_ops", "preload_dlls", "set_default_logger_severity", "set_default_logger_verbosity",
           "set_seed"]
__version__ = "0.1.0"
