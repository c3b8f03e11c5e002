"""Custom ops: kernels of your own for ops of your own domain (or ops dynashape lacks).

    import torch, dynashape

    def scaled_tanh(x, *, alpha=1.0, out=None):          # inputs positional, attributes keyword-only
        return torch.mul(torch.tanh(x), alpha, out=out)   # write into ``out`` when it is given

    def same_shape(shapes, values, *, alpha=1.0):         # one shape per output, from the inputs' shapes
        return [shapes[0]]

    dynashape.register_op("ScaledTanh", scaled_tanh, infer=same_shape, domain="com.example")

A node ``ScaledTanh`` of domain ``com.example`` (the model imports that domain in its
``opset_import``) then runs in both executors, on CPU and CUDA (the kernel gets tensors on the
session's device).

- ``kernel(*inputs, out=None, **attributes)``: attributes arrive as keyword arguments with their
  ONNX names; give each a default. With ``out`` (a tensor, or a tuple for several outputs), write
  the result there and return it: the runtime plans those buffers. ``writes_out=False`` for a
  kernel that always returns a new tensor instead.
- ``infer(shapes, values, **attributes)``: the output shapes, as tuples, from the inputs' shapes.
  It is also run on symbolic dims when the model is compiled, so use plain arithmetic on the dims
  (``+ - * //``, comparisons), not ``int()``. ``values[i]`` holds input i's value as a CPU tensor
  for the inputs listed in ``shape_deps`` (an output size read from data). ``infer=None``: the
  output shape is known only after the kernel ran (like NonZero): the node is a break point.
- ``since``: the opset of the op's domain from which this kernel serves (a later registration
  of the same op at a higher opset takes over from there).

``dynashape ops --domain com.example`` lists what is registered.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import OptionsError
from .ops.registry import op


def register_op(op_type: str, kernel: Callable, *, infer: Callable | None, domain: str = "", since: int = 1,
                shape_deps: tuple[int, ...] = (), writes_out: bool = True) -> None:
    """Register ``kernel`` (and its shape function ``infer``) for ``op_type`` of ``domain``; see
    the module docstring."""
    if not op_type or not isinstance(op_type, str):
        raise OptionsError(f"register_op: op_type must be a non-empty str, got {op_type!r}")
    if not callable(kernel) or (infer is not None and not callable(infer)):
        raise OptionsError(f"register_op({op_type!r}): kernel and infer must be callables")
    op(op_type, since, domain, infer=infer, shape_deps=tuple(shape_deps), writes_out=writes_out,
       notes="custom")(kernel)
