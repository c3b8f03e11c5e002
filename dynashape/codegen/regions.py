"""Regions: runs of generated lines whose shapes depend on one set of symbols, given static impls.

The body of a specialization's ``run`` is a list of *items* (the lines of one node, with the
setup lines before them). ``partition`` cuts it into regions:

- an item that cannot be replayed by a static impl bounds regions: break points and control
  flow (``st.sub``), the KV append and output buffers (``st.kv``, ``st.out``: per-call host work
  and addresses that move), a write into memory that is neither an arena buffer nor the item's
  own (an ``out=`` into another line's result), and on CUDA anything that moves data between
  host and device (host nodes, ``.cpu()``, ``.item()``, ``.tolist()``, ``.to(DEV``);
- consecutive replayable items stay in one region while they depend on the same symbols, so in a
  decode step the parts that depend only on batch and new tokens are regions of their own apart
  from the attention core, whose shapes follow the past.

A region's *key symbols* are those its shapes and buffer addresses depend on; a static impl is
built per value of them. Its *live-ins* are names it reads that it does not make: buffers of the
arena (stable for a key: read in place), values made from shapes whose other symbols change
(refreshed: copied into the impl's own buffer before a replay) and locals of other items
(refreshed). Its *live-outs* are the locals it makes that later lines read.

All of this is a pure function of the item list and what the builder knows of its names.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field

_STRING = re.compile(r"'[^']*'|\"[^\"]*\"")
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_TARGETS = re.compile(r"^\s*([A-Za-z_][\w\s,*]*?)\s*=(?!=)")
_OUT = re.compile(r"out=\(?([A-Za-z_]\w*)")
_INPLACE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\.\w+_\(")
# on CUDA, lines that move data between host and device: a graph would replay the copy from the
# host address it was captured with, or cannot capture it at all
_HOST_SYNC = (".cpu()", ".item()", ".tolist()", ".numpy()", ".to(DEV", "torch.tensor(", "torch.as_tensor(",
              "torch.from_numpy(")
MIN_KERNELS = 2  # a region of one kernel is not worth a static impl: the replay costs a launch too


@dataclass
class Item:
    """The lines of one node (and the setup lines before it)."""

    lines: list[str]
    node: object | None
    syms: frozenset[str]  # symbols of the node's dims
    host: bool = False  # the node runs on the host
    bounding: bool = False  # break point, control flow, KV append: never in a region
    counters: list[str] = field(default_factory=list)  # host-side counters, run after the item either way
    setup: int = 0  # how many of ``lines`` are setup lines (not mapped to the node in errors)


@dataclass
class Member:
    """What the builder knows of a group member (a name made once per symbol values)."""

    group_syms: frozenset[str]
    buffer: bool  # a buffer or a view of one (read and written in place) vs a value made from shapes
    shape_syms: frozenset[str] = frozenset()


@dataclass
class Region:
    index: int
    items: list[int]  # item positions, consecutive
    syms: frozenset[str]
    live_in: list[str] = field(default_factory=list)
    refresh: list[bool] = field(default_factory=list)  # per live-in: copied into the impl before a replay
    live_out: list[str] = field(default_factory=list)
    results: list[bool] = field(default_factory=list)  # per live-out: handed to the caller
    kernels: int = 0

    @property
    def static(self) -> bool:
        return self.kernels >= MIN_KERNELS


def _reads(line: str) -> list[str]:
    text = _STRING.sub("''", line)
    names = []
    for m in _NAME.finditer(text):
        n = m.group(0)
        rest = text[m.end():m.end() + 2]
        if keyword.iskeyword(n) or (rest.startswith("=") and not rest.startswith("==")):
            continue  # a keyword argument's name, or Python's own words
        names.append(n)
    return names


def targets(line: str) -> list[str]:
    m = _TARGETS.match(line)
    if not m or "(" in m.group(1):
        return []
    return [t.strip().lstrip("*") for t in m.group(1).split(",") if t.strip().lstrip("*") and t.strip() != "_"]


def _rhs_reads(line: str) -> list[str]:
    m = _TARGETS.match(line)
    return _reads(line[m.end():] if m and "(" not in m.group(1) else line)


def replayable(item: Item, members: dict[str, Member], cuda: bool) -> bool:
    if item.bounding or item.node is None:
        return False
    if cuda and item.host:
        return False
    own: set[str] = set()
    for line in item.lines:
        if "st." in line or (cuda and any(s in line for s in _HOST_SYNC)):
            return False
        # a write (out=, an in-place method) must land in a buffer of the arena or in what this
        # item made: a static impl would write a refreshed copy of anything else (an output
        # buffer, a KV slot, another line's result), not the memory the next lines read
        for m in list(_OUT.finditer(line)) + list(_INPLACE.finditer(line)):
            if m.group(1) not in members and m.group(1) not in own:
                return False
        own.update(targets(line))
    return True


def partition(items: list[Item], members: dict[str, Member], symvars: dict[str, str],
              params: list[str], results: list[str], cuda: bool, cut=None) -> list[Region]:
    """Regions of ``items`` (see the module docstring). ``symvars``: symbol -> its local;
    ``params``: the inputs of ``run``; ``results``: the locals it returns; ``cut(positions,
    syms)``: a run's items as consecutive parts, each a region of its own (``tokens.py``)."""
    local = set(params) | set(members)
    for it in items:
        for line in it.lines:
            local.update(targets(line))
    var_sym = {v: s for s, v in symvars.items()}
    ok = [replayable(it, members, cuda) for it in items]
    # runs of replayable items with equal symbols, within stretches between bounding items
    runs: list[list] = []  # [items, syms, stretch]
    stretch = 0
    for i, it in enumerate(items):
        if not ok[i]:
            stretch += 1
            continue
        syms = _item_syms(it, members, var_sym)
        if runs and runs[-1][2] == stretch and runs[-1][1] == syms:
            runs[-1][0].append(i)
        else:
            runs.append([[i], syms, stretch])
    # a short run joins a neighbour whose symbols cover its own (no symbol added to a key); one
    # that no neighbour covers stays alone (the attention core of a decode step, keyed by the past)
    merged = True
    while merged:
        merged = False
        for k, (its, syms, st) in enumerate(runs):
            if len(its) >= MIN_KERNELS:
                continue
            for j in (k - 1, k + 1):
                if 0 <= j < len(runs) and runs[j][2] == st and syms <= runs[j][1]:
                    lo, hi = min(j, k), max(j, k)
                    runs[lo:hi + 1] = [[runs[lo][0] + runs[hi][0], runs[j][1], st]]
                    merged = True
                    break
            if merged:
                break
    if cut is not None:
        runs = [[part, syms, st] for its, syms, st in runs for part in cut(its, syms)]
    regions = [Region(k, its, syms) for k, (its, syms, _) in enumerate(runs)]
    for r in regions:
        _flows(r, items, members, var_sym, local, results)
    return regions


