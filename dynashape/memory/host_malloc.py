"""glibc malloc tuned for a CPU inference loop: large freed blocks stay in the heap.

torch allocates the result of every kernel that does not write into a buffer we give it (a
convolution, say) with the C allocator. glibc serves blocks above its mmap threshold (128 KiB to
32 MiB, adapting) with a fresh mmap and unmaps them on free, so a large result costs page faults
on every call: on this project's machine an element-wise op on a fresh 10 MB tensor took 3 ms
instead of 0.25. Raising the mmap threshold and the trim threshold keeps freed blocks in the heap
for the next call, as the allocators inference servers ship with (jemalloc, tcmalloc) do.

The threshold asked for is 1 GiB: results of a batch of images pass 32 MiB easily (PP-OCRv4 rec
at 36x3x48x608: 63 MB feature maps, 285k-318k page faults a call with the threshold at 32 MiB,
940 ms a call; none at 1 GiB, 675 ms). glibc builds that refuse a threshold above HEAP_MAX_SIZE / 2
get 32 MiB, the most they take. The heap keeps its high-water mark (as onnxruntime's arena does).
It is process-wide, done once, on Linux with glibc only, and off with ``malloc_tuning=False`` or
DYNASHAPE_MALLOC_TUNING=0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLDS = (1 << 30, 32 * 1024 * 1024)  # the second: what every 64-bit glibc takes (HEAP_MAX_SIZE / 2)
_TRIM = 1 << 30

_done: bool | None = None


def tune() -> bool:
    """Apply the tuning once; whether it is in effect."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux") or os.environ.get("DYNASHAPE_MALLOC_TUNING", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = any(mallopt(_M_MMAP_THRESHOLD, t) == 1 for t in _MMAP_THRESHOLDS) and mallopt(_M_TRIM_THRESHOLD, _TRIM) == 1
    _done = bool(ok)
    log.debug("glibc malloc tuning %s", "applied" if ok else "refused")
    return _done
