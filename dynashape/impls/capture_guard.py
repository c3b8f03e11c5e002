"""Device-wide synchronisations and GPU random numbers wait while a thread captures a CUDA graph.

CUDA forbids a device-wide synchronisation anywhere in the process while a stream is capturing
(``cudaDeviceSynchronize`` behind ``torch.cuda.synchronize()``, the ``cudaFree`` behind
``torch.cuda.empty_cache()``): the call fails with a CUDA error and the capture is lost. The
decode graphs built ahead (runtime/decode_graph.py) are captured on a thread while the caller
goes on, and callers synchronise all the time (every benchmark does). So while a session may
capture on a thread, torch's two Python entry points are wrapped: a call waits for a capture in
flight to end (tens of ms), then runs; a capture waits for synchronisations in flight to end
before it begins. The waits are counted (``waits()``). Stream-level synchronisations
(``.item()``, ``.cpu()``, ``Stream.synchronize``) are legal during a capture on another stream
(``capture_error_mode="thread_local"``) and are left alone.

The same holds for random numbers on the GPU: ``capture_begin`` marks the device's default
generator as capturing (its offsets then belong to the graph), and a random op launched by any
other thread meanwhile fails ("Offset increment outside graph capture encountered unexpectedly";
found on the device: a test's ``torch.randn`` right after a session's call, while the session
captured in the background). An application that samples tokens with ``torch.multinomial`` while
the next KV bucket is captured ahead would fail so. torch's random entry points (functions and
in-place Tensor methods) are wrapped the same way: they wait for a capture in flight.

``install()`` / ``release()`` count the sessions that need the wrappers; torch's own functions
are put back when the last one goes.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

import torch

from ..memory import allocators

_cond = threading.Condition()
_capturing = 0  # captures in flight (threads between capture_begin and capture_end)
_queued = 0  # captures waiting to begin: new synchronisations wait behind them (no starving)
_syncing = 0  # wrapped synchronisations in flight
_users = 0  # install() calls not yet released
_counts = {"waits": 0, "wait_s": 0.0}
_local = threading.local()  # .capturing: this thread is capturing (its own calls are not held)
_originals: dict[tuple, object] = {}


_RANDOM_FUNCTIONS = ("rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "normal",
                     "bernoulli", "multinomial", "poisson")
_RANDOM_METHODS = ("uniform_", "normal_", "random_", "bernoulli_", "bernoulli", "exponential_", "geometric_",
                   "log_normal_", "cauchy_", "multinomial")


def _targets() -> list[tuple]:
    syncs = [(torch.cuda, "synchronize"), (torch.cuda, "empty_cache"), (torch.cuda.memory, "empty_cache")]
    rng = [(torch, n) for n in _RANDOM_FUNCTIONS] + [(torch.Tensor, n) for n in _RANDOM_METHODS]
    return syncs + [(m, n) for m, n in rng if hasattr(m, n)] + [(torch.nn.functional, "dropout")]


@contextlib.contextmanager
def capturing():
    """Around a capture on a background thread: begins once no wrapped synchronisation runs;
    wrapped calls from other threads wait until it ends."""
    global _capturing, _queued
    with _cond:
        _queued += 1
        while _syncing:
            _cond.wait()
        _queued -= 1
        _capturing += 1
    _local.capturing = True
    try:
        yield
    finally:
        _local.capturing = False
        with _cond:
            _capturing -= 1
            _cond.notify_all()


@contextlib.contextmanager
def device_wide():
    """Around a device-wide synchronisation: waits for a capture in flight on another thread, and
    holds new captures until it is done. Also what the direct allocator's cuMemFree runs in (an
    implicit device synchronisation: a re-plan that gave an arena back while the background
    thread captured invalidated the capture, measured on an H100)."""
    global _syncing
    if getattr(_local, "capturing", False):  # the capturing thread itself: CUDA's own error stands
        yield
        return
    with _cond:
        if _capturing or _queued:
            t0 = time.perf_counter()
            while _capturing or _queued:
                _cond.wait()
            _counts["waits"] += 1
            _counts["wait_s"] += time.perf_counter() - t0
        _syncing += 1
    try:
        yield
    finally:
        with _cond:
            _syncing -= 1
            _cond.notify_all()


def _held(fn):
    @functools.wraps(fn)
    def held(*args, **kwargs):
        with device_wide():
            return fn(*args, **kwargs)
    held.dynashape_capture_guard = True
    return held


def install() -> None:
    """One more user of the wrappers (a session that captures on a thread)."""
    global _users
    with _cond:
        _users += 1
        if _users > 1:
            return
        for mod, name in _targets():
            fn = getattr(mod, name)
            # a method torch.Tensor inherits (from TensorBase) is shadowed, then deleted again
            _originals[(mod, name)] = (fn, name in vars(mod))
            setattr(mod, name, _held(fn))


def release() -> None:
    """One user fewer; torch's own functions back when none is left (unless someone wrapped them
    again after us: theirs stays)."""
    global _users
    with _cond:
        if _users == 0:
            return
        _users -= 1
        if _users:
            return
        for (mod, name), (fn, own) in _originals.items():
            if getattr(getattr(mod, name), "dynashape_capture_guard", False):
                if own:
                    setattr(mod, name, fn)
                else:
                    delattr(mod, name)
        _originals.clear()


def installed() -> bool:
    return _users > 0


def waits() -> dict:
    """Synchronisations that waited for a capture, and for how long in all (process-wide)."""
    with _cond:
        return dict(_counts)


# the direct allocator's frees of device memory wait for a capture in flight, as synchronize() does
allocators.FREE_GUARD[0] = device_wide
