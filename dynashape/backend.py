"""An onnx.backend Backend over InferenceSession, so the ONNX test suites can drive dynashape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from .api import InferenceSession


class DynashapeRep(BackendRep):
    """A prepared model: run() takes inputs in graph order (or by name) and returns outputs in order."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.input_names = [a.name for a in session.get_inputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            # Trailing optional inputs may be left out, as in the onnx test data.
            feeds = dict(zip(self.input_names, inputs))
        return tuple(self.session.run(None, feeds))


class DynashapeBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> DynashapeRep:
        super().prepare(model, device, **kwargs)
        options = {k: v for k, v in kwargs.items() if k not in ("rtol", "atol")}
        return DynashapeRep(InferenceSession(model, device=_device(device), **options))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info=None, **kwargs: Any):
        """Wrap one node in a model whose input types come from the given arrays."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        arrays = [np.asarray(x) for x in inputs]
        vis = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(node.input, arrays) if n]
        outs = [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in node.output if n]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        graph = onnx.helper.make_graph([node], "run_node", vis, outs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(node.domain, opset)])
        return cls.run_model(model, [a for n, a in zip(node.input, arrays) if n], device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        import torch
        d = device.upper()
        return d == "CPU" or (d.startswith("CUDA") and torch.cuda.is_available())


def _device(device: str) -> str:
    d = str(device).lower()
    return "cpu" if d == "cpu" else d


prepare = DynashapeBackend.prepare
run_model = DynashapeBackend.run_model
run_node = DynashapeBackend.run_node
supports_device = DynashapeBackend.supports_device
