"""Kernels a static impl chooses by timing them: the forms an op can be computed in, one kept per key.

The dynamic path serves every shape with one way of calling an op. A static impl is built for
one shape, so it can afford to measure: while a CUDA static impl is built, ``impls/static.py``
enters ``specialised(tuner)``; an op with several forms (``tuned_gemm.py``: products,
``tuned_conv.py``: convolutions) asks ``choose`` for the form of its key (the op, its shapes,
dtype, epilogue, layout), and at the key's first sight the tuner times every form and the
fastest is kept (process-wide, as cuDNN's benchmark mode keeps its algorithms). The graph then
captures that form. Every form computes the same values within the dtype's rounding.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager

_LOCAL = threading.local()
_LOCK = threading.Lock()
_CHOICES: dict[tuple, str] = {}
# forms taken from a convolution timed at another batch (``_sibling``), never timed themselves: not
# in the disk cache, not a sibling for others, and fixed once taken (a build's capture asks again
# and must get the form its warm run prepared)
_PROVISIONAL: dict[tuple, str] = {}
SIBLING_SPAN = 4  # a timed batch serves batches up to this factor away
STATS: Counter = Counter()  # process-wide: tuned, tune_s, chose_<op>_<form>


@contextmanager
def thread_setting(local: threading.local, name: str, value):
    """``local.<name> = value`` for this thread inside (``as`` gives the value), the previous
    value (or None) after."""
    prev = getattr(local, name, None)
    setattr(local, name, value)
    try:
        yield value
    finally:
        setattr(local, name, prev)


def specialised(tuner):
    """Inside (this thread): ops with several forms take the one ``tuner(key, runs)`` chose for
    their key, timing them at the key's first sight. ``tuner`` returns the index of the fastest
    run, or None when nothing can be timed (then the op's first form serves, the key untuned)."""
    return thread_setting(_LOCAL, "tuner", tuner)


def untimed(key: tuple, runs: list) -> None:
    """A tuner that times nothing: a key without a kept form takes the op's prior guess, else its
    first form (the op's own call), and stays untuned (a CUDA region's first graph, built at
    once: runtime/spec_state.py)."""
    return None


def counting_defaults():
    """Inside (this thread): a list whose one item counts the keys that took their first form
    because nothing could be timed (``untimed``), i.e. what a tuned rebuild would time."""
    return thread_setting(_LOCAL, "defaulted", [0])


def pinning():
    """Inside (this thread): each key keeps the form it first took here. A background build runs
    its region on scratch first, then captures it: another session's worker may keep a form for a
    key in between, and the capture must take the form the warm run prepared (Winograd's weights,
    a split product's parts are made outside the capture)."""
    return thread_setting(_LOCAL, "pinned", {})


def active() -> bool:
    return getattr(_LOCAL, "tuner", None) is not None


def choices() -> dict:
    """The form kept per key (a copy), for stats and tests."""
    with _LOCK:
        return dict(_CHOICES)


def remember(entries: dict) -> None:
    """Take forms chosen before (the disk cache, impls/disk_cache.py): key -> form."""
    with _LOCK:
        _CHOICES.update(entries)


def forget() -> None:
    with _LOCK:
        _CHOICES.clear()
        _PROVISIONAL.clear()


def choose(key: tuple, forms: tuple[str, ...], run: Callable[[str], object], prior: str | None = None) -> str:
    """The form kept for ``key`` (its first element names the op); at its first sight the
    tuner times ``run(form)`` for each form. Where nothing can be timed now, ``prior`` (the op's
    guess from measurements of the same geometry, when it is one of ``forms``), else ``forms[0]``
    (the op's own call); the key then stays untuned."""
    if len(forms) == 1:
        return forms[0]
    pinned = getattr(_LOCAL, "pinned", None)
    if pinned is not None and key in pinned:
        return pinned[key]
    choice = _choose(key, forms, run, prior)
    if pinned is not None:
        pinned[key] = choice
    return choice


def _choose(key: tuple, forms: tuple[str, ...], run: Callable[[str], object], prior: str | None) -> str:
    with _LOCK:
        choice = _CHOICES.get(key) or _PROVISIONAL.get(key) or _sibling(key, forms)
    if choice is not None:
        return choice
    best = _LOCAL.tuner(key, [(lambda f=f: run(f)) for f in forms])
    if best is None:  # inside a capture, or an untimed build: nothing is timed
        counted = getattr(_LOCAL, "defaulted", None)
        if counted is not None:
            counted[0] += 1
        if prior in forms:
            STATS[f"prior_{key[0]}_{prior}"] += 1
            return prior
        return forms[0]
    choice = forms[best]
    with _LOCK:
        _CHOICES[key] = choice
    STATS[f"chose_{key[0]}_{choice}"] += 1
    return choice


def _sibling(key: tuple, forms: tuple[str, ...]) -> str | None:
    """The form timed for the same convolution at the nearest batch (within ``SIBLING_SPAN``),
    kept provisional for ``key``; None when there is none. A region's batch buckets (1, 2, 4, 8,
    16, 24, 32) differ only in the batch: timing every convolution again per bucket was 0.45 s
    of a ResNet-50 bucket's 0.5 s build on an H100 (benchmarks/bucket_builds.py), and the
    fastest form moves with the batch only across larger factors (tuned_conv.py). Called under
    ``_LOCK``."""
    if key[0] != "conv":
        return None
    b, rest = key[1][0], key[1][1:]
    best = None
    for k, f in _CHOICES.items():
        if k[0] != "conv" or k[1][1:] != rest or k[2:] != key[2:] or f not in forms:
            continue
        ratio = max(b, k[1][0]) / max(min(b, k[1][0]), 1)
        if ratio <= SIBLING_SPAN and (best is None or ratio < best[0]):
            best = (ratio, f)
    if best is None:
        return None
    _PROVISIONAL[key] = best[1]
    STATS["sibling_forms"] += 1
    return best[1]
