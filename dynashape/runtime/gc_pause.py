"""Python's cyclic garbage collector paused while a model is parsed, compiled or traced.

Those steps make ~100,000 small objects (Dimensions, Values, expressions) that live on, and each
allocation burst sets off collections that scan the whole heap (torch, onnx and the model: ~250,000
objects). Measured on optimum's merged T5 decoder: the first call of its prompt branch 382-387 ms
with the collector on, 299-307 ms with it off. Reference counting still frees what dies; the cycles
made meanwhile wait for the next collection after the step.

A session's load (``collect_after``) that made many objects ends with a full collection. Without it
they are promoted to the oldest generation over the next calls, and CPython runs a full collection
once the objects promoted since the last one pass a quarter of those it kept then: a call of the
session's first few paid it, a scan of the whole process (in a process holding torch, transformers
and an eager BERT-base beside the session, ~0.4 s: BERT-base's fifth call at a random shape took
411 ms on an H200, benchmarks/new_shapes_gpu.py). Done at load, the calls start with nothing promoted.
A load that made fewer than ``LOAD_COLLECT`` objects (the small models a CPU process serves, whose
load takes tens of milliseconds) skips it: a scan of the process would be most of its load.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager

# objects made while a load ran (gc's count of the youngest generation) from which it ends with a
# full collection; DYNASHAPE_LOAD_COLLECT=0 never
LOAD_COLLECT = int(os.environ.get("DYNASHAPE_LOAD_COLLECT", 20_000))
STATS = {"load_collections": 0}


@contextmanager
def gc_paused(collect_after: bool = False):
    if not gc.isenabled():  # (nested, or the caller's own choice: left as it is)
        yield
        return
    gc.disable()
    try:
        yield
    except BaseException:
        gc.enable()
        raise
    made = gc.get_count()[0]
    gc.enable()
    if collect_after and 0 < LOAD_COLLECT <= made:
        gc.collect()
        STATS["load_collections"] += 1
