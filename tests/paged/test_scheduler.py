"""The paged KV pool and the continuous-batching scheduler (dynashape/paged) on a small decoder in
float64: conversations that join and leave at any step, prompts in chunks, preemption when blocks
run out, aborts, refusals. Every conversation's greedy tokens must equal its lone run's, computed
by plain causal attention over its whole sequence (no pool, no batching)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dynashape import errors
from dynashape.errors import KVCapacityError
from dynashape.paged import BlockPool, Scheduler, Sequence, blocks_for_memory, paged_attention, write_kv
from dynashape.paged.scheduler import bucket

VOCAB, D, HEADS, KVH, LAYERS, MAXPOS = 61, 32, 4, 2, 2, 256


class Toy(torch.nn.Module):
    """A decoder with grouped-query attention and learned positions, random float64 weights."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) / s[-1] ** 0.5  # noqa: E731
        self.emb, self.pos, self.head = r(VOCAB, D) * 4, r(MAXPOS, D), r(D, VOCAB) * 8
        self.wq = [r(D, HEADS * 8) for _ in range(LAYERS)]
        self.wk = [r(D, KVH * 8) for _ in range(LAYERS)]
        self.wv = [r(D, KVH * 8) for _ in range(LAYERS)]
        self.wo = [r(HEADS * 8, D) for _ in range(LAYERS)]
        self.w1, self.w2 = [r(D, 64) for _ in range(LAYERS)], [r(64, D) for _ in range(LAYERS)]

    def _layers(self, x, attend):
        for i in range(LAYERS):
            q = (x @ self.wq[i]).view(-1, HEADS, 8)
            k, v = (x @ self.wk[i]).view(-1, KVH, 8), (x @ self.wv[i]).view(-1, KVH, 8)
            x = x + attend(i, q, k, v).reshape(-1, HEADS * 8) @ self.wo[i]
            x = x + F.gelu(x @ self.w1[i]) @ self.w2[i]
        return x @ self.head

    def lone(self, prompt, max_new, eos=None):
        """Greedy tokens of one conversation, its whole sequence recomputed at every token."""
        toks = list(prompt)
        out = []
        for _ in range(max_new):
            t = torch.tensor(toks)
            x = self.emb[t] + self.pos[torch.arange(len(toks))]

            def attend(i, q, k, v):
                k, v = k.repeat_interleave(HEADS // KVH, 1), v.repeat_interleave(HEADS // KVH, 1)
                o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                   is_causal=True)
                return o.transpose(0, 1)
            nxt = int(self._layers(x, attend)[-1].argmax())
            out.append(nxt)
            toks.append(nxt)
            if nxt == eos:
                break
        return out

    def step(self, plan, pool):
        """One continuous-batching step: every row's positions at once over the paged pool."""
        if not plan.rows:
            return {}
        tokens = torch.tensor([t for r in plan.rows for t in r.tokens])
        pos = torch.cat([torch.arange(r.start, r.end) for r in plan.rows])
        slots = torch.from_numpy(np.concatenate([r.slots for r in plan.rows]))
        keys, lens = [r.seq.key for r in plan.rows], [r.end - r.start for r in plan.rows]
        x = self.emb[tokens] + self.pos[pos]

        def attend(i, q, k, v):
            write_kv(pool, i, slots, k, v)
            return paged_attention(q, pool, i, keys, lens)
        logits = self._layers(x, attend)
        ends = np.cumsum(lens) - 1
        return {r.seq.key: int(logits[e].argmax()) for r, e in zip(plan.rows, ends) if r.samples}


def _serve(model, pool, arrivals, **kw):
    """Run conversations arriving at given steps to the end; their tokens by key, and the scheduler."""
    sched = Scheduler(pool, **kw)
    pending = sorted(arrivals, key=lambda a: a[0])
    step = 0
    while pending or not sched.idle:
        while pending and pending[0][0] <= step:
            sched.add(pending.pop(0)[1])
        plan = sched.plan()
        sched.commit(plan, model.step(plan, pool))
        step += 1
        assert step < 5000
    return sched


def _serve_overlapped(model, pool, arrivals, **kw):
    """``_serve`` as the engine's overlap runs it: each step planned before the last one's tokens are
    committed, a decode row whose token is in flight fed that token (the engine does it on the device)."""
    sched = Scheduler(pool, **kw)
    pending = sorted(arrivals, key=lambda a: a[0])
    step, prev = 0, None
    while pending or not sched.idle or prev is not None:
        while pending and pending[0][0] <= step:
            sched.add(pending.pop(0)[1])
        plan = sched.plan()
        for r in plan.rows:
            if r.pending:
                r.tokens = [prev[1][r.seq.key]]
        out = model.step(plan, pool)
        if prev is not None:
            sched.commit(*prev)
        prev = (plan, out) if plan.rows else None
        step += 1
        assert step < 5000
    return sched


