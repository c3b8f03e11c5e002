"""``dynashape serve``: options parsed and checked by loading the model (--dry-run starts nothing)."""

from __future__ import annotations

import pytest

from dynashape.cli import main
from dynashape.errors import OptionsError
from dynashape.serve.command import parse_pad
from tests.models import llama, transformers_models


def test_parse_pad():
    assert parse_pad(["input_ids=0", "x=1:-1.5"]) == {"input_ids": 0.0, "x": (1, -1.5)}
    for bad in ("input_ids", "=0", "a=b"):
        with pytest.raises(OptionsError, match="NAME=VALUE"):
            parse_pad([bad])


def test_dry_run_prints_the_policy(capsys):
    bert = str(transformers_models.model_path("bert"))
    assert main(["serve", bert, "--pad", "input_ids=0", "--mask", "attention_mask", "--replicas", "2",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "'batch' batched" in out and "'seq' padded to multiples of 16" in out and "'replicas': 2" in out
    assert main(["serve", str(llama.model_path()), "--dry-run"]) == 0
    assert "4 state pairs" in capsys.readouterr().out


def test_padding_without_mask_is_a_usage_error(capsys):
    bert = str(transformers_models.model_path("bert"))
    assert main(["serve", bert, "--pad", "input_ids=0", "--dry-run"]) == 2
    assert "needs mask=" in capsys.readouterr().err


def test_llm_dry_run_checks_the_decoder(capsys):
    path = str(llama.model_path({**llama.TINY, "mask_input": True, "position_ids": True}))
    assert main(["serve", path, "--llm", "--kv-blocks", "64", "--max-rows", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 layers, KV 2x16, the concat convention" in out and "'num_blocks': 64" in out and "'max_rows': 8" in out
    # a decoder that places its rotary by the past's length cannot batch rows: said before anything starts
    assert main(["serve", str(llama.model_path()), "--llm", "--dry-run"]) != 0
    assert "attention_mask" in capsys.readouterr().err


def test_llm_options_reach_the_engine():
    from types import SimpleNamespace

    from dynashape.serve.command import llm_options
    args = SimpleNamespace(replicas=1, cpus_per_replica=1.0, gpus_per_replica=0.0, block_size=16, max_rows=8,
                           kv_blocks=None, device=None, token_budget=256, prefill_budget=64, chunk_graphs=True)
    opts = llm_options(args)
    assert opts["token_budget"] == 256 and opts["prefill_budget"] == 64 and opts["chunk_graphs"] is True
    args.prefill_budget, args.chunk_graphs, args.token_budget = None, None, None
    opts = llm_options(args)
    assert "prefill_budget" not in opts and "chunk_graphs" not in opts and "token_budget" not in opts
