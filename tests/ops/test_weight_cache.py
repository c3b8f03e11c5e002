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


def test_forms_that_keep_their_weights_values_let_the_weight_go():
    """A kept form that held its weight (or a view of it: a view keeps its base's Python object)
    kept the weight alive, so the cache never dropped either: the quantized LSTM's weights and
    the integer products' prepared B of every session ever made stayed in memory."""
    from dynashape.ops import contrib_rnn, linalg, rnn
    lw = torch.randn(1, 4 * 16, 16)  # an LSTM's W, laid out for csrc/lstm.c
    rnn._LSTM_FORMS.get(lw, lambda v=lw: rnn._gate_blocks(v, 16))
    w = torch.randint(-128, 128, (2, 8, 32), dtype=torch.int8)
    scale, zp = torch.rand(2), torch.zeros(2, dtype=torch.int8)
    qw = contrib_rnn._weights(w, scale, zp)
    qw.native(False)
    b = torch.randint(0, 256, (16, 8), dtype=torch.uint8)
    prep = linalg.prepared_b(b, torch.tensor(3, dtype=torch.uint8))
    assert prep.int8() is not None and torch.equal(prep.raw, b)  # the values are still there to use
    wid, bid, lid = id(w), id(b), id(lw)
    assert wid in contrib_rnn._WEIGHTS and bid in linalg._PREPARED and lid in rnn._LSTM_FORMS
    del w, b, qw, prep, lw
    gc.collect()
    assert wid not in contrib_rnn._WEIGHTS and bid not in linalg._PREPARED and lid not in rnn._LSTM_FORMS
