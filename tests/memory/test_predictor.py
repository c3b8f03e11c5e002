import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynashape.errors import OptionsError
from dynashape.memory.predictor import ENV_VAR, PredictorOptions, ShapePredictor, history_key

FP32 = 32


def feed(p: ShapePredictor, shapes, key="n", bitwidth=FP32, **kw):
    """Feed shapes as successive reallocations; return the last result."""
    res = None
    for s in shapes:
        res = p.predict(key, s, bitwidth, False, **kw)
    return res


def kv(L: int, d: int = 64) -> tuple:
    return (1, 8, L, d)


# ---- REFERENCE.md steps with concrete numbers --------------------------------------------------

def test_kv_cache_like_fixed_step_predicts_ten_steps_ahead():
    # one step of [1, 8, L, 64] fp32 is 8 * 64 * 4 = 2048 bytes <= 16384: iterations mode
    p = ShapePredictor()
    assert p.predict("n", kv(10), FP32, False) == (False, ())
    assert p.predict("n", kv(11), FP32, False) == (False, ())
    assert p.predict("n", kv(12), FP32, False) == (True, kv(22))
    assert p.stats()["iterations_mode"] == 1 and p.stats()["predictions_made"] == 1


def test_large_growth_slice_falls_back_to_ratio_mode():
    # one step of [1, 8, L, 1024] fp32 is 32768 bytes > 16384: ratio mode, flat shape of rank 4
    p = ShapePredictor()
    ok, shape = feed(p, [kv(10, 1024), kv(11, 1024), kv(12, 1024)])
    assert ok and shape == (math.floor(8 * 12 * 1024 * 1.1), 1, 1, 1) == (108134, 1, 1, 1)
    assert p.stats()["ratio_mode"] == 1 and p.stats()["iterations_mode"] == 0


def test_step1_reuse_records_but_does_not_predict():
    p = ShapePredictor()
    assert p.predict("n", kv(10), FP32, True) == (False, ())
    assert p.predict("n", kv(11), FP32, True) == (False, ())
    assert p.predict("n", kv(12), FP32, True) == (False, ())  # 3 shapes, but the buffer suffices
    assert p.stats()["reused"] == 3 and p.stats()["predictions_made"] == 0
    # the reused calls were recorded: the next reallocation predicts from 11, 12, 13
    assert p.predict("n", kv(13), FP32, False) == (True, kv(23))


def test_step1_reuse_wins_over_custom_path():
    p = ShapePredictor()
    assert p.predict("n", kv(10), FP32, True, custom_count=128, custom_dim=2) == (False, ())


def test_step2_custom_dim_needs_no_history():
    p = ShapePredictor()
    assert p.predict("kv", kv(7), FP32, False, custom_count=128 + 5, custom_dim=2) == (True, kv(140))
    assert p.stats()["custom_mode"] == 1


def test_step2_custom_dim_out_of_range_is_an_error():
    p = ShapePredictor()
    with pytest.raises(ValueError, match="custom_dim 4"):
        p.predict("kv", kv(7), FP32, False, custom_count=8, custom_dim=4)
    with pytest.raises(ValueError, match="custom_dim 0"):
        p.predict("s", (), FP32, False, custom_count=8, custom_dim=0)


def test_step2_needs_both_custom_values():
    p = ShapePredictor()
    assert p.predict("a", kv(7), FP32, False, custom_count=0, custom_dim=2) == (False, ())
    assert p.predict("b", kv(7), FP32, False, custom_count=8, custom_dim=-1) == (False, ())


def test_step3_two_shapes_are_not_enough():
    p = ShapePredictor()
    assert feed(p, [(4, 4), (40, 4)]) == (False, ())
    assert p.stats()["predictions_made"] == 0


def test_step4_only_the_last_three_shapes_count():
    p = ShapePredictor()
    # 1 -> 5 is a big jump, but only 5, 6, 7 are kept: a fixed step of 1
    assert feed(p, [(1, 4), (5, 4), (6, 4), (7, 4)]) == (True, (17, 4))


def test_step4_unequal_steps_use_ratio_mode():
    p = ShapePredictor()
    assert feed(p, [(10, 4), (11, 4), (13, 4)]) == (True, (57, 1))  # floor(52 * 1.1) = 57


def test_step4_step_at_max_dim_diff_is_accepted_and_above_is_not():
    p = ShapePredictor()
    assert feed(p, [(10, 4), (12, 4), (14, 4)], key="two") == (True, (34, 4))
    assert feed(p, [(10, 4), (13, 4), (16, 4)], key="three") == (True, (70, 1))  # floor(64 * 1.1)


