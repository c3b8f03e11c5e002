"""codegen/dead_locals.py: the generated ``run`` deletes each tensor local after the line that reads
it last, so results that kernels allocated (CPU convolutions) die as soon as they are dead instead
of at the end of the call; the cases where a ``del`` would be wrong are left alone."""

from __future__ import annotations

import weakref

import numpy as np
import torch

from dynashape.codegen.dead_locals import drop_dead
from tests.compile.test_fusion import Builder, check_sequence, randn


def _body(src: str) -> list[str]:
    return [line for line in src.splitlines() if line.strip()]


def test_a_local_is_deleted_after_its_last_reader_at_that_indentation():
    lines = _body("""
    t_a = f(x)
    t_b = g(t_a)
    if o is None:
        t_c = h(t_b)
        t_d = k(t_c)
    else:
        t_d, = o
    return (t_d,)
""")
    out, origin = drop_dead(lines)
    assert out == _body("""
    t_a = f(x)
    t_b = g(t_a)
    del t_a
    if o is None:
        t_c = h(t_b)
        del t_b
        t_d = k(t_c)
        del t_c
    else:
        t_d, = o
    return (t_d,)
""")
    assert [i for i in origin if i >= 0] == list(range(len(lines))) and origin.count(-1) == 3


def test_loops_closures_headers_open_brackets_and_return_are_left_alone():
    lines = _body("""
    t_a = f(x)
    t_l = f(x)
    t_h = f(x)
    t_p = f(x)
    t_r = f(x)
    for i in range(3):
        y = g(t_a, i)
    cb = lambda: t_l
    if t_h is None:
        pass
    z = k(t_p,
          1)
    return (t_r,)
""")
    out, _ = drop_dead(lines)
    assert not [line for line in out if "del " in line], out


def test_the_generated_run_frees_a_convolution_result_when_it_is_dead():
    """Three CPU convolutions in a chain: the first one's result (made by its kernel, not in the arena)
    is gone before the call ends; the values stay onnxruntime's."""
    b = Builder()
    rng = np.random.default_rng(3)
    x = b.input("x", ["n", 3, "h", "w"])
    y = x
    for cin, cout in [(3, 8), (8, 8), (8, 4)]:
        y = b.op("Relu", b.op("Conv", y, b.const(rng.standard_normal((cout, cin, 3, 3)) * 0.3), kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]))
    model = b.model([y])
    sess = check_sequence(model, [{"x": randn(rng, 1, 3, 12, 10)}, {"x": randn(rng, 2, 3, 7, 9)}])
    src = sess.compiled.specs[0].source
    assert "del t_" in src
    # the first convolution's result: watch it die (a weak reference to what its kernel returned)
    seen: list = []
    dead_before: list = []  # at each convolution's call: which earlier results are gone
    from dynashape.ops import cpu_conv
    real = cpu_conv.bound_conv2d_act

    def spy(*a, **k):
        kernel = real(*a, **k)

        def watched(x, w, b_=None, out=None):
            dead_before.append([r() is None for r in seen])
            y = kernel(x, w, b_, out)
            seen.append(weakref.ref(y))
            return y
        return watched
    cpu_conv.bound_conv2d_act = spy
    try:
        import dynashape
        s2 = dynashape.InferenceSession(model.SerializeToString())
        feed = {"x": torch.from_numpy(randn(rng, 1, 3, 16, 16))}
        out = s2.run(None, feed)
    finally:
        cpu_conv.bound_conv2d_act = real
    # the third convolution starts with the first one's result gone (its reader, the second, ran)
    assert dead_before == [[], [False], [True, False]]
    assert out[0].shape == (1, 4, 16, 16)
