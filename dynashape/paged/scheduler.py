"""Continuous batching over the paged KV pool: which conversations step together.

Each step takes every running conversation's next token (a decode row each) and then spends what
is left of a token budget on prompts in chunks, so that a long prompt never holds the others'
tokens back for more than a chunk (vLLM's chunked prefill; TGI's waiting-served ratio plays the
same part). A conversation joins as soon as its first chunk fits and leaves when it stops. When a
running conversation needs a block and none is free, the newest running one is preempted: its
blocks are given back and it waits again at the front, to be recomputed from its prompt and the
tokens it made so far (vLLM's recompute preemption; no host copy of its blocks). A conversation
that could not fit even alone is refused when it arrives (KVCapacityError).

The scheduler does no arithmetic on tensors: ``plan()`` says what the step computes and where the
new positions' keys and values go (``slots``), the model runs the step, ``commit()`` takes the
tokens it produced. A step may be planned before the last one's tokens are on the host (the
engine's overlap, vLLM's async scheduling): a conversation's token in flight (``Sequence.inflight``)
is the input of its next decode row (``Row.pending``: the engine feeds it from the device), it
counts toward ``max_new``, and a row planned after the token that ends a conversation (an EOS not
seen yet) is computed for nothing and dropped at its commit. Rows are padded to a bucket
(``bucket``) so that one CUDA graph per bucket serves a step of any size.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionsError
from .blocks import BlockPool
from .inflight import decode_row

# rows a decode run is padded to (a CUDA graph each): steps of 8 up to 64, so that a padded row costs
# at most ~1/5 of a run's products (fp32 products at 33 rows padded to 64 took ~2x the work)
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


@dataclass(eq=False)
class Sequence:
    """A conversation: its prompt, the tokens made so far, and how many positions are in the pool."""

    key: object
    prompt: list[int]
    max_new: int
    eos: int | tuple | None = None  # a token id, or ids, that end it
    out: list[int] = field(default_factory=list)
    computed: int = 0          # positions whose keys and values are in the pool
    state: str = "waiting"     # waiting, running, done, aborted
    preemptions: int = 0
    order: int = 0             # arrival order: the newest running one is preempted first
    keep: bool = False         # parked when it ends: its blocks serve the conversation's next turn
    inflight: int = 0          # tokens sampled by a step whose commit has not come yet (0 or 1)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.out

    @property
    def longest(self) -> int:
        """Positions it may hold: its prompt and every token it may make but the last (never fed back)."""
        return len(self.prompt) + max(self.max_new - 1, 0)

    @property
    def finished(self) -> bool:
        if len(self.out) >= self.max_new:
            return True
        if self.eos is None or not self.out:
            return False
        return self.out[-1] in self.eos if isinstance(self.eos, tuple) else self.out[-1] == self.eos


@dataclass
class Row:
    """One conversation's part of a step: its positions ``start:end`` (token ids ``tokens``), the
    pool slots they are written to, and whether the step's last row of it yields a new token."""

    seq: Sequence
    start: int
    end: int
    tokens: list[int]
    slots: np.ndarray  # (host) where the new positions' keys and values go
    samples: bool
    pending: bool = False  # its one token is the last step's, still on the device (``tokens`` is a placeholder)


@dataclass
class Plan:
    rows: list[Row]
    preempted: list[Sequence]

    @property
    def tokens(self) -> int:
        return sum(r.end - r.start for r in self.rows)

    @property
    def decode_rows(self) -> int:
        return sum(1 for r in self.rows if decode_row(r))


