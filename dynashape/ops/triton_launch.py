"""What the ops' own Triton kernels share around a launch.

``INTERPRET``: Triton runs the kernels in its interpreter (TRITON_INTERPRET=1, read at import), on
CPU tensors: their tests where there is no GPU. ``on(device)``: Triton launches on the current CUDA
device, so a launch for a tensor on ``cuda:1`` makes that device current first (nothing to do in
the interpreter).
"""

from __future__ import annotations

import contextlib
import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def on(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
