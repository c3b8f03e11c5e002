"""PagedEngine (dynashape/paged/engine.py): the exported Llama (torch.onnx, with an attention_mask
and position_ids as optimum's decoders take them) serving conversations that join at random steps,
with prompts in chunks, rows of different lengths in one batch and preemption when blocks run
out. Every conversation's greedy tokens must equal its lone run in onnxruntime (the whole prompt,
then one token a step over its own dense past)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from dynashape import errors
from dynashape.paged.engine import PagedEngine, Sampling
from tests.helpers import run_interpreted
from tests.models import llama

CFG = {**llama.TINY, "mask_input": True, "position_ids": True}


@pytest.fixture(scope="module")
def path():
    return str(llama.model_path(CFG))


@pytest.fixture(scope="module")
def lone(path):
    """Greedy tokens of one conversation alone, in onnxruntime; cached by (prompt, steps)."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = llama.input_names(CFG)
    memo: dict = {}

    def run(prompt: list[int], steps: int, eos: int | None = None) -> list[int]:
        key = (tuple(prompt), steps, eos)
        if key in memo:
            return memo[key]
        past = [np.zeros((1, CFG["kv_heads"], 0, CFG["head_dim"]), np.float32) for _ in range(2 * CFG["layers"])]
        toks, out = list(prompt), []
        new = np.asarray([prompt], np.int64)
        while len(out) < steps:
            n, p = new.shape[1], past[0].shape[2]
            feeds = [new, np.ones((1, p + n), np.int64), np.arange(p, p + n, dtype=np.int64)[None], *past]
            res = sess.run(None, dict(zip(names, feeds)))
            t = int(res[0][0, -1].argmax())
            out.append(t)
            toks.append(t)
            past = res[1:]
            new = np.asarray([[t]], np.int64)
            if t == eos:
                break
        memo[key] = out
        return out
    return run


def drive(engine, arrivals: dict, max_steps: int = 2000) -> dict:
    """Conversations ``arrivals[step] = [(key, prompt, max_new, eos), ...]`` joining at their
    steps, run to the end; the tokens each got, by key."""
    got: dict = {}
    step = 0
    while step < max_steps and (step <= max(arrivals) or not engine.idle):
        for key, prompt, max_new, eos in arrivals.get(step, []):
            engine.add(key, prompt, max_new, eos)
            got[key] = []
        for e in engine.step():
            got[e.key].append(e.token)
        step += 1
    assert engine.idle, "conversations left running"
    return got


