"""dynashape: run ONNX models with dynamic shapes on torch kernels, on CPU and CUDA."""

from . import errors
from .api import InferenceSession, InferRequest, NodeArg
from .shape import Dimension, PartialShape

__all__ = ["InferenceSession", "InferRequest", "NodeArg", "Dimension", "PartialShape", "errors"]
__version__ = "0.1.0"
