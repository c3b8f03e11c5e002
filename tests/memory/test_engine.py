"""The memory Engine on the CPU: counters by allocation type, ownership on release, the verbose
log, the host fallback (with a fake device) and the preallocation rule."""

import gc
import logging
import os
import subprocess
import sys

import pytest
import torch

from dynashape.errors import OptionsError
from dynashape.memory.allocators import CpuAllocator, FakeDeviceAllocator
from dynashape.memory.engine import ALLOC_TYPES, Engine, OutOfDeviceMemory

F32 = torch.float32


def lines(text):
    return [ln for ln in text.splitlines() if ln]


@pytest.fixture(autouse=True)
def _logging_hides_info(caplog):
    """Whatever pytest's log level, logging does not show the engine's INFO lines unless a test
    says so: then they must come on stderr."""
    caplog.set_level(logging.WARNING, logger="dynashape.memory")


def test_buffers_have_the_asked_shape_dtype_and_type():
    e = Engine()
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool,
                  torch.complex64):
        for t in ALLOC_TYPES:
            b = e.allocate(7, dtype, t)
            assert b.shape == (7,) and b.dtype == dtype and b.device.type == "cpu"
            assert b._base is None and b.is_contiguous()
            assert e.alloc_type_of(b) == t
    assert e.stats()["allocations"] == 7 * 3


def test_counters_and_per_type_current_and_peak():
    e = Engine()
    d = e.allocate(100, F32)              # 400 device
    h = e.allocate(10, torch.int64, "host")  # 80 host
    s = e.allocate(3, torch.float16, "shared")  # 6 shared
    st = e.stats()
    assert (st["allocations"], st["frees"], st["handed_out"]) == (3, 0, 0)
    assert st["allocated_bytes_total"] == 486 and st["current_bytes"] == 486 and st["peak_bytes"] == 486
    assert (st["device_current_bytes"], st["host_current_bytes"], st["shared_current_bytes"]) == (400, 80, 6)
    assert (st["device_allocations"], st["host_allocations"], st["shared_allocations"]) == (1, 1, 1)
    e.release(d)
    d2 = e.allocate(50, F32)              # 200 device: below the device peak
    st = e.stats()
    assert st["frees"] == 1 and st["allocations"] == 4 and st["allocated_bytes_total"] == 686
    assert st["device_current_bytes"] == 200 and st["device_peak_bytes"] == 400
    assert st["current_bytes"] == 286 and st["peak_bytes"] == 486
    assert e.used("device") == 200 and e.used("host") == 80 and e.used("shared") == 6
    for b in (h, s, d2):
        e.release(b)
    st = e.stats()
    assert st["current_bytes"] == 0 and st["frees"] == 4
    assert all(st[f"{t}_current_bytes"] == 0 for t in ALLOC_TYPES)
    assert (st["device_peak_bytes"], st["host_peak_bytes"], st["shared_peak_bytes"]) == (400, 80, 6)
    assert isinstance(st["alloc_time_s"], float) and st["alloc_time_s"] >= 0.0


def test_reset_stats_zeroes_counters_and_restarts_peaks_from_current():
    e = Engine()
    a = e.allocate(100, F32)
    b = e.allocate(25, F32, "host")
    e.release(a)
    e.reset_stats()
    st = e.stats()
    assert st["allocations"] == st["frees"] == st["allocated_bytes_total"] == 0 and st["alloc_time_s"] == 0.0
    assert st["peak_bytes"] == st["current_bytes"] == 100
    assert st["device_peak_bytes"] == 0 and st["host_peak_bytes"] == 100
    e.release(b)
    assert e.stats()["frees"] == 1 and e.stats()["peak_bytes"] == 100


def test_release_finds_the_buffer_through_a_view_and_refuses_strangers():
    e = Engine()
    b = e.allocate(12, F32)
    e.release(b[4:].view(2, 4))  # a view shares the storage: it names the same buffer
    assert e.stats()["current_bytes"] == 0
    with pytest.raises(ValueError):
        e.release(b)  # twice
    with pytest.raises(ValueError):
        e.release(torch.empty(3))
    with pytest.raises(ValueError):
        e.alloc_type_of(torch.empty(3))


def test_zero_elements_count_zero_bytes_but_get_an_address_of_their_own():
    e = Engine()
    a, b = e.allocate(0, F32), e.allocate(0, torch.int64, "host")
    assert a.numel() == b.numel() == 0
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert e.alloc_type_of(b) == "host" and e.stats()["allocated_bytes_total"] == 0
    e.release(a)
    e.release(b)
    assert e.stats()["frees"] == 2