def conversations(seed: int, n: int, steps: int) -> dict:
    rng = np.random.default_rng(seed)
    arrivals: dict = {}
    for i in range(n):
        prompt = rng.integers(1, CFG["vocab"], rng.integers(1, 40)).tolist()
        arrivals.setdefault(int(rng.integers(0, steps)), []).append((f"c{i}", prompt, int(rng.integers(1, 20)), None))
    return arrivals


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlapped"])
@pytest.mark.parametrize("paged", [True, False], ids=["pool-read-in-place", "pasts-gathered"])
@pytest.mark.parametrize("seed", [0, 1])
def test_conversations_joining_at_random_steps_get_their_lone_greedy_tokens(path, lone, seed, paged, overlap, device):
    # on CUDA the decode runs replay CUDA graphs (step_graphs.py), the padding rows of a bucket included.
    # paged: the attention reads the blocks through the tables (PagedAttention); else the pasts are gathered.
    # overlap: a step is planned and launched before the last one's tokens are read (they are fed from the device)
    # chunk_graphs: on CUDA the prompt-chunk runs replay graphs too where the pool is read in place
    engine = PagedEngine(path, device=device, block_size=8, num_blocks=64, max_rows=8, token_budget=48, chunk=16,
                         past_multiple=16 if device.startswith("cuda") else None, paged_kv=paged, overlap=overlap,
                         chunk_graphs=paged)
    arrivals = conversations(seed, 10, 25)
    got = drive(engine, arrivals)
    for convs in arrivals.values():
        for key, prompt, max_new, _ in convs:
            assert got[key] == lone(prompt, max_new), key
    st = engine.stats()
    assert st["kv_blocks_used"] == 0 and st["finished"] == 10 and st["runs"] > 0
    if not overlap and not st["preemptions"]:  # the step trace: each prompt position and later token once
        convs = [c for cs in arrivals.values() for c in cs]  # (a prompt's last piece of one token runs as decode)
        assert sum(d + c for _, d, c, _ in engine.trace) == sum(len(p) + n - 1 for _, p, n, _ in convs)
        assert any(c > 0 for _, _, c, _ in engine.trace) and all(t > 0 for t, _, _, _ in engine.trace)
    if paged:  # (and the LM head over each row's last position only)
        assert st["paged_kv"] == "on" and st["gathered_bytes"] == 0 and engine.last_only
    else:
        assert st["paged_kv"].startswith("off") and st["gathered_bytes"] > 0
    if device.startswith("cuda"):
        assert st["step_graph_replays"] > 0 and st["step_graphs_refused"] == 0, engine.graphs.refusals
        assert engine.chunk_graphs == paged and any(s > 1 for _, _, s in engine.graphs.keys) == paged
        assert (st["eager_runs"] == 0) == paged  # the pasts gathered: prompt chunks run eagerly


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlapped"])
@pytest.mark.parametrize("packed", [False, True], ids=["runs-apart", "packed"])
def test_preempted_conversations_are_recomputed_to_the_same_tokens(path, lone, overlap, packed, device):
    # 12 blocks of 8 positions for 6 conversations of up to ~60 positions: the newest are preempted
    # (with overlap, some while their token is in flight: recomputed once it is in). packed: a step's
    # decode rows and prompt chunks (the recomputed ones too) in one run
    engine = PagedEngine(path, device=device, block_size=8, num_blocks=12, max_rows=6, token_budget=64, chunk=32,
                         overlap=overlap, **({"paged_kv": True, "packed": True} if packed else {"packed": False}))
    arrivals = {0: [(f"p{i}", list(range(3 + 5 * i, 20 + 5 * i)), 30, None) for i in range(6)]}
    got = drive(engine, arrivals)
    assert engine.stats()["preemptions"] > 0 and engine.packed == packed
    for key, prompt, max_new, _ in arrivals[0]:
        assert got[key] == lone(prompt, max_new), key


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlapped"])
def test_eos_per_row_abort_and_refusal(path, lone, overlap, device):
    # with overlap the row planned after the EOS (not read yet) is computed for nothing: no token of it is seen
    engine = PagedEngine(path, device=device, block_size=8, num_blocks=16, max_rows=4, overlap=overlap)
    ref = lone([5, 6, 7], 12)
    eos = ref[4]
    want = ref[:ref.index(eos) + 1]
    got = drive(engine, {0: [("e", [5, 6, 7], 12, eos), ("f", [9, 10], 6, None)]})
    assert got["e"] == want and got["f"] == lone([9, 10], 6)
    engine.add("gone", [1, 2, 3], 50)
    engine.step()
    assert engine.stats()["kv_blocks_used"] > 0
    assert engine.abort("gone") and engine.stats()["kv_blocks_used"] == 0
    assert [e.token for e in engine.step()] == [] and engine.idle  # (a token in flight for it is dropped)
    with pytest.raises(errors.KVCapacityError, match="needs"):
        engine.add("huge", list(range(1, 200)), 10)  # 208 positions, the pool holds 128
    with pytest.raises(errors.InputError, match="at least one token"):
        engine.add("empty", [], 3)
    engine.add("after", [9, 10], 6)  # the engine serves on after the refusals
    out = []
    while not engine.idle:
        out += [e.token for e in engine.step()]
    assert out == lone([9, 10], 6)


def test_sampling_per_row_is_reproducible_by_seed(path):
    def sample(seed, others):
        engine = PagedEngine(path, block_size=8, num_blocks=64, max_rows=8)
        engine.add("s", [4, 5, 6], 15, sampling=Sampling(do_sample=True, temperature=0.8, top_k=20, seed=seed))
        for i in range(others):  # greedy rows beside it change nothing in its draws
            engine.add(f"g{i}", [7 + i, 8], 10)
        toks = []
        while not engine.idle:
            toks += [e.token for e in engine.step() if e.key == "s"]
        return toks
    a, b, c = sample(1, 0), sample(1, 3), sample(2, 0)
    assert a == b and len(a) == 15 and a != c
    with pytest.raises(errors.OptionsError, match="temperature"):
        PagedEngine(path, num_blocks=8).add("x", [1], 2, sampling=Sampling(do_sample=True, temperature=0))


def test_a_decoder_without_position_ids_is_refused_with_the_reason():
    path = str(llama.model_path({**llama.TINY, "mask_input": True}))
    with pytest.raises(errors.InvalidModelError, match="position_ids"):
        PagedEngine(path, num_blocks=8)


def run_one(engine, key, prompt, n, keep=True) -> list[int]:
    engine.add(key, prompt, n, keep=keep)
    out = []
    while not engine.idle:
        out += [e.token for e in engine.step() if e.key == key]
    return out


