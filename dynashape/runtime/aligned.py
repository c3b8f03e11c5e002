"""Static impls aligned along a symbol (batch buckets and FC fake alignment; which regions:
``codegen/align.py``).

Convolutional regions (``Alignment.kind == "conv"``) on CUDA key their static impls by the batch
rounded up to a bucket (``conv_bucket``: 1, 2, 4, 8, then every multiple of 8 up to
``MAX_ALIGNED``), always with static impls: a vision service's batches of any size then replay a
handful of graphs, built in the background (``impls/static.py`` ``detached``), instead of one
build per batch value, which stalled callers for seconds each (ResNet-50 at a random batch per
call: 0.02-0.1x PyTorch eager). The buckets are fine where a padded image costs a real one's
compute: at most 8 images are padded past 8.

Token regions (``kind == "tokens"``, ``codegen/tokens.py``), opt-in (DYNASHAPE_TOKEN_BUCKETS): a
transformer's per-token parts, keyed by ``token_bucket(batch * seq)`` and run as rows ``[T, 1, ...]``:
the padded signature puts the bucket in the batch and 1 in the sequence, the plan holds room for
it (``token_room``), and a live-in ``[B, S, ...]`` is the first ``B * S`` rows of its padded view.

FC fake alignment (decoders' regions, ``kind == "fc"``), opt-in:

A region aligned along ``S`` keys its static impls by ``S`` rounded up to a multiple of ``m`` (the
option ``fc_align=m``, or DYNASHAPE_FC_ALIGN=m) for values up to ``MAX_ALIGNED``: one impl serves
every value of the bucket. Off by default: measured on a 12-layer decoder whose batch changes among
1-8 (H200, regions serving every step, ``benchmarks/aligned.py``) it took the builds from 328 to
181, their time from 0.80 to 0.34 s and the graphs' memory from 54.5 to 43.5 MiB, and the steady
step 5% slower (9.3 -> 9.8 ms: a copy of the attention's result into a padded buffer, and the
host's work around each replay). On CPU (regions compiled by inductor, tiny decoder) builds 88 ->
51, their time 45 -> 39 s (inductor's cache makes a similar region's build cheap), steps 14%
slower. Worth it where builds are what hurts: many batch sizes, each seen a few times. The
request's arena is planned with room for the padded value of an aligned symbol, and the region's
live-ins have ``S`` as their leading dim with fixed sizes behind it (``codegen/align.py``), so the
padded view of an arena buffer is the real one with more rows after it, at the same address with
the same strides: the impl is built over the group functions' views at the padded signature and
replays over the very memory the rest of the step reads. Buffers that alias one another (a merged
projection and the slices of it the next kernels read) alias at the padded size too. Per replay
only live-ins from outside the arena (an attention kernel's result) are copied into a padded
buffer, and the live-outs are handed on as their real rows; the padded rows hold whatever was there
(a row-wise region never mixes them into real rows). What is saved is a build (a capture, its
timing of forms) per value and the memory of one graph per value.
"""

from __future__ import annotations

import math
import os

import torch

from ..errors import OptionsError
from ..impls import CannotCapture

MAX_ALIGNED = 64  # values above are not aligned: padding them would cost real compute (fc_align's bound, options.py)
# token counts above are not bucketed (a token region's graphs, codegen/tokens.py): the dynamic path
# serves them, bound by the GPU there (H200, BERT-base at 12,288 tokens: 31.6 ms dynamic, 33 as a
# graph, benchmarks/token_probe.py); and 21 buckets x BERT-base's 13 token regions stay within the
# impl cache (31 buckets up to 32,768 tokens were 403 graphs: ~100 evictions a run, 70 GB of pools)
MAX_TOKENS = 6144
PLAN_TOKENS = 32768  # the rows a token plan holds at once (SpecState._plan): batch 64 x seq 512


