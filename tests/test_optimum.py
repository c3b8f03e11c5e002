"""dynashape.optimum.ORTModelForCausalLM: optimum's class over a folder as optimum exports it
(config.json, model.onnx), code unchanged beyond the import. On the test Llama (random weights):
generate's greedy tokens equal a greedy loop over the torch module, left-padded rows equal their
lone generations, max_new_tokens / max_length / eos / pad follow transformers' rules, and forward
with past_key_values continues a sequence as one longer call would."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from dynashape import errors
from dynashape.optimum import ORTModelForCausalLM
from tests.models import llama
from tests.test_generate import reference_greedy

MASKED = {**llama.TINY, "mask_input": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("optimum")
    shutil.copy(llama.model_path(MASKED), d / "model.onnx")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": 999_999, "pad_token_id": 0,
                                               "num_attention_heads": MASKED["heads"],
                                               "num_key_value_heads": MASKED["kv_heads"],
                                               "hidden_size": MASKED["heads"] * MASKED["head_dim"],
                                               "max_position_embeddings": 256}))
    return d


def _provider(device: str) -> str:
    return "CUDAExecutionProvider" if device.startswith("cuda") else "CPUExecutionProvider"


def test_generate_is_the_greedy_loop_of_the_torch_module(folder, device):
    model = ORTModelForCausalLM.from_pretrained(folder, provider=_provider(device))
    ids = torch.from_numpy(np.random.default_rng(0).integers(1, MASKED["vocab"], (2, 6)))
    out = model.generate(ids, max_new_tokens=12)
    assert out.shape == (2, 18) and out.device.type == torch.device(device).type
    np.testing.assert_array_equal(out[:, :6].cpu().numpy(), ids.numpy())
    np.testing.assert_array_equal(out[:, 6:].cpu().numpy(), reference_greedy(ids.numpy(), 12, MASKED))
    # max_length counts the input; transformers' default is 20 in all
    assert model.generate(ids, max_length=9).shape == (2, 9)
    assert model.generate(ids).shape == (2, 20)


def test_left_padded_rows_equal_their_lone_generations(folder, device):
    model = ORTModelForCausalLM.from_pretrained(folder, provider=_provider(device))
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, MASKED["vocab"], 7), rng.integers(1, MASKED["vocab"], 4)
    ids = torch.zeros(2, 7, dtype=torch.int64)
    mask = torch.zeros(2, 7, dtype=torch.int64)
    ids[0], mask[0] = torch.from_numpy(a), 1
    ids[1, 3:], mask[1, 3:] = torch.from_numpy(b), 1
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8).cpu()
    lone_a = model.generate(torch.from_numpy(a)[None], max_new_tokens=8).cpu()
    lone_b = model.generate(torch.from_numpy(b)[None], max_new_tokens=8).cpu()
    np.testing.assert_array_equal(out[0, 7:], lone_a[0, 7:])
    np.testing.assert_array_equal(out[1, 7:], lone_b[0, 4:])
    right = mask.flip(1)
    with pytest.raises(errors.InputError, match="left-padded"):
        model.generate(input_ids=ids, attention_mask=right, max_new_tokens=2)


def test_eos_ends_a_row_and_the_pad_token_follows(folder):
    model = ORTModelForCausalLM.from_pretrained(folder)
    ids = torch.from_numpy(np.random.default_rng(2).integers(1, MASKED["vocab"], (2, 5)))
    free = model.generate(ids, max_new_tokens=10)
    eos = int(free[0, 8])  # the fourth new token of row 0 (or an earlier one equal to it) ends it
    out = model.generate(ids, max_new_tokens=10, eos_token_id=eos, pad_token_id=7)
    row0 = out[0, 5:].tolist()
    cut = row0.index(eos)
    assert row0[:cut + 1] == free[0, 5:5 + cut + 1].tolist() and set(row0[cut + 1:]) <= {7}


def test_forward_with_past_key_values_continues_a_sequence(folder, device):
    model = ORTModelForCausalLM.from_pretrained(folder, provider=_provider(device))
    ids = torch.from_numpy(np.random.default_rng(3).integers(1, MASKED["vocab"], (1, 9))).to(device)
    whole = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    first = model(input_ids=ids[:, :6], attention_mask=torch.ones_like(ids[:, :6]))
    assert len(first.past_key_values) == MASKED["layers"] and first.past_key_values[0][0].shape[2] == 6
    rest = model(input_ids=ids[:, 6:], attention_mask=torch.ones_like(ids), past_key_values=first.past_key_values)
    torch.testing.assert_close(rest.logits, whole.logits[:, 6:], atol=2e-5, rtol=1e-4)
    logits, past = rest  # transformers' outputs unpack by position too
    assert logits is rest.logits and past is rest.past_key_values


def test_what_is_not_supported_is_a_typed_error(folder, tmp_path):
    with pytest.raises(errors.InputError, match="no such folder"):
        ORTModelForCausalLM.from_pretrained(tmp_path / "missing")
    model = ORTModelForCausalLM.from_pretrained(folder)
    with pytest.raises(errors.OptionsError, match="beam"):
        model.generate(torch.ones(1, 3, dtype=torch.int64), num_beams=4)
    with pytest.raises(errors.OptionsError, match="provider"):
        ORTModelForCausalLM.from_pretrained(folder, provider="ROCMExecutionProvider")
