"""Engine: owns the memory a network allocates and counts it.

Every output buffer of every node comes from here, so the counters say what a run really
allocated. (The allocation types, the pool and the predictor of the memory issue build on it.)
"""

from __future__ import annotations

import logging
import os
from collections import Counter

import torch

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, verbose: int | None = None) -> None:
        self.verbose = int(os.environ.get("DYNASHAPE_VERBOSE", "0")) if verbose is None else verbose
        self.counters: Counter = Counter()
        self.current_bytes = 0
        self.peak_bytes = 0

    def allocate(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        buf = torch.empty(numel, dtype=dtype, device=device)
        nbytes = buf.numel() * buf.element_size()
        self.counters["allocations"] += 1
        self.counters["allocated_bytes_total"] += nbytes
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        if self.verbose >= 2:
            log.info("Allocate %d bytes of %s allocation type (current=%d; max=%d)", nbytes,
                     device.type, self.current_bytes, self.peak_bytes)
        return buf

    def release(self, buf: torch.Tensor, handed_out: bool = False) -> None:
        nbytes = buf.numel() * buf.element_size()
        self.counters["handed_out" if handed_out else "frees"] += 1
        self.current_bytes -= nbytes
        if self.verbose >= 2:
            log.info("Free %d bytes (current=%d; max=%d)", nbytes, self.current_bytes, self.peak_bytes)

    def stats(self) -> dict:
        return {**self.counters, "current_bytes": self.current_bytes, "peak_bytes": self.peak_bytes}