SERVES = {"in-turn": _serve, "overlapped": _serve_overlapped}


def _conversations(rng, n, prompt=(3, 40), new=(4, 24)):
    """(arrival step, conversation) pairs: random prompts and answer lengths."""
    out = []
    for i in range(n):
        toks = [int(t) for t in rng.integers(0, VOCAB, rng.integers(*prompt))]
        out.append((int(rng.integers(0, 30)), Sequence(f"c{i}", toks, int(rng.integers(*new)))))
    return out


@pytest.mark.parametrize("serve", ["in-turn", "overlapped"])
@pytest.mark.parametrize("blocks,chunk", [(200, 256), (200, 7), (24, 16)])
def test_every_conversation_gets_its_lone_runs_tokens(blocks, chunk, serve):
    """Plenty of blocks; prompts in chunks of 7; so few blocks that running conversations are
    preempted and recomputed (overlapped: some while their token is in flight)."""
    model = Toy()
    pool = BlockPool(blocks, 4, LAYERS, KVH, 8, torch.float64)
    arrivals = _conversations(np.random.default_rng(blocks + chunk), 12)
    sched = SERVES[serve](model, pool, arrivals, max_rows=8, token_budget=48, chunk=chunk)
    for _, seq in arrivals:
        assert seq.state == "done" and seq.out == model.lone(seq.prompt, seq.max_new), seq.key
    assert pool.used_blocks == 0 and not pool.tables  # every block back
    if blocks == 24:
        assert sched.stats["preemptions"] > 0
    assert sched.stats["finished"] == 12 and pool.peak_used <= blocks


@pytest.mark.parametrize("serve", ["in-turn", "overlapped"])
def test_a_stop_token_ends_a_conversation_and_frees_its_blocks(serve):
    # overlapped: the row planned after the stop token (not read yet) is computed and dropped
    model = Toy(1)
    prompt = [3, 14, 15, 9, 2, 6]
    lone = model.lone(prompt, 20)
    eos = lone[4]
    seq = Sequence("s", prompt, 20, eos=eos)
    pool = BlockPool(16, 4, LAYERS, KVH, 8, torch.float64)
    SERVES[serve](model, pool, [(0, seq)])
    assert seq.out == lone[:lone.index(eos) + 1] and pool.used_blocks == 0


def test_an_aborted_conversation_frees_its_blocks_and_the_others_go_on():
    model = Toy(2)
    pool = BlockPool(64, 4, LAYERS, KVH, 8, torch.float64)
    sched = Scheduler(pool, token_budget=64)
    a, b = Sequence("a", list(range(1, 20)), 10), Sequence("b", list(range(5, 12)), 10)
    sched.add(a), sched.add(b)
    for _ in range(3):
        plan = sched.plan()
        sched.commit(plan, model.step(plan, pool))
    held = len(pool.tables["a"].blocks)
    used = pool.used_blocks
    assert sched.abort("a") and a.state == "aborted" and pool.used_blocks == used - held
    while not sched.idle:
        plan = sched.plan()
        sched.commit(plan, model.step(plan, pool))
    assert b.out == model.lone(b.prompt, 10) and pool.used_blocks == 0


def test_a_conversation_that_cannot_fit_is_refused_with_a_typed_error():
    pool = BlockPool(8, 4, LAYERS, KVH, 8, torch.float64)  # 32 positions
    sched = Scheduler(pool)
    with pytest.raises(KVCapacityError, match="needs 9 KV blocks"):
        sched.add(Sequence("big", list(range(30)), 5))  # 34 positions
    assert sched.idle and sched.stats["refused"] == 1
    sched.add(Sequence("fits", list(range(28)), 5))  # 32 positions: exactly the pool


def test_blocks_are_taken_as_positions_grow_and_slots_address_them():
    pool = BlockPool(10, 4, 1, 1, 2)
    s1 = pool.grow("a", 6)  # blocks 0, 1
    s2 = pool.grow("b", 3)  # block 2
    s3 = pool.grow("a", 3)  # positions 6..8: block 1's last two, then block 3
    assert s1.tolist() == [0, 1, 2, 3, 4, 5] and s2.tolist() == [8, 9, 10] and s3.tolist() == [6, 7, 12]
    assert pool.tables["a"].blocks == [0, 1, 3] and pool.used_blocks == 4
    tables, lengths = pool.table_tensor(["a", "b"])
    assert tables.tolist() == [[0, 1, 3], [2, -1, -1]] and lengths.tolist() == [9, 3]
    assert not pool.can_grow("c", 25) and pool.can_grow("c", 24)
    with pytest.raises(KVCapacityError):
        pool.grow("c", 25)
    assert "c" not in pool.tables and pool.used_blocks == 4  # nothing taken
    assert pool.release("a") == 3 and pool.free_blocks == 9
    assert pool.stats()["kv_blocks_peak"] == 4