def test_a_conversations_next_turn_reuses_its_blocks(path, lone):
    engine = PagedEngine(path, block_size=8, num_blocks=64, max_rows=4)
    first = [5, 6, 7, 8]
    out1 = run_one(engine, "c", first, 6)
    assert out1 == lone(first, 6)
    st = engine.stats()
    assert st["parked"] == 1 and st["kv_blocks_used"] == 2  # 9 positions (the last token is not fed yet)
    second = first + out1 + [9, 10]
    assert run_one(engine, "c", second, 5) == lone(second, 5)
    assert engine.stats()["reused_positions"] == len(first) + len(out1) - 1
    third = first[:2] + [11, 12]  # a turn that rewrites the past: only the shared start is kept
    assert run_one(engine, "c", third, 3) == lone(third, 3)
    assert engine.stats()["reused_positions"] == len(first) + len(out1) - 1 + 2
    assert engine.abort("c") and engine.stats()["kv_blocks_used"] == 0 and engine.stats()["parked"] == 0


def test_parked_conversations_give_their_blocks_back_when_others_need_them(path, lone):
    engine = PagedEngine(path, block_size=8, num_blocks=6, max_rows=4)
    a = list(range(3, 30))
    assert run_one(engine, "a", a, 5) == lone(a, 5)  # 31 positions parked: 4 of the 6 blocks
    b = list(range(40, 60))
    assert run_one(engine, "b", b, 10, keep=False) == lone(b, 10)  # needs 4: "a" is let go
    st = engine.stats()
    assert st["parked_evicted"] == 1 and st["parked"] == 0 and st["kv_blocks_used"] == 0
    nxt = a + lone(a, 5) + [7]
    assert run_one(engine, "a", nxt, 4) == lone(nxt, 4)  # computed whole again, the same tokens


class Keys:
    """A stand-in for the CUDA step graphs on the CPU: each run eagerly, as a key's first run is."""

    def __init__(self, eng) -> None:
        self.eng, self.keys, self.counters = eng, set(), {}

    def run(self, batch, patch=None):
        eng = self.eng
        assert batch.paged and batch.tables.shape[1] == eng.table_width and batch.b in (1, 2, 4, 8)
        self.keys.add((batch.b, batch.p, batch.s))
        t = batch.tensors(eng.dev, eng._int, eng.io, scratch=eng.pool.scratch_slot)
        if patch is not None:
            patch(t["ids"])
        return eng.body(eng.request, batch, t, eng.dense(batch))


@pytest.mark.parametrize("packed", [False, True], ids=["apart", "packed"])
def test_runs_as_the_step_graphs_take_them_give_the_lone_tokens(path, lone, packed):
    """The CUDA step graphs' side of the engine, on the CPU: decode runs and prompt-chunk runs handed
    to the graphs with their tables as wide as a conversation of the model's context (the shapes a
    captured key fixes), rows padded to buckets, tokens in flight patched in, the LM head over each
    row's last position only. A stand-in runs each eagerly (a capture needs CUDA). ``packed``: a
    step's decode rows and prompt chunks in one run, their tokens one after another (a multiple of 8
    of them, as CUDA's are of 64)."""
    engine = PagedEngine(path, block_size=8, num_blocks=64, max_rows=8, token_budget=48, chunk=16, pad_rows=True,
                         paged_kv=True, overlap=True, packed=packed)
    engine.graphs, engine.chunk_graphs, engine.chunk_multiple = Keys(engine), True, 8
    arrivals = conversations(3, 10, 25)
    got = drive(engine, arrivals)
    for convs in arrivals.values():
        for key, prompt, max_new, _ in convs:
            assert got[key] == lone(prompt, max_new), key
    assert {s for _, _, s in engine.graphs.keys} > {1}  # decode runs and chunk runs both went to the graphs
    assert engine.stats()["eager_runs"] == 0 and engine.packed == packed
    if packed:  # a run's tokens a multiple of 8, at least one a row
        assert all(s % 8 == 0 and s >= b for b, _, s in engine.graphs.keys if s > 1)