def test_handed_out_memory_stays_valid_and_is_freed_when_the_caller_drops_it():
    fake = FakeDeviceAllocator(1 << 20)
    e = Engine(allocator=fake)
    b = e.allocate(256, F32)
    b.copy_(torch.arange(256, dtype=F32))
    e.release(b, handed_out=True)
    st = e.stats()
    assert st["handed_out"] == 1 and st["frees"] == 0 and st["current_bytes"] == 0
    # the memory is the caller's now: still there, still writable, still held on the device
    assert torch.equal(b, torch.arange(256, dtype=F32))
    b[:10] = -1.0
    assert b[:10].sum().item() == -10.0 and b[10:].sum().item() == sum(range(10, 256))
    assert fake.used == 1024
    view = b[100:]
    del b
    gc.collect()
    assert fake.used == 1024  # a view keeps it alive
    assert view[0].item() == 100.0
    del view
    gc.collect()
    assert fake.used == 0


def test_release_frees_at_once():
    fake = FakeDeviceAllocator(1 << 20)
    e = Engine(allocator=fake)
    b = e.allocate(256, F32)
    assert fake.used == 1024
    e.release(b)  # freed although the Python object b is still alive
    assert fake.used == 0
    del b
    gc.collect()
    assert fake.used == 0  # and not given back a second time


def test_verbose_lines_on_stderr(capsys):
    e = Engine(verbose=2)
    a = e.allocate(100, F32)
    b = e.allocate(10, torch.int64, "host")
    c = e.allocate(3, torch.float16, "shared")
    e.release(a)
    e.release(c, handed_out=True)
    e.release(b)
    assert lines(capsys.readouterr().err) == [
        "dynashape.memory: Allocate 400 bytes of device allocation type (current=400; max=400)",
        "dynashape.memory: Allocate 80 bytes of host allocation type (current=480; max=480)",
        "dynashape.memory: Allocate 6 bytes of shared allocation type (current=486; max=486)",
        "dynashape.memory: Free 400 bytes of device allocation type (current=86; max=486)",
        "dynashape.memory: Hand out 6 bytes of shared allocation type (current=80; max=486)",
        "dynashape.memory: Free 80 bytes of host allocation type (current=0; max=486)",
    ]


def test_verbose_lines_go_to_logging_when_it_shows_them(caplog, capsys):
    caplog.set_level(logging.INFO, logger="dynashape.memory")
    e = Engine(verbose=2)
    e.release(e.allocate(4, torch.int32))
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("dynashape.memory", logging.INFO, "Allocate 16 bytes of device allocation type (current=16; max=16)"),
        ("dynashape.memory", logging.INFO, "Free 16 bytes of device allocation type (current=0; max=16)"),
    ]
    assert capsys.readouterr().err == ""  # never twice


def test_verbose_lines_are_visible_without_any_logging_setup():
    code = "import torch; from dynashape.memory import engine; engine.Engine(verbose=2).allocate(2, torch.int8)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stderr == "dynashape.memory: Allocate 2 bytes of device allocation type (current=2; max=2)\n"


def test_verbose_level_below_two_is_quiet_and_the_environment_sets_the_level(capsys, monkeypatch):
    monkeypatch.delenv("DYNASHAPE_VERBOSE", raising=False)
    for e in (Engine(), Engine(verbose=1)):
        e.release(e.allocate(4, F32))
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("DYNASHAPE_VERBOSE", "2")
    e = Engine()
    e.allocate(4, F32)
    assert lines(capsys.readouterr().err) == [
        "dynashape.memory: Allocate 16 bytes of device allocation type (current=16; max=16)"]
    Engine(verbose=0).allocate(4, F32)  # the argument wins over the environment
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("DYNASHAPE_VERBOSE", "loud")
    with pytest.raises(OptionsError, match="DYNASHAPE_VERBOSE"):
        Engine()


def test_too_big_for_the_device_goes_to_host(capsys):
    fake = FakeDeviceAllocator(1000)
    e = Engine(allocator=fake, verbose=2)
    assert e.device_total() == 1000
    b = e.allocate(500, F32)  # 2000 bytes > the device
    assert e.alloc_type_of(b) == "host" and fake.device_allocations == 0
    st = e.stats()
    assert st["fallbacks_to_host"] == 1 and st["host_current_bytes"] == 2000 and st["device_current_bytes"] == 0
    err = lines(capsys.readouterr().err)
    assert len(err) == 2
    assert err[0].startswith("dynashape.memory: Allocation of 2000 bytes of device allocation type falls back "
                             "to host: bigger than the device (1000 bytes)")
    assert err[1] == "dynashape.memory: Allocate 2000 bytes of host allocation type (current=2000; max=2000)"
    b.fill_(3.0)
    assert b.sum().item() == 1500.0


