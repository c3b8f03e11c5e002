"""dynashape.generate: onnxruntime-genai's Model / GeneratorParams / Generator over a decoder folder.

On the test Llama (tests/models/llama.py, random weights, KV inputs ``past_key_i``): greedy tokens
equal a reference loop over the torch module; sampling is reproducible by seed and top_k=1 is
greedy; rows end on their own EOS and then take the pad token; max_length stops the generation;
the logits processors follow transformers' definitions; genai_config.json and optimum-style folders
are read; the ``dynashape generate`` command streams the tokenizer's text of the greedy tokens."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from dynashape import errors
from dynashape.generate import Generator, GeneratorParams, Model, Tokenizer
from dynashape.generate.folder import read_folder
from dynashape.generate.generator import IDLE_MAX
from dynashape.generate.sampling import penalise_repeats, top_k_top_p
from tests.models import llama

CFG = llama.TINY
EOS_FREE = -1  # an id no model emits: EOS never ends a row


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An onnxruntime-genai-style folder: genai_config.json naming the decoder file."""
    d = tmp_path_factory.mktemp("genai")
    shutil.copy(llama.model_path(CFG), d / "decoder.onnx")
    (d / "genai_config.json").write_text(json.dumps({
        "model": {"decoder": {"filename": "decoder.onnx"}, "eos_token_id": [EOS_FREE], "pad_token_id": 0,
                  "context_length": 200},
        "search": {"max_length": 40, "do_sample": False}}))
    return d


def reference_greedy(prompt: np.ndarray, steps: int, cfg: dict = CFG, penalty: float = 1.0) -> np.ndarray:
    """Greedy tokens of the torch module: the prompt, then one token a step over its KV cache (the
    repetition penalty as transformers applies it; a mask of ones for a model that takes one)."""
    m = llama.build(cfg)
    b = prompt.shape[0]
    past = [torch.zeros(b, cfg["kv_heads"], 0, cfg["head_dim"]) for _ in range(2 * cfg["layers"])]
    ids, out = torch.from_numpy(prompt).long(), []
    seq = ids.clone()
    with torch.no_grad():
        for _ in range(steps):
            mask = [torch.ones(b, past[0].shape[2] + ids.shape[1], dtype=torch.int64)] if cfg.get("mask_input") else []
            res = m(ids, *mask, *past)
            logits = res[0][:, -1].clone()
            held = logits.gather(1, seq)
            logits.scatter_(1, seq, torch.where(held < 0, held * penalty, held / penalty))
            tok = logits.argmax(-1)
            out.append(tok.numpy())
            past, ids = list(res[1:]), tok[:, None]
            seq = torch.cat([seq, ids], 1)
    return np.stack(out, 1)


def prompt(batch: int, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, CFG["vocab"], (batch, n))


def generate(model, tokens, **search) -> Generator:
    p = GeneratorParams(model)
    p.set_search_options(**search)
    g = Generator(model, p)
    g.append_tokens(tokens)
    while not g.is_done():
        g.generate_next_token()
    return g


def test_greedy_tokens_equal_a_reference_loop_over_the_torch_module(folder, device):
    model = Model(folder, device=device)
    for batch, seed in ((1, 0), (3, 1)):
        p = prompt(batch, 5, seed)
        g = generate(model, p, max_length=5 + 24)
        want = reference_greedy(p, 24)
        for r in range(batch):
            np.testing.assert_array_equal(g.get_sequence(r), np.concatenate([p[r], want[r]]))
        np.testing.assert_array_equal(g.get_next_tokens(), want[:, -1])


def test_repetition_penalty_and_a_model_that_takes_a_mask_follow_the_reference(folder, device, tmp_path):
    model = Model(folder, device=device)
    p = prompt(2, 5, 6)
    g = generate(model, p, max_length=5 + 16, repetition_penalty=1.5)
    want = reference_greedy(p, 16, penalty=1.5)
    assert np.array_equal(np.stack([g.get_sequence(r)[5:] for r in range(2)]), want)
    masked = {**CFG, "mask_input": True}
    shutil.copy(llama.model_path(masked), tmp_path / "model.onnx")
    m2 = Model(tmp_path, device=device)
    assert m2.io.attention_mask == "attention_mask"
    g = generate(m2, p, max_length=5 + 16)
    assert np.array_equal(np.stack([g.get_sequence(r)[5:] for r in range(2)]), reference_greedy(p, 16, masked))


