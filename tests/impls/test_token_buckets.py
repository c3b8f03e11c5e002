"""Token regions (codegen/tokens.py, codegen/align.py kind "tokens", runtime/aligned.py): a
transformer's per-token parts are cut apart from its attention, proven token by token from the
values' shapes and the ops, and one static impl per bucket of ``batch * seq`` serves every shape
whose token count fits, as rows ``[T, 1, ...]`` over padded views of the arena. On the CPU (CI)
the same path runs with the specialised region source (turned on for the session here); on the
device these tests run CUDA graphs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import dynashape
from dynashape.codegen.tokens import split
from dynashape.errors import OptionsError
from dynashape.runtime.aligned import MAX_TOKENS, token_bucket

from ..models.transformers_models import model_path


@pytest.fixture(autouse=True)
def _tokens(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_TOKEN_BUCKETS", "1")  # the cut on any device (its default: CUDA)
    monkeypatch.setenv("DYNASHAPE_CPU_STATIC", "specialized")  # builds in ms on the CPU


def _regions(sess):
    return [rc for st in sess._default.runner.states.values() for rc in st.spec.regions]


def _session(path, device):
    sess = dynashape.InferenceSession(str(path), device=device, static_impls="sync")
    sess.compiled.token_buckets = True  # the CUDA default, on the CPU too for this test
    return sess


def _feeds(name, b, s, rng, device):
    ids = torch.from_numpy(rng.integers(0, 1000, (b, s)).astype(np.int64))
    f = {"input_ids": ids}
    if name == "bert":
        mask = torch.ones(b, s, dtype=torch.int64)
        mask[:, s - s // 3:] = torch.from_numpy(rng.integers(0, 2, (b, s // 3)))  # some padding
        f["attention_mask"] = mask
    return {k: v.to(device) for k, v in f.items()}


def test_buckets_are_powers_of_two_then_quarters_of_an_octave():
    assert [token_bucket(v) for v in (1, 3, 64, 65, 256)] == [64, 64, 64, 128, 256]
    assert [token_bucket(v) for v in (257, 320, 321, 385, 1000, 4097)] == [320, 320, 384, 448, 1024, 5120]
    assert token_bucket(MAX_TOKENS) == MAX_TOKENS
    values = range(1, MAX_TOKENS + 1)
    buckets = {token_bucket(v) for v in values}
    assert len(buckets) == 21  # few and bounded
    assert all(v <= token_bucket(v) <= max(2 * v, 1) and token_bucket(v) <= 1.25 * v + 1 for v in values if v > 256)
    assert token_bucket(MAX_TOKENS + 1) is None and token_bucket(0) is None


def test_the_cut_keeps_stretches_with_a_product_apart():
    its = list(range(8))
    tokenwise = [True, False, True, True, True, False, True, True]
    product = [True, False, False, True, False, False, False, False]
    # the first item alone has a product but is one item; 2-4 qualify; 6-7 have no product
    assert split(its, tokenwise, product) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert split(its, [True] * 8, product) == [its]  # the whole run is per token: one region
    assert split(its, [False] * 8, product) == [its]


@pytest.mark.parametrize("name", ["bert"])  # (GPT-2's [B*S, H] products: not yet token regions, see tokens.py)
def test_one_impl_per_token_bucket_serves_every_shape_and_padding_never_leaks(device, name):
    path = model_path(name)
    sess = _session(path, device)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    # the largest shape first: one arena plan holds every later shape's bucket
    shapes = [(8, 48)] + [(int(rng.integers(1, 9)), int(rng.integers(2, 48))) for _ in range(10)]
    for b, s in shapes:
        f = _feeds(name, b, s, rng, device)
        if sess.stats().get("static_builds_aligned", 0):  # padded rows of the arena hold NaN
            for st in sess._default.runner.states.values():
                for t in st.typed:
                    if t.dtype.is_floating_point:
                        t.fill_(float("nan"))
        got = sess.run(None, f)
        want = ref.run(None, {k: v.cpu().numpy() for k, v in f.items()})
        for g, w in zip(got, want):
            g = g.cpu().numpy() if isinstance(g, torch.Tensor) else g
            assert np.isfinite(g).all()
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    tokens = [rc for rc in _regions(sess) if rc.align is not None and rc.align.kind == "tokens"]
    assert tokens and all(rc.align.lead == ("batch", "seq") for rc in tokens)
    stats = sess.stats()
    assert stats["static_builds_aligned"] > 0 and stats["static_hits"] > 0
    # few impls for eleven shapes: one per bucket and token region, not one per shape
    assert stats["static_builds_aligned"] <= len(tokens) * len({token_bucket(b * s) for b, s in shapes})


def test_attention_and_position_embeddings_stay_out_of_token_regions(device):
    sess = _session(model_path("bert"), device)
    sess.run(None, _feeds("bert", 2, 5, np.random.default_rng(1), device))
    tokens = [rc for rc in _regions(sess) if rc.align is not None and rc.align.kind == "tokens"]
    assert tokens
    for rc in tokens:
        body = "\n".join(rc.body).lower()
        assert "attention" not in body and "softmax" not in body and "position" not in body, body


def test_a_bad_token_bucket_setting_is_an_options_error(device, monkeypatch):
    monkeypatch.setenv("DYNASHAPE_TOKEN_BUCKETS", "yes")
    with pytest.raises(OptionsError, match="DYNASHAPE_TOKEN_BUCKETS"):
        dynashape.InferenceSession(str(model_path("bert")), device=device, static_impls="sync")


def test_the_arena_holds_room_for_token_buckets_only_where_they_are_bucketed(device):
    """A region qualifies as a token region whether or not the buckets are on; its arena is
    planned for the range's top (batch 64) only where they are (with them off, a CPU session of
    a [N, S, H] model planned 64 x 512 rows for a call of 2 x 5)."""
    feeds = _feeds("bert", 2, 5, np.random.default_rng(2), device)
    plans = {}
    for on in (False, True):
        sess = dynashape.InferenceSession(str(model_path("bert")), device=device, static_impls="sync")
        sess.compiled.token_buckets = on
        sess.run(None, feeds)
        states = list(sess._default.runner.states.values())
        assert any(st.spec.token_positions for st in states)
        plans[on] = max(st.caps[st.spec.token_positions[0][0]] for st in states if st.spec.token_positions)
    assert plans[False] < 64 <= plans[True]
