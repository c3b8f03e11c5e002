"""What a run sets process-wide and puts back afterwards: torch's CPU thread count (``threads=``)
and the TF32 switches of CUDA products and convolutions (``allow_tf32=``)."""

from __future__ import annotations

import threading

import torch

from .errors import OptionsError
from .ops import split_tf32


class Threads:
    """torch's intra-op thread count set for a run and restored afterwards. The count is
    process-wide: concurrent runs of sessions with different counts share whichever was set last."""

    def __init__(self, n: int | None) -> None:
        self.n = n
        self.prev = None

    def __enter__(self):
        if self.n:
            self.prev = torch.get_num_threads()
            if self.prev != self.n:
                torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        if self.n and self.prev is not None and self.prev != self.n:
            torch.set_num_threads(self.prev)


class Precision:
    """fp32 means fp32: cuDNN convolutions use TF32 on Ampere and later unless told otherwise,
    which moves results by ~1e-3 relative. A run turns TF32 off (unless the session allows it)
    and restores the caller's global flags afterwards. It also sets, for its thread, how float32
    products run (``fp32_products``, ops/split_tf32.py) and the switches a build it queues applies
    on the compile worker. One object serves a session's concurrent runs: what each restores is
    kept per thread."""

    def __init__(self, allow_tf32: bool, fp32_products: str = "auto") -> None:
        self.allow = allow_tf32
        self.products = fp32_products
        self._local = threading.local()

    def __enter__(self):
        stack = self._local.__dict__.setdefault("stack", [])
        cm = split_tf32.switches(self.allow)
        cm.__enter__()
        stack.append((cm, split_tf32.MODE.set(self.products), split_tf32.ALLOW_TF32.set(self.allow)))

    def __exit__(self, *exc):
        cm, mode, allow = self._local.stack.pop()
        split_tf32.ALLOW_TF32.reset(allow)
        split_tf32.MODE.reset(mode)
        cm.__exit__(None, None, None)


def fp32_products(value) -> str:
    """The session's ``fp32_products`` checked at its creation."""
    if value is None:
        return "auto"
    if value not in split_tf32.MODES:
        raise OptionsError(f"fp32_products={value!r}: expected one of {', '.join(map(repr, split_tf32.MODES))}")
    return value
