"""impls/capture_guard.py: while a background thread captures a CUDA graph, torch's device-wide
synchronisations from other threads wait for it, and a capture waits for those in flight. The
logic runs here on stand-ins for torch.cuda.synchronize / empty_cache (CI has no GPU); the
decode tests on a GPU synchronise during real captures (tests/impls/test_decode_graphs.py)."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from dynashape.impls import capture_guard


@pytest.fixture
def fake(monkeypatch):
    """torch.cuda's synchronisations replaced by recorders (before the guard wraps them), the
    guard's own state fresh (CUDA sessions of other tests in this process may hold it: those no
    longer referenced are collected first, so that their finalizers put torch's functions back)."""
    gc.collect()
    monkeypatch.setattr(capture_guard, "_users", 0)
    monkeypatch.setattr(capture_guard, "_originals", {})
    calls = []
    gate = threading.Event()
    gate.set()

    def sync(device=None):
        gate.wait(5)
        calls.append(("synchronize", threading.current_thread().name))

    def empty():
        calls.append(("empty_cache", threading.current_thread().name))
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty)
    monkeypatch.setattr(torch.cuda.memory, "empty_cache", empty)
    yield calls, gate, sync, empty
    while capture_guard.installed():
        capture_guard.release()


def _in_thread(fn, name):
    t = threading.Thread(target=fn, name=name, daemon=True)
    t.start()
    return t


def test_install_wraps_and_release_puts_torch_back(fake):
    _, _, sync, empty = fake
    capture_guard.install()
    capture_guard.install()  # a second session
    assert torch.cuda.synchronize is not sync and torch.cuda.synchronize.__wrapped__ is sync
    assert torch.cuda.memory.empty_cache.__wrapped__ is empty
    capture_guard.release()
    assert torch.cuda.synchronize is not sync  # one session still captures
    capture_guard.release()
    assert torch.cuda.synchronize is sync and torch.cuda.empty_cache is empty
    assert torch.cuda.memory.empty_cache is empty
    capture_guard.release()  # one too many: nothing to undo
    assert not capture_guard.installed()


def test_a_synchronize_waits_for_the_capture_in_flight(fake):
    calls = fake[0]
    capture_guard.install()
    before = capture_guard.waits()["waits"]
    inside, leave = threading.Event(), threading.Event()

    def capture():
        with capture_guard.capturing():
            inside.set()
            leave.wait(5)
            calls.append(("capture ended", "capturer"))
    cap = _in_thread(capture, "capturer")
    assert inside.wait(5)
    users = [_in_thread(torch.cuda.synchronize, "caller"), _in_thread(torch.cuda.empty_cache, "other")]
    time.sleep(0.2)
    assert calls == []  # both held while the capture runs
    leave.set()
    for t in (cap, *users):
        t.join(5)
    assert calls[0] == ("capture ended", "capturer")
    assert sorted(calls[1:]) == [("empty_cache", "other"), ("synchronize", "caller")]
    assert capture_guard.waits()["waits"] == before + 2 and capture_guard.waits()["wait_s"] > 0


def test_a_capture_waits_for_a_synchronize_in_flight(fake):
    calls, gate, _, _ = fake
    capture_guard.install()
    gate.clear()  # the synchronisation blocks until the gate opens
    syncing = _in_thread(torch.cuda.synchronize, "caller")
    time.sleep(0.1)

    def capture():
        with capture_guard.capturing():
            calls.append(("capture began", "capturer"))
    cap = _in_thread(capture, "capturer")
    time.sleep(0.2)
    assert calls == []
    gate.set()
    syncing.join(5)
    cap.join(5)
    assert calls == [("synchronize", "caller"), ("capture began", "capturer")]


def test_the_capturing_thread_itself_is_not_held(fake):
    """Its own synchronize goes straight to CUDA (which refuses it during a capture): no deadlock."""
    calls = fake[0]
    capture_guard.install()
    with capture_guard.capturing():
        torch.cuda.synchronize()
    assert calls == [("synchronize", threading.current_thread().name)]


