"""Frees put off until the stream has run dry (memory/deferred_frees.py), with a fake stream: a
re-plan's freed arena is no host sync, and memory held back stays bounded."""

import pytest

from dynashape.memory.deferred_frees import DeferredFrees
from dynashape.ops import host_sync


@pytest.fixture
def syncs():
    """The process's host-sync counters from zero, and zero again after (a failed assertion too)."""
    host_sync.reset()
    yield
    host_sync.reset()


class FakeStream:
    """Work queued on a stream: ``launch()`` queues, ``run()`` lets it all finish."""

    def __init__(self):
        self.queued = 0  # launches so far
        self.finished = 0  # launches run
        self.capturing = False
        self.waits = 0
        self.freed: list[int] = []

    def launch(self):
        self.queued += 1

    def run(self):
        self.finished = self.queued

    def frees(self, cap):
        return DeferredFrees(lambda call, ptr: self.freed.append(ptr), lambda: None if self.capturing else self.queued,
                             lambda marker: self.finished >= marker,
                             lambda: not self.capturing and self.finished == self.queued, self._wait, cap)

    def _wait(self):
        self.waits += 1
        self.run()


def test_a_free_behind_queued_work_waits_for_the_stream_to_run_dry(syncs):
    s = FakeStream()
    d = s.frees(cap=1000)
    s.launch()  # a kernel that may still read the buffer
    d.put("cuMemFree_v2", 1, 100)
    assert s.freed == [] and d.pending_bytes == 100
    assert d.reap() == 0 and s.freed == []  # still queued: nothing freed, nothing waited
    s.run()
    assert d.reap() == 100 and s.freed == [1] and d.pending_bytes == 0
    assert s.waits == 0 and host_sync.counters()["host_syncs"] == 0
    assert d.counts == {"deferred": 1, "freed_idle": 1, "freed_waiting": 0}


def test_an_idle_stream_frees_at_once():
    s = FakeStream()
    d = s.frees(cap=1000)
    s.launch()
    s.run()
    d.put("cuMemFree_v2", 7, 10)
    assert s.freed == [7] and s.waits == 0


def test_later_work_on_the_stream_holds_the_free_back():
    # the buffer's own work has run, but cuMemFree would wait for what was queued since
    s = FakeStream()
    d = s.frees(cap=1000)
    d.put("cuMemFree_v2", 1, 10)  # nothing queued: freed now
    s.launch()
    d.put("cuMemFree_v2", 2, 10)
    s.run()
    s.launch()  # the next call's kernels
    assert d.reap() == 0 and s.freed == [1]
    s.run()
    assert d.reap() == 10 and s.freed == [1, 2]


def test_over_the_cap_a_free_waits_and_is_counted(syncs):
    s = FakeStream()
    d = s.frees(cap=150)
    s.launch()
    d.put("cuMemFree_v2", 1, 100)
    s.launch()
    d.put("cuMemFree_v2", 2, 100)  # 200 > 150: wait for the stream, then free both
    assert s.freed == [1, 2] and s.waits == 1 and d.pending_bytes == 0
    assert host_sync.counters()["host_syncs_by_op"] == {"free of device memory": 1}
    assert d.counts["freed_waiting"] == 2


def test_a_free_during_a_capture_waits_for_the_capture_to_end():
    s = FakeStream()
    d = s.frees(cap=1000)
    s.capturing = True  # no event can be recorded, and the stream is not idle while it captures
    d.put("cuMemFree_v2", 3, 10)
    assert s.freed == []
    s.capturing = False
    assert d.reap() == 10 and s.freed == [3] and s.waits == 0


def test_flush_frees_everything(syncs):
    s = FakeStream()
    d = s.frees(cap=1000)
    s.launch()
    d.put("cuMemFree_v2", 4, 10)
    d.flush()
    assert s.freed == [4] and s.waits == 1
