"""A run's small input arrays on the device as views of one buffer, filled by one copy.

A paged run feeds the model ~9 small arrays (token ids, positions, block tables, lengths, slots...).
Copied one by one, each took a pinned staging buffer and a copy launch: at 64 conversations the
replay's input copies were ~0.5 ms of a step's ~1.3 ms host time (H200, issue 39). Here they are
laid out in one buffer (each at a 64-byte aligned offset), written into one pinned host buffer by
numpy and sent with one copy that does not make the host wait.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

ALIGN = 64


@functools.cache
def _np_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


class Staged:
    """``arrays``: name -> (host array, device dtype). ``tensors``: name -> the device view; ``fill``
    writes the next run's arrays of the same shapes."""

    def __init__(self, arrays: dict[str, tuple[np.ndarray, torch.dtype]], dev: torch.device) -> None:
        self.dev = dev
        self.layout: dict[str, tuple[int, int, tuple, torch.dtype]] = {}
        at = 0
        for name, (a, dtype) in arrays.items():
            nbytes = a.size * torch.empty(0, dtype=dtype).element_size()
            self.layout[name] = (at, nbytes, a.shape, dtype)
            at += -(-nbytes // ALIGN) * ALIGN
        self.nbytes = max(at, 1)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=dev)
        self.tensors = {name: self.buffer[off:off + n].view(dtype).view(shape)
                        for name, (off, n, shape, dtype) in self.layout.items()}
        self.fill(arrays)

    def fill(self, arrays: dict[str, tuple[np.ndarray, torch.dtype]]) -> None:
        # pinned on CUDA: the copy does not wait, and torch's host cache keeps the block until it has run
        host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=self.dev.type == "cuda")
        h = host.numpy()
        for name, (a, _) in arrays.items():
            off, n, shape, dtype = self.layout[name]
            if a.shape != shape:
                raise ValueError(f"staged input {name!r}: shape {a.shape}, the buffer's is {shape}")
            h[off:off + n].view(_np_dtype(dtype)).reshape(shape)[...] = a
        self.buffer.copy_(host, non_blocking=True)
