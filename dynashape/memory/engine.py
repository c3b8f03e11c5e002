"""Engine: owns the memory a network allocates, by allocation type, and counts it.

Every buffer a network uses comes from ``Engine.allocate`` and goes back through
``Engine.release``, so the counters say what a run really allocated. Where the memory comes from
is the allocator's business (see ``allocators.py``: "direct", the default, or "torch").

Allocation types, as in OpenVINO's GPU plugin: "device" (device memory), "host" (pinned host
memory the device reads and writes directly) and "shared" (managed memory that migrates on
demand). On CUDA all three are CUDA tensors that kernels take as they are.

Host fallback: a device allocation bigger than the device (``device_total()``), one that would
take the device usage past ``device_memory_limit``, or one the allocator refuses with
OutOfDeviceMemory is made as "host" memory instead; ``stats()["fallbacks_to_host"]`` counts it and
the verbose log says it.

Verbose log (``verbose=``, else the environment variable DYNASHAPE_VERBOSE): from level 1 each host
fallback, from level 2 one line per allocation, free and hand-out, in OpenVINO's form::

    Allocate 400 bytes of device allocation type (current=400; max=400)
    Free 400 bytes of device allocation type (current=0; max=400)
    Hand out 400 bytes of device allocation type (current=0; max=400)

where current and max are the totals over all types. The lines go to the ``logging`` logger
``dynashape.memory`` (level INFO) when the application's logging would show them (a handler is
configured and INFO is enabled for that logger); otherwise they are printed to stderr as
``dynashape.memory: <line>``, as OpenVINO prints its GPU_Debug lines. Asking for verbose output
is enough to see it, and it is never printed twice.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
import time
import weakref
from collections import deque

import torch

from ..errors import MemoryLimitError, OptionsError, ShapeError
from .allocators import ALLOC_TYPES, OutOfDeviceMemory, make_allocator

__all__ = ["ALLOC_TYPES", "Engine", "OutOfDeviceMemory"]

log = logging.getLogger("dynashape.memory")

# share of the device a preallocation may fill, as OpenVINO's can_preallocate
_PREALLOCATION_SHARE = 0.9


def _say(msg: str) -> None:
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info(msg)
    else:
        print(f"dynashape.memory: {msg}", file=sys.stderr, flush=True)


def host_total() -> int:
    """Bytes of physical memory on this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def _verbose_level(verbose: int | None) -> int:
    if verbose is not None:
        if isinstance(verbose, bool) or not isinstance(verbose, (int, str)):
            raise OptionsError(f"verbose={verbose!r}: expected an integer level (0, 1, 2)")
        try:
            return int(verbose)
        except ValueError:
            raise OptionsError(f"verbose={verbose!r}: expected an integer level (0, 1, 2)") from None
    text = os.environ.get("DYNASHAPE_VERBOSE", "").strip() or "0"
    try:
        return int(text)
    except ValueError:
        raise OptionsError(f"DYNASHAPE_VERBOSE={text!r}: expected an integer level (0, 1, 2)") from None


def _device(device: torch.device | str) -> torch.device:
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise OptionsError(f"device {device!r}: {e}") from None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise OptionsError(f"device {device!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")
    return dev


def _limit(value, name: str = "device_memory_limit") -> int | None:
    if value is None:
        return None
    try:
        limit = operator.index(value)
    except TypeError:
        limit = 0
    if limit <= 0:
        raise OptionsError(f"{name}={value!r}: expected a positive number of bytes")
    return limit


_SMALL_HANDED = 1 << 16  # outputs below this many bytes are tracked by weak reference (_handed_small)
_SWEEP = 256

