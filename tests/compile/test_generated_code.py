"""The generated code equals the interpreter (and onnxruntime) on random graphs and shape sequences.

Each example is a random graph over x[N, M] and y[N, M] or y[1, M] (see ``graphgen.py``) and a
sequence of 3-6 shapes with repeats and 1s. Every step feeds the same fresh random data to a
compiled and an interpreter session, as numpy arrays and as torch tensors, and compares the
outputs; onnxruntime is the reference for the numpy runs. Outputs handed out earlier must not change
when later runs reuse the arena, and the feeds must come back untouched. Every other step's torch
feeds are transposed views (not contiguous)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from hypothesis import HealthCheck, given, settings

import dynashape

from .graphgen import cases

RTOL, ATOL = 1e-5, 1e-6  # compiled against interpreter: the same torch kernels
ORT_RTOL, ORT_ATOL = 1e-4, 1e-5  # against onnxruntime: other kernels, other summation orders


def close(got, want, what: str, rtol=RTOL, atol=ATOL, terms: int = 1) -> None:
    """Equal within tolerance. ``atol`` is for values of size 1: it grows with the largest value and
    with ``terms``, the length of the longest sum a value may be (kernels that add in another order
    differ by a few ulps of the terms, which is more than rtol of a sum that cancels)."""
    got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    want = want.numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale * terms, equal_nan=True, err_msg=what)


def ort_session(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def feeds_for(rng, n: int, m: int, y_broadcast: bool) -> dict:
    def rand(shape):
        x = rng.uniform(-2, 2, size=shape).astype(np.float32)
        x[np.abs(x) < 1e-3] = 0.5  # never zeros
        return x
    return {"x": rand((n, m)), "y": rand((1 if y_broadcast else n, m))}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=cases(min_steps=3, max_steps=10))
def test_compiled_equals_interpreter_on_random_graphs(case):
    model = case.model
    compiled = dynashape.InferenceSession(model, executor="compiled")
    interp = dynashape.InferenceSession(model, executor="interpreter")
    ref = ort_session(model)
    rng = np.random.default_rng(case.seed)
    handed_out = []  # (step, torch outputs of the compiled session, the results they must keep)
    numpy_out = []
    for step, (n, m) in enumerate(case.shapes):
        terms = max(1, n, m)
        feeds = feeds_for(rng, n, m, case.y_broadcast)
        saved = {k: v.copy() for k, v in feeds.items()}
        want = interp.run(None, feeds)
        got = compiled.run(None, feeds)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert isinstance(g, np.ndarray)
            close(g, w, f"step {step} (N={n}, M={m}) output {i}: compiled vs interpreter", terms=terms)
        for i, (g, w) in enumerate(zip(got, ref.run(None, feeds))):
            close(g, w, f"step {step} (N={n}, M={m}) output {i}: compiled vs onnxruntime", ORT_RTOL, ORT_ATOL,
                  terms)
        if step % 2:  # non-contiguous tensors (transposed views) with the same values
            tfeeds = {k: torch.from_numpy(np.ascontiguousarray(v.T)).T for k, v in feeds.items()}
        else:
            tfeeds = {k: torch.from_numpy(v.copy()) for k, v in feeds.items()}
        got_t = compiled.run(None, tfeeds)
        want_t = interp.run(None, tfeeds)
        for i, (g, wt, w) in enumerate(zip(got_t, want_t, want)):
            assert isinstance(g, torch.Tensor) and isinstance(wt, torch.Tensor)
            close(g, w, f"step {step} output {i}: compiled (torch feeds) vs interpreter", terms=terms)
            close(wt, w, f"step {step} output {i}: interpreter (torch feeds) vs interpreter", terms=terms)
        for k in feeds:  # the feeds are the caller's: nothing writes into them
            np.testing.assert_array_equal(feeds[k], saved[k], err_msg=f"step {step}: numpy feed {k}")
            np.testing.assert_array_equal(tfeeds[k].numpy(), saved[k], err_msg=f"step {step}: torch feed {k}")
        handed_out.append((step, got_t, [g.clone() for g in got_t]))
        numpy_out.append((step, got, [g.copy() for g in got]))
    # what was handed out belongs to the caller: later runs did not write into it
    for step, outs, copies in handed_out + numpy_out:
        for i, (g, w) in enumerate(zip(outs, copies)):
            g = g.numpy() if isinstance(g, torch.Tensor) else g
            w = w.numpy() if isinstance(w, torch.Tensor) else w
            np.testing.assert_array_equal(g, w, err_msg=f"output {i} of step {step}, after the later steps")
    stats = compiled.stats()
    assert stats["compiled_runs"] == 2 * len(case.shapes)
    assert stats.get("interpreter_runs", 0) == 0
    # (the generic specialization traced at load, precompile's CPU default, may serve none of them)
    assert 1 <= stats["specializations"] <= len(set(case.shapes)) + stats.get("specializations_precompiled", 0)
    assert stats["shape_program_traces"] == stats["specializations"]
    assert interp.stats().get("compiled_runs", 0) == 0
