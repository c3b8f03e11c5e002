"""Host feeds of a device session: copied into a device buffer kept per input.

A numpy (or CPU tensor) feed for a CUDA session needs device memory every call. Instead of a
fresh tensor per call, each input keeps a buffer that is reused while it is large enough, and
sized by the ShapePredictor when it must grow (an input that grows step by step is predicted
like any other buffer).
"""

from __future__ import annotations

from collections import Counter

import torch

from ..ops.shapes import prod


class InputStager:
    def __init__(self, device: torch.device, engine, predictor, stats: Counter) -> None:
        self.device, self.engine, self.predictor, self.stats = device, engine, predictor, stats
        self.buffers: dict[str, tuple[torch.Tensor, int]] = {}

    def __call__(self, name: str, t):
        """``t`` on the session's device (a staged copy when it is elsewhere)."""
        if not isinstance(t, torch.Tensor) or t.device == self.device:
            return t
        n, key = t.numel(), f"input:{name}"
        buf, cap = self.buffers.get(name, (None, 0))
        if buf is None or n > cap or n * 10 < cap or buf.dtype != t.dtype:
            if buf is not None:
                self.engine.release(buf)
            want = n
            if self.predictor is not None:
                ok, predicted = self.predictor.predict(key, tuple(t.shape), t.dtype.itemsize * 8, False)
                if ok and prod(predicted) > n:
                    want = prod(predicted)
                    self.stats["predictions_used"] += 1
            buf, cap = self.engine.allocate(want, t.dtype), want
            self.buffers[name] = (buf, cap)
        elif self.predictor is not None:
            self.predictor.predict(key, tuple(t.shape), t.dtype.itemsize * 8, True)
        self.stats["input_bytes_staged"] += n * t.element_size()
        return buf[:n].view(t.shape).copy_(t, non_blocking=t.is_pinned())