def test_sampling_is_reproducible_by_seed_and_top_k_1_is_greedy(folder, device):
    model = Model(folder, device=device)
    p = prompt(2, 4, 2)
    opts = dict(max_length=30, do_sample=True, top_k=50, top_p=0.9, temperature=1.3)
    a = generate(model, p, random_seed=7, **opts)
    b = generate(model, p, random_seed=7, **opts)
    c = generate(model, p, random_seed=8, **opts)
    seqs = [np.stack([g.get_sequence(r) for r in range(2)]) for g in (a, b, c)]
    np.testing.assert_array_equal(seqs[0], seqs[1])
    assert not np.array_equal(seqs[0], seqs[2])  # 26 draws from ~50 tokens each: the seeds part
    greedy = generate(model, p, max_length=30)
    one = generate(model, p, max_length=30, do_sample=True, top_k=1, random_seed=3)
    np.testing.assert_array_equal(np.stack([one.get_sequence(r) for r in range(2)]),
                                  np.stack([greedy.get_sequence(r) for r in range(2)]))


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_each_row_ends_on_its_own_eos_then_takes_the_pad_token(folder, device, graphs):
    # "on": steps run ahead of the token's read until row 0 ends, then wait for the read (the pad)
    model = Model(folder, device=device, decode_graphs=graphs, kv_bucket=16)
    p = prompt(2, 5, 3)
    want = reference_greedy(p, 20)
    eos = int(want[0, 6])  # row 0's 7th token ends it
    assert eos not in want[1, :8].tolist() and eos not in want[0, :6].tolist()
    model.config.eos = (eos,)
    g = Generator(model, GeneratorParams(model))
    g.params.set_search_options(max_length=5 + 20)
    g.append_tokens(p)
    steps = 0
    while not g.is_done():
        g.generate_next_token()
        steps += 1
    assert steps == 20  # row 1 runs on to max_length (unless it meets the EOS itself)
    row0 = g.get_sequence(0)[5:]
    np.testing.assert_array_equal(row0[:7], want[0, :7])
    assert (row0[7:] == 0).all()  # the pad token after its EOS
    assert g.get_sequence(1)[5:5 + 8].tolist() == want[1, :8].tolist()
    if graphs == "on":  # ahead from the first bound step until row 0's EOS
        assert 3 <= g.ahead_steps <= 7, g.ahead_steps
    model.config.eos = (EOS_FREE,)


def test_min_length_holds_eos_back(folder):
    model = Model(folder)
    p = prompt(1, 5, 3)
    want = reference_greedy(p, 8)
    model.config.eos = (int(want[0, 0]),)  # the first greedy token is the EOS
    try:
        g = generate(model, p, max_length=20)
        assert len(g.get_sequence(0)) == 6  # ended at once
        g = generate(model, p, max_length=20, min_length=10)
        assert g.get_sequence(0)[5] != want[0, 0] and len(g.get_sequence(0)) >= 10
    finally:
        model.config.eos = (EOS_FREE,)


def test_max_length_stops_and_a_step_after_the_end_is_a_typed_error(folder):
    model = Model(folder)
    g = generate(model, prompt(1, 6, 4), max_length=9)
    assert len(g.get_sequence(0)) == 9 and g.is_done()
    with pytest.raises(errors.GenerationError, match="done"):
        g.generate_next_token()
    with pytest.raises(errors.GenerationError, match="prompt"):
        Generator(model, GeneratorParams(model)).generate_next_token()
    with pytest.raises(errors.OptionsError, match="unknown option"):
        GeneratorParams(model).set_search_options(max_lenght=3)
    with pytest.raises(errors.InputError, match="attention_mask"):
        Generator(model, GeneratorParams(model)).append_tokens([[1, 2, 3], [4, 5]])


