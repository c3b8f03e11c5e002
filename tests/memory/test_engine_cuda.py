"""The memory Engine's CUDA allocators, on a real GPU (skipped without one)."""

import gc

import pytest
import torch

from dynashape.memory.allocators import pointer_kind
from dynashape.memory.engine import ALLOC_TYPES, Engine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MiB = 1 << 20
# what device memory may move besides our buffers: torch's cache, kernels loaded on first use
SLACK = 32 * MiB


def ptr(buf):
    return buf.untyped_storage().data_ptr()


def device_free():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def warm_up():
    """Load the kernels the measured tests launch, so that loading them is not measured."""
    for dtype in (torch.uint8, torch.int32):
        t = torch.zeros(4, dtype=dtype, device="cuda")
        t.fill_(3)
        t.sum().item()


@pytest.mark.parametrize("allocator", ["direct", "torch"])
@pytest.mark.parametrize("alloc_type", ALLOC_TYPES)
def test_every_type_is_a_cuda_tensor_kernels_use(allocator, alloc_type):
    e = Engine("cuda", allocator=allocator)
    n = 1 << 20
    cached = torch.cuda.memory_allocated(e.device)
    a = e.allocate(n, torch.float32, alloc_type)
    b = e.allocate(n, torch.float32, alloc_type)
    assert a.is_cuda and a.device == e.device and a.shape == (n,) and e.alloc_type_of(a) == alloc_type
    assert pointer_kind(ptr(a)) == alloc_type
    # only device memory under "torch" comes from torch's caching allocator
    through_torch = torch.cuda.memory_allocated(e.device) - cached
    assert through_torch == (8 * n if (allocator, alloc_type) == ("torch", "device") else 0)
    a.fill_(1.5)
    torch.arange(n, device=e.device, dtype=torch.float32, out=b)
    c = a + b
    torch.add(a, b, out=a)  # a kernel writing into the buffer
    assert torch.equal(a, c)
    assert torch.equal(a.cpu(), torch.arange(n, dtype=torch.float32) + 1.5)
    e.release(a)
    e.release(b)
    assert e.stats()["frees"] == 2 and e.stats()["current_bytes"] == 0


def test_direct_release_gives_the_memory_back_to_the_device():
    e = Engine("cuda")
    warm_up()
    before, reserved = device_free(), torch.cuda.memory_reserved(e.device)
    b = e.allocate(256 * MiB, torch.uint8)
    b.fill_(7)
    assert before - device_free() >= 256 * MiB
    assert torch.cuda.memory_reserved(e.device) == reserved  # torch's cache was not involved
    e.release(b)
    assert device_free() >= before - SLACK


def test_torch_allocator_keeps_the_memory_cached():
    # Measured on what this engine's block does, whatever else the process holds: earlier tests
    # can leave segments reserved (graph pools of live sessions) that the 256 MiB fits into.
    gc.collect()
    torch.cuda.empty_cache()
    e = Engine("cuda", allocator="torch")
    b = e.allocate(256 * MiB, torch.uint8)
    held, reserved = torch.cuda.memory_allocated(e.device), torch.cuda.memory_reserved(e.device)
    e.release(b)
    del b
    # the block went back to torch's cache, not to the device: allocated dropped, reserved did not
    assert held - torch.cuda.memory_allocated(e.device) >= 256 * MiB
    assert torch.cuda.memory_reserved(e.device) == reserved
    torch.cuda.empty_cache()


def test_handed_out_direct_memory_lives_with_the_tensor_then_is_freed():
    e = Engine("cuda")
    warm_up()
    before = device_free()
    b = e.allocate(64 * MiB, torch.int32)
    b.fill_(3)
    e.release(b, handed_out=True)
    assert e.stats()["handed_out"] == 1 and e.stats()["current_bytes"] == 0
    # still valid after the engine let it go (min/max: no large temporary, unlike an int64 sum,
    # whose 512 MiB would stay in torch's cache and hide what this test measures)
    assert b.min().item() == 3 and b.max().item() == 3
    assert before - device_free() >= 256 * MiB
    del b
    gc.collect()
    torch.cuda.empty_cache()
    assert device_free() >= before - SLACK


def test_too_big_for_the_device_limit_goes_to_host():
    e = Engine("cuda", device_memory_limit=MiB)
    b = e.allocate(MiB, torch.float32)  # 4 MiB > the 1 MiB "device"
    assert e.alloc_type_of(b) == "host" and pointer_kind(ptr(b)) == "host"
    assert e.stats()["fallbacks_to_host"] == 1
    b.fill_(2.0)
    assert b.sum().item() == 2.0 * MiB
    e.release(b)


def test_out_of_device_memory_goes_to_host():
    e = Engine("cuda")
    torch.cuda.empty_cache()
    # take almost all the free memory, so that a 1 GiB request (256 Mi floats) really runs out
    filler = e.allocate(device_free() - 512 * MiB, torch.uint8)
    assert e.alloc_type_of(filler) == "device"
    b = e.allocate(256 * MiB, torch.float32)
    assert e.alloc_type_of(b) == "host" and e.stats()["fallbacks_to_host"] == 1
    b.fill_(1.0)
    assert b[-5:].sum().item() == 5.0
    e.release(b)
    e.release(filler)


def test_a_release_behind_queued_work_waits_for_nothing():
    # the arena a re-plan gives back: freed once the stream has run dry, not with a sync now
    from dynashape.impls.context import wait_all
    from dynashape.ops import host_sync
    gc.collect()  # earlier tests' sessions: their frees and background builds done before the count
    wait_all(60)
    e = Engine("cuda")
    warm_up()
    x = torch.randn(4096, 4096, device="cuda")
    y = torch.empty_like(x)
    torch.mm(x, x, out=y)  # cuBLAS's handle and workspace made before the measure
    before = device_free()
    b = e.allocate(256 * MiB, torch.uint8)
    host_sync.reset()
    b.fill_(1)
    for _ in range(20):
        torch.mm(x, x, out=y)  # work queued behind the buffer's last use
    e.release(b)
    assert host_sync.counters()["host_syncs"] == 0
    torch.cuda.synchronize()
    small = e.allocate(1, torch.uint8)  # the allocator's next use, the stream idle: the free is done
    d = e.allocator.deferred
    assert d.pending_bytes == 0 and d.counts["freed_idle"] >= 1 and d.counts["freed_waiting"] == 0, d.counts
    # (the device's free memory moves with whatever else the process holds: measured after the counts)
    assert device_free() >= before - SLACK
    e.release(small)
