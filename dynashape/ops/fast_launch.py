"""Launching a Triton kernel without the JIT's per-call binding: its compiled form kept per
specialisation, run directly.

Why: ``kernel[grid](...)`` binds every argument, computes the specialisation key (each pointer's
alignment, each integer's value class) and looks the compiled kernel up on every call: ~40 us of
Python on the H200's host over the ~12 us of the launch itself (benchmarks/triton_launch.py).
On the dynamic path, whose calls of a few thousand tokens are bound by the host's launches, a
Triton kernel that replaces two or three torch kernels saves nothing at that price. Here the key
is what can change between calls of one kernel in our use: the constexprs the caller passes, which
pointers are 16-byte aligned (Triton specialises on that) and which are None; integer arguments
must be in the kernel's ``do_not_specialize`` (a row count, a stride), so that one compiled form
serves every value. The first call of a key goes through the JIT (compiling where needed) and keeps
what it returns; later ones call the compiled kernel's ``run`` with the same arguments the JIT
passes it (every parameter in order, constexprs included: Triton >= 3.2's launcher).
"""

from __future__ import annotations

import inspect

import torch

try:
    import triton
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

_DIRECT = triton is not None and tuple(int(p) for p in triton.__version__.split(".")[:2]) >= (3, 2)
FAST_LAUNCHES = [0]  # launches that skipped the JIT's binding (stats' triton_fast_launches)


class Launcher:
    """``Launcher(kernel)(grid, args, constexprs, num_warps)``: ``args`` the kernel's leading
    parameters (tensors, None, ints or floats), ``constexprs`` the trailing constexpr parameters in
    order."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.names = None  # the constexprs' parameter names, for the JIT's keyword call
        self.compiled: dict[tuple, object] = {}

    def __call__(self, grid: tuple, args: tuple, constexprs: tuple, num_warps: int = 4) -> None:
        device = next(a for a in args if isinstance(a, torch.Tensor)).device
        key = (constexprs, num_warps, device.index, tuple(
            None if a is None else a.data_ptr() % 16 == 0 for a in args if not isinstance(a, (int, float))))
        ck = self.compiled.get(key) if _DIRECT else None
        if ck is None:
            if self.names is None:
                params = list(inspect.signature(self.kernel.fn).parameters)
                self.names = params[len(params) - len(constexprs):]
            ck = self.kernel[grid](*args, **dict(zip(self.names, constexprs)), num_warps=num_warps)
            if _DIRECT and ck is not None:
                self.compiled[key] = ck
            return
        FAST_LAUNCHES[0] += 1
        g = grid + (1,) * (3 - len(grid))
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, None, None, None, *args, *constexprs)
