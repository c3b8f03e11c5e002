"""Padded calls: a call's dynamic axes rounded up to a bucket, its outputs cut back to the real size.

Static impls (CUDA graphs) are keyed by exact dims, so text of any length at any batch never meets
one: BERT-base at a random (batch 1-32, seq 8-384) per call ran every call on the dynamic path,
bound there by ~300 kernel launches of host work (~5-10 ms a call). Where
``compile/pad_proof.py`` proves that the real part of every output ignores what padding adds
(zeros in the padded positions: token 0 under an attention mask of 0), a call runs at the bucket of
each padded axis instead, its inputs padded with zeros, and its outputs sliced back: a handful of
shapes come back call after call, each replayed as one graph once built (in the background, at its
first sight: buckets come back by design), and the dynamic path serves a bucket until then.

Buckets (``bucket``): the next power of two (DYNASHAPE_PAD_BUCKETS=pow2, the default) or also 1.5x
between (``half``: at most 50% padded, fewer padded rows, twice the graphs), from a floor per axis
(``floor_of``: a 16th of the axis' bound, such as 32 for a table of 512 positions, else 4), so that
small calls, bound by the host, share a few graphs. A call is padded only where the padded signature
is the same specialization's (its guards, such as ``seq <= 512`` for a table of 512 positions, hold
there too) and the padded axes' product stays within DYNASHAPE_PAD_MAX_ELEMENTS (default 4096).
Measured on an H200 (BERT-base, benchmarks/pad_probe.py; eager / the dynamic path / the padded
graph, ms): (3, 20) as (4, 32) 12.7 / 9.1 / 1.4; (7, 100) as (8, 128) 12.0 / 9.5 / 2.6; (13, 200) as
(16, 256) 13.7 / 13.1 / 8.0; but (23, 172) as (32, 256) 21.5 / 15.1 / 15.0 and (9, 378) as (16, 512)
20.1 / 14.1 / 17.7: above ~4,000 tokens the calls are bound by their kernels, which padding adds to.

``pad_inputs``: 'auto' (the default: on CUDA where static impls are on, since the padding buys
graphs), 'on' (any device: the CPU tests), 'off'. ``stats()``: ``padded_calls``,
``pad_refused_calls`` (a proven model's calls run unpadded: too large, another specialization),
``pad_deferred_calls`` (unpadded while the bucket's graphs are built: a bucket is padded at its
first sight, which queues its graphs, and again once they landed; meanwhile its calls run the
dynamic path over their real rows, less work than over the padded ones),
``padded_elements`` against ``real_elements`` (the padded axes' products summed), and
``padding`` (proven, or why not).
"""

from __future__ import annotations

import math
import os

import torch

from ..compile.pad_proof import PadProof, prove
from ..errors import OptionsError

DEFAULT_MAX_ELEMENTS = 4096
# the smallest bucket of an axis: a 16th of its bound (a table of 512 positions: 32), else this; small
# calls are bound by the host, and a graph at a larger bucket costs them no more than a smaller one
DEFAULT_FLOOR = 4
# reported (as 0 too) wherever calls may be padded
PAD_COUNTERS = ("padded_calls", "pad_refused_calls", "pad_deferred_calls", "real_elements", "padded_elements")


def pad_mode(option, device: torch.device, static: str | None, cache_dir=None) -> bool:
    """Whether a session pads its calls (``pad_inputs=``; DYNASHAPE_PAD_INPUTS overrides 'auto').
    'auto': on CUDA with static impls and a disk cache, where the buckets' graphs pay: the next
    process builds them at load (the first one builds them on the worker, beside its calls)."""
    text = str(option if option is not None else os.environ.get("DYNASHAPE_PAD_INPUTS", "auto")).lower()
    if text not in ("auto", "on", "off", "1", "0", "true", "false"):
        raise OptionsError(f"pad_inputs={option!r}: expected 'auto', 'on' or 'off'")
    if text == "auto":
        return device.type == "cuda" and static is not None and cache_dir is not None
    return text in ("on", "1", "true")


def bucket_rule() -> str:
    text = os.environ.get("DYNASHAPE_PAD_BUCKETS", "pow2")
    if text not in ("pow2", "half"):
        raise OptionsError(f"DYNASHAPE_PAD_BUCKETS={text!r}: expected 'pow2' or 'half'")
    return text


def max_elements() -> int:
    text = os.environ.get("DYNASHAPE_PAD_MAX_ELEMENTS", str(DEFAULT_MAX_ELEMENTS))
    if not text.isdigit() or int(text) < 1:
        raise OptionsError(f"DYNASHAPE_PAD_MAX_ELEMENTS={text!r}: expected a positive int")
    return int(text)


