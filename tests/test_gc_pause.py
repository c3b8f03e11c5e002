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