def test_without_a_capture_nothing_waits(fake):
    calls = fake[0]
    capture_guard.install()
    before = capture_guard.waits()["waits"]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert [c[0] for c in calls] == ["synchronize", "empty_cache"] and capture_guard.waits()["waits"] == before


def test_random_entry_points_are_wrapped_and_put_back(fake):
    """Functions of torch and the in-place methods Tensor inherits: wrapped while a session
    captures, and after the last one torch's own again (an inherited method: no shadow left)."""
    randn, multinomial = torch.randn, torch.multinomial
    assert "normal_" not in vars(torch.Tensor)
    capture_guard.install()
    assert torch.randn.__wrapped__ is randn and torch.multinomial.__wrapped__ is multinomial
    assert "normal_" in vars(torch.Tensor)
    g = torch.Generator().manual_seed(0)
    x = torch.empty(3).normal_(generator=g)  # still torch's: same numbers as unwrapped
    assert torch.equal(x, torch.empty(3).normal_(generator=torch.Generator().manual_seed(0)))
    capture_guard.release()
    assert torch.randn is randn and torch.multinomial is multinomial
    assert "normal_" not in vars(torch.Tensor)


def test_random_numbers_wait_for_the_capture_in_flight(fake):
    """On a GPU, a random op launched by another thread during a capture fails (the default
    generator is the graph's until capture_end); here the waiting itself, on the CPU."""
    capture_guard.install()
    before = capture_guard.waits()["waits"]
    inside, leave, done = threading.Event(), threading.Event(), []

    def capture():
        with capture_guard.capturing():
            inside.set()
            leave.wait(5)
            done.append("capture ended")
    cap = _in_thread(capture, "capturer")
    assert inside.wait(5)

    def sample():
        torch.multinomial(torch.rand(4), 1)
        done.append("sampled")
    user = _in_thread(sample, "sampler")
    time.sleep(0.2)
    assert done == []  # held while the capture runs
    leave.set()
    cap.join(5)
    user.join(5)
    assert done == ["capture ended", "sampled"]
    assert capture_guard.waits()["waits"] >= before + 1


def test_a_failed_capture_hands_the_generator_back():
    """impls/static.py: capture_begin makes the device's default generator state the graph's; a
    capture_end that fails raises before handing it back. The state copied before the capture is
    put back (on stand-ins here; on a GPU, below)."""
    from dynashape.impls import static

    class Gen:
        def __init__(self):
            self.state = "live"

        def clone_state(self):
            return "copy"

        def graphsafe_set_state(self, s):
            self.state = s
    g = Gen()
    static._rng_restore(torch.device("cuda"), (g, g.clone_state()))
    assert g.state == "copy"
    static._rng_restore(torch.device("cuda"), None)  # no snapshot (older torch, no GPU): nothing to do
    if not torch.cuda.is_available():
        assert static._rng_snapshot(torch.device("cuda")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures need a GPU")
def test_random_numbers_work_after_a_capture_that_failed():
    """A QDQ model whose int16 FakeQuant cannot be captured (the capture is refused, counted, the
    dynamic path serves): torch.randn on the GPU must still work afterwards."""
    import numpy as np
    from onnx import TensorProto as TP

    import dynashape
    from tests.compile.test_fuse_qdq import _feeds, _model
    sess = dynashape.InferenceSession(_model(TP.INT16, 100), device="cuda", static_impls="sync")
    rng = np.random.default_rng(0)
    for n, k in [(3, 8), (3, 8), (1, 33), (1, 33)]:
        sess.run(None, _feeds(rng, n, k, 0.05))
    assert sess.stats()["static_refused"] >= 1  # the capture did fail (else this tests nothing)
    torch.randn(4, device="cuda")
    torch.multinomial(torch.rand(4, device="cuda"), 1)
    torch.cuda.synchronize()
    del sess  # its refused graphs and pools go now, not in a later test's memory accounting
    import gc
    gc.collect()
    torch.cuda.empty_cache()