def test_step4_no_growth_is_not_a_fixed_step():
    p = ShapePredictor()
    assert feed(p, [(10, 4)] * 3) == (True, (44, 1))


def test_step4_negative_deltas_use_ratio_mode():
    p = ShapePredictor()
    # a steady shrink has d0 == d1, but a negative step is never iterations mode
    assert feed(p, [(20, 4), (19, 4), (18, 4)]) == (True, (79, 1))  # floor(72 * 1.1)
    p2 = ShapePredictor(PredictorOptions(ratio=1.0))
    assert feed(p2, [(20, 4), (19, 4), (18, 4)]) == (False, ())


def test_step4_growth_slice_bytes_limit_is_inclusive():
    p = ShapePredictor()
    # slice of [1, L, 4096] fp32 is exactly 16384 bytes: accepted
    assert feed(p, [(1, L, 4096) for L in (1, 2, 3)], key="a") == (True, (1, 13, 4096))
    # [1, L, 4097]: 16388 bytes, refused -> ratio mode
    ok, shape = feed(p, [(1, L, 4097) for L in (1, 2, 3)], key="b")
    assert ok and shape == (math.floor(3 * 4097 * 1.1), 1, 1)


def test_step4_slice_of_several_growing_dims_counts_them_as_one():
    # both dims grow: the slice is 1 x 1 element, far below the limit even for huge dims
    p = ShapePredictor(PredictorOptions(max_iter_bytes=4))
    assert feed(p, [(1000, 1000), (1001, 1001), (1002, 1002)]) == (True, (1012, 1012))


def test_step4_sub_byte_slice_rounds_up():
    # [L, 3] int4: a slice of 3 elements is 12 bits = 2 bytes (rounded up)
    shapes = [(1, 3), (2, 3), (3, 3)]
    assert feed(ShapePredictor(PredictorOptions(max_iter_bytes=2, ratio=1.0)), shapes, bitwidth=4) == (True, (13, 3))
    assert feed(ShapePredictor(PredictorOptions(max_iter_bytes=1, ratio=1.0)), shapes, bitwidth=4) == (False, ())


def test_step5_custom_count_overrides_iters():
    p = ShapePredictor()
    assert feed(p, [kv(10), kv(11), kv(12)], custom_count=5) == (True, kv(17))


def test_step5_iters_option_sets_the_horizon():
    p = ShapePredictor(PredictorOptions(iters=3))
    assert feed(p, [(2, 5), (4, 6), (6, 7)]) == (True, (12, 10))


