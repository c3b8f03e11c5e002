"""ops/weight_cache.py: a form derived from a weight is made once per tensor object, slot and tag,
made again when the tensor is written to or the tag changes, and dropped with the tensor."""

from __future__ import annotations

import gc

import torch

from dynashape.ops.weight_cache import ConstantsCache, WeightCache


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
    from dynashape.ops import contrib_rnn, integer_gemm, rnn
    lw = torch.randn(1, 4 * 16, 16)  # an LSTM's W, laid out for csrc/lstm.c
    rnn._LSTM_FORMS.get(lw, lambda v=lw: rnn._gate_blocks(v, 16))
    w = torch.randint(-128, 128, (2, 8, 32), dtype=torch.int8)
    scale, zp = torch.rand(2), torch.zeros(2, dtype=torch.int8)
    qw = contrib_rnn._weights(w, scale, zp)
    qw.native(False)
    b = torch.randint(0, 256, (16, 8), dtype=torch.uint8)
    prep = integer_gemm.prepared_b(b, torch.tensor(3, dtype=torch.uint8))
    assert prep.int8() is not None and torch.equal(prep.raw, b)  # the values are still there to use
    wid, bid, lid = id(w), id(b), id(lw)
    assert wid in contrib_rnn._WEIGHTS and bid in integer_gemm._PREPARED and lid in rnn._LSTM_FORMS
    del w, b, qw, prep, lw
    gc.collect()
    assert wid not in contrib_rnn._WEIGHTS and bid not in integer_gemm._PREPARED and lid not in rnn._LSTM_FORMS


def test_constants_cache_follows_identity_version_and_tag():
    """A value of a few constant tensors is made once; a write (version), another tensor, another
    tag or a None in another place makes it again; the limit empties the cache."""
    cache, made = ConstantsCache(limit=4), []

    def make(v):
        made.append(v)
        return v

    s, z = torch.tensor(0.5), torch.tensor(3)
    assert cache.get((s, z), lambda: make(1)) == 1
    assert cache.get((s, z), lambda: make(2)) == 1 and made == [1]
    assert cache.get((s, z), lambda: make(3), tag=7) == 3  # another tag: another entry
    s.add_(1.0)  # a write: the version moves
    assert cache.get((s, z), lambda: make(4)) == 4
    assert cache.get((torch.tensor(0.5), z), lambda: make(5)) == 5  # an equal tensor is another tensor
    assert cache.get((s, None), lambda: make(6)) == 6
    assert len(cache._items) <= 4  # emptied on reaching the limit
    assert made == [1, 3, 4, 5, 6]
