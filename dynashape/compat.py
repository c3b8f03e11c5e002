"""onnxruntime's Python API around InferenceSession: SessionOptions, RunOptions, NodeArg,
providers, model metadata and IOBinding, so that code written for onnxruntime runs unchanged.

``SessionOptions`` (dynashape/session_options.py) holds onnxruntime's fields and dynashape's; what
each of onnxruntime's does here is in its table, dynashape/options.py (docs/options.md).

Providers: ``CPUExecutionProvider`` -> cpu, ``CUDAExecutionProvider`` -> ``cuda:<device_id>``
(cpu with a RuntimeWarning when torch sees no CUDA device); ``TensorrtExecutionProvider`` is run
as CUDA (torch kernels, with a RuntimeWarning); the other onnxruntime providers (ROCm, MIGraphX,
DirectML, OpenVINO, CoreML, ...) are skipped with a RuntimeWarning, as onnxruntime skips a
provider that is not available; a name onnxruntime does not know is an OptionsError.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .errors import OptionsError, UnsupportedFeatureError
from .ir import elem_type_name
from .ort_enums import ExecutionMode, ExecutionOrder, GraphOptimizationLevel  # noqa: F401  onnxruntime's names
from .session_options import SessionOptions  # noqa: F401  onnxruntime's name
from .shape import PartialShape


@dataclass(frozen=True)
class NodeArg:
    """Like onnxruntime.NodeArg: ``shape`` holds ints for fixed dims and names or None for dynamic ones."""

    name: str
    type: str
    shape: list
    partial_shape: PartialShape | None


def node_arg(v) -> NodeArg:
    """The NodeArg of a graph input or output."""
    t = f"tensor({elem_type_name(v.elem_type)})"  # onnxruntime's spelling: tensor(float)
    if v.kind != "tensor":
        t = f"{v.kind}({t})"
    shape = [] if v.shape is None else [d.min if d.is_static else (d.symbol or None) for d in v.shape]
    return NodeArg(v.name, t, shape, v.shape)


class RunOptions:
    """onnxruntime.RunOptions: ``terminate=True`` makes a run that starts raise
    RunTerminatedError (the session stays usable); the log fields and tags are recorded."""

    def __init__(self) -> None:
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""  # onnxruntime's run tag
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    @property
    def run_tag(self) -> str:
        """The run's tag: onnxruntime's ``logid`` (an older onnxruntime name)."""
        return self.logid

    @run_tag.setter
    def run_tag(self, value: str) -> None:
        self.logid = value

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise OptionsError(f"RunOptions has no config entry {key!r}")
        return self._config[key]


def get_available_providers() -> list[str]:
    if torch.cuda.is_available():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def get_all_providers() -> list[str]:
    return list(_KNOWN)


def get_device() -> str:
    """onnxruntime.get_device: "GPU" when torch sees a CUDA device, else "CPU"."""
    return "GPU" if torch.cuda.is_available() else "CPU"

_SKIPPED = ("ROCMExecutionProvider", "MIGraphXExecutionProvider", "DmlExecutionProvider",
            "OpenVINOExecutionProvider", "CoreMLExecutionProvider", "DnnlExecutionProvider",
            "ACLExecutionProvider", "ArmNNExecutionProvider", "QNNExecutionProvider",
            "NnapiExecutionProvider", "XnnpackExecutionProvider", "VitisAIExecutionProvider",
            "WebGpuExecutionProvider", "JsExecutionProvider", "AzureExecutionProvider",
            "CANNExecutionProvider", "SNPEExecutionProvider", "TvmExecutionProvider",
            "RknpuExecutionProvider", "NvTensorRTRTXExecutionProvider")
_KNOWN = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "CPUExecutionProvider") + _SKIPPED


def resolve_providers(providers, provider_options=None) -> tuple[torch.device, list[str], list[dict]]:
    """The device that ``providers`` (names or (name, options) pairs, onnxruntime's order of
    preference) select, with the providers kept and their options."""
    if isinstance(providers, str):
        providers = [providers]
    entries = []
    for i, p in enumerate(providers):
        if isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str):
            name, opts = p[0], dict(p[1] or {})
        elif isinstance(p, str):
            name, opts = p, {}
        else:
            raise OptionsError(f"providers[{i}] = {p!r}: expected a provider name or a (name, options) pair")
        if provider_options is not None and i < len(provider_options) and provider_options[i]:
            opts.update(provider_options[i])
        entries.append((name, opts))
    if provider_options is not None and len(provider_options) != len(entries):
        raise OptionsError(f"provider_options has {len(provider_options)} entries for {len(entries)} providers; "
                           f"give one dict per provider")
    unknown = [n for n, _ in entries if n not in _KNOWN]
    if unknown:
        raise OptionsError(f"unknown provider(s) {unknown}; known providers are {list(_KNOWN)} "
                           f"(dynashape runs CUDAExecutionProvider and CPUExecutionProvider)")
    for name, opts in entries:
        if name in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
            if not torch.cuda.is_available():
                warnings.warn(f"{name} is not available (torch sees no CUDA device); running on "
                              f"CPUExecutionProvider", RuntimeWarning, stacklevel=4)
                continue
            if name == "TensorrtExecutionProvider":
                warnings.warn("TensorrtExecutionProvider: dynashape runs the model on CUDA with torch kernels",
                              RuntimeWarning, stacklevel=4)
            try:
                index = int(opts.get("device_id", 0))
            except (TypeError, ValueError) as e:
                raise OptionsError(f"{name} device_id={opts.get('device_id')!r} is not an integer") from e
            return (torch.device("cuda", index), ["CUDAExecutionProvider", "CPUExecutionProvider"],
                    [{k: str(v) for k, v in {"device_id": index, **opts}.items()}, {}])
        if name == "CPUExecutionProvider":
            return torch.device("cpu"), ["CPUExecutionProvider"], [{}]
        warnings.warn(f"{name} is not available in dynashape; skipped", RuntimeWarning, stacklevel=4)
    return torch.device("cpu"), ["CPUExecutionProvider"], [{}]


class ModelMetadata:
    """onnxruntime.ModelMetadata, read from the ModelProto."""

    def __init__(self, proto) -> None:
        self.producer_name = proto.producer_name
        self.graph_name = proto.graph.name
        self.graph_description = proto.graph.doc_string
        self.domain = proto.domain
        self.description = proto.doc_string
        self.version = proto.model_version
        self.custom_metadata_map = {p.key: p.value for p in proto.metadata_props}

    def __repr__(self) -> str:
        return (f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
                f"domain={self.domain!r}, version={self.version})")


def _device_of(device_type, device_id) -> torch.device:
    t = str(device_type).lower()
    if t in ("cpu", "cpu_input", "cpu_output"):
        return torch.device("cpu")
    if t in ("cuda", "gpu"):
        return torch.device("cuda", int(device_id or 0))
    raise OptionsError(f"device_type {device_type!r}: expected 'cpu' or 'cuda'")


class IOBinding:
    """onnxruntime.IOBinding over torch tensors (``session.io_binding()``).

    Inputs: ``bind_cpu_input(name, array)``, ``bind_input_tensor(name, tensor)`` (dynashape: a
    torch tensor on any device). ``bind_input`` with a raw ``buffer_ptr`` (onnxruntime's form)
    raises UnsupportedFeatureError: use ``bind_input_tensor``. Outputs: ``bind_output(name,
    device_type, device_id)`` (the output comes back as a tensor on that device), or
    ``bind_output_tensor(name, tensor)`` (a preallocated tensor: with tensor inputs and the
    compiled executor, the kernel that makes the output writes straight into it, no copy; else the
    output is copied in; its shape and dtype must match). ``run_with_iobinding`` runs; ``get_outputs()`` gives torch
    tensors, ``copy_outputs_to_cpu()`` numpy arrays."""

    def __init__(self, session) -> None:
        self._session = session
        self._inputs: dict[str, object] = {}
        self._outputs: dict[str, tuple] = {}  # name -> (device, preallocated tensor or None)
        self._results: list = []

    # ---- inputs
    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr) -> None:
        """onnxruntime's raw-pointer form: not supported (dynashape holds torch tensors); raises
        UnsupportedFeatureError. Use ``bind_input_tensor(name, tensor)`` or ``bind_cpu_input``."""
        raise UnsupportedFeatureError(
            f"IOBinding.bind_input({name!r}, ..., buffer_ptr=...): binding a raw buffer pointer is not "
            f"supported; use bind_input_tensor({name!r}, tensor) with a torch tensor, or bind_cpu_input")

    def bind_cpu_input(self, name: str, arr_on_cpu) -> None:
        self._inputs[name] = np.asarray(arr_on_cpu) if not isinstance(arr_on_cpu, torch.Tensor) else arr_on_cpu

    def bind_input_tensor(self, name: str, tensor: torch.Tensor) -> None:
        """dynashape: bind a torch tensor (any device) as the input ``name``."""
        if not isinstance(tensor, torch.Tensor):
            raise OptionsError(f"bind_input_tensor({name!r}): expected a torch.Tensor, got {type(tensor).__name__}")
        self._inputs[name] = tensor

    def bind_ortvalue_input(self, name, ortvalue) -> None:
        raise UnsupportedFeatureError("IOBinding.bind_ortvalue_input: OrtValue is not supported; "
                                      "use bind_input_tensor with a torch tensor")

    # ---- outputs
    def bind_output(self, name: str, device_type="cpu", device_id=0, element_type=None, shape=None,
                    buffer_ptr=None) -> None:
        """The output ``name`` comes back on ``device_type``:``device_id``. A raw ``buffer_ptr``
        is not supported (UnsupportedFeatureError): use ``bind_output_tensor``."""
        if buffer_ptr is not None:
            raise UnsupportedFeatureError(
                f"IOBinding.bind_output({name!r}, ..., buffer_ptr=...): binding a raw buffer pointer is not "
                f"supported; use bind_output_tensor({name!r}, tensor) with a preallocated torch tensor")
        self._outputs[name] = (_device_of(device_type, device_id), None)

    def bind_output_tensor(self, name: str, tensor: torch.Tensor) -> None:
        """dynashape: a preallocated torch tensor the output ``name`` is copied into."""
        if not isinstance(tensor, torch.Tensor):
            raise OptionsError(f"bind_output_tensor({name!r}): expected a torch.Tensor, got {type(tensor).__name__}")
        self._outputs[name] = (tensor.device, tensor)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def synchronize_inputs(self) -> None:
        pass

    def synchronize_outputs(self) -> None:
        if torch.cuda.is_available() and any(d.type == "cuda" for d, _ in self._outputs.values()):
            torch.cuda.synchronize()

    def get_outputs(self) -> list:
        """The outputs of the last run_with_iobinding as torch tensors, in binding order."""
        return list(self._results)

    def get_outputs_names(self) -> list[str]:
        return list(self._outputs)

    def copy_outputs_to_cpu(self) -> list:
        return [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t for t in self._results]

    # ---- running (InferenceSession.run_with_iobinding)
    def _run(self, run_options=None) -> None:
        s = self._session
        names = list(self._outputs) or [a.name for a in s.get_outputs()]
        if all(isinstance(v, np.ndarray) for v in self._inputs.values()):
            feeds = dict(self._inputs)
        else:
            feeds = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in self._inputs.items()}
        bound = {n: pre for n, (_, pre) in self._outputs.items() if pre is not None}
        outs = s._run_bound(names, feeds, run_options, bound)
        results = []
        for n, o in zip(names, outs):
            t = torch.from_numpy(np.ascontiguousarray(o)) if isinstance(o, np.ndarray) else o
            dev, pre = self._outputs.get(n, (None, None))
            if pre is not None:
                if tuple(pre.shape) != tuple(t.shape) or pre.dtype != t.dtype:
                    raise OptionsError(f"bind_output_tensor({n!r}): the bound tensor is {pre.dtype}"
                                       f"{list(pre.shape)}, the output is {t.dtype}{list(t.shape)}")
                if t is not pre:  # written in place when its kernel could (no copy); else copied in
                    pre.copy_(t)
                t = pre
            elif dev is not None and isinstance(t, torch.Tensor) and t.device != dev:
                t = t.to(dev)
            results.append(t)
        self._results = results