def test_step5_zero_iters_switches_iterations_mode_off():
    p = ShapePredictor(PredictorOptions(iters=0, ratio=1.5))
    assert feed(p, [kv(10), kv(11), kv(12)]) == (True, (8 * 12 * 64 * 3 // 2, 1, 1, 1))


def test_step7_no_ratio_and_no_fixed_step_gives_nothing():
    p = ShapePredictor(PredictorOptions(ratio=1.0))
    assert feed(p, [(10, 4), (11, 4), (13, 4)]) == (False, ())


# ---- behaviour OpenVINO does not define ----------------------------------------------------------

def test_rank_change_resets_the_key():
    p = ShapePredictor()
    assert feed(p, [(2, 3), (2, 4)]) == (False, ())
    assert p.predict("n", (2, 3, 1), FP32, False) == (False, ())
    assert p.stats()["rank_resets"] == 1
    assert p.predict("n", (2, 3, 2), FP32, False) == (False, ())  # only 2 shapes since the reset
    assert p.predict("n", (2, 3, 3), FP32, False) == (True, (2, 3, 13))


def test_rank_change_still_allows_the_custom_path():
    p = ShapePredictor()
    feed(p, [(2, 3), (2, 4)])
    assert p.predict("n", (2, 3, 1), FP32, False, custom_count=4, custom_dim=2) == (True, (2, 3, 5))


def test_scalars_never_predict():
    p = ShapePredictor(PredictorOptions(ratio=3.0))  # even a ratio that would grow 1 element
    assert feed(p, [(), (), (), ()]) == (False, ())
    assert p.stats()["predictions_made"] == 0


def test_ratio_without_gain_is_no_prediction():
    p = ShapePredictor()
    assert feed(p, [(1,), (3,), (2,)]) == (False, ())  # floor(2 * 1.1) == 2
    assert feed(p, [(9,), (3,), (10,)], key="b") == (True, (11,))


def test_zero_sized_growing_dim_predicts_from_the_deltas():
    p = ShapePredictor()
    assert feed(p, [kv(0), kv(1), kv(2)]) == (True, kv(12))


def test_zero_sized_shape_that_stays_empty_is_no_prediction():
    p = ShapePredictor()
    # L grows by 1 but the leading 0 keeps every shape empty: nothing to gain
    assert feed(p, [(0, 4, 1), (0, 5, 1), (0, 6, 1)]) == (False, ())
    # ratio mode on 0 elements
    assert feed(p, [(0, 4), (0, 9), (0, 2)], key="r") == (False, ())
    # custom path keeps it empty too
    assert p.predict("c", (0, 8, 3), FP32, False, custom_count=8, custom_dim=2) == (False, ())


def test_can_preallocate_sees_bytes_of_the_prediction_and_can_refuse():
    asked = []

    def no(nbytes):
        asked.append(nbytes)
        return False

    p = ShapePredictor(can_preallocate=no)
    assert feed(p, [kv(10), kv(11), kv(12)]) == (False, ())
    assert asked == [8 * 22 * 64 * 4]
    assert p.stats()["refused_by_capacity"] == 1 and p.stats()["predictions_made"] == 0
    # the refusal does not lose the history: an allowing check on the next step predicts
    p.can_preallocate = lambda nbytes: asked.append(nbytes) or True
    assert p.predict("n", kv(13), FP32, False) == (True, kv(23))
    assert asked[-1] == 8 * 23 * 64 * 4


def test_can_preallocate_not_asked_without_prediction():
    asked = []
    p = ShapePredictor(can_preallocate=lambda b: asked.append(b) or True)
    feed(p, [(4, 4), (5, 4)])
    p.predict("n", (6, 4), FP32, True)
    assert asked == []


def test_can_preallocate_rounds_sub_byte_up():
    asked = []
    p = ShapePredictor(can_preallocate=lambda b: asked.append(b) or True)
    assert p.predict("n", (3,), 4, False, custom_count=2, custom_dim=0) == (True, (5,))
    assert asked == [3]  # 5 int4 elements = 20 bits -> 3 bytes


def test_disabled_options_never_predict_even_on_the_custom_path():
    p = ShapePredictor(PredictorOptions.parse("0 0 0 1.0"))
    assert feed(p, [kv(10), kv(11), kv(12)]) == (False, ())
    assert p.predict("kv", kv(7), FP32, False, custom_count=128, custom_dim=2) == (False, ())
    assert p.stats()["predictions_made"] == 0


def test_reset_one_key_or_all():
    p = ShapePredictor()
    feed(p, [(1,), (2,)], key="a")
    feed(p, [(1,), (2,)], key="b")
    p.reset("a")
    p.reset("unknown")  # no error
    assert p.predict("a", (3,), FP32, False) == (False, ())
    assert p.predict("b", (3,), FP32, False) == (True, (13,))
    p.reset()
    assert p.stats()["keys"] == 0
    assert p.stats()["predictions_made"] == 1  # counters survive a reset
    assert p.predict("b", (4,), FP32, False) == (False, ())


def test_bad_shape_or_bitwidth_is_an_error():
    p = ShapePredictor()
    with pytest.raises(ValueError):
        p.predict("n", (2, -1), FP32, False)
    with pytest.raises(ValueError):
        p.predict("n", (2, 1), 0, False)


def test_shape_may_be_any_int_sequence():
    p = ShapePredictor()
    assert feed(p, [[1, 4], [2, 4], [3, 4]]) == (True, (13, 4))


def test_history_key():
    assert history_key("attn/k") == "attn/k"
    assert history_key("attn/k", 0) == "attn/k"
    assert history_key("split", 2) == "split_out2"


def test_default_options_are_openvino_defaults():
    o = PredictorOptions()
    assert (o.iters, o.max_iter_bytes, o.max_dim_diff, o.ratio) == (10, 16384, 2, 1.1)
    assert o.enabled
    assert ShapePredictor().options == o


# ---- options ------------------------------------------------------------------------------------

def test_parse_valid():
    assert PredictorOptions.parse("10 16384 2 1.1") == PredictorOptions()
    assert PredictorOptions.parse("  5\t100 1   2 ") == PredictorOptions(5, 100, 1, 2.0)
    off = PredictorOptions.parse("0 0 0 1.0")
    assert not off.enabled
    assert PredictorOptions.parse("0 0 0 1.2").enabled  # ratio mode alone
    assert PredictorOptions.parse("3 0 0 1.0").enabled  # iterations alone (or custom path)
    assert not PredictorOptions.parse("0 99 9 0.5").enabled


@pytest.mark.parametrize("text", ["", "10 16384 2", "10 16384 2 1.1 7", "ten 16384 2 1.1", "10 16384 2.5 1.1",
                                  "10 16384 2 x", "-1 16384 2 1.1", "10 16384 2 nan", "10 16384 2 inf",
                                  "10 16384 2 -1.1", "10,16384,2,1.1"])
def test_parse_malformed_names_text_and_form(text):
    with pytest.raises(OptionsError) as e:
        PredictorOptions.parse(text)
    msg = str(e.value)
    assert repr(text) in msg and "iters max_iter_bytes max_dim_diff ratio" in msg


def test_parse_rejects_non_string():
    with pytest.raises(OptionsError, match="iters max_iter_bytes max_dim_diff ratio"):
        PredictorOptions.parse(10)


def test_construction_validates():
    with pytest.raises(OptionsError, match="iters"):
        PredictorOptions(iters=-1)
    with pytest.raises(OptionsError, match="max_dim_diff"):
        PredictorOptions(max_dim_diff=1.5)
    with pytest.raises(OptionsError, match="max_iter_bytes"):
        PredictorOptions(max_iter_bytes=True)
    with pytest.raises(OptionsError, match="ratio"):
        PredictorOptions(ratio="1.1")
    assert isinstance(PredictorOptions(ratio=2).ratio, float)


def test_from_env_or_defaults_without_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert PredictorOptions.from_env_or() == PredictorOptions()
    monkeypatch.setenv(ENV_VAR, "   ")  # blank counts as unset
    assert PredictorOptions.from_env_or(None) == PredictorOptions()


def test_from_env_or_reads_env(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "0 0 0 1.0")
    o = PredictorOptions.from_env_or(None)
    assert o == PredictorOptions(0, 0, 0, 1.0) and not o.enabled


def test_explicit_value_wins_over_env(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "0 0 0 1.0")
    assert PredictorOptions.from_env_or("4 64 1 1.5") == PredictorOptions(4, 64, 1, 1.5)
    given_opts = PredictorOptions(iters=7)
    assert PredictorOptions.from_env_or(given_opts) is given_opts
    assert PredictorOptions.from_env_or({"iters": 3, "ratio": 1.0}) == PredictorOptions(iters=3, ratio=1.0)


def test_malformed_env_names_the_variable(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "10 lots 2 1.1")
    with pytest.raises(OptionsError, match=ENV_VAR) as e:
        PredictorOptions.from_env_or()
    assert "'10 lots 2 1.1'" in str(e.value) and "iters max_iter_bytes max_dim_diff ratio" in str(e.value)


def test_from_env_or_rejects_unknown_keys_and_types():
    with pytest.raises(OptionsError, match="unknown preallocation option"):
        PredictorOptions.from_env_or({"iterations": 3})
    with pytest.raises(OptionsError, match="iters"):
        PredictorOptions.from_env_or({"iters": -3})
    with pytest.raises(OptionsError, match="got list"):
        PredictorOptions.from_env_or([10, 16384, 2, 1.1])


# ---- properties ---------------------------------------------------------------------------------

options_st = st.builds(PredictorOptions, iters=st.integers(0, 12), max_iter_bytes=st.integers(0, 1 << 15),
                       max_dim_diff=st.integers(0, 3), ratio=st.sampled_from([0.0, 1.0, 1.1, 1.5, 2.0]))
bitwidth_st = st.sampled_from([1, 4, 8, 16, 32, 64])


@st.composite
def shape_sequences(draw, min_size=1, max_size=8, max_dim=12):
    """Shapes of one rank: either independent, or a walk whose per-dim steps repeat often (so that
    iterations mode, ratio mode and shrinking all occur)."""
    rank = draw(st.integers(0, 4))
    n = draw(st.integers(min_size, max_size))
    dim = st.integers(0, max_dim)
    if draw(st.booleans()):
        return draw(st.lists(st.tuples(*[dim] * rank), min_size=n, max_size=n))
    shapes = [draw(st.tuples(*[dim] * rank))]
    step = draw(st.tuples(*[st.integers(-1, 3)] * rank))
    for _ in range(n - 1):
        if draw(st.integers(0, 3)) == 0:  # now and then the step changes
            step = draw(st.tuples(*[st.integers(-1, 3)] * rank))
        shapes.append(tuple(max(0, a + d) for a, d in zip(shapes[-1], step)))
    return shapes


calls_st = st.lists(st.tuples(st.booleans(), st.sampled_from([-1, 0, 3]), st.sampled_from([-1, 0])),
                    min_size=8, max_size=8)  # per call: can_reuse_buffer, custom_count, custom_dim


@settings(max_examples=300, deadline=None)
@given(options_st, shape_sequences(), bitwidth_st, calls_st)
def test_prop_prediction_never_shrinks_and_counts(opts, shapes, bitwidth, calls):
    p = ShapePredictor(opts)
    made = 0
    for s, (reuse, count, cdim) in zip(shapes, calls):
        cdim = cdim if s else -1  # a scalar has no dim 0 to grow
        ok, pred = p.predict("k", s, bitwidth, reuse, custom_count=count, custom_dim=cdim)
        if ok:
            made += 1
            assert len(pred) == len(s)
            assert math.prod(pred) > math.prod(s)  # stronger than >=: a prediction always adds room
            assert not reuse
        else:
            assert pred == ()
    assert p.stats()["predictions_made"] == made


@settings(max_examples=300, deadline=None)
@given(options_st, shape_sequences(), bitwidth_st)
def test_prop_without_ratio_every_prediction_is_current_plus_iters_steps(opts, shapes, bitwidth):
    opts = PredictorOptions(opts.iters, opts.max_iter_bytes, opts.max_dim_diff, 1.0)
    p = ShapePredictor(opts)
    prev = None
    for s in shapes:
        ok, pred = p.predict("k", s, bitwidth, False)
        if ok:
            d0 = tuple(a - b for a, b in zip(s, prev))
            assert pred == tuple(c + d * opts.iters for c, d in zip(s, d0))
            assert all(0 <= d <= opts.max_dim_diff for d in d0)
        prev = s


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 4).flatmap(lambda r: st.tuples(st.tuples(*[st.integers(0, 50)] * r),
                                                     st.tuples(*[st.integers(0, 2)] * r))),
       st.integers(1, 12), bitwidth_st)
