"""Tiny GPT-2 and BERT from transformers configs, random weights, exported with torch.onnx (dynamo).

Nothing is downloaded: the models are built from configs and seeded. Both export with a dynamic
batch (1..64) and sequence (1..128). GPT-2 takes ``input_ids``; BERT takes ``input_ids`` and
``attention_mask``. Files are cached under ``.cache/models`` (see ``cache.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from .cache import cached

MAX_BATCH, MAX_SEQ = 64, 128
TINY = dict(layers=2, hidden=64, heads=4, vocab=1000, max_positions=128, seed=0)


class GPT2Wrapper(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids, use_cache=False, return_dict=False)[0]


class BertWrapper(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids, attention_mask=attention_mask, return_dict=False)
        return out[0], out[1]


def build_gpt2(cfg: dict = TINY) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(cfg["seed"])
    config = GPT2Config(n_layer=cfg["layers"], n_embd=cfg["hidden"], n_head=cfg["heads"],
                        vocab_size=cfg["vocab"], n_positions=cfg["max_positions"])
    return GPT2Wrapper(GPT2Model(config)).eval()


def build_bert(cfg: dict = TINY) -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(cfg["seed"])
    config = BertConfig(num_hidden_layers=cfg["layers"], hidden_size=cfg["hidden"],
                        num_attention_heads=cfg["heads"], intermediate_size=4 * cfg["hidden"],
                        vocab_size=cfg["vocab"], max_position_embeddings=cfg["max_positions"])
    return BertWrapper(BertModel(config)).eval()


MODELS = {
    # name: (builder, input names, output names)
    "gpt2": (build_gpt2, ["input_ids"], ["last_hidden_state"]),
    "bert": (build_bert, ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"]),
}


def export(name: str, path: Path, cfg: dict = TINY) -> None:
    build, inputs, outputs = MODELS[name]
    model = build(cfg)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    seq = torch.export.Dim("seq", min=1, max=MAX_SEQ)
    b, s = 2, 7  # example sizes that are neither 0 nor 1, so the export does not specialise them
    args = (torch.randint(0, cfg["vocab"], (b, s)),)
    if "attention_mask" in inputs:
        args += (torch.ones(b, s, dtype=torch.int64),)
    dynamic_shapes = {n: {0: batch, 1: seq} for n in inputs}
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), dynamo=True, dynamic_shapes=dynamic_shapes,
                          input_names=inputs, output_names=outputs, external_data=False)


def model_path(name: str, cfg: dict = TINY) -> Path:
    """The exported model, from the cache or exported now."""
    config = {"model": name, **cfg, "max_batch": MAX_BATCH, "max_seq": MAX_SEQ}
    return cached(f"hf-{name}", config, lambda p: export(name, p, cfg), module=sys.modules[__name__])