def append_mid_generation(model, before: int, after: int) -> tuple[np.ndarray, dict]:
    """The sequence of a generator given a prompt, ``before`` steps, two appended tokens, then
    ``after`` steps, and its request's stats."""
    g = Generator(model, GeneratorParams(model))
    g.append_tokens(prompt(1, 4, 5))
    for _ in range(before):
        g.generate_next_token()
    g.append_tokens(np.array([[11, 12]]))
    for _ in range(after):
        g.generate_next_token()
    return g.get_sequence(0), g.request.stats()


def continued_alone(model, seq: np.ndarray, steps: int) -> np.ndarray:
    """The sequence of a fresh generator given ``seq`` but its last ``steps`` tokens, then ``steps`` steps."""
    whole = Generator(model, GeneratorParams(model))
    whole.append_tokens(seq[None, :-steps])
    for _ in range(steps):
        whole.generate_next_token()
    return whole.get_sequence(0)


def test_append_tokens_after_steps_continues_the_cache(folder):
    """Tokens appended mid-generation join after the last chosen one, as one longer prompt would."""
    model = Model(folder)
    seq, _ = append_mid_generation(model, 3, 1)
    np.testing.assert_array_equal(continued_alone(model, seq, 1), seq)


def test_the_lean_step_serves_decode_steps_and_hands_the_kv_back_to_runs(folder, device, tmp_path):
    """With whole-step graphs (on CPU too with decode_graphs="on") a decode step after the first is
    served by the bound step (runtime/bound_step.py): no run, the KV kept in the step's storages.
    It declines at each bucket's end (kv_bucket=16: every 16 tokens), where a run takes the KV
    back as pasts and binds again, and for appended tokens; the tokens stay the reference's."""
    for cfg, path in ((CFG, folder), ({**CFG, "mask_input": True}, tmp_path)):
        if path is tmp_path:
            shutil.copy(llama.model_path(cfg), tmp_path / "model.onnx")
        model = Model(path, device=device, decode_graphs="on", kv_bucket=16)
        p = prompt(2, 5, 9)
        g = generate(model, p, max_length=5 + 40)
        want = reference_greedy(p, 40, cfg)
        assert np.array_equal(np.stack([g.get_sequence(r)[5:] for r in range(2)]), want)
        st = g.request.stats()
        assert st["decode_bound_steps"] >= 30, st
        assert g.ahead_steps >= 30  # each launched before the host read the token it runs on
        assert 2 <= st["decode_bound_declines"] <= 6, st  # bucket ends at 16, 32 and the first decode step
        assert st["decode_graph_replays"] >= st["decode_bound_steps"]
    # appended tokens after bound steps: a run serves them, over the KV the bound steps wrote
    model = Model(folder, device=device, decode_graphs="on", kv_bucket=16)
    seq, st = append_mid_generation(model, 6, 3)
    assert st["decode_bound_steps"] >= 4
    np.testing.assert_array_equal(continued_alone(Model(folder, device=device, decode_graphs="off"), seq, 3), seq)


def test_logits_processors_follow_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    pen = penalise_repeats(logits, torch.tensor([[0, 1]]), 2.0)
    torch.testing.assert_close(pen, torch.tensor([[1.0, -2.0, 0.5, 3.0]]))
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = top_k_top_p(probs, 0, 0.7).isfinite()  # 0.5 < 0.7, 0.5 + 0.3 reaches it: two kept
    assert kept.tolist() == [[True, True, False, False]]
    assert top_k_top_p(probs, 3, 1.0).isfinite().tolist() == [[True, True, True, False]]
    assert top_k_top_p(probs, 0, 0.1).isfinite().tolist() == [[True, False, False, False]]


def test_folders_of_both_exporters_are_read(folder, tmp_path):
    c = read_folder(folder)
    assert c.onnx_path.name == "decoder.onnx" and c.context_length == 200 and c.search["max_length"] == 40
    shutil.copy(folder / "decoder.onnx", tmp_path / "model.onnx")
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2, "pad_token_id": 1,
                                                      "max_position_embeddings": 128}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3], "do_sample": True,
                                                                 "top_p": 0.8}))
    o = read_folder(tmp_path)
    assert o.onnx_path.name == "model.onnx" and o.eos == (2, 3) and o.pad == 1 and o.context_length == 128
    assert o.search == {"do_sample": True, "top_p": 0.8}
    with pytest.raises(errors.InvalidModelError, match="no genai_config.json"):
        read_folder(tmp_path.parent)  # a folder with no model in it


