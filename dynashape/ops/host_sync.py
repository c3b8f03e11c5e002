"""Host reads of device memory, counted by the op that asked.

On CUDA the host reading a device value waits for every kernel queued before it: the GPU runs
dry while Python catches up, and a static impl's capture cannot contain the read at all. The
dynamic path reads the device only where the data decides a shape (NonZero, Unique, Compress,
NonMaxSuppression, a shape input computed on the device...); each such read goes through here
and is counted by op name (``stats()["host_syncs"]`` and ``["host_syncs_by_op"]``, process-wide
as the native kernels' counters are). A read of a CPU tensor is no sync and is not counted.
tests/test_host_syncs.py runs CUDA models under ``torch.cuda.set_sync_debug_mode`` to check
that nothing else reads the device.
"""

from __future__ import annotations

import threading
from collections import Counter

_LOCK = threading.Lock()
COUNTS: Counter = Counter()


def count(op: str, t=None) -> None:
    """Count one host read on behalf of ``op`` (of ``t``, when given: only a CUDA tensor's counts)."""
    if t is not None and not getattr(t, "is_cuda", False):
        return
    with _LOCK:
        COUNTS[op] += 1


def tolist(t, op: str):
    """``t.tolist()``, counted when ``t`` is on the device."""
    count(op, t)
    return t.tolist()


def item(t, op: str):
    """``t.item()``, counted when ``t`` is on the device."""
    count(op, t)
    return t.item()


def counters() -> dict:
    """``host_syncs`` (the total) and ``host_syncs_by_op`` of this process."""
    with _LOCK:
        return {"host_syncs": sum(COUNTS.values()), "host_syncs_by_op": dict(COUNTS)}


def reset() -> None:
    with _LOCK:
        COUNTS.clear()