def test_out_of_device_memory_goes_to_host(capsys):
    fake = FakeDeviceAllocator(1000)
    e = Engine(allocator=fake, verbose=1)
    a = e.allocate(150, F32)  # 600: fits
    b = e.allocate(150, F32)  # 600 more: the fake device refuses
    assert e.alloc_type_of(a) == "device" and e.alloc_type_of(b) == "host"
    assert e.stats()["fallbacks_to_host"] == 1 and fake.used == 600
    assert "falls back to host: the device is out of memory" in capsys.readouterr().err
    e.release(a)
    c = e.allocate(150, F32)  # room again
    assert e.alloc_type_of(c) == "device" and e.stats()["fallbacks_to_host"] == 1
    # only device requests fall back: host and shared ones never touch the device
    e.allocate(1000, F32, "shared")
    assert e.stats()["shared_current_bytes"] == 4000 and fake.used == 600


def test_device_memory_limit_caps_the_device():
    e = Engine(device_memory_limit=1000)
    assert e.device_total() == 1000
    assert e.alloc_type_of(e.allocate(300, F32)) == "host"  # 1200 > 1000
    a = e.allocate(150, F32)
    b = e.allocate(150, F32)  # 600 + 600 > 1000
    assert (e.alloc_type_of(a), e.alloc_type_of(b)) == ("device", "host")
    assert e.stats()["fallbacks_to_host"] == 2 and e.used("device") == 600
    # the limit wins over what the allocator's device says
    assert Engine(allocator=FakeDeviceAllocator(1 << 30), device_memory_limit=4096).device_total() == 4096


def test_can_preallocate_follows_the_reference_rule():
    e = Engine(device_memory_limit=1000)
    assert e.can_preallocate(899) and not e.can_preallocate(900)  # used + n < 0.9 * total
    assert not e.can_preallocate(1001)  # more than one allocation can be
    e.allocate(125, F32)  # 500 device
    e.allocate(500, F32, "host")  # host memory does not count
    assert e.used("device") == 500
    assert e.can_preallocate(399) and not e.can_preallocate(400)


def test_device_total_on_cpu_is_the_physical_memory():
    e = Engine()
    assert e.device_total() == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert Engine(allocator=FakeDeviceAllocator(12345)).device_total() == 12345


def test_torch_allocator_on_cpu():
    e = Engine("cpu", allocator="torch")
    assert e.allocator_name == "torch"
    b = e.allocate(64, torch.float64, "host")
    b.fill_(0.5)
    assert b.sum().item() == 32.0 and e.alloc_type_of(b) == "host"
    e.release(b)
    assert e.stats()["frees"] == 1 and e.stats()["current_bytes"] == 0


def test_default_allocator_is_direct():
    e = Engine()
    assert e.allocator_name == "direct" and isinstance(e.allocator, CpuAllocator)


def test_an_allocator_object_gets_the_calls():
    class Recorder:
        def __init__(self):
            self.calls = []

        def alloc(self, nbytes, alloc_type):
            self.calls.append(("alloc", nbytes, alloc_type))
            return torch.empty(nbytes, dtype=torch.uint8), f"h{len(self.calls)}"

        def free(self, handle, alloc_type):
            self.calls.append(("free", handle, alloc_type))

    r = Recorder()
    e = Engine(allocator=r)
    a = e.allocate(3, torch.int16, "shared")
    z = e.allocate(0, F32)
    e.release(a)
    e.release(z, handed_out=True)  # handed out: the allocator is not asked to free it
    assert r.calls == [("alloc", 6, "shared"), ("alloc", 1, "device"), ("free", "h1", "shared")]
    assert e.allocator_name == "Recorder"


def test_an_allocator_that_breaks_the_protocol_is_refused():
    class Strided:
        def alloc(self, nbytes, alloc_type):
            return torch.empty(nbytes + 1, dtype=torch.uint8)[1:], None

        def free(self, handle, alloc_type):
            pass

    with pytest.raises(TypeError, match="offset 0"):
        Engine(allocator=Strided()).allocate(4, F32)


def test_bad_options():
    with pytest.raises(OptionsError, match="unknown allocator 'caching'"):
        Engine(allocator="caching")
    with pytest.raises(OptionsError, match="alloc"):
        Engine(allocator=object())
    with pytest.raises(OptionsError, match="device_memory_limit"):
        Engine(device_memory_limit=0)
    with pytest.raises(OptionsError, match="not supported"):
        Engine("meta")
    with pytest.raises(ValueError, match="allocation type 'usm_host'"):
        Engine().allocate(4, F32, "usm_host")


