"""Allocators: where the Engine's memory really comes from.

Which allocator, and why
------------------------
``allocator="direct"`` is the default. On CUDA it allocates and frees every buffer with the CUDA
driver (``cuMemAlloc`` / ``cuMemFree`` for device memory, ``cuMemHostAlloc`` / ``cuMemFreeHost`` for
pinned host memory, ``cuMemAllocManaged`` for shared memory), so an allocation the Engine counts is
an allocation the device really made, with its real cost: tens of microseconds to milliseconds,
and a free that needs the device idle. That is the cost OpenVINO's ShapePredictor and memory pool
exist to avoid, so with this allocator what they save shows up in the Engine's counts, its
``alloc_time_s`` and ``torch.cuda.mem_get_info``.

``allocator="torch"`` goes through torch's caching allocator instead. After warm-up an allocation
there is a free-list lookup and a free keeps the memory cached, so it is faster, shares its cache
with the rest of the torch program, and is the baseline to compare with; but its counts and times
say little about what the device did, which is why it is not the default.

On CPU both are ``torch.empty`` (malloc; large blocks go back to the system when freed), and the
three allocation types are the same host memory (the type is still recorded and counted).

The allocator protocol
----------------------
Besides the two names, the Engine takes any object with

``alloc(nbytes, alloc_type) -> (tensor, handle)``
    a 1-D ``torch.uint8`` tensor of at least ``nbytes`` bytes (``nbytes >= 1``) at storage offset 0
    on the Engine's device, and a handle for ``free``. Raise :class:`OutOfDeviceMemory` when a
    ``"device"`` allocation cannot be made; the Engine then uses ``"host"`` instead.
``free(handle, alloc_type) -> None``
    give the memory back now. The caller promised not to use the tensor any more, even if a
    Python reference to it still exists.
``device_total() -> int | None`` (optional)
    bytes the device holds; ``None`` or absent: the Engine asks the device.

Ownership: the memory must stay valid as long as the tensor's storage lives, and be given back
when it dies. The Engine never calls ``free`` for a buffer it handed out to its caller; that
buffer is freed when the caller's last tensor on it goes away. (The CUDA allocators get this from
torch: a tensor built from ``__cuda_array_interface__`` keeps the owner object alive, and the
owner frees the pointer when it is collected.)

Frees and streams: a CUDA free must not give back memory a kernel queued on torch's current
stream still uses, and ``cuMemFree`` waits for the device besides. The direct allocator notes the
free with an event and does it once the stream has run dry, or after a counted wait when too much
is held back (``deferred_frees.py``); the torch allocator's pinned blocks still wait for the
stream. A buffer used on another stream must be synchronised by whoever used it there.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import weakref
from contextlib import contextmanager
from typing import Protocol

import torch

from ..errors import OptionsError
from ..ops import host_sync
from .deferred_frees import DeferredFrees

ALLOC_TYPES = ("device", "host", "shared")
ALLOCATORS = ("direct", "torch")


class OutOfDeviceMemory(MemoryError):
    """A device allocation that the device cannot make (the Engine falls back to host memory)."""


class CudaDriverError(RuntimeError):
    """A CUDA driver call that failed for another reason than device memory."""

    def __init__(self, call: str, code: int, name: str) -> None:
        self.call, self.code = call, code
        super().__init__(f"{call} failed with {name} ({code})")


class Allocator(Protocol):
    def alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, object]: ...

    def free(self, handle: object, alloc_type: str) -> None: ...


def make_allocator(spec, device: torch.device):
    """The allocator named by ``spec`` ("direct" or "torch") for ``device``, or ``spec`` itself
    when it is an object that follows the protocol."""
    if isinstance(spec, str):
        if spec not in ALLOCATORS:
            raise OptionsError(f"unknown allocator {spec!r}; known allocators are {list(ALLOCATORS)} "
                               "or an object with alloc(nbytes, alloc_type) and free(handle, alloc_type)")
        if device.type == "cuda":
            return CudaDriverAllocator(device) if spec == "direct" else TorchCachingAllocator(device)
        return CpuAllocator(spec)
    if callable(getattr(spec, "alloc", None)) and callable(getattr(spec, "free", None)):
        return spec
    raise OptionsError(f"allocator {spec!r} is neither a name in {list(ALLOCATORS)} nor an object with "
                       "alloc(nbytes, alloc_type) and free(handle, alloc_type) methods")


# ---- CPU ----------------------------------------------------------------------------------------
class CpuAllocator:
    """torch.empty on the CPU for every type: device, host and shared memory are one there."""

    def __init__(self, name: str = "direct") -> None:
        self.name = name

    def alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, object]:
        return torch.empty(nbytes, dtype=torch.uint8), None

    def free(self, handle: object, alloc_type: str) -> None:
        """Nothing to do: the memory goes back to malloc when the last tensor on it dies."""


class FakeDeviceAllocator:
    """A device of ``capacity_bytes`` simulated on the CPU, to test the host fallback without a GPU.

    A "device" allocation beyond the free capacity raises OutOfDeviceMemory; ``used`` is the
    simulated device memory in use. It is given back by ``free`` or, for a buffer the Engine
    handed out, when the buffer's storage dies. Host and shared allocations are unlimited.
    """

    name = "fake"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = int(capacity_bytes)
        self.used = 0
        self.device_allocations = 0

    def device_total(self) -> int:
        return self.capacity

    def alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, object]:
        if alloc_type == "device" and self.used + nbytes > self.capacity:
            raise OutOfDeviceMemory(f"fake device: {nbytes} bytes requested, "
                                    f"{self.capacity - self.used} of {self.capacity} free")
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if alloc_type != "device":
            return buf, None
        self.used += nbytes
        self.device_allocations += 1
        # the handle gives the bytes back once: when free() calls it or when the storage dies
        give_back = weakref.finalize(buf.untyped_storage(), self._give_back, nbytes)
        give_back.atexit = False
        return buf, give_back

    def free(self, handle: object, alloc_type: str) -> None:
        if handle is not None:
            handle()

    def _give_back(self, nbytes: int) -> None:
        self.used -= nbytes


# ---- CUDA driver through ctypes ------------------------------------------------------------------
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_MEMHOSTALLOC_PORTABLE = 0x01
CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_MEM_ATTACH_GLOBAL = 0x1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
CU_MEMORYTYPE_HOST = 1

_P = ctypes.POINTER
_DRIVER_SIGNATURES = {
    "cuInit": [ctypes.c_uint],
    "cuGetErrorName": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuDeviceGet": [_P(ctypes.c_int), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_P(ctypes.c_void_p), ctypes.c_int],
    "cuCtxGetCurrent": [_P(ctypes.c_void_p)],
    "cuCtxPushCurrent_v2": [ctypes.c_void_p],
    "cuCtxPopCurrent_v2": [_P(ctypes.c_void_p)],
    "cuMemAlloc_v2": [_P(ctypes.c_uint64), ctypes.c_size_t],
    "cuMemFree_v2": [ctypes.c_uint64],
    "cuMemHostAlloc": [_P(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint],
    "cuMemHostGetDevicePointer_v2": [_P(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint],
    "cuMemFreeHost": [ctypes.c_void_p],
    "cuMemAllocManaged": [_P(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_uint],
    "cuPointerGetAttribute": [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64],
}


class _Driver:
    """The few libcuda entry points the allocators use, with every CUresult checked."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        for name, argtypes in _DRIVER_SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        self.lib = lib
        self.call("cuInit", 0)
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()

    def call(self, name: str, *args, oom: type[Exception] = OutOfDeviceMemory) -> None:
        res = getattr(self.lib, name)(*args)
        if res == 0:
            return
        text = ctypes.c_char_p()
        self.lib.cuGetErrorName(res, ctypes.byref(text))
        label = text.value.decode() if text.value else "unknown CUresult"
        if res == CUDA_ERROR_OUT_OF_MEMORY:
            raise oom(f"{name}: {label}")
        raise CudaDriverError(name, res, label)

    def primary_context(self, index: int) -> ctypes.c_void_p:
        """The device's primary context, the one torch's runtime uses. Retained once per process
        and never released: buffers handed out may outlive any allocator."""
        with self._lock:
            ctx = self._contexts.get(index)
            if ctx is None:
                dev, ctx = ctypes.c_int(), ctypes.c_void_p()
                self.call("cuDeviceGet", ctypes.byref(dev), index)
                self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
                self._contexts[index] = ctx
            return ctx

    @contextmanager
    def on(self, ctx: ctypes.c_void_p):
        """Run driver calls in ``ctx``. The calling thread may have no current context (a fresh
        thread) or another device's: push ours for the calls and restore it afterwards."""
        cur = ctypes.c_void_p()
        self.call("cuCtxGetCurrent", ctypes.byref(cur))
        if cur.value == ctx.value:
            yield
            return
        self.call("cuCtxPushCurrent_v2", ctx)
        try:
            yield
        finally:
            self.call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))