def _word_tokenizer(path) -> None:
    from tokenizers import Tokenizer as HF
    from tokenizers.decoders import WordPiece  # joins words with spaces
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    vocab = {f"w{i}": i for i in range(CFG["vocab"])}
    tok = HF(WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.decoder = WordPiece(prefix="##")
    tok.save(str(path))


def test_the_generate_command_streams_the_greedy_text(folder, tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from dynashape.cli import main
    d = tmp_path / "m"
    shutil.copytree(folder, d)
    _word_tokenizer(d / "tokenizer.json")
    text = "w5 w17 w230 w9"
    ids = Tokenizer(d).encode(text)
    want = reference_greedy(ids[None].astype(np.int64), 12)[0]
    assert main(["generate", str(d), "--prompt", text, "--max-length", str(len(ids) + 12)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == Tokenizer(d).decode(want).strip()
    assert "tokens/s" in err


def test_a_finished_generator_lends_its_request_and_rebuilds_its_cache_if_asked_to_go_on(folder, device):
    """A model's next Generator takes the request of a finished one (the whole-step graphs its runs
    built come with it: no new build), or of a collected one; the finished one, asked to go on
    (append_tokens), rebuilds its cache from its tokens: its next tokens are a fresh generator's."""
    model = Model(folder, device=device, decode_graphs="on", kv_bucket=64)
    p1, p2 = prompt(1, 5, 21), prompt(1, 5, 22)
    g1 = generate(model, p1, max_length=30)
    req = g1.request
    builds = req.stats()["decode_graph_builds"]
    g2 = generate(model, p2, max_length=30)
    assert g2.request is req and g1.request is None
    assert req.stats()["decode_graph_builds"] == builds  # the graphs of the first generation served
    np.testing.assert_array_equal(g2.get_sequence(0)[5:], reference_greedy(p2, 25)[0])
    # g1 goes on: its cache is rebuilt from its 30 tokens, then the appended ones run
    g1.params.set_search_options(max_length=40)
    g1.append_tokens(np.array([[7, 8]]))
    for _ in range(3):
        g1.generate_next_token()
    seq = g1.get_sequence(0)
    fresh = Generator(model, GeneratorParams(model))
    fresh.params.set_search_options(max_length=40)
    fresh.append_tokens(seq[None, :-3])
    for _ in range(3):
        fresh.generate_next_token()
    np.testing.assert_array_equal(fresh.get_sequence(0), seq)
    # a collected generator's request is the next one's
    held = fresh.request
    del fresh
    import gc
    gc.collect()
    g3 = Generator(model, GeneratorParams(model))
    assert g3.request is held
    # the model keeps at most IDLE_MAX requests of collected generators (the rest let go)
    many = [Generator(model, GeneratorParams(model)) for _ in range(5)]
    del many, g3
    gc.collect()
    assert 1 <= len(model._idle) <= IDLE_MAX


def test_a_bad_device_name_is_the_session_s_typed_error(folder):
    # (Model asks whether the device is CUDA before the session exists: a name torch cannot read must
    # reach the session's check, not fail in torch first)
    with pytest.raises(errors.OptionsError, match="'gpu' is not a device name"):
        Model(folder, device="gpu")


def test_greedy_choice_on_the_cpu_is_torch_s_argmax_with_ties_and_nans():
    # the CPU form goes through numpy's argmax: the first index of the largest value, a NaN largest
    from dynashape.generate.sampling import greedy
    rng = np.random.default_rng(4)
    for rows, vocab in ((1, 32000), (3, 17), (5, 1000)):
        x = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32))
        x[0, 5] = x[0, 2] = x[0].max() + 1  # a tie: the first one wins
        if rows > 1:
            x[1, 7] = x[1, 3] = float("nan")  # NaNs: the first one wins
        got = greedy(x)
        assert got.dtype == torch.int64 and torch.equal(got, x.argmax(dim=1)), (got, x.argmax(dim=1))
        t = x.t().contiguous().t()  # a transposed view: the same choice
        assert torch.equal(greedy(t), t.argmax(dim=1))