def test_fake_device_refuses_beyond_its_capacity():
    fake = FakeDeviceAllocator(100)
    buf, handle = fake.alloc(60, "device")
    with pytest.raises(OutOfDeviceMemory):
        fake.alloc(41, "device")
    fake.alloc(1000, "host")  # host memory is not the device's
    fake.free(handle, "device")
    assert fake.used == 0 and fake.alloc(100, "device")[0].numel() == 100


# ---- the CUDA driver plumbing, with a fake libcuda (the real one runs in test_engine_cuda.py) ----
class FakeLibcuda:
    """Answers the driver calls the allocators make: each returns the CUresult set for it."""

    def __init__(self, results=None, current=None):
        self.results, self.current, self.calls = results or {}, current, []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            if name == "cuCtxGetCurrent":
                args[0]._obj.value = self.current
            if name == "cuGetErrorName":
                args[1]._obj.value = b"CUDA_ERROR_FAKE"
            return self.results.get(name, 0)
        return call


def fake_driver(lib):
    from dynashape.memory import allocators
    drv = allocators._Driver.__new__(allocators._Driver)
    drv.lib = lib
    return drv


def test_driver_results_become_typed_errors():
    from dynashape.memory.allocators import CudaDriverError
    drv = fake_driver(FakeLibcuda({"cuMemAlloc_v2": 2, "cuMemHostAlloc": 2, "cuMemFree_v2": 700}))
    drv.call("cuMemAllocManaged", None, 8, 1)  # CUDA_SUCCESS
    with pytest.raises(OutOfDeviceMemory, match="cuMemAlloc_v2: CUDA_ERROR_FAKE"):
        drv.call("cuMemAlloc_v2", None, 8)
    with pytest.raises(MemoryError) as host_oom:
        drv.call("cuMemHostAlloc", None, 8, 3, oom=MemoryError)
    assert not isinstance(host_oom.value, OutOfDeviceMemory)  # no device fallback for host memory
    with pytest.raises(CudaDriverError, match="cuMemFree_v2 failed with CUDA_ERROR_FAKE") as other:
        drv.call("cuMemFree_v2", 16)
    assert other.value.code == 700


def test_driver_calls_run_in_the_devices_primary_context():
    import ctypes
    ctx = ctypes.c_void_p(0x1000)
    for current, pushed in ((0x1000, False), (None, True), (0x2000, True)):
        lib = FakeLibcuda(current=current)
        with fake_driver(lib).on(ctx):
            lib.calls.append("work")
        expected = ["cuCtxGetCurrent", "cuCtxPushCurrent_v2", "work", "cuCtxPopCurrent_v2"]
        assert lib.calls == (expected if pushed else ["cuCtxGetCurrent", "work"])


def test_cuda_buffer_frees_once_on_release_or_when_collected():
    from dynashape.memory.allocators import CudaBuffer
    freed = []
    b = CudaBuffer(0x10, 8, lambda: freed.append("b"))
    assert b.__cuda_array_interface__ == {"version": 3, "shape": (8,), "typestr": "|u1", "data": (0x10, False),
                                          "strides": None}
    b.free()
    del b
    gc.collect()
    c = CudaBuffer(0x20, 8, lambda: freed.append("c"))
    del c  # never released: collecting it frees the memory
    gc.collect()
    assert freed == ["b", "c"]


def test_outputs_handed_out_count_while_the_caller_holds_them():
    """caller_held_bytes: small outputs (weakly referenced, swept) and large ones (a finalizer)
    both count until the caller drops them, in any order; the sweep keeps the bookkeeping bounded."""
    from dynashape.memory import engine as E
    e = Engine()
    small = [e.allocate_output((4, 4), F32) for _ in range(3)]
    big = e.allocate_output((E._SMALL_HANDED // 4 + 1,), F32)
    assert e.stats()["caller_held_bytes"] == 3 * 64 + big.numel() * 4
    del small[1]  # out of order
    assert e.stats()["caller_held_bytes"] == 2 * 64 + big.numel() * 4
    del big
    gc.collect()
    assert e.stats()["caller_held_bytes"] == 2 * 64
    small.clear()
    for _ in range(3 * E._SWEEP):
        e.allocate_output((2,), F32)  # dropped at once
    assert len(e._small) <= E._SWEEP
    assert e.stats()["caller_held_bytes"] == 0 and e.stats()["peak_with_caller_bytes"] >= 3 * 64
