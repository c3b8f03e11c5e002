"""deterministic=True: a CPU decode loop gives the same bits every run. Without it, a decoder's
static impls are built on a background thread and replace the dynamic path at whichever step
the build finishes; the two paths round differently (7e-7 on logits), so two runs differed. With
it, a static impl is built in the call that asks for it (the key's second sight once
DYNASHAPE_CPU_DECODE_STATIC calls are made), at the same step every run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import dynashape
from dynashape.errors import OptionsError
from dynashape.impls import compile_process
from dynashape.runtime import static_mode
from tests.models import llama

STEPS = 20


def _decode(sess, seed: int) -> list[np.ndarray]:
    """A prompt of 5 tokens, then STEPS steps of one token (fresh random ids), the present fed
    back as the past; the logits of every step."""
    cfg = llama.TINY
    names = llama.input_names()
    rng = np.random.default_rng(seed)
    past = [np.zeros((2, cfg["kv_heads"], 0, cfg["head_dim"]), np.float32) for _ in range(2 * cfg["layers"])]
    ids = rng.integers(0, cfg["vocab"], (2, 5)).astype(np.int64)
    logits = []
    for _ in range(STEPS):
        out = sess.run(None, dict(zip(names, [ids, *past])))
        logits.append(np.asarray(out[0]).copy())
        past = [np.asarray(p) for p in out[1:]]
        ids = rng.integers(0, cfg["vocab"], (2, 1)).astype(np.int64)
    return logits


def test_two_runs_give_the_same_bits_with_static_impls_switching_in(monkeypatch):
    monkeypatch.setenv("DYNASHAPE_CPU_DECODE_STATIC", "3")  # static impls from the 4th call on
    path = str(llama.model_path())
    runs, stats = [], []
    for _ in range(2):
        sess = dynashape.InferenceSession(path, deterministic=True)
        assert sess.compiled.static == "sync" and sess.compiled.static_after == 3
        runs.append(_decode(sess, seed=7))
        stats.append(sess.stats())
    # the static impls did take over (else the test would show nothing), at the same calls
    assert stats[0]["static_builds"] >= 1 and stats[0]["static_hits"] >= 1, stats[0]
    assert [(s["static_builds"], s["static_hits"], s["static_misses"]) for s in stats[1:]] == \
        [(stats[0]["static_builds"], stats[0]["static_hits"], stats[0]["static_misses"])]
    for step, (a, b) in enumerate(zip(*runs)):
        assert a.tobytes() == b.tobytes(), f"step {step}: runs differ by {np.abs(a - b).max()}"
    ref = _decode(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), seed=7)
    for step, (a, r) in enumerate(zip(runs[0], ref)):
        np.testing.assert_allclose(a, r, rtol=0, atol=1e-5, err_msg=f"step {step}")


def test_an_explicit_async_choice_is_made_sync_and_other_modes_kept():
    path = str(llama.model_path())
    assert dynashape.InferenceSession(path, static_impls="async", deterministic=True).compiled.static == "sync"
    assert dynashape.InferenceSession(path, static_impls="off", deterministic=True).compiled.static is None
    sess = dynashape.InferenceSession(path, decode_ahead=8, deterministic=True)
    assert sess._decode_ahead == 0  # a bucket's graph built on a thread would be waited for; none is
    with pytest.raises(OptionsError, match="deterministic"):
        dynashape.InferenceSession(path, deterministic="yes")


def test_cuda_turns_static_impls_off():
    """On CUDA a build keeps the forms timed fastest: which one wins is timing (no GPU needed here:
    the rule alone)."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [static_mode.deterministic_mode(m, cuda) for m in ("async", "sync", None)] == [None, None, None]
    assert [static_mode.deterministic_mode(m, cpu) for m in ("async", "sync", "decoders", None)] == \
        ["sync", "sync", "decoders", None]


def test_the_thread_count_does_not_follow_the_compile_process(monkeypatch):
    monkeypatch.setattr(compile_process, "warmed", lambda: False)  # its imports still under way
    sess = dynashape.InferenceSession(str(llama.model_path()), deterministic=True, static_impls="async")
    sess.compiled._prewarmed = True
    assert sess.compiled.run_threads(2) == 2 and sess.compiled.run_threads(None) is None
    # an async session gives the compile process a core meanwhile: the count would follow its progress
    other = dynashape.InferenceSession(str(llama.model_path()), static_impls="async")
    other.compiled._prewarmed = True
    assert other.compiled.run_threads(2) == 1