def floor_of(limit: int | None) -> int:
    """An axis' smallest bucket: the power of two at or above a 16th of its bound, else DEFAULT_FLOOR."""
    return DEFAULT_FLOOR if limit is None else bucket(max(1, limit // 16), "pow2")


def pad_settings() -> tuple[str, int]:
    """(bucket rule, largest padded product) from the environment; OptionsError for a bad value."""
    return bucket_rule(), max_elements()


def bucket(value: int, rule: str) -> int:
    """The next power of two at or above ``value``; with ``half`` also 3 * 2^k."""
    p = 1 << max(0, (value - 1).bit_length())
    if rule == "half" and value > 2 and value <= 3 * p // 4:
        return 3 * p // 4
    return p


class InputPadding:
    """A request's padded calls over its compiled runner (``RequestState._run``)."""

    def __init__(self, model, stats) -> None:
        self.model, self.stats = model, stats
        self.rule, self.cap = pad_settings()
        self.seen: set = set()  # padded signatures called at once

    def proof(self, spec) -> PadProof | str:
        p = getattr(spec, "padding", None)
        if p is None:
            try:
                p = prove(spec.trace)
            except Exception as e:  # noqa: BLE001  a case the proof does not handle: unpadded, and said why
                p = f"the proof failed: {type(e).__name__}: {e}"
            spec.padding = p
            self.model.stats["padding"] = "proven" if isinstance(p, PadProof) else p
        return p

    def run(self, runner, inputs: list, hand_out: bool) -> list | None:
        plan = self._plan(runner, inputs)
        if plan is None:
            return runner.run(inputs, hand_out)
        proof, real, padded = plan
        ins = list(inputs)
        for pos, axes in _by_input(proof).items():
            x = ins[pos]
            shape = list(x.shape)
            for axis, s in axes:
                shape[axis] = padded[s]
            big = torch.zeros(shape, dtype=x.dtype, device=x.device)
            big[tuple(slice(0, n) for n in x.shape)].copy_(x)
            ins[pos] = big
        runner.padded_call = True
        try:
            outs = runner.run(ins, hand_out)
        finally:
            runner.padded_call = False
        if outs is None:
            return None
        self.stats["padded_calls"] += 1
        self.stats["real_elements"] += math.prod(real.values())
        self.stats["padded_elements"] += math.prod(padded.values())
        for j, axes in enumerate(proof.outputs):
            o = outs[j]
            if axes and isinstance(o, torch.Tensor):
                for axis, s in axes:
                    o = o.narrow(axis, 0, real[s])
                outs[j] = o.contiguous() if hand_out else o
        return outs

    def _plan(self, runner, inputs: list):
        """(proof, real sizes, padded sizes) of a call to pad, or None."""
        shapes = tuple([x.shape if isinstance(x, torch.Tensor) else None for x in inputs])
        if None in shapes:
            return None
        st = runner.state(shapes)  # (kept as the runner's last: an unpadded call finds it again at once)
        if st is None:
            return None
        spec = st.spec
        proof = self.proof(spec)
        if not isinstance(proof, PadProof):
            return None
        real = {s: shapes[pos][axis] for pos, axis, s in proof.inputs}
        padded = {s: max(real[s], min(max(bucket(v, self.rule), floor_of(proof.limits.get(s))),
                                      proof.limits.get(s, 1 << 62))) for s, v in real.items()}
        if padded == real:
            return None
        if math.prod(padded.values()) > self.cap:
            self.stats["pad_refused_calls"] += 1
            return None
        where = {(pos, axis): s for pos, axis, s in proof.inputs}
        big = tuple(tuple(padded[where[pos, axis]] if (pos, axis) in where else n for axis, n in enumerate(shp))
                    for pos, shp in enumerate(shapes))
        if not _accepts(spec, big):
            self.stats["pad_refused_calls"] += 1  # the padded signature is another program's (its guards)
            return None
        if big in self.seen:
            if self.model.static and not self._ready(runner, spec, big):
                # the bucket's graphs are still being built: padded, the call would run the dynamic
                # path over the padded rows; unpadded it does less work
                self.stats["pad_deferred_calls"] += 1
                return None
        else:
            self.seen.add(big)  # its first sight: padded, so that the bucket's graphs are built
        return proof, real, padded

    @staticmethod
    def _ready(runner, spec, shapes: tuple) -> bool:
        st = runner.state(shapes)
        values = {d.symbol: shapes[d.input][d.axis] for d in spec.trace.input_dims}
        return st is not None and st.ready(values)


def _accepts(spec, shapes: tuple) -> bool:
    """Whether ``spec``'s guards hold for ``shapes`` (asked without tracing another specialization)."""
    try:
        return bool(spec.accepts(shapes))
    except ArithmeticError:
        return False


def _by_input(proof: PadProof) -> dict[int, list[tuple[int, str]]]:
    out: dict[int, list] = {}
    for pos, axis, s in proof.inputs:
        out.setdefault(pos, []).append((axis, s))
    return out