def test_pool_size_from_free_memory_and_row_buckets():
    per_block = 2 * 2 * 16 * 4 * 64 * 2  # k and v, 2 layers, 16 positions, 4 heads of 64, bf16
    assert blocks_for_memory(100 * per_block, 0.1, 16, 2, 4, 64, torch.bfloat16) == 90
    with pytest.raises(errors.OptionsError, match="headroom"):
        blocks_for_memory(1, 1.0, 16, 2, 4, 64, torch.float32)
    assert [bucket(n) for n in (1, 3, 5, 9, 33, 64, 65, 300)] == [1, 4, 8, 16, 40, 64, 80, 300]


def test_paged_attention_equals_dense_causal_attention_over_each_conversation():
    """Packed rows of three conversations (a decode row, a prompt chunk in the middle of its
    prompt, a whole prompt), their blocks scattered over the pool, against dense attention."""
    g = torch.Generator().manual_seed(7)
    pool = BlockPool(40, 4, 1, KVH, 8, torch.float64)
    lengths, news = {"a": 13, "b": 9, "c": 6}, {"a": 1, "b": 5, "c": 6}
    full = {}
    while any(pool.tables.get(k) is None or pool.tables[k].length < n for k, n in lengths.items()):
        for key in lengths:  # grown in turns of up to 5 positions: their blocks interleave in the pool
            have = pool.tables[key].length if key in pool.tables else 0
            if lengths[key] > have:
                pool.grow(key, min(lengths[key] - have, 5))
    for key, n in lengths.items():
        full[key] = (torch.randn(n, KVH, 8, generator=g, dtype=torch.float64),
                     torch.randn(n, KVH, 8, generator=g, dtype=torch.float64))
        bs = pool.block_size
        pos = torch.arange(n)
        slots = torch.tensor(pool.tables[key].blocks)[pos // bs] * bs + pos % bs
        write_kv(pool, 0, slots, *full[key])
    assert pool.tables["a"].blocks != list(range(len(pool.tables["a"].blocks)))  # not contiguous
    q = torch.randn(sum(news.values()), HEADS, 8, generator=g, dtype=torch.float64)
    got = paged_attention(q, pool, 0, list(news), list(news.values()))
    start = 0
    for key, n in news.items():
        k, v = (t.repeat_interleave(HEADS // KVH, 1) for t in full[key])
        L = lengths[key]
        s = torch.einsum("qhd,khd->hqk", q[start:start + n], k) / 8 ** 0.5
        s = s.masked_fill(torch.arange(L)[None, None, :] > torch.arange(L - n, L)[None, :, None], float("-inf"))
        want = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
        torch.testing.assert_close(got[start:start + n], want, rtol=1e-12, atol=1e-12)
        start += n


def test_a_prefill_budget_caps_the_prompt_positions_of_a_step_with_decode_rows():
    """``prefill_budget``: while decode rows run, a step takes at most that many prompt positions (the
    inter-token latency's tail); a step without decode rows takes the whole token budget."""
    pool = BlockPool(200, 8, 1, KVH, 4)
    sched = Scheduler(pool, token_budget=64, chunk=32, prefill_budget=8)
    sched.add(Sequence("a", list(range(1, 41)), 5))
    first = sched.plan()  # no decode row yet: the whole budget (one chunk of 32)
    assert [(r.start, r.end) for r in first.rows] == [(0, 32)]
    sched.commit(first, {})
    second = sched.plan()
    assert [(r.start, r.end) for r in second.rows] == [(32, 40)]
    sched.commit(second, {"a": 7})  # its prompt done: it decodes from now on
    sched.add(Sequence("b", list(range(1, 50)), 5))
    for _ in range(3):  # "a" decodes, "b"'s prompt goes 8 positions a step
        plan = sched.plan()
        rows = {r.seq.key: (r.start, r.end) for r in plan.rows}
        assert rows["a"][1] - rows["a"][0] == 1 and rows["b"][1] - rows["b"][0] == 8
        sched.commit(plan, {r.seq.key: 3 for r in plan.rows if r.samples})
    with pytest.raises(errors.OptionsError, match="prefill_budget"):
        Scheduler(pool, prefill_budget=0)
