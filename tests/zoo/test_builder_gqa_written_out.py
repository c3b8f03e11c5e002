"""onnxruntime-genai's model builder's Llama, Qwen2 and Phi-3 (float32, 2 layers, random weights) with
GroupQueryAttention written out (gqa_as_concat, dynashape.generate's default on CUDA): accepted for
each architecture, its decode steps run as the whole-step function (decode_graphs='on': the CPU runs
the same logic without a graph), and its greedy tokens equal the op kept's for 40 steps. Heavy: the
builds need onnxruntime-genai (the zoo extra)."""

from __future__ import annotations

import numpy as np
import pytest

import dynashape.generate as dg
from tests.zoo.conftest import load_generator, run_builder

pytestmark = pytest.mark.heavy


def _build(tmp, arch: str):
    for pkg in ("onnxruntime_genai", "transformers", "tokenizers"):
        pytest.importorskip(pkg, reason=f"{pkg} (the zoo extra) builds this model")
    load_generator().make_llama_checkpoint(tmp / "hf", arch)
    return run_builder(tmp, "fp32")


def _greedy(model, steps: int = 40):
    params = dg.GeneratorParams(model)
    n = 8 + steps
    params.set_search_options(max_length=n, min_length=n)
    gen = dg.Generator(model, params)
    gen.append_tokens(np.arange(5, 13)[None])
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out, gen.request.stats()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "phi3"])
def test_builder_models_step_written_out_with_the_op_s_tokens(tmp_path, arch):
    folder = str(_build(tmp_path, arch))
    want, _ = _greedy(dg.Model(folder))
    got, stats = _greedy(dg.Model(folder, gqa_as_concat=True, decode_graphs="on"))
    assert stats["gqa_as_concat"] == "rewritten"
    assert stats["decode_graph_replays"] >= 35, stats
    assert got == want
