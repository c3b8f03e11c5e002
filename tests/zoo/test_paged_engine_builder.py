"""PagedEngine over the 2-layer int4 Llama of onnxruntime-genai's model builder (GroupQueryAttention:
right-padded pasts, each row's new position at its own length): conversations joining at random
steps, prompts in chunks, get the greedy tokens of their lone runs (dynashape.generate, whose tokens
tests/zoo/test_genai_int4_decode.py checks against onnxruntime-genai's). Heavy: the build needs
onnxruntime-genai (the zoo extra)."""

from __future__ import annotations

import numpy as np
import pytest

import dynashape.generate as G
from dynashape.paged.engine import PagedEngine
from tests.zoo.test_genai_int4_decode import genai_dir  # noqa: F401  (the module's fixture)

pytestmark = pytest.mark.heavy


def lone(model, prompt: list[int], steps: int) -> list[int]:
    params = G.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps)
    gen = G.Generator(model, params)
    gen.append_tokens(np.asarray([prompt]))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


@pytest.mark.parametrize("paged", [False, True], ids=["pasts-gathered", "pool-read-in-place"])
@pytest.mark.parametrize("seed", [0, 1])
def test_builder_conversations_at_random_steps_get_their_lone_tokens(genai_dir, seed, paged):  # noqa: F811
    # paged: GroupQueryAttention rewritten to PagedGroupQueryAttention (compile/paged_kv.py), continued
    # prompts batched with the others; with the overlap for seed 1
    model = G.Model(genai_dir)
    rng = np.random.default_rng(seed)
    convs = {f"c{i}": (rng.integers(1, 200, rng.integers(2, 30)).tolist(), int(rng.integers(3, 25))) for i in range(10)}
    arrive = {k: int(rng.integers(0, 10)) for k in convs}
    engine = (PagedEngine(genai_dir, block_size=16, num_blocks=64, max_rows=8, token_budget=64, chunk=16,
                          paged_kv=True, overlap=bool(seed)) if paged else
              PagedEngine(model, block_size=16, num_blocks=64, max_rows=8, token_budget=64, chunk=16))
    assert engine.convention == "gqa" and (engine.paged_refused is None) == paged, engine.paged_refused
    got: dict = {}
    step = 0
    while step < 12 or not engine.idle:
        for k, s in arrive.items():
            if s == step:
                engine.add(k, *convs[k], eos=model.config.eos)
                got[k] = []
        for e in engine.step():
            got[e.key].append(e.token)
        step += 1
    for k, (prompt, n) in convs.items():
        assert got[k] == lone(model, prompt, n), k
    assert engine.stats()["rows"] > engine.stats()["runs"]  # rows shared runs
