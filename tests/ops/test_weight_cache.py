"""ops/weight_cache.py: a form derived from a weight is made once per tensor object, slot and tag,
made again when the tensor is written to or the tag changes, and dropped with the tensor."""

from __future__ import annotations

import gc

import torch

from dynashape.ops.weight_cache import WeightCache


def test_made_once_per_weight_slot_and_tag_and_dropped_with_the_weight():
    cache, made = WeightCache(), []
    w = torch.randn(3, 4)

    def make(tag):
        return lambda: made.append(tag) or len(made)
    a = cache.get(w, make("a"))
    assert cache.get(w, make("again")) == a and made == ["a"]
    assert cache.get(w, make("t"), slot=True) != a and len(cache) == 2  # another form of the same weight
    assert cache.get(w, make("tag1"), tag=1) != a  # what else it was made from changed: made again
    assert cache.get(w, make("tag1 again"), tag=1) == 3 and made == ["a", "t", "tag1"]
    w.add_(1.0)  # written to: made again
    assert cache.get(w, make("v"), tag=1) == 4
    key = id(w)
    assert key in cache
    del w
    gc.collect()
    assert key not in cache and len(cache) == 0
