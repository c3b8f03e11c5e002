"""Shape-aware batching: group requests whose merged run is one shape, merge, split back.

Pure functions of a ``ServePolicy`` and numpy feeds, so the Ray deployment, the single-process
server and the tests share them. Requests join when every input has the same dtype and the same
dims apart from the batch axis (and apart from a paddable axis, which is rounded up to a bucket):
no request is ever padded along a dim the user did not declare paddable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .policy import ServePolicy

Feeds = dict[str, np.ndarray]


def bucket(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (the padded length of a group)."""
    return -(-n // multiple) * multiple


def rows(policy: ServePolicy, feeds: Feeds) -> int:
    """How many batch rows a request brings (a request may itself be a batch)."""
    for name, axis in policy.batch_axes.items():
        a = feeds.get(name)
        if a is not None and a.ndim > axis:
            return int(a.shape[axis])
    return 1


def length(policy: ServePolicy, feeds: Feeds) -> int | None:
    """A request's own length along the paddable axis (its mask's), or None without padding."""
    if policy.mask is None:
        return None
    m = feeds.get(policy.mask)
    axis = policy.pad_axes[policy.mask]
    return int(m.shape[axis]) if m is not None and m.ndim > axis else None


def signature(policy: ServePolicy, feeds: Feeds, alone: int) -> tuple:
    """What must be equal for requests to share a run. ``alone`` makes a key of its own for a
    request that cannot join any other (inconsistent lengths, a missing input: its own run then
    raises the typed error that names what is wrong)."""
    n = length(policy, feeds)
    sizes = {a.shape[b] for name, b in policy.batch_axes.items() if (a := feeds.get(name)) is not None and a.ndim > b}
    if len(sizes) > 1:  # rows that would not line up once merged
        return ("alone", alone)
    target = bucket(n, policy.pad_multiple) if n is not None else None
    key = []
    for name in sorted(feeds):
        a = feeds[name]
        dims = list(a.shape)
        b = policy.batch_axes.get(name)
        if b is not None and b < len(dims):
            dims[b] = None
        p = policy.pad_axes.get(name)
        if p is not None and p < len(dims):
            if dims[p] != n:
                return ("alone", alone)
            dims[p] = target
        key.append((name, a.dtype.str, tuple(dims)))
    if set(feeds) != set(policy.batch_axes) and policy.batches:
        return ("alone", alone)
    return tuple(key)


def plan(policy: ServePolicy, items: list[Feeds], max_batch: int,
         ready: Callable[[tuple, int], bool] = lambda sig, n: False) -> list[list[int]]:
    """Indices of ``items`` grouped into runs: same signature, at most ``max_batch`` rows each
    (a request bigger than that runs alone). Runs whose merged shape is ``ready`` (its code and
    static impls built: a replay, not a trace) come first, so a burst of mixed shapes serves the
    cheap ones without waiting behind a first call."""
    if not policy.batches or max_batch <= 1:
        return [[i] for i in range(len(items))]
    groups: dict[tuple, list[int]] = {}
    for i, feeds in enumerate(items):
        groups.setdefault(signature(policy, feeds, i), []).append(i)
    runs: list[tuple[bool, list[int]]] = []
    for sig, idxs in groups.items():
        cur: list[int] = []
        cur_rows = 0
        for i in idxs:
            r = rows(policy, items[i])
            if cur and cur_rows + r > max_batch:
                runs.append((ready(sig, cur_rows), cur))
                cur, cur_rows = [], 0
            cur.append(i)
            cur_rows += r
        runs.append((ready(sig, cur_rows), cur))
    runs.sort(key=lambda run: not run[0])  # stable: arrival order within each class
    return [idxs for _, idxs in runs]


def _padded(policy: ServePolicy, name: str, a: np.ndarray, target: int | None) -> np.ndarray:
    axis = policy.pad_axes.get(name)
    if target is None or axis is None or a.shape[axis] == target:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, target - a.shape[axis])
    return np.pad(a, widths, constant_values=np.asarray(policy.pad_values[name], dtype=a.dtype))


def merge(policy: ServePolicy, items: list[Feeds]) -> tuple[Feeds, list[tuple[int, int | None]]]:
    """One run's feeds from requests of one signature, and what ``split`` needs to undo it."""
    meta = [(rows(policy, f), length(policy, f)) for f in items]
    lengths = [n for _, n in meta if n is not None]
    target = bucket(max(lengths), policy.pad_multiple) if lengths else None
    if len(items) == 1:
        return {k: _padded(policy, k, v, target) for k, v in items[0].items()}, meta
    merged = {}
    for name in items[0]:
        parts = [_padded(policy, name, f[name], target) for f in items]
        merged[name] = np.concatenate(parts, axis=policy.batch_axes[name])
    return merged, meta


def split(policy: ServePolicy, outputs: Feeds, meta: list[tuple[int, int | None]]) -> list[Feeds]:
    """Each request's outputs: its rows of the batch axis, cut back to its own length."""
    cuts = np.cumsum([r for r, _ in meta])[:-1]
    per: list[Feeds] = [{} for _ in meta]
    for name, a in outputs.items():
        b = policy.output_batch_axes.get(name)
        parts = np.split(a, cuts, axis=b) if b is not None and len(meta) > 1 else [a] * len(meta)
        p = policy.output_pad_axes.get(name)
        for i, part in enumerate(parts):
            n = meta[i][1]
            if p is not None and n is not None and part.shape[p] != n:
                part = np.take(part, np.arange(n), axis=p)
            per[i][name] = np.ascontiguousarray(part)
    return per
