"""Runs one case of the bad-input table (cases.py) and says what happened: the test asserts on it,
``scripts/gen_reliability_doc.py`` writes it into docs/reliability.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

import dynashape
from dynashape.errors import DynashapeError

from .cases import Case

ABSURD_BYTES = 64 << 20  # what a run may allocate in total when it refuses an absurd size


@dataclass
class Outcome:
    passed: bool
    got: str  # the error type raised, or "ran"
    message: str
    after: str  # the same session with a good feed afterwards: "correct", "wrong", "-" (no session)
    why: str = ""


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray) and not x.dtype.isnative:
        return x.astype(x.dtype.newbyteorder("="))
    return x


def _ort(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _same(got, want) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g = _np(g)
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True):
            return False
    return True


def _agrees(sess, ref, feeds, output_names=None) -> bool:
    names = output_names
    if isinstance(names, str):
        names = [names]
    want = ref.run(names, {k: _np(v) for k, v in feeds.items()})
    return _same(sess.run(output_names, feeds), want)


def run_case(case: Case, executor: str = "compiled", device: str = "cpu") -> Outcome:
    model = case.model()
    options = {"executor": executor, **case.options}
    device = options.pop("device", device)
    if case.feeds is None:
        try:
            dynashape.InferenceSession(model, device=device, **options)
        except Exception as e:  # noqa: BLE001  the outcome is what it raised
            return _judge(case, e, "-")
        return Outcome(False, "ran", "", "-", "loaded without an error")
    sess = dynashape.InferenceSession(model, device=device, **options)
    ref = _ort(model)
    before = sess.memory_stats()["allocated_bytes_total"]
    error = None
    try:
        if case.error is None:
            ok = _agrees(sess, ref, case.feeds(), case.output_names)
        else:
            sess.run(case.output_names, case.feeds())
    except Exception as e:  # noqa: BLE001
        error = e
    allocated = sess.memory_stats()["allocated_bytes_total"] - before
    good = case.good() if case.good is not None else None
    after = "correct" if good is None or _agrees(sess, ref, good) else "wrong"
    if case.error is None:
        if error is not None:
            return Outcome(False, type(error).__name__, str(error)[:300], after, "a valid input raised")
        return Outcome(ok and after == "correct", "ran", "matches onnxruntime" if ok else "differs from onnxruntime",
                       after)
    if error is None:
        return Outcome(False, "ran", "", after, "no error raised")
    out = _judge(case, error, after)
    if case.absurd and allocated > ABSURD_BYTES:
        return Outcome(False, out.got, out.message, after, f"{allocated} bytes allocated for an absurd size")
    return out


def _judge(case: Case, e: Exception, after: str) -> Outcome:
    msg = str(e)
    want = case.error if isinstance(case.error, tuple) else (case.error,)
    if not isinstance(e, DynashapeError):
        return Outcome(False, type(e).__name__, msg[:300], after, "not a dynashape error")
    if not isinstance(e, want):
        return Outcome(False, type(e).__name__, msg[:300], after,
                       f"expected {' or '.join(w.__name__ for w in want)}")
    missing = [w for w in case.words if w not in msg]
    if missing:
        return Outcome(False, type(e).__name__, msg[:300], after, f"message lacks {missing}")
    if after == "wrong":
        return Outcome(False, type(e).__name__, msg[:300], after, "the session gave a wrong answer afterwards")
    return Outcome(True, type(e).__name__, msg[:300], after)