class Engine:
    """Allocates, frees and counts the buffers of one device (one engine per infer request).

    ``allocator``: "direct" (default), "torch", or an object following the protocol of
    ``allocators.py``. ``device_memory_limit``: bytes the device is taken to hold (default: all
    of it). Not thread-safe: like the request that owns it, use it from one thread at a time.
    """

    def __init__(self, device: torch.device | str = "cpu", *, allocator="direct", verbose: int | None = None,
                 device_memory_limit: int | None = None, max_buffer_bytes: int | None = None) -> None:
        self.device_memory_limit = _limit(device_memory_limit)
        self.max_buffer_bytes = _limit(max_buffer_bytes, "max_buffer_bytes")
        # sizes that pass check_size on any machine this runs on (the message it builds costs
        # microseconds a buffer): up to 16 MiB, or max_buffer_bytes where that is less
        self._surely_fits = 1 << 24 if self.max_buffer_bytes is None else min(1 << 24, self.max_buffer_bytes)
        self.device = _device(device)
        self.allocator = make_allocator(allocator, self.device)
        self.allocator_name = getattr(self.allocator, "name", type(self.allocator).__name__)
        self.verbose = _verbose_level(verbose)
        self._total: int | None = None
        self._host_total: int | None = None
        # live buffers by storage address: (bytes counted, allocation type, allocator handle)
        self._live: dict[int, tuple[int, str, object]] = {}
        self._current = dict.fromkeys(ALLOC_TYPES, 0)
        self._caller = 0  # bytes handed to callers whose tensors are still alive
        # small handed-out outputs, tracked by weak reference and swept (_handed_small says why)
        self._small: deque = deque()
        self.reset_stats()

    # ---- allocation ---------------------------------------------------------------------------
    def allocate(self, numel: int, dtype: torch.dtype, alloc_type: str = "device") -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements of ``dtype`` on the engine's device."""
        if alloc_type not in ALLOC_TYPES:
            raise ValueError(f"allocation type {alloc_type!r}; expected one of {ALLOC_TYPES}")
        nbytes = int(numel) * dtype.itemsize
        if not 0 <= nbytes <= self._surely_fits:
            self.check_size(nbytes, f"a buffer of {int(numel)} {dtype} elements")
        start = time.perf_counter()
        alloc_type, base, handle = self._alloc(nbytes, alloc_type)
        # a fresh tensor on the allocator's storage, like torch.empty's (not a view: _base is None)
        buf = torch.empty(0, dtype=dtype, device=base.device).set_(base.untyped_storage(), 0, (int(numel),), (1,))
        self._live[buf.untyped_storage().data_ptr()] = (nbytes, alloc_type, handle)
        self._time += time.perf_counter() - start
        self._count_allocation(nbytes, alloc_type)
        return buf

    def allocate_output(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A buffer that goes to the caller as soon as it is written (a graph output in torch
        mode): torch's allocator makes it (it is the caller's memory, freed when the caller drops
        it; a driver allocation and free per call would cost more than the kernels of a small
        model), and it is counted as an allocation handed out."""
        n = 1
        for d in shape:
            n *= int(d)
        nbytes = n * dtype.itemsize
        if not 0 <= nbytes <= self._surely_fits:
            self.check_size(nbytes, f"an output of shape {list(shape)} ({dtype})")
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        st = self._stats
        st["allocations"] += 1
        st["device_allocations"] += 1
        st["allocated_bytes_total"] += nbytes
        st["handed_out"] += 1
        self._caller += nbytes
        if nbytes < _SMALL_HANDED:
            self._handed_small(buf, nbytes)
        else:
            weakref.finalize(buf, self._caller_dropped, nbytes)
        total = self.current_bytes + self._caller
        if total > self._peak_with_caller:
            self._peak_with_caller = total
        if self.verbose >= 2:
            _say(f"Allocate {nbytes} bytes for an output handed out (torch's allocator)")
        return buf

    def _alloc(self, nbytes: int, alloc_type: str) -> tuple[str, torch.Tensor, object]:
        # a zero-element buffer still gets a byte of its own: buffers are known by their address
        size = max(nbytes, 1)
        if alloc_type == "device":
            reason = self._device_refusal(nbytes)
            if reason is None:
                try:
                    return ("device", *self._checked(self.allocator.alloc(size, "device"), size))
                except OutOfDeviceMemory as e:
                    reason = f"the device is out of memory ({e})"
            self._stats["fallbacks_to_host"] += 1
            if self.verbose >= 1:
                _say(f"Allocation of {nbytes} bytes of device allocation type falls back to host: {reason}")
            alloc_type = "host"
        return (alloc_type, *self._checked(self.allocator.alloc(size, alloc_type), size))

    def buffer_limit(self) -> int:
        """The largest buffer this engine will try to allocate: ``max_buffer_bytes`` when given,
        else what the larger of the device and the host holds (a device buffer that does not fit
        may fall back to host memory, one that fits neither is refused)."""
        if self.max_buffer_bytes is not None:
            return self.max_buffer_bytes
        if self._host_total is None:
            self._host_total = host_total()
        return max(self.device_total(), self._host_total) if self.device.type == "cuda" else self._host_total

    def check_size(self, nbytes: int, what: str) -> None:
        """Refuse, before any allocation, a buffer larger than ``buffer_limit()``."""
        if nbytes < 0:
            raise ShapeError(f"{what}: negative size ({nbytes} bytes)")
        limit = self.buffer_limit()
        if nbytes > limit:
            self._stats["refused_allocations"] += 1
            src = "max_buffer_bytes" if self.max_buffer_bytes is not None else "what this machine holds"
            raise MemoryLimitError(f"{what} needs {nbytes} bytes, more than {src} ({limit} bytes); "
                                   f"nothing was allocated")

    def _device_refusal(self, nbytes: int) -> str | None:
        """Why a device allocation of ``nbytes`` must not even be tried, or None."""
        total = self.device_total()
        if nbytes > total:
            return f"bigger than the device ({total} bytes)"
        limit = self.device_memory_limit
        if limit is not None and self._current["device"] + nbytes > limit:
            return f"device usage would exceed device_memory_limit ({self._current['device']} + {nbytes} > {limit})"
        return None

    def _checked(self, got: tuple[torch.Tensor, object], size: int) -> tuple[torch.Tensor, object]:
        base, handle = got
        if base.dtype != torch.uint8 or base.dim() != 1 or base.numel() < size or base.storage_offset() != 0 \
                or base.device != self.device:
            raise TypeError(f"allocator {self.allocator_name!r} returned {base.dtype} {tuple(base.shape)} at offset "
                            f"{base.storage_offset()} on {base.device}; expected 1-D uint8 of >= {size} bytes at "
                            f"offset 0 on {self.device}")
        return base, handle

    def release(self, buf: torch.Tensor, handed_out: bool = False) -> None:
        """Give ``buf`` (a tensor from ``allocate``, or a view of it) back.

        ``handed_out``: the caller keeps the tensor and becomes its owner; the memory lives as
        long as the caller's tensors on it and is freed after. Otherwise it is freed now, and
        the tensor must not be used any more.
        """
        rec = self._live.pop(buf.untyped_storage().data_ptr(), None)
        if rec is None:
            raise ValueError("release() of a buffer this engine did not allocate, or already released")
        nbytes, alloc_type, handle = rec
        if not handed_out:
            start = time.perf_counter()
            self.allocator.free(handle, alloc_type)
            self._time += time.perf_counter() - start
        self._stats["handed_out" if handed_out else "frees"] += 1
        self._current[alloc_type] -= nbytes
        if handed_out:
            # the memory lives on with the caller: counted in caller_held_bytes until its last
            # tensor dies, so that the peak of what really exists can be told
            self._caller += nbytes
            root = buf._base if buf._base is not None else buf
            weakref.finalize(root, self._caller_dropped, nbytes)
        if self.verbose >= 2:
            verb = "Hand out" if handed_out else "Free"
            _say(f"{verb} {nbytes} bytes of {alloc_type} allocation type "
                 f"(current={self.current_bytes}; max={self._peak_total})")

    def _count_allocation(self, nbytes: int, alloc_type: str) -> None:
        st = self._stats
        st["allocations"] += 1
        st[f"{alloc_type}_allocations"] += 1
        st["allocated_bytes_total"] += nbytes
        self._current[alloc_type] += nbytes
        self._peak[alloc_type] = max(self._peak[alloc_type], self._current[alloc_type])
        self._peak_total = max(self._peak_total, self.current_bytes)
        self._peak_with_caller = max(self._peak_with_caller, self.current_bytes + self._caller)
        if self.verbose >= 2:
            _say(f"Allocate {nbytes} bytes of {alloc_type} allocation type "
                 f"(current={self.current_bytes}; max={self._peak_total})")

    def _caller_dropped(self, nbytes: int) -> None:
        self._caller -= nbytes

    def _handed_small(self, buf: torch.Tensor, nbytes: int) -> None:
        """A small output counted in caller_held_bytes until the caller drops it, by a weak
        reference swept from the oldest (a finalizer per output cost ~2.5 us a call; a decode
        step hands out five). Outputs dropped out of order are found by a whole sweep every
        _SWEEP entries: until then they count, at most _SWEEP * _SMALL_HANDED bytes."""
        q = self._small
        while q and q[0][0]() is None:
            self._caller -= q.popleft()[1]
        if len(q) >= _SWEEP:
            self._sweep_small()
            q = self._small
        q.append((weakref.ref(buf), nbytes))

    # ---- queries ------------------------------------------------------------------------------
    def alloc_type_of(self, buf: torch.Tensor) -> str:
        rec = self._live.get(buf.untyped_storage().data_ptr())
        if rec is None:
            raise ValueError("alloc_type_of() of a buffer this engine does not hold")
        return rec[1]

    def device_total(self) -> int:
        """Bytes the device can hold: device_memory_limit when set, else what the allocator or the
        device says (on CPU: the physical memory)."""
        if self.device_memory_limit is not None:
            return self.device_memory_limit
        if self._total is None:
            total = getattr(self.allocator, "device_total", lambda: None)()
            if total is None and self.device.type == "cuda":
                total = torch.cuda.get_device_properties(self.device).total_memory
            if total is None:
                total = host_total()
            self._total = int(total)
        return self._total

    def used(self, alloc_type: str = "device") -> int:
        """Bytes of ``alloc_type`` this engine holds now."""
        return self._current[alloc_type]

    @property
    def current_bytes(self) -> int:
        return sum(self._current.values())

    @property
    def peak_bytes(self) -> int:
        return self._peak_total

    def can_preallocate(self, nbytes: int) -> bool:
        """OpenVINO's rule: no bigger than one allocation can be, and the device stays below 90%."""
        total = self.device_total()
        if nbytes > total:
            return False
        return self.used("device") + nbytes < _PREALLOCATION_SHARE * total

    # ---- counters -----------------------------------------------------------------------------
    def stats(self) -> dict:
        self._sweep_small()  # (what the caller holds now, to the byte)
        out = {**self._stats, "alloc_time_s": self._time, "current_bytes": self.current_bytes,
               "peak_bytes": self._peak_total, "caller_held_bytes": self._caller,
               "peak_with_caller_bytes": self._peak_with_caller}
        for t in ALLOC_TYPES:
            out[f"{t}_current_bytes"] = self._current[t]
            out[f"{t}_peak_bytes"] = self._peak[t]
        return out

    def _sweep_small(self) -> None:
        q = self._small
        alive = deque(e for e in q if e[0]() is not None)
        self._caller -= sum(n for _, n in q) - sum(n for _, n in alive)
        self._small = alive

    def reset_stats(self) -> None:
        """Counters to zero; peaks start again from what is allocated now."""
        keys = ("allocations", "frees", "handed_out", "allocated_bytes_total", "fallbacks_to_host",
                "refused_allocations")
        self._stats = dict.fromkeys(keys + tuple(f"{t}_allocations" for t in ALLOC_TYPES), 0)
        self._time = 0.0
        self._peak = dict(self._current)
        self._peak_total = self.current_bytes
        self._peak_with_caller = self.current_bytes + self._caller