def test_prop_fixed_small_step_predicts_iters_ahead(start_and_step, iters, bitwidth):
    start, step = start_and_step
    p = ShapePredictor(PredictorOptions(iters=iters, max_iter_bytes=1 << 30, ratio=1.0))
    shapes = [tuple(a + k * d for a, d in zip(start, step)) for k in range(3)]
    ok, pred = feed(p, shapes, bitwidth=bitwidth)
    expected = tuple(c + d * iters for c, d in zip(shapes[-1], step))
    if any(step) and math.prod(expected) > math.prod(shapes[-1]):
        assert (ok, pred) == (True, expected)
    else:  # no step, or an empty tensor that stays empty
        assert (ok, pred) == (False, ())


@settings(max_examples=200, deadline=None)
@given(st.builds(PredictorOptions, iters=st.just(0), max_iter_bytes=st.integers(0, 1 << 20),
                 max_dim_diff=st.integers(0, 5), ratio=st.floats(0.0, 1.0)),
       shape_sequences(), bitwidth_st, calls_st)
def test_prop_disabled_options_never_predict(opts, shapes, bitwidth, calls):
    assert not opts.enabled
    p = ShapePredictor(opts)
    for s, (reuse, count, cdim) in zip(shapes, calls):
        cdim = cdim if s else -1
        assert p.predict("k", s, bitwidth, reuse, custom_count=count, custom_dim=cdim) == (False, ())
    assert p.stats()["predictions_made"] == 0


@settings(max_examples=200, deadline=None)
@given(options_st, shape_sequences(min_size=2, max_size=2), bitwidth_st, st.sampled_from([-1, 0, 5]))
def test_prop_first_two_calls_never_predict(opts, shapes, bitwidth, count):
    p = ShapePredictor(opts)
    for s in shapes:  # custom_count alone (no custom_dim) does not open the custom path
        assert p.predict("k", s, bitwidth, False, custom_count=count) == (False, ())


@settings(max_examples=200, deadline=None)
@given(options_st, st.lists(st.tuples(st.sampled_from("abc"), st.tuples(st.integers(0, 9), st.integers(1, 9))),
                            max_size=20), bitwidth_st)
def test_prop_histories_are_per_key(opts, calls, bitwidth):
    mixed = ShapePredictor(opts)
    got = {k: [] for k in "abc"}
    for key, s in calls:
        got[key].append(mixed.predict(key, s, bitwidth, False))
    for key in "abc":
        alone = ShapePredictor(opts)
        assert [alone.predict(key, s, bitwidth, False) for k, s in calls if k == key] == got[key]