@functools.cache
def _driver() -> _Driver:
    return _Driver()


def pointer_kind(ptr: int) -> str:
    """What the driver says ``ptr`` is: "shared" (managed), "host" (pinned) or "device"."""
    drv = _driver()
    managed, mtype = ctypes.c_uint64(0), ctypes.c_uint64(0)  # wide, zeroed: the driver writes less
    drv.call("cuPointerGetAttribute", ctypes.byref(managed), CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr)
    if managed.value:
        return "shared"
    drv.call("cuPointerGetAttribute", ctypes.byref(mtype), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    return "host" if mtype.value == CU_MEMORYTYPE_HOST else "device"


class CudaBuffer:
    """Owns one allocation and shows it to torch as a uint8 CUDA array.

    ``torch.as_tensor`` keeps this object alive as long as the tensor's storage lives; the memory
    is given back by ``free()`` (the Engine's release) or, failing that, when it is collected.
    """

    def __init__(self, ptr: int, nbytes: int, release) -> None:
        self.ptr, self.nbytes = ptr, nbytes
        self._release = release

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"version": 3, "shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "strides": None}

    def free(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:  # interpreter shutdown: the driver or torch may be gone already
            pass


class _NotWrapped(RuntimeError):
    """torch copied the memory instead of wrapping it (it belongs to another device)."""


def _wrap(owner: CudaBuffer, device: torch.device) -> torch.Tensor:
    # device= is required: without it as_tensor would copy the array to the CPU
    t = torch.as_tensor(owner, device=device)
    if t.data_ptr() != owner.ptr:
        raise _NotWrapped(f"memory at {owner.ptr:#x} is not on {device}")
    return t


# what a free of device memory runs in: capture_guard.install() puts its ``device_wide`` here (a
# free is an implicit device synchronisation, which a CUDA graph captured on another thread forbids)
FREE_GUARD: list = [contextlib.nullcontext]


def _sync(device: torch.device) -> None:
    # the memory may still be read by queued kernels; counted as a host sync (ops/host_sync.py)
    host_sync.count("free of device memory")
    torch.cuda.current_stream(device).synchronize()


def _mark(device: torch.device):
    """An event after the work queued so far on this thread's stream (None while it captures)."""
    if torch.cuda.is_current_stream_capturing():
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(device))
    return ev


def _idle(device: torch.device) -> bool:
    return not torch.cuda.is_current_stream_capturing() and torch.cuda.current_stream(device).query()


# pending frees held back at most: past this a free waits for the stream (deferred_frees.py)
DEFERRED_FREE_SHARE = 1 / 32
DEFERRED_FREE_MIN = 256 << 20


def _driver_free(drv: _Driver, ctx, call: str, ptr: int) -> None:
    with FREE_GUARD[0]():  # no capture on another thread meanwhile (impls/capture_guard.py)
        with drv.on(ctx):
            drv.call(call, ptr)


class CudaDriverAllocator:
    """Device, pinned host and managed memory straight from the CUDA driver ("direct")."""

    name = "direct"

    def __init__(self, device: torch.device) -> None:
        torch.cuda.init()  # torch's runtime first, so that its primary context is the one we use
        self.device = device
        self._drv = _driver()
        self._ctx = self._drv.primary_context(device.index)
        total = torch.cuda.get_device_properties(device).total_memory
        # nothing in it refers to self: the finalizer below must not keep the allocator alive
        self.deferred = DeferredFrees(
            functools.partial(_driver_free, self._drv, self._ctx), functools.partial(_mark, device),
            lambda ev: ev.query(), functools.partial(_idle, device),
            lambda: torch.cuda.current_stream(device).synchronize(),
            max(DEFERRED_FREE_MIN, int(total * DEFERRED_FREE_SHARE)))
        # frees still pending when the allocator goes (its last buffer gone) are done then
        weakref.finalize(self, self.deferred.flush)

    def alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, CudaBuffer]:
        self.deferred.reap()
        try:
            return self._alloc(nbytes, alloc_type)
        except OutOfDeviceMemory:
            if not self.deferred.reap(force=True):
                raise
            return self._alloc(nbytes, alloc_type)  # the frees held back made room

    def _alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, CudaBuffer]:
        drv = self._drv
        with drv.on(self._ctx):
            if alloc_type == "host":
                hptr, dptr = ctypes.c_void_p(), ctypes.c_uint64()
                flags = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
                drv.call("cuMemHostAlloc", ctypes.byref(hptr), nbytes, flags, oom=MemoryError)
                owner = CudaBuffer(0, nbytes, functools.partial(self._free, "cuMemFreeHost", hptr.value, nbytes))
                # with unified addressing this is the host pointer itself; ask anyway
                drv.call("cuMemHostGetDevicePointer_v2", ctypes.byref(dptr), hptr, 0)
            else:
                dptr = ctypes.c_uint64()
                if alloc_type == "shared":
                    drv.call("cuMemAllocManaged", ctypes.byref(dptr), nbytes, CU_MEM_ATTACH_GLOBAL)
                else:
                    drv.call("cuMemAlloc_v2", ctypes.byref(dptr), nbytes)
                owner = CudaBuffer(0, nbytes, functools.partial(self._free, "cuMemFree_v2", dptr.value, nbytes))
        owner.ptr = dptr.value
        return _wrap(owner, self.device), owner

    def free(self, handle: CudaBuffer, alloc_type: str) -> None:
        handle.free()

    def _free(self, call: str, ptr: int, nbytes: int) -> None:
        # done when the stream has run dry, not with a sync now (deferred_frees.py)
        self.deferred.put(call, ptr, nbytes)


