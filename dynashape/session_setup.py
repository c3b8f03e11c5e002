"""The choices a session makes from its options at creation, each checked there (an OptionsError
naming the option, not a failure at the first run): the device, the executor, whether to trace at
load, and which inputs decide an If (deciding_inputs.py)."""

from __future__ import annotations

import numpy as np
import onnx
import torch

from . import deciding_inputs as deciding
from .compat import resolve_providers
from .errors import OptionsError


def deciders(proto, options: dict, executor: str, device) -> tuple:
    """(name, dtypes a feed may have, shape) of each input that decides an If (deciding_inputs.py);
    () where variants are off: the option, the interpreter (the reference flow runs the graph as it
    is), a device session (reading the value would wait for the device)."""
    if not options.get("decided_ifs", True) or executor != "compiled" or device.type != "cpu":
        return ()
    names = deciding.deciding_inputs(proto)
    out = []
    for i in proto.graph.input:
        if i.name in names:
            t = i.type.tensor_type
            np_dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
            out.append((i.name, (np_dtype, torch.from_numpy(np.zeros(0, np_dtype)).dtype),
                        tuple(d.dim_value for d in t.shape.dim)))
    return tuple(out)


def precompile_wanted(value, static: str | None) -> str | None:
    """``precompile``: which specializations are traced at load. 'auto': all the likely ones where
    static impls are on (CUDA by default: a first call at a new shape should not pay a trace), only
    the generic one elsewhere (one trace at load, ~0.1 s: the first call of a CPU session then runs
    the generated code, as onnxruntime's first call runs its kernels); True: all; False: none.
    Returns "all", "generic" or None."""
    if value == "auto":
        return "all" if static is not None else "generic"
    if isinstance(value, bool):
        return "all" if value else None
    raise OptionsError(f"precompile={value!r}: expected 'auto', True or False")


def flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{name}={value!r}: expected True or False")
    return value


EXECUTORS = ("compiled", "interpreter")


def executor(value) -> str:
    """``executor=``: "compiled" (generated code per specialization; the default) or
    "interpreter" (the per-node flow for every run)."""
    v = value if value is not None else "compiled"
    if v not in EXECUTORS:
        raise OptionsError(f"executor={v!r}: expected one of {list(EXECUTORS)}")
    return v


def device_of(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OptionsError(f"device {device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionsError(f"device {device!r} asked for, but this torch build sees no CUDA device")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise OptionsError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise OptionsError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")
    return dev


def placement(device, providers, provider_options) -> tuple[torch.device, list[str], list[dict]]:
    """(device, providers, their options) of a session: ``device=`` where given (providers are
    still checked: an unknown name is an error), else the first available of onnxruntime's
    ``providers``, else the CPU."""
    if provider_options is not None and providers is None:
        raise OptionsError("provider_options given without providers")
    if device is None and providers:
        return resolve_providers(providers, provider_options)
    if providers:
        resolve_providers(providers, provider_options)
    dev = device_of(device if device is not None else "cpu")
    if dev.type == "cuda":
        return dev, ["CUDAExecutionProvider", "CPUExecutionProvider"], [{"device_id": str(dev.index)}, {}]
    return dev, ["CPUExecutionProvider"], [{}]
