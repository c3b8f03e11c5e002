"""The decode step as one function over KV storages of fixed capacity (whole-step graphs).

A decode step's specialization has one symbol that grows by the new tokens every call: the past
length ``g`` (the past axis of the KV Concats). A CUDA graph per value of ``g`` would never be
replayed. Yet only three kinds of lines depend on ``g``:

- the KV appends ``present = st.kv[i](past, new)``: here ``new`` is written into a storage of
  capacity ``C`` at the device positions ``P .. P + n - 1`` (``index_copy_``; ``P`` is a device
  tensor holding ``g``, filled before each replay), and ``present`` is the whole storage;
- the attention kernels that read the presents: here they read the whole storage with a mask
  built on the device (``VALID``: key ``j`` is visible when ``j < P + n``), so their shapes follow
  ``C``, not ``g``; positions beyond the length hold finite values (zeros at first) and get a
  weight of exactly 0;
- values the shape program made from ``g`` (position ids from the past length): computed on the
  device from ``P`` rather than copied from the host.

The buffers the lines write (arena views, and views of them) are the step's own: allocated when
it is captured, from the graph's memory pool, so a re-plan of the request's arena (a longer
prompt's prefill) never moves memory under a graph.

``step_plan`` rewrites the lines of ``run`` that way into
``step(<other symbols>, C, P, KS0, ..., <live-ins>) -> <results that are not presents>`` or says
why it cannot (the attention reads a mask made from ``g``, a line outside these three depends on
``g``, a break point, host work...): then the regions and the dynamic path serve that
specialization, and the reason is reported. ``runtime/decode_graph.py`` runs it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch

from ..ops.kv_attention import kv_attention
from ..ops.rope_append import rope_append
from .regions import _HOST_SYNC, Item, Member, _rhs_reads, targets
from .step_capacity import GATHER_OPS, MASK_OPS, Refused, at_capacity, mask_line, mentions, prep_source
from .step_fusions import fuse_rope_append

_KV_CALL = re.compile(r"^(\w+) = st\.kv\[(\d+)\]\((\w+), (\w+)\)$")
_KV_PREPARE = re.compile(r"^(\w+) = st\.kv\[(\d+)\]\.prepare\((\w+), (.*)\)$")
_OUT = re.compile(r"^(\w+) = st\.out\((\d+), (.*)\)$")
_ATTN = re.compile(r"^(\w+) = (k_\w+)\((\w+), (\w+), (\w+), (\w+)\)$")


@dataclass
class KVInfo:
    """What the builder knows of one KV Concat (``st.kv[index]``)."""

    index: int
    axis: int
    past: str | None  # the local of its past (an input of run)
    out: str | None  # the local of its result (the present)
    growth: str | None  # the symbol g the past's length grows with: the past is g + c along the axis
    new_len: str | None  # source of the new part's length along the axis (None: not past + one part)
    shift: str | None = None  # source of g - (the past's length): c's negation, free of g
    total: str | None = None  # source of the present's length along the axis (keys seen)


@dataclass
class StepPlan:
    source: str  # def step(...)
    growth: str  # the symbol that grows
    keyvars: list[str]  # locals of the other signature symbols, in signature order
    kv: list[KVInfo]
    new_len: str  # source of the new tokens' count (from the key symbols)
    live_in: list[str]  # locals read from run: inputs (refreshed) and group members (stable)
    inputs: list[str]  # the live-ins that are inputs of run
    results: list[tuple[str, int]]  # per result of run: ("kv", kv position) or ("out", position in step's)
    svals: list[str] = field(default_factory=list)  # members computed on the device from P
    keysyms: list[str] = field(default_factory=list)  # the symbols of keyvars
    padded: list[tuple[str, int]] = field(default_factory=list)  # inputs read padded to C: (local, axis)
    cap: list[str] = field(default_factory=list)  # live-ins made at the capacity by prep, once per bucket
    prep: str = ""  # def prep(<keyvars>, C, <prep_live_in>) -> cap (step_capacity.py)
    prep_live_in: list[str] = field(default_factory=list)


def step_plan(items: list[Item], kv: list[KVInfo], members: dict[str, Member], svals: dict[str, tuple],
              symvar: dict[str, str], sig_symbols: list[str], params: list[str], results: list[str],
              out_dtypes: dict[int, str], cuda: bool, groups: list[tuple[frozenset, list[str]]],
              fills: dict[str, tuple] | None = None, input_dims: dict[str, list[str]] | None = None) -> StepPlan:
    """The whole-step function of a specialization (module docstring), or ``Refused``.
    ``svals``: member -> (element sources, dtype source, shape, on the host) of values made from
    shapes; ``out_dtypes``: st.out index -> dtype source; ``groups``: (symbols, lines) of each
    group, in the order run unpacks them; ``fills``: member -> (value, dtype source, dims
    sources) of masks made from shapes that are one value everywhere; ``input_dims``: input
    local -> its dims' sources; ``sig_symbols``: the symbols that key the specialization's
    values (those the shape program did not replace)."""
    fills, input_dims = fills or {}, input_dims or {}
    if not kv:
        raise Refused("no KV cache")
    growth = {k.growth for k in kv}
    if len(growth) != 1 or None in growth:
        raise Refused("the KV pasts do not grow along one symbol")
    g = growth.pop()
    gvar = symvar[g]
    if any(k.new_len is None or k.past is None or k.out is None for k in kv):
        raise Refused("a KV append that is not past + one new part")
    new_lens, shifts, totals = ({getattr(k, a) for k in kv} for a in ("new_len", "shift", "total"))
    if len(new_lens) != 1 or mentions(next(iter(new_lens)), gvar):
        raise Refused("the KV appends add parts of different or growing lengths")
    if len(shifts) != 1 or len(totals) != 1 or None in shifts or None in totals:
        raise Refused("the KV pasts do not grow alike")
    new_len, shift, total = next(iter(new_lens)), next(iter(shifts)), next(iter(totals))
    by_index = {k.index: k for k in kv}
    presents = {k.out: k for k in kv}
    pasts = {k.past for k in kv}
    growing, aliases = _growing_inputs(input_dims, pasts, gvar, total, new_len, symvar, sig_symbols)
    alias_syms = {s for s in sig_symbols if symvar[s] in aliases}
    padded: set[str] = set()  # values the step makes at the capacity along the keys
    gathers: list[tuple[str, str]] = []  # (line, node name) of gathers in mask lines
    lines: list[str] = []
    used_svals: list[str] = []
    for it in items:
        if it.node is None:
            raise Refused("lines that belong to no node")
        if it.bounding:
            raise Refused(f"node {it.node.name!r} is a break point or control flow")
        if cuda and it.host:
            raise Refused(f"node {it.node.name!r} runs on the host")
        is_kv = any(k.out in targets(x) for x in it.lines for k in kv)
        is_attn = any(_ATTN.match(x) for x in it.lines)
        op = getattr(it.node, "op_type", None)
        on_keys = g in it.syms or bool(alias_syms & it.syms)
        mask = not is_kv and not is_attn and on_keys and op in MASK_OPS | GATHER_OPS
        for line in it.lines:
            if mask:
                lines.append(mask_line(line, it.node.name, total, aliases, gvar, set(presents) | pasts))
                padded.update(targets(line))
                if op in GATHER_OPS:
                    gathers.append((lines[-1], it.node.name))
                continue
            if any(mentions(line, a) for a in aliases):
                raise Refused(f"node {it.node.name!r} reads the length of {sorted(growing)} and is not a mask")
            lines.append(_rewrite(line, it, by_index, presents, pasts, out_dtypes, gvar, is_kv, cuda, new_len,
                                  padded))
        if not is_kv and not mask and g in it.syms and not is_attn:
            raise Refused(f"node {it.node.name!r} has shapes that depend on {g!r}")
    # the buffers the lines write (arena views and views of them) become the step's own memory:
    # allocated when the graph is captured, from its pool, so that no re-plan of the request's
    # arena (a longer prompt's prefill) moves them under the graph
    buffers = _buffer_lines(lines, groups, members, g, gvar, total, aliases, alias_syms)
    lines = buffers + lines
    if os.environ.get("DYNASHAPE_STEP_FUSIONS", "1") != "0":  # off: for A/B measurements
        lines = fuse_rope_append(lines, list(results))
    # what the lines read: inputs, group members (stable, or values of g made here), made locals
    made: set[str] = set()
    live_in: list[str] = []
    pads: list[tuple[str, int]] = []
    cap: list[str] = []
    local = set(params) | set(members)
    for line in lines:
        for n in _rhs_reads(line):
            if n in made or n in live_in or n not in local:
                continue
            m = members.get(n)
            if m is not None and (g in m.group_syms or alias_syms & m.group_syms):
                if n in svals and not svals[n][3] and not alias_syms & m.group_syms:
                    if n not in used_svals:  # a value of the length: computed on the device from P
                        used_svals.append(n)
                    continue
                cap.append(n)  # made at the capacity once per bucket (prep)
                live_in.append(n)
                continue
            if n in pasts:
                raise Refused(f"the past {n!r} is read outside the KV append")
            if n in growing:
                if growing[n] is None:
                    raise Refused(f"input {n!r} grows along an axis that is not the keys seen")
                pads.append((n, growing[n]))
            live_in.append(n)
        made.update(targets(line))
    for line, name in gathers:  # indices that are capacity values (checked non-negative at run time)
        call = re.match(r"^\w+ = [\w.]+\((.*)\)$", line)
        args = [a.strip() for a in call.group(1).split(",")] if call else []
        indices = [a for a in args if "=" not in a][1:]
        if not indices or not all(a in cap for a in indices):
            raise Refused(f"gather {name!r} in a mask reads indices that are not made from shapes")
    out_results: list[tuple[str, int]] = []
    returned: list[str] = []
    for r in results:
        if r in presents:
            out_results.append(("kv", kv.index(presents[r])))
        elif r in made and r not in padded:
            out_results.append(("out", len(returned)))
            returned.append(r)
        else:
            raise Refused(f"result {r!r} is not made by the step")
    keysyms = [s for s in sig_symbols if s != g and s not in alias_syms]
    keyvars = [symvar[s] for s in keysyms]
    prep, prep_live = prep_source(cap, groups, members, fills, total, aliases, g, gvar, keyvars) if cap else ("", [])
    gdev = f"(P0 + {shift})" if shift != "0" else "P0"  # g on the device
    head = ["# whole step over KV storages of capacity C; the past length is the device tensor P",
            "P0 = P[0]",
            f"IDX = torch.arange({new_len}, device=DEV) + P",
            f"VALID = torch.arange(C, device=DEV)[None, :] < (P + {new_len})",
            # the mask as the attention adds it: 0 for the keys written so far, -inf beyond
            f"NEG = torch.zeros((1, 1, 1, C), dtype=KS{kv[0].index}.dtype, device=DEV).masked_fill_("
            "VALID.logical_not().view(1, 1, 1, C), float('-inf'))"]
    for n in used_svals:
        elems, dt, shape, _ = svals[n]
        srcs = [_device_expr(e, gvar, gdev) for e in elems]
        head.append(f"{n} = torch.stack([{', '.join(f'_tdev({s}, P0)' for s in srcs)}]).to({dt}).reshape({shape!r})")
    args = keyvars + ["C", "P"] + [f"KS{k.index}" for k in kv] + live_in
    src = [f"def step({', '.join(args)}):"] + ["    " + x for x in head + lines]
    src.append(f"    return ({', '.join(returned)}{',' if len(returned) == 1 else ''})")
    return StepPlan("\n".join(src) + "\n", g, keyvars, kv, new_len, live_in,
                    [n for n in live_in if n in params and n not in growing], out_results, used_svals, keysyms, pads,
                    cap, prep, prep_live)


def _growing_inputs(input_dims: dict[str, list[str]], pasts: set[str], gvar: str, total: str, new_len: str,
                    symvar: dict[str, str], sig_symbols: list[str]) -> tuple[dict[str, int | None], tuple[str, ...]]:
    """Inputs other than the pasts whose dims grow with the keys seen: input -> the axis (None when
    it is not one axis of the keys seen), and the variables that stand for the keys seen: an
    input's dim of its own symbol (an ``attention_mask [batch, total]`` whose length the shape
    program does not tie to the past: a model that gathers from it) that no other dim names."""
    growing: dict[str, int | None] = {}
    aliases: list[str] = []
    sigvars = {symvar[s] for s in sig_symbols}
    uses: dict[str, int] = {}
    for dims in input_dims.values():
        for d in dims:
            for v in sigvars:
                if mentions(d, v):
                    uses[v] = uses.get(v, 0) + 1
    for n, dims in input_dims.items():
        if n in pasts:
            continue
        hits = [a for a, d in enumerate(dims) if mentions(d, gvar)]
        if hits:
            growing[n] = hits[0] if len(hits) == 1 and dims[hits[0]] == total else None
            continue
        own = [a for a, d in enumerate(dims) if d in sigvars and uses.get(d) == 1 and a > 0 and d != new_len]
        if len(own) == 1 and n not in growing:
            growing[n] = own[0]
            aliases.append(dims[own[0]])
    return growing, tuple(aliases)


_ARENA_VIEW = re.compile(r"^(\w+) = A\[(\d+)\]\.as_strided\((.*), off\[\d+\]\)$")


def _buffer_lines(lines: list[str], groups: list[tuple[frozenset, list[str]]], members: dict[str, Member],
                  g: str, gvar: str, total: str, aliases: tuple[str, ...], alias_syms: set[str]) -> list[str]:
    """The group lines that make the buffers ``lines`` read (transitively), arena views made
    fresh allocations of the same shape and strides; those of a mask over the keys seen are
    made at the capacity."""
    wanted = {n for line in lines for n in _rhs_reads(line) if n in members and members[n].buffer}
    ordered = [(syms, line) for syms, glines in groups for line in glines]
    picked: list[str] = []
    for syms, line in reversed(ordered):
        made = [t for t in targets(line) if t in wanted]
        if not made:
            continue
        if g in syms or alias_syms & syms:
            line = at_capacity(line, total, aliases)
            if mentions(line, gvar):
                raise Refused(f"buffer {made[0]!r} has a size that depends on {g!r}")
        m = _ARENA_VIEW.match(line)
        if m:
            line = f"{m.group(1)} = torch.empty_strided({m.group(3)}, dtype=ADT{m.group(2)}, device=DEV)"
        elif "A[" in line or "off[" in line or "st." in line:
            raise Refused(f"buffer {made[0]!r} is made in a way the step cannot make it ({line.strip()[:60]})")
        picked.append(line)
        wanted.update(n for n in _rhs_reads(line) if n in members and members[n].buffer)
    return picked[::-1]


def _rewrite(line: str, it: Item, kv: dict[int, KVInfo], presents: dict[str, KVInfo], pasts: set[str],
             out_dtypes: dict[int, str], gvar: str, is_kv: bool, cuda: bool, new_len: str, padded: set[str]) -> str:
    """One line of ``run`` as the whole step runs it, or ``Refused``."""
    m = _KV_PREPARE.match(line)
    if m:  # the producer of the new part writes into a buffer of the step's own
        return f"{m.group(1)} = torch.empty({m.group(4)}, dtype=KS{m.group(2)}.dtype, device=DEV)"
    m = _KV_CALL.match(line)
    if m:
        k = kv[int(m.group(2))]
        if m.group(3) != k.past:
            raise Refused(f"KV append {k.index} reads {m.group(3)!r}, not its past")
        return f"{m.group(1)} = _kv_write(KS{k.index}, {k.axis}, IDX, {m.group(4)})"
    if is_kv:
        raise Refused(f"the KV append of node {it.node.name!r} is not past + one new part")
    m = _OUT.match(line)
    if m:  # an output buffer: the graph's own memory (the impl copies results out)
        return f"{m.group(1)} = torch.empty({m.group(3)}, dtype={out_dtypes[int(m.group(2))]}, device=DEV)"
    if "st." in line:
        raise Refused(f"node {it.node.name!r} needs the request state ({line.strip()[:60]})")
    if cuda and any(s in line for s in _HOST_SYNC):
        raise Refused(f"node {it.node.name!r} moves data between host and device")
    reads = set(_rhs_reads(line))
    if mentions(line, gvar):
        raise Refused(f"node {it.node.name!r} reads the growing length as a number")
    read_presents = [n for n in reads if n in presents]
    m = _ATTN.match(line)
    if not read_presents:
        if reads & padded:
            raise Refused(f"node {it.node.name!r} reads a mask over the keys seen and is not their attention")
        return line
    if m is None or getattr(it.node, "op_type", None) != "Attention" or m.group(3) in presents:
        raise Refused(f"node {it.node.name!r} reads a KV present and is not an attention")
    mask = m.group(6)
    if mask != "None" and mask not in padded:
        raise Refused(f"attention {it.node.name!r} reads a mask that is not over the keys seen")
    k, v = presents.get(m.group(4)), presents.get(m.group(5))
    if k is None or v is None:
        raise Refused(f"attention {it.node.name!r} reads one present and something else")
    attrs = it.node.attrs
    if attrs.get("k_transposed", 0):
        raise Refused(f"attention {it.node.name!r} reads its keys transposed")
    extra = "" if mask == "None" else f", {mask}, {attrs.get('mask_kind', 'add')!r}"
    return f"{m.group(1)} = _kv_attn({m.group(3)}, KS{k.index}, KS{v.index}, P, {new_len}, NEG, " \
           f"{float(attrs.get('scale', 1.0))!r}{extra})"


def _device_expr(src: str, gvar: str, gdev: str = "P0") -> str:
    """A symbol expression's source with the growing symbol read from the device (``gdev``)."""
    src = re.sub(rf"(?<!\w){gvar}(?!\w)", gdev, src)
    return re.sub(r"(?<![\w.])(max|min)\(", r"_t\1(", src)


# ---- what the step's lines call (added to the specialization's namespace) -----------------------
def _kv_write(storage, axis: int, idx, new):
    """Write ``new`` at the device positions ``idx`` along ``axis``: the present is the storage."""
    storage.index_copy_(axis, idx, new)
    return storage


def _tdev(x, like):
    """``x`` as a device tensor like ``like``: an int of the shape program becomes a fill, never
    a copy from the host (which a graph would replay from the address it was captured with)."""
    return x if isinstance(x, torch.Tensor) else torch.full_like(like, x)


def _tmax(a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return max(a, b)
    like = a if isinstance(a, torch.Tensor) else b
    return torch.maximum(_tdev(a, like), _tdev(b, like))


def _tmin(a, b):
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return min(a, b)
    like = a if isinstance(a, torch.Tensor) else b
    return torch.minimum(_tdev(a, like), _tdev(b, like))


HELPERS = {"_kv_attn": kv_attention, "_kv_write": _kv_write, "_rope_append": rope_append, "_tdev": _tdev,
           "_tmax": _tmax, "_tmin": _tmin}