class TorchCachingAllocator:
    """torch's allocators ("torch"): the caching device allocator, torch's pinned host allocator
    for host memory, and the driver's managed memory for shared (torch has no managed allocator)."""

    name = "torch"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._direct: CudaDriverAllocator | None = None

    def alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, object]:
        if alloc_type == "shared":
            return self._driver_alloc(nbytes, alloc_type)
        if alloc_type == "host":
            return self._pinned(nbytes)
        try:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device), None
        except torch.cuda.OutOfMemoryError as e:
            raise OutOfDeviceMemory(str(e)) from e

    def free(self, handle: object, alloc_type: str) -> None:
        # device memory goes back to torch's cache when the last tensor on it dies
        if handle is not None:
            handle.free()

    def _pinned(self, nbytes: int) -> tuple[torch.Tensor, object]:
        """A pinned CPU tensor is not a CUDA tensor; with unified addressing its pointer is valid
        on the device, so show the same memory to torch as CUDA memory."""
        keep = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)]
        owner = CudaBuffer(keep[0].data_ptr(), nbytes, functools.partial(self._drop_pinned, keep))
        try:
            return _wrap(owner, self.device), owner
        except _NotWrapped:
            # torch pinned it under another device's context: take pinned memory from the driver
            owner.free()
            return self._driver_alloc(nbytes, "host")

    def _drop_pinned(self, keep: list) -> None:
        # torch's host cache does not know our kernels used the block: wait before it reuses it
        _sync(self.device)
        keep.clear()

    def _driver_alloc(self, nbytes: int, alloc_type: str) -> tuple[torch.Tensor, object]:
        if self._direct is None:
            self._direct = CudaDriverAllocator(self.device)
        return self._direct.alloc(nbytes, alloc_type)