@pytest.mark.parametrize("overlap", [False, True], ids=["in-turn", "overlapped"])
def test_packed_runs_of_decode_rows_and_prompt_chunks_give_the_lone_tokens(path, lone, overlap):
    """Decode rows and prompt chunks of one step in one run of a batch of one (PagedEngine(packed=True)),
    their tokens one after another: every conversation's lone tokens, in fewer runs than apart."""
    runs = {}
    for packed in (False, True):
        engine = PagedEngine(path, block_size=8, num_blocks=64, max_rows=8, token_budget=48, chunk=16, paged_kv=True,
                             overlap=overlap, packed=packed)
        arrivals = conversations(0, 10, 25)
        got = drive(engine, arrivals)
        for convs in arrivals.values():
            for key, prompt, max_new, _ in convs:
                assert got[key] == lone(prompt, max_new), (packed, key)
        runs[packed] = engine.stats()["runs"]
        st = engine.stats()
        assert st["kv_blocks_used"] == 0 and st["packed"] == ("on" if packed else "off: turned off")
    assert runs[True] < runs[False]


def test_packed_runs_take_chunks_of_128_one_a_step_by_default_and_are_on_where_chunk_runs_are_captured(path):
    # packed runs: chunks of 128, at most one a step while decode rows run (the H200's measured setting)
    packed = PagedEngine(path, block_size=8, num_blocks=64, paged_kv=True, packed=True)
    assert packed.packed and (packed.scheduler.chunk, packed.scheduler.prefill_budget) == (128, 128)
    mine = PagedEngine(path, block_size=8, num_blocks=64, paged_kv=True, packed=True, chunk=32, prefill_budget=None)
    assert (mine.scheduler.chunk, mine.scheduler.prefill_budget) == (32, None)
    # by default on where chunk runs are captured (CUDA's step graphs): not on the CPU, whose defaults stay
    plain = PagedEngine(path, block_size=8, num_blocks=64, paged_kv=True)
    assert not plain.packed and (plain.scheduler.chunk, plain.scheduler.prefill_budget) == (256, None)
    assert plain.stats()["packed"].startswith("off: no prompt-chunk graphs")


def test_a_graph_the_pass_cannot_rewrite_keeps_the_gathered_pasts_and_says_why(path, lone):
    engine = PagedEngine(path, block_size=8, num_blocks=64, max_rows=4, paged_kv=True, fusion=False, packed=True)
    assert engine.paged_refused == "fusion is off" and engine.stats()["paged_kv"] == "off: fusion is off"
    assert engine.stats()["packed"] == "off: the pool is not read in place: fusion is off"
    assert run_one(engine, "x", [4, 5, 6], 6, keep=False) == lone([4, 5, 6], 6)
    assert engine.stats()["gathered_bytes"] > 0


def test_memory_stats_report_the_pool_beside_the_session(path):
    engine = PagedEngine(path, block_size=8, num_blocks=16, max_rows=4, headroom=0.25)
    engine.add("m", [1, 2, 3, 4, 5], 4)
    engine.step()
    m = engine.memory_stats()
    per_block = 2 * CFG["layers"] * 8 * CFG["kv_heads"] * CFG["head_dim"] * 4
    assert m["kv_blocks"] == 16 and m["kv_blocks_used"] == 1 and m["kv_pool_bytes"] == 16 * per_block
    assert m["kv_used_bytes"] == per_block and m["kv_headroom"] == 0.25
    assert set(engine.model.session.memory_stats()) <= set(m)  # the session's counters beside them


def test_warm_up_keys_and_their_padding_runs_touch_only_the_scratch_block(path, lone):
    """What warm_up captures on CUDA, on the CPU: the keys (a decode run per bucket of rows, prompt-chunk
    runs per chunk length and few rows), and a run of padding rows only, which must leave every real
    block as it was (a capture's first run is eager) and the engine serving as before."""
    import torch

    from dynashape.paged.batch import padding_batch
    engine = PagedEngine(path, block_size=8, num_blocks=32, max_rows=16, token_budget=512, chunk=100, paged_kv=True)
    engine.chunk_multiple, engine.chunk_graphs = 64, True  # (CUDA's)
    keys = engine.warm_keys()
    assert [k for k in keys if k[1] == 1] == [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1)]
    assert [k for k in keys if k[1] > 1] == [(b, s) for s in (64, 128) for b in (1, 2, 4, 8)]
    engine.packed = True  # a step's rows (any bucket up to max_rows) over its tokens, up to a chunk and 64 more
    assert [k for k in engine.warm_keys() if k[1] > 1] == [(b, s) for s in (64, 128, 192) for b in (1, 2, 4, 8, 16)]
    engine.packed = False
    assert run_one(engine, "a", [3, 1, 4, 1, 5], 3, keep=True) == lone([3, 1, 4, 1, 5], 3)  # blocks held (parked)
    k, v = engine.pool.k.clone(), engine.pool.v.clone()
    for b, s, packed in [(1, 1, False), (4, 1, False), (2, 64, False), (4, 64, True)]:
        batch = padding_batch(engine.pool, b, s, engine.table_width, packed=packed)
        t = batch.tensors(engine.dev, engine._int, engine.io, scratch=engine.pool.scratch_slot)
        logits = engine.body(engine.request, batch, t, engine.dense(batch))
        assert logits.shape[:2] == (b, 1) and torch.isfinite(logits).all()
    real = engine.pool.num_blocks
    assert torch.equal(engine.pool.k[:, :real], k[:, :real]) and torch.equal(engine.pool.v[:, :real], v[:, :real])
    assert not torch.equal(engine.pool.k[:, real], k[:, real])  # the scratch block took the padding's keys
    assert run_one(engine, "b", [2, 7, 1, 8], 4) == lone([2, 7, 1, 8], 4)


