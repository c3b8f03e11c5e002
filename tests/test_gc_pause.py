"""The collector paused while a model loads or a shape is traced (runtime/gc_pause.py): on during
the caller's own code, after a failed load too, and a caller's own choice to keep it off is kept."""

import gc

import numpy as np
import pytest

import dynashape
from dynashape.errors import InvalidModelError
from dynashape.runtime.gc_pause import gc_paused

from .test_subgraphs import if_model


def test_paused_inside_and_on_again_after_a_load_and_a_new_shape():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the outer one turns it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    sess = dynashape.InferenceSession(if_model())
    assert gc.isenabled()
    x = np.ones((2, 3), np.float32)
    sess.run(None, {"x": x, "w": np.ones(3, np.float32)})
    assert gc.isenabled()


def test_a_failed_load_turns_it_back_on_and_a_callers_off_stays_off():
    with pytest.raises(InvalidModelError):
        dynashape.InferenceSession(b"not a model")
    assert gc.isenabled()
    gc.disable()
    try:
        dynashape.InferenceSession(if_model())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_load_that_made_many_objects_ends_with_a_full_collection(monkeypatch):
    """So that the calls after it do not pay the full collection its objects would set off; a load
    below the bound does not pay one (a small model's load would be mostly that scan)."""
    from dynashape.runtime import gc_pause
    fulls = []

    def seen(phase, info):
        if phase == "stop" and info["generation"] == 2:
            fulls.append(1)
    gc.callbacks.append(seen)
    try:
        monkeypatch.setattr(gc_pause, "LOAD_COLLECT", 10 ** 9)
        before = gc_pause.STATS["load_collections"]
        dynashape.InferenceSession(if_model())
        assert gc_pause.STATS["load_collections"] == before
        monkeypatch.setattr(gc_pause, "LOAD_COLLECT", 1)  # every load made at least one object
        fulls.clear()
        with gc_paused(collect_after=True):
            junk = [[i] for i in range(100)]  # noqa: F841  objects made while paused
        assert fulls and gc_pause.STATS["load_collections"] == before + 1
        fulls.clear()
        with gc_paused():  # a shape traced in a call: no collection after it
            junk = [[i] for i in range(100)]  # noqa: F841
        assert not fulls
    finally:
        gc.callbacks.remove(seen)
