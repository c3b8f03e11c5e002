"""Memory through the session: in-place concat of a KV cache, the predictor's effect, memory_stats,
the verbose log, options; results always equal to onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper

import dynashape
from dynashape.errors import OptionsError

from ..ops.harness import DEVICE, rand

H, D = 2, 8  # heads, head dim


def kv_model() -> onnx.ModelProto:
    """present = Concat(past, x * w) along the sequence axis, y = present summed over it: a
    one-layer caricature of a KV-cache decoder (the Mul feeds the Concat and nothing else)."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["k"]),
             helper.make_node("Concat", ["past", "k"], ["present"], axis=2),
             helper.make_node("ReduceSum", ["present", "axes"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "kv", [helper.make_tensor_value_info("past", TP.FLOAT, ["b", H, "p", D]),
                                        helper.make_tensor_value_info("x", TP.FLOAT, ["b", H, "s", D])],
                          [helper.make_tensor_value_info("present", TP.FLOAT, ["b", H, "t", D]),
                           helper.make_tensor_value_info("y", TP.FLOAT, ["b", H, D])],
                          initializer=[onnx.numpy_helper.from_array(rand((1, H, 1, D)), "w"),
                                       onnx.numpy_helper.from_array(np.array([2], np.int64), "axes")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def ort_run(model, feeds):
    import onnxruntime as ort
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in feeds.items()})


def decode(sess, model, steps, batch=1, check=True, rng=None):
    rng = rng or np.random.default_rng(0)
    dev = torch.device(DEVICE)
    past = torch.from_numpy(rand((batch, H, 3, D), rng=rng)).to(dev)
    for _ in range(steps):
        x = torch.from_numpy(rand((batch, H, 1, D), rng=rng)).to(dev)
        present, y = sess.run(None, {"past": past, "x": x})
        if check:
            want = ort_run(model, {"past": past, "x": x})
            np.testing.assert_allclose(present.cpu().numpy(), want[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(y.cpu().numpy(), want[1], rtol=1e-5, atol=1e-5)
        past = present
    return past


def test_kv_cache_appends_in_place_without_copying_the_past():
    m = kv_model()
    sess = dynashape.InferenceSession(m, device=DEVICE)
    decode(sess, m, 40)
    st = sess.memory_stats()
    # the first step copies the caller's initial past; after it, the past is already in place and
    # only the new position is written (by the Mul, straight into its slot)
    assert st["concat_past_in_place"] == 39
    assert st["concat_bytes_copied"] == 3 * H * D * 4
    assert st["concat_storages"] == 1  # 43 positions fit in the first storage's spare room


def test_kv_cache_without_in_place_concat_copies_the_past_every_step():
    m = kv_model()
    sess = dynashape.InferenceSession(m, device=DEVICE, inplace_concat=False)
    decode(sess, m, 10)
    st = sess.memory_stats()
    assert st["concat_past_in_place"] == 0
    # every step copies the whole past and the new position: 3+i+1 positions at step i
    assert st["concat_bytes_copied"] == sum(3 + i + 1 for i in range(10)) * H * D * 4


def test_feeding_the_same_past_twice_never_overwrites_a_present():
    """Beam search: two continuations of one past. The second must not write over the first."""
    m = kv_model()
    sess = dynashape.InferenceSession(m, device=DEVICE)
    past = decode(sess, m, 3, check=False)
    dev = torch.device(DEVICE)
    xa, xb = (torch.from_numpy(rand((1, H, 1, D))).to(dev) for _ in range(2))
    pa, _ = sess.run(None, {"past": past, "x": xa})
    pa_copy = pa.clone()
    pb, _ = sess.run(None, {"past": past, "x": xb})
    torch.testing.assert_close(pa, pa_copy)  # untouched
    np.testing.assert_allclose(pb.cpu().numpy(), ort_run(m, {"past": past, "x": xb})[0], rtol=1e-5)
    assert sess.memory_stats()["concat_past_in_place"] == 3  # the second continuation was copied


def test_growth_rules_and_numpy_feeds_agree():
    m = kv_model()
    for growth in ("openvino", "geometric"):
        sess = dynashape.InferenceSession(m, device=DEVICE, kv_growth=growth)
        decode(sess, m, 12)
    # numpy feeds: outputs are copied out, so nothing is in place, and results are the same
    sess = dynashape.InferenceSession(m, device=DEVICE)
    rng = np.random.default_rng(5)
    past = rand((2, H, 1, D), rng=rng)
    for _ in range(6):
        x = rand((2, H, 1, D), rng=rng)
        got = sess.run(None, {"past": past, "x": x})
        for g, w in zip(got, ort_run(m, {"past": past, "x": x})):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        past = got[0]


def chain(n=6):
    nodes = [helper.make_node("Abs" if i % 2 else "Neg", ["x" if i == 0 else f"t{i - 1}"],
                              [f"t{i}" if i < n - 1 else "y"]) for i in range(n)]
    g = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TP.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_predictor_cuts_allocations_of_a_growing_chain():
    def allocations(**opts):
        s = dynashape.InferenceSession(chain(), device=DEVICE, **opts)
        for n in range(1, 42):
            x = rand((n,))
            np.testing.assert_allclose(s.run(None, {"x": x})[0], _chain_ref(x), rtol=1e-6)
        return s.memory_stats()
    off, on = allocations(preallocation="0 0 0 1.0"), allocations()
    assert on["predictions_used"] > 0 and off["predictions_used"] == 0
    assert on["allocations"] * 4 <= off["allocations"]
    assert on["reuses"] > off["reuses"]


def _chain_ref(x):
    y = x
    for i in range(6):
        y = np.abs(y) if i % 2 else -y
    return y


# The pool serves the interpreter (the generated code plans an arena instead: tests/memory/test_arena.py).
INTERP = {"executor": "interpreter"}


def test_pool_shares_buffers_between_values_that_do_not_overlap():
    s = dynashape.InferenceSession(chain(8), device=DEVICE, preallocation="0 0 0 1.0", **INTERP)
    s.run(None, {"x": rand((16,))})
    st = s.memory_stats()
    # 7 inner values in a chain: each conflicts only with its neighbours, so 2 records serve them
    assert st["pool_records"] == 2
    s2 = dynashape.InferenceSession(chain(8), device=DEVICE, preallocation="0 0 0 1.0", memory_pool=False, **INTERP)
    s2.run(None, {"x": rand((16,))})
    assert s2.memory_stats()["allocations"] > st["allocations"]


def _node_buffers_are_engine_memory(net):
    """Every buffer a node would write into is memory the engine holds now (not a record the pool
    gave back while a user still pointed at it)."""
    held = net.engine._live
    for inst in net.insts:
        outs = inst.out if isinstance(inst.out, tuple) else (inst.out,)
        for t in (*inst.buffers, *outs):
            if isinstance(t, torch.Tensor):
                assert t.untyped_storage().data_ptr() in held, inst.name


@pytest.mark.parametrize("deps", ["in_order", "out_of_order"])
def test_shared_records_grow_once_for_all_their_users(deps):
    s = dynashape.InferenceSession(chain(8), device=DEVICE, preallocation="0 0 0 1.0", memory_deps=deps, **INTERP)
    req = s.create_infer_request()
    cap, peaks = 0, []
    for n in (4, 4, 64, 64, 8, 300, 300, 1000, 2, 2):  # grow, repeat (fast path), shrink (reclaim)
        x = rand((n,))
        req.engine.reset_stats()
        np.testing.assert_allclose(req.run(None, {"x": x})[0], _chain_ref(x), rtol=1e-6)
        _node_buffers_are_engine_memory(req.network)
        cap = n if n > cap or n * 10 < cap else cap  # realloc_if_needed's rule
        st = req.memory_stats()
        # the 7 inner values take turns in 2 records, each regrown in place for all its users
        # (not a new record beside an old one some user still pins)
        assert st["pool_records"] == 2 and st["pool_record_bytes"] == 2 * cap * 4
        peaks.append(st["peak_bytes"])
    assert req.network.pool.stats()["grown_records"] > 0
    # during the growth to 1000: the 2 records and the output (and on a GPU the device copy of
    # the numpy feed), never old and new records together
    assert peaks[7] <= (2 * 1000 + 1000 + (DEVICE != "cpu") * 1000) * 4


def test_a_value_of_unchanged_shape_follows_its_record_when_another_user_grows_it():
    """zn (always 16 long) and xa (as long as x) never live at once, so they share a record. When
    x grows, xa regrows the record; zn's shape did not change, so zn's node does not reallocate:
    it must have been pointed at the new record, not left on the freed one."""
    nodes = [helper.make_node("Neg", ["z"], ["zn"]),
             helper.make_node("ReduceSum", ["zn"], ["zr"], keepdims=1),
             helper.make_node("Sigmoid", ["x"], ["xa"]),
             helper.make_node("Tanh", ["xa"], ["xb"]),
             helper.make_node("Mul", ["xb", "zr"], ["y"])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("z", TP.FLOAT, ["m"]),
                                       helper.make_tensor_value_info("x", TP.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ["n"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    s = dynashape.InferenceSession(m, device=DEVICE, preallocation="0 0 0 1.0", **INTERP)
    req = s.create_infer_request()
    z = rand((16,))
    for n in (16, 16, 30, 30, 64, 64):
        x = rand((n,))
        got = req.run(None, {"z": z, "x": x})[0]
        np.testing.assert_allclose(got, np.tanh(1 / (1 + np.exp(-x))) * -z.sum(), rtol=1e-5)
        _node_buffers_are_engine_memory(req.network)
    assert req.network.pool.stats()["grown_records"] >= 2


def test_out_of_order_deps_option_runs_and_matches():
    s = dynashape.InferenceSession(chain(), device=DEVICE, memory_deps="out_of_order", **INTERP)
    for n in (3, 9, 2):
        x = rand((n,))
        np.testing.assert_allclose(s.run(None, {"x": x})[0], _chain_ref(x), rtol=1e-6)


def test_memory_stats_keys_and_verbose_log(capfd):
    s = dynashape.InferenceSession(chain(), device=DEVICE, verbose=2)
    s.run(None, {"x": rand((5,))})
    st = s.memory_stats()
    for key in ("allocations", "frees", "allocated_bytes_total", "current_bytes", "peak_bytes",
                "device_current_bytes", "device_peak_bytes", "host_current_bytes", "host_peak_bytes",
                "shared_current_bytes", "shared_peak_bytes", "reuses", "predictions_made", "predictions_used"):
        assert key in st, key
    assert st["allocations"] > 0 and st["peak_bytes"] >= st["current_bytes"] > 0
    err = capfd.readouterr().err
    assert "Allocate " in err and " bytes of device allocation type (current=" in err


@pytest.mark.parametrize("opts, words", [
    ({"preallocation": "ten 0 0 1"}, ["ten 0 0 1", "iters max_iter_bytes max_dim_diff ratio"]),
    ({"memory_deps": "sideways"}, ["sideways", "in_order"]),
    ({"kv_growth": "huge"}, ["huge", "geometric"]),
    ({"allocator": "magic"}, ["magic"]),
])
def test_bad_memory_options_are_option_errors(opts, words):
    with pytest.raises(OptionsError) as info:
        dynashape.InferenceSession(chain(), device=DEVICE, **opts).run(None, {"x": rand((2,))})
    for w in words:
        assert w in str(info.value)


def test_device_memory_limit_sends_big_buffers_to_host():
    s = dynashape.InferenceSession(chain(), device=DEVICE, device_memory_limit=1024)
    x = rand((4096,))
    np.testing.assert_allclose(s.run(None, {"x": x})[0], _chain_ref(x), rtol=1e-6)
    st = s.memory_stats()
    assert st["fallbacks_to_host"] > 0 and st["host_peak_bytes"] > 0


def test_a_numpy_callers_past_and_new_part_go_into_the_kept_storage_in_one_copy():
    """A past that is a copy of the last present (a numpy caller's loop) is concatenated with the
    new part into the storage kept for it (kv_append.py ``_into_own``) while it has room: the
    same values as torch.cat, no new storage per step, and a past that lives in that storage
    itself, or a new part of another dtype, takes the general path."""
    from collections import Counter

    from dynashape.memory.engine import Engine
    from dynashape.runtime.kv_append import KVAppend
    stats = Counter()
    kv = KVAppend(2, 0, "geometric", Engine("cpu"), stats)
    rng = np.random.default_rng(7)
    past = torch.from_numpy(rand((1, H, 3, D), rng=rng))
    for _ in range(12):
        new = torch.from_numpy(rand((1, 1, H, D), rng=rng)).permute(0, 2, 1, 3)  # a view, as a Transpose's
        out = kv(past, new)
        torch.testing.assert_close(out, torch.cat([past, new], 2), rtol=0, atol=0)
        past = out.clone()  # what a numpy caller hands back
    assert stats["concat_storages"] <= 2  # grown once or twice, not per step
    own = kv.owned
    inside = own.narrow(2, 0, 4)  # a past in the kept storage itself: never overwritten by its own copy
    want = torch.cat([inside, new], 2)
    torch.testing.assert_close(kv(inside, new), want, rtol=0, atol=0)
    assert kv._into_own(past, new.double(), 2) is None
    torch.testing.assert_close(kv._into_own(past, new, 2), torch.cat([past, new], 2), rtol=0, atol=0)


def test_a_length_that_grows_by_one_re_plans_the_arena_every_few_steps_not_every_few_calls():
    """A buffer sized by the past length: the arena is planned for the predictor's ``iters``
    steps ahead of a length that grows by one a call (the predictor sees that length only when it
    passes its capacity, and alone would take ratio mode's 10%: a re-plan every ~5 steps at 50)."""
    nodes = [helper.make_node("Concat", ["past", "x"], ["present"], axis=2),
             helper.make_node("Neg", ["present"], ["n"]),  # an arena buffer as long as the past
             helper.make_node("ReduceSum", ["n", "axes"], ["y"], keepdims=0)]
    g = helper.make_graph(nodes, "grow", [helper.make_tensor_value_info("past", TP.FLOAT, ["b", H, "p", D]),
                                          helper.make_tensor_value_info("x", TP.FLOAT, ["b", H, 1, D])],
                          [helper.make_tensor_value_info("present", TP.FLOAT, None),
                           helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          initializer=[onnx.numpy_helper.from_array(np.array([2], np.int64), "axes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    sess = dynashape.InferenceSession(m)
    rng = np.random.default_rng(9)
    past = rand((1, H, 40, D), rng=rng)
    for _ in range(60):
        x = rand((1, H, 1, D), rng=rng)
        present, y = sess.run(None, {"past": past, "x": x})
        np.testing.assert_allclose(y, -np.concatenate([past, x], 2).sum(2), rtol=1e-5, atol=1e-5)
        past = present
    assert sess.stats()["arena_plans"] <= 8  # 60 steps: ratio mode alone made 10 plans


def test_a_lent_room_takes_the_new_part_in_place_and_dies_with_its_memory():
    """``lend_room`` (the paged engine's gathered pasts, kv_append.py): a past lent with the room
    behind it is appended to in place, also when one buffer holds several layers' storages and
    is reused (a captured step runs its body twice over the same buffers); an entry that no append
    took holds its memory only weakly."""
    import gc
    from collections import Counter

    from dynashape.memory.engine import Engine
    from dynashape.runtime import kv_append
    from dynashape.runtime.kv_append import KVAppend, lend_room
    rng = np.random.default_rng(3)
    layers = [KVAppend(2, i, "geometric", Engine("cpu"), Counter()) for i in range(2)]
    dense = torch.empty(2, 1, H, 5, D)  # two layers' storages in one buffer, room for one position each
    for _ in range(2):
        dense[:, :, :, :4] = torch.from_numpy(rand((2, 1, H, 4, D), rng=rng))
        for i, kv in enumerate(layers):
            past, new = dense[i, :, :, :4], torch.from_numpy(rand((1, H, 1, D), rng=rng))
            want = torch.cat([past, new], 2)
            lend_room(past, dense[i])
            out = kv(past, new)
            torch.testing.assert_close(out, want, rtol=0, atol=0)
            assert out.data_ptr() == dense[i].data_ptr()  # in place: the past was not copied
            assert kv.stats["concat_storages"] == 0
    # an empty past (a first prompt chunk; the paged attention's pasts): keyed by where it starts
    # in its buffer, not by its data pointer (0 for every empty tensor)
    two = torch.empty(2, 1, H, 3, D)
    for i in range(len(layers)):
        lend_room(two[i, :, :, :0], two[i])
    for i, kv in enumerate(layers):
        new = torch.from_numpy(rand((1, H, 3, D), rng=rng))
        out = kv(two[i, :, :, :0], new)
        torch.testing.assert_close(out, new, rtol=0, atol=0)
        assert out.data_ptr() == two[i].data_ptr() and kv.stats["concat_storages"] == 0
    left = torch.empty(1, H, 6, D)
    lend_room(left[:, :, :3], left)
    key = (id(left), 0)
    assert kv_append._LENT[key][0]() is left
    del left
    gc.collect()
    assert kv_append._LENT[key][0]() is None  # nothing here keeps the buffer alive
    del kv_append._LENT[key]