def bucket(n: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket holding ``n`` rows (n itself beyond the largest)."""
    return next((b for b in buckets if b >= n), n)


class Scheduler:
    def __init__(self, pool: BlockPool, max_rows: int = 64, token_budget: int = 512, chunk: int = 256,
                 prefill_budget: int | None = None) -> None:
        """``prefill_budget``: the prompt positions a step takes while it also has decode rows (None: the
        token budget's rest). Smaller: a decode step carries less prompt work, so the inter-token
        latency's tail shrinks, and the prompts take more steps (time to first token)."""
        if max_rows < 1 or token_budget < 1 or chunk < 1 or (prefill_budget is not None and prefill_budget < 1):
            raise OptionsError(f"max_rows={max_rows}, token_budget={token_budget}, chunk={chunk}, "
                               f"prefill_budget={prefill_budget}: expected >= 1")
        self.pool, self.max_rows, self.token_budget, self.chunk = pool, max_rows, token_budget, chunk
        self.prefill_budget = prefill_budget
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self._order = itertools.count()
        # ended conversations kept for their next turn (``Sequence.keep``), least recently used
        # first: their blocks are given back when others need them, or when a turn does not extend them
        self.parked: OrderedDict = OrderedDict()
        self.stats = {"steps": 0, "preemptions": 0, "refused": 0, "aborted": 0, "finished": 0,
                      "reused_positions": 0, "parked_evicted": 0}

    # ---- arrivals and departures -------------------------------------------------------------
    def add(self, seq: Sequence) -> Sequence:
        """Queue a conversation; KVCapacityError (nothing queued) if it could never fit."""
        try:
            self.pool.check_fits(seq.key, seq.longest)
        except Exception:
            self.stats["refused"] += 1
            raise
        seq.order, seq.state = next(self._order), "waiting"
        last = self.parked.pop(seq.key, None)
        if last is not None:  # the conversation's next turn: the positions it shares stay in the pool
            common = 0
            for a, b in zip(last.tokens[:last.computed], seq.prompt[:-1]):  # (the last is fed: its logits)
                if a != b:
                    break
                common += 1
            self.pool.truncate(seq.key, common)
            seq.computed = common
            self.stats["reused_positions"] += common
        self.waiting.append(seq)
        return seq

    def _evict_parked(self) -> bool:
        """Give back the blocks of the least recently parked conversation (a conversation that runs
        or waits is never parked: its next turn took it out)."""
        if not self.parked:
            return False
        key, _ = self.parked.popitem(last=False)
        self.pool.release(key)
        self.stats["parked_evicted"] += 1
        return True

    def abort(self, key) -> bool:
        """A client gone: its conversation leaves and its blocks are free at once."""
        if self.parked.pop(key, None) is not None:
            self.pool.release(key)
            return True
        for queue in (self.running, self.waiting):
            for s in queue:
                if s.key == key:
                    queue.remove(s)
                    self.pool.release(key)
                    s.state = "aborted"
                    self.stats["aborted"] += 1
                    return True
        return False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- a step ------------------------------------------------------------------------------
    def plan(self, held: set | frozenset = frozenset()) -> Plan:
        """The next step's rows: every running conversation's next position first (preempting the
        newest ones when blocks run out), then prompt chunks within the token budget. ``held``: keys
        of conversations that sit this step out and are never preempted (a prompt chunk of theirs is
        still running on a stream of its own)."""
        rows: list[Row] = []
        preempted: list[Sequence] = []
        budget = self.token_budget
        order = sorted(self.running, key=lambda s: s.order)
        # prompt positions this step may take: fewer while it has decode rows (prefill_budget)
        prompt_left = self.token_budget
        if self.prefill_budget is not None and any(q.computed >= len(q.prompt) for q in order):
            prompt_left = self.prefill_budget
        for seq in order:
            if seq.state != "running" or budget <= 0 or len(rows) >= self.max_rows or seq.key in held:
                continue
            if len(seq.out) + seq.inflight >= seq.max_new:
                continue  # its last token is in flight: it ends at that commit
            prompt = seq.computed < len(seq.prompt)  # a prompt's next chunk, not a decode row
            if prompt and prompt_left <= 0:
                continue
            n = min(len(seq.prompt) + len(seq.out) + seq.inflight - seq.computed, self.chunk, budget,
                    prompt_left if prompt else budget)
            while not self.pool.can_grow(seq.key, n):
                if self._evict_parked():
                    continue
                victims = [s for s in self.running if s.state == "running" and s.key not in held]
                if not victims:
                    break
                victim = max(victims, key=lambda s: s.order)
                self._preempt(victim, preempted)
                if victim is seq:
                    break
            if seq.state != "running" or not self.pool.can_grow(seq.key, n):
                continue
            rows.append(self._row(seq, n))
            budget -= n
            prompt_left -= n if prompt else 0
        for seq in list(self.waiting):  # arrival order; the preempted ones went to the front
            if budget <= 0 or prompt_left <= 0 or len(rows) >= self.max_rows:
                break
            if seq.inflight or seq.key in held:
                continue  # preempted while its token was in flight: recomputed once that token is in
            n = min(len(seq.tokens) - seq.computed, self.chunk, budget, prompt_left)
            while not self.pool.can_grow(seq.key, n) and self._evict_parked():
                pass
            if not self.pool.can_grow(seq.key, n):
                break  # a new prompt never evicts a running conversation; later ones wait their turn
            self.waiting.remove(seq)
            seq.state = "running"
            self.running.append(seq)
            rows.append(self._row(seq, n))
            budget -= n
            prompt_left -= n
        self.stats["steps"] += 1
        return Plan(rows, preempted)

    def _row(self, seq: Sequence, n: int) -> Row:
        """The row, its positions counted as computed from now on (the run that writes them is
        launched before any later step's reads them)."""
        start = seq.computed
        slots = self.pool.grow(seq.key, n)
        end = start + n
        have = len(seq.prompt) + len(seq.out) + seq.inflight
        seq.computed = end
        pending = seq.inflight > 0  # a decode row whose token is the last step's, on the device
        if pending:
            tokens = [0]
        elif n == 1 and start == have - 1 and seq.out:  # a decode row: the token made last
            tokens = seq.out[-1:]
        else:
            tokens = seq.tokens[start:end]
        row = Row(seq, start, end, tokens, slots, samples=end == have, pending=pending)
        seq.inflight += row.samples  # its token, until the step's commit
        return row

    def _preempt(self, seq: Sequence, preempted: list[Sequence]) -> None:
        self.pool.release(seq.key)
        self.running.remove(seq)
        seq.computed, seq.state = 0, "waiting"
        seq.preemptions += 1
        self.stats["preemptions"] += 1
        self.waiting.insert(0, seq)
        preempted.append(seq)

    def commit(self, plan: Plan, sampled: dict) -> list[Sequence]:
        """After the model ran ``plan``: ``sampled[key]`` is the token each sampling row made. The
        tokens are appended; the conversations that stop leave (their blocks freed) and are
        returned. A row of a conversation that ended or was aborted since its plan is dropped; one
        preempted since keeps its token (it was computed before the preemption)."""
        done = []
        for r in plan.rows:
            seq = r.seq
            if not r.samples:
                continue
            seq.inflight = max(seq.inflight - 1, 0)
            if seq.state not in ("running", "waiting"):
                continue  # aborted, or ended by an earlier token: its blocks are gone already
            seq.out.append(int(sampled[seq.key]))
            if seq.finished:
                (self.running if seq.state == "running" else self.waiting).remove(seq)
                if seq.keep:
                    self.parked[seq.key] = seq
                else:
                    self.pool.release(seq.key)
                seq.state = "done"
                self.stats["finished"] += 1
                done.append(seq)
        return done
