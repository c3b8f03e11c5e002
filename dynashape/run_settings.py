"""What a run sets process-wide and puts back afterwards: torch's CPU thread count (``threads=``)
and the TF32 switches of CUDA products and convolutions (``allow_tf32=``)."""

from __future__ import annotations

import torch


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
    and restores the caller's global flags afterwards."""

    def __init__(self, allow_tf32: bool) -> None:
        self.allow = allow_tf32
        self.prev = None

    def __enter__(self):
        b = torch.backends
        self.prev = (b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32)
        b.cudnn.allow_tf32 = b.cuda.matmul.allow_tf32 = self.allow

    def __exit__(self, *exc):
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.prev