def align_multiple(option: int | None = None) -> int:
    """``fc_align``: the multiple a region's aligned symbol is rounded up to, 0 (the default)
    for none; where the session leaves it unset, DYNASHAPE_FC_ALIGN (an operator's override of
    the default). Read at session creation; a bad value is an OptionsError naming its source."""
    if option is not None:
        name, text = "fc_align", option
    else:
        name, text = "DYNASHAPE_FC_ALIGN", os.environ.get("DYNASHAPE_FC_ALIGN")
        if text is None:
            return 0
    try:
        m = int(text) if not isinstance(text, (bool, float)) else -1
    except ValueError:
        m = -1
    if m < 0 or m > MAX_ALIGNED:
        raise OptionsError(f"{name}={text!r}: expected an integer from 0 (off) to {MAX_ALIGNED}")
    return m


def conv_bucket(value: int) -> int | None:
    """The bucket of a batch ``value``: the next power of two up to 8, then the next multiple of
    8; None above ``MAX_ALIGNED`` (not bucketed)."""
    if not 0 < value <= MAX_ALIGNED:
        return None
    if value <= 8:
        return 1 << (value - 1).bit_length()
    return -(-value // 8) * 8


def token_bucket(value: int) -> int | None:
    """The bucket of a token count (``batch * seq`` of a token region, ``codegen/tokens.py``): 64
    at least (so few rows cost nothing: such calls are bound by the host), the next power of two
    up to 256, then the next multiple of a quarter of the octave (at most 25% padded, ~10% on
    average; four buckets an octave, 21 up to ``MAX_TOKENS``); None above."""
    if not 0 < value <= MAX_TOKENS:
        return None
    if value <= 256:
        return max(64, 1 << (value - 1).bit_length())
    step = 1 << ((value - 1).bit_length() - 3)
    return -(-value // step) * step


def rows(al, key: tuple, sig: bool = False) -> int:
    """The rows an aligned region sees at ``key`` (or a signature, ``sig``): its symbol's value, or
    for a token region the product of its two leading symbols."""
    p, q = (al.sig_pos, al.sig_pos2) if sig else (al.key_pos, al.key_pos2)
    return key[p] if al.symbol2 is None else key[p] * key[q]


def padded_at(al, key: tuple, padded: int, sig: bool = False) -> tuple:
    """``key`` (or a signature) at the padded rows: the symbol at ``padded``; for a token region
    the rows as ``[padded, 1]`` (the batch carries the tokens, the sequence is one long)."""
    p, q = (al.sig_pos, al.sig_pos2) if sig else (al.key_pos, al.key_pos2)
    out = list(key)
    out[p] = padded
    if al.symbol2 is not None:
        out[q] = 1
    return tuple(out)


def token_room(cap_b: int, cap_s: int, padded) -> int:
    """The sequence capacity an arena plan needs so that a token region's padded rows ``[T, 1]``
    fit in every buffer planned for ``[cap_b, cap_s]``: ``T`` is at most the bucket of
    ``cap_b * cap_s`` (buckets grow with the count)."""
    t = padded("tokens", cap_b * cap_s)
    return cap_s if t is None else max(cap_s, -(-t // cap_b))


def aligned_value(value: int, multiple: int) -> int | None:
    """``value`` rounded up to ``multiple``, or None when it is not aligned."""
    if multiple <= 1 or not 0 < value <= MAX_ALIGNED:
        return None
    return -(-value // multiple) * multiple


class PaddedViews:
    """The arena's views at a padded signature, over the request's own arena: the plan reserved
    room for the padded value (``SpecState._plan`` rounds an aligned symbol's capacity up), and
    a view's strides do not depend on its leading dim, so the padded view of a buffer is the
    real one with more rows behind it (what the specialization's group functions read:
    ``typed``, ``off``, ``cur``)."""

    def __init__(self, state, sig: tuple) -> None:
        self.typed, self.off = state.typed, state.off
        self.cur: list = [None] * len(state.spec.refresh)
        for g, refresh in enumerate(state.spec.refresh):
            self.cur[g] = refresh(self, sig)


def _same_memory(padded: torch.Tensor, real: torch.Tensor, k: int = 1) -> bool:
    """Whether ``real`` is the first rows of ``padded``: same address, same sizes behind the
    leading dim (for a token region, ``k == 2``: ``real``'s two leading dims are one run of rows,
    ``padded``'s are ``[T, 1]``), same strides wherever the real view has more than one element (a
    stride along a dim of size 1 means nothing, and torch's views leave it arbitrary)."""
    if k == 2:
        b, n = real.shape[:2]
        if (n > 1 and real.stride(1) != padded.stride(0)) or (b > 1 and real.stride(0) != n * padded.stride(0)):
            return False  # the tokens are not one run of rows
        padded, real = padded.select(1, 0), real.reshape(b * n, *real.shape[2:]) if real.numel() else real
        if real.dim() != padded.dim():
            return False
    return (padded.data_ptr() == real.data_ptr() and padded.shape[1:] == real.shape[1:]
            and all(a == b for a, b, n in zip(padded.stride(), real.stride(), real.shape) if n > 1))


class AlignedImpl:
    """A static impl built over the padded views at the padded value, serving every value up to it.
    A token region's (``al.symbol2``) live-ins ``[B, S, ...]`` are its rows ``[T, 1, ...]``."""

    aligned = True

    def __init__(self, build_inner, al, views: PaddedViews, ins: tuple, padded: int, detached: bool = False) -> None:
        """``detached``: built off the calling thread (``impls/static.py`` ``detached``): this
        call's live-ins are not read (the first replay copies its own in)."""
        self.al, self.padded = al, padded
        self.k = k = 1 if al.symbol2 is None else 2  # leading dims that are the rows
        self.padded_ins: list = []
        self.copies: list[int] = []  # live-ins outside the arena: copied into a padded buffer per call
        for i, (x, member, carried) in enumerate(zip(ins, al.members, al.carries_in)):
            if member is not None:
                v = views.cur[member[0]][member[1]]  # the same memory, more rows
                if isinstance(x, torch.Tensor) and not _same_memory(v, x, k):
                    raise CannotCapture(f"live-in {i}: its padded view is not the real one with more rows "
                                        f"(strides {tuple(v.stride())} against {tuple(x.stride())})")
                self.padded_ins.append(v)
            elif carried:
                shape = (padded, *(1,) * (k - 1), *x.shape[k:])
                self.padded_ins.append(torch.zeros(shape, dtype=x.dtype, device=x.device))
                self.copies.append(i)
            else:
                self.padded_ins.append(x)  # no rows of the symbol: the inner impl's own refresh serves it
        self.carried = [i for i, c in enumerate(al.carries_in) if c]  # at least one (align.plan)
        self.rows_after = {i: ins[i].shape[k:] for i in self.carried}
        lead = ins[self.carried[0]].shape[:k]
        if not detached:
            self._copy_in(ins, lead)
        try:
            self.inner = build_inner(tuple(self.padded_ins))
        except CannotCapture as e:  # the region ran once on the padded views: the call takes its real rows
            if e.first is not None:
                e.first = self._real_rows(e.first, lead)
            raise
        self.kind, self.nbytes = self.inner.kind, self.inner.nbytes
        self.untuned = getattr(self.inner, "untuned", 0)
        self.fallback = getattr(self.inner, "fallback", None)
        self.phases = getattr(self.inner, "phases", {})

    def _copy_in(self, ins: tuple, lead: tuple) -> None:
        real = math.prod(lead)
        for i in self.copies:
            x = ins[i]
            self.padded_ins[i][:real].view(x.shape).copy_(x)

    def __call__(self, ins: tuple):
        k = self.k
        lead = ins[self.carried[0]].shape[:k]
        real = math.prod(lead)
        if real > self.padded:
            return None  # a guard: the dynamic path serves (counted by the caller)
        for i in self.carried:
            x = ins[i]
            if x.shape[:k] != lead or x.shape[k:] != self.rows_after[i]:
                return None
        if getattr(self.inner, "first", None) is None:  # the build's own call has copied its rows in
            self._copy_in(ins, lead)
        outs = self.inner(tuple(self.padded_ins))
        return None if outs is None else self._real_rows(outs, lead)

    def _real_rows(self, outs, lead: tuple) -> tuple:
        """The live-outs' real rows (what the region wrote into the arena is there already); a
        token region's as ``[B, S, ...]`` again."""
        if self.k == 1:
            return tuple(o[:lead[0]] if c else o for o, c in zip(outs, self.al.carries_out))
        real = math.prod(lead)
        return tuple(o[:real].view(*lead, *o.shape[2:]) if c else o for o, c in zip(outs, self.al.carries_out))
