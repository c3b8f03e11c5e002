"""Frees of driver memory put off until the stream has run dry: no host sync for a re-plan.

A driver free (``cuMemFree``) must not give back memory that a kernel queued on the stream may
still read, and it waits for the whole device besides (an implicit synchronisation). The direct
allocator used to synchronise the stream and free at once, so every arena a re-plan gave back
was a host sync on the calling thread (BERT-base cycling shapes: issue 36 wants none).

Now a free is only noted: an event is recorded on the freeing thread's stream and the pointer
waits in a list. The list is emptied, without waiting, the next time the allocator is used
while nothing is left queued (every event has completed and the stream's ``query()`` is true:
between calls, where a caller has read its outputs). A free waits as before (a host sync,
counted as "free of device memory") only when the pending bytes pass a cap or an allocation
fails for memory: the memory held back is bounded, and an out-of-memory never comes from it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..ops import host_sync


class DeferredFrees:
    """Pending frees of one allocator.

    ``free_now(call, ptr)``: the driver free itself; ``mark()``: a marker of the work queued so far
    on the freeing thread's stream (an event), or None where none can be recorded (a capture);
    ``done(marker)``: whether that work has run; ``idle()``: whether the current stream has
    nothing queued (false while it captures); ``wait()``: synchronise the stream (the counted
    host sync)."""

    def __init__(self, free_now: Callable, mark: Callable, done: Callable, idle: Callable, wait: Callable,
                 cap_bytes: int) -> None:
        self._free_now, self._mark, self._done, self._idle, self._wait = free_now, mark, done, idle, wait
        self.cap_bytes = cap_bytes
        self._pending: list[tuple[object, str, int, int]] = []  # (marker, call, ptr, nbytes)
        self._lock = threading.Lock()
        self.pending_bytes = 0
        self.counts = {"deferred": 0, "freed_idle": 0, "freed_waiting": 0}

    def put(self, call: str, ptr: int, nbytes: int) -> None:
        """Note a free; done at once when nothing is queued, with a wait when over the cap."""
        marker = self._mark()
        with self._lock:
            self._pending.append((marker, call, ptr, nbytes))
            self.pending_bytes += nbytes
            self.counts["deferred"] += 1
            over = self.pending_bytes > self.cap_bytes
        self.reap(force=over)

    def reap(self, force: bool = False) -> int:
        """Free what is pending: without waiting when its work has run and the stream is idle, or
        (``force``) after a counted wait. Returns the bytes freed."""
        with self._lock:
            if not self._pending:
                return 0
            ready = self._idle() and all(m is None or self._done(m) for m, *_ in self._pending)
            if not ready and not force:
                return 0
            items, self._pending, freed = self._pending, [], self.pending_bytes
            self.pending_bytes = 0
        if not ready:
            host_sync.count("free of device memory")
            self._wait()
        self.counts["freed_idle" if ready else "freed_waiting"] += len(items)
        for _, call, ptr, _ in items:
            self._free_now(call, ptr)
        return freed

    def flush(self) -> None:
        """Free everything now (the allocator is going away): waits if it must."""
        try:
            self.reap(force=True)
        except Exception:  # interpreter shutdown: the driver or torch may be gone already
            pass