def _item_syms(it: Item, members: dict[str, Member], var_sym: dict[str, str]) -> frozenset[str]:
    syms = set(it.syms)
    for line in it.lines:
        for n in _reads(line):
            if n in var_sym:
                syms.add(var_sym[n])
            m = members.get(n)
            if m is not None:
                syms |= m.group_syms if m.buffer else m.shape_syms
    return frozenset(syms)


def _flows(r: Region, items: list[Item], members: dict[str, Member], var_sym: dict[str, str],
           local: set[str], results: list[str]) -> None:
    """Live-ins, live-outs and the key symbols of region ``r``."""
    made: list[str] = []
    made_set: set[str] = set()
    live_in: list[str] = []
    syms = set(r.syms)
    for i in r.items:
        r.kernels += 1
        for line in items[i].lines:
            for n in _rhs_reads(line):
                if n in made_set or n in live_in:
                    continue
                if n in var_sym:
                    syms.add(var_sym[n])  # an int of the program: part of the key, not an input
                    continue
                if n in local:
                    live_in.append(n)
            for t in targets(line):
                if t not in made_set:
                    made_set.add(t)
                    made.append(t)
    later: set[str] = set(results)
    last = r.items[-1]
    for it in items[last + 1:]:
        for line in it.lines:
            later.update(_reads(line))
    r.syms = frozenset(syms)
    r.live_in = live_in
    r.refresh = [not (n in members and (members[n].buffer or members[n].group_syms <= r.syms)) for n in live_in]
    r.live_out = [n for n in made if n in later]
    r.results = [n in results for n in r.live_out]