def test_prompt_chunks_on_their_own_stream_hold_their_conversations_until_their_tokens_are_in(path, lone, monkeypatch):
    """The chunk stream's bookkeeping, on the CPU: a prompt chunk launched apart (the stand-in graphs; its
    tokens reported in only every other time they are asked for) keeps its conversation out of every
    plan until its commit, and never preempted; an abort meanwhile waits for that commit. The tokens
    stay the lone run's, every block comes back."""
    import dynashape.paged.engine as pe

    engine = PagedEngine(path, block_size=8, num_blocks=40, max_rows=8, token_budget=48, chunk=16, pad_rows=True,
                         paged_kv=True, overlap=True)
    engine.graphs, engine.chunk_graphs, engine.chunk_stream = Keys(engine), True, "stand-in"
    asked = []
    monkeypatch.setattr(pe, "ready", lambda inf: asked.append(1) or len(asked) % 2 == 0)
    plan, planned = engine.scheduler.plan, []

    def checked(held=frozenset()):
        p = plan(held=held)
        assert not {r.seq.key for r in p.rows} & set(held), "a held conversation was planned"
        assert not {q.key for q in p.preempted} & set(held), "a held conversation was preempted"
        planned.append(len(held))
        return p
    engine.scheduler.plan = checked
    arrivals = conversations(5, 10, 25)
    got = drive(engine, arrivals)
    for convs in arrivals.values():
        for key, prompt, max_new, _ in convs:
            assert got[key] == lone(prompt, max_new), key
    st = engine.stats()
    assert st["chunk_stream_runs"] > 0 and max(planned) > 0 and st["kv_blocks_used"] == 0 and not engine.held
    # an abort while the conversation's chunk is out (beside another's decode): its blocks stay until
    # that commit, then go
    engine.add("stays", [7, 8, 9], 12)
    got = [e.token for _ in range(3) for e in engine.step()]
    engine.add("gone", list(range(1, 30)), 5)
    got += [e.token for e in engine.step()]
    assert "gone" in engine.held and engine.abort("gone") and engine.pool.used_blocks > 0
    with pytest.raises(errors.InputError, match="'gone' is still leaving"):  # its blocks are not free yet
        engine.add("gone", [1, 2], 3)
    while not engine.idle:
        events = engine.step()
        assert all(e.key != "gone" for e in events)
        got += [e.token for e in events]
    assert got == lone([7, 8, 9], 12)
    assert engine.pool.used_blocks == 0 and not engine.abort_later and engine.stats()["aborted"] == 1


INTERPRETED_ENGINE = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
from dynashape.ops import paged_attention as pa
from dynashape.paged.engine import PagedEngine
from tests.models import llama
from tests.paged.test_engine import CFG, conversations, drive
for packed in (False, True):
    engine = PagedEngine(str(llama.model_path(CFG)), block_size=8, num_blocks=64, max_rows=8, token_budget=48,
                         chunk=16, paged_kv=True, packed=packed, overlap=True, pad_rows=True)
    got = drive(engine, conversations(0, 6, 15))
    print(packed, sorted(got.items()))
assert pa.COUNTS["paged_attention_torch"] == 0 and pa.COUNTS["paged_attention_triton"] > 0
"""


def test_the_engine_through_the_triton_kernels_interpreted_on_the_cpu(path, lone):
    # the attention as CUDA runs it (the decode and chunk kernels, packed rows too), in Triton's interpreter
    # on the CPU: every conversation's lone tokens (no triton in CI: skipped there; with a GPU the CUDA
    # tests run the compiled kernels instead)
    out = run_interpreted(INTERPRETED_ENGINE, timeout=600, ends_ok=False)
    want = sorted((key, lone(prompt, n)) for convs in conversations(0, 6, 15).values() for key, prompt, n, _ in convs)
    lines = out.strip().splitlines()
    assert lines == [f"{packed} {want}" for packed in (False, True)]
