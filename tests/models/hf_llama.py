"""A tiny Llama from transformers (``LlamaForCausalLM`` from a config, random weights), with its
KV cache as inputs and outputs and an ``attention_mask``, exported by torch.onnx (dynamo).

This is how a user's export of an HF decoder looks: transformers builds the causal and padding
mask itself (in transformers 5 by gathering ``attention_mask[batch, key]`` over a Range of the
keys), repeats the KV heads for grouped-query attention, and runs SDPA; the mask's length is its
own dim ``total``. Inputs: ``input_ids`` [batch, seq], ``attention_mask`` [batch, total],
``past_{key,value}_i`` [batch, kv_heads, past, head_dim]; outputs ``logits`` and
``present_{key,value}_i``. Nothing is downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from .cache import cached

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=1000, seed=0)


def head_dim(cfg: dict = TINY) -> int:
    return cfg["hidden"] // cfg["heads"]


class WithCache(torch.nn.Module):
    """``forward(input_ids, attention_mask, *past) -> (logits, *presents)`` over a DynamicCache."""

    def __init__(self, model, layers: int) -> None:
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, attention_mask, *past):
        from transformers.cache_utils import DynamicCache

        try:
            cache = DynamicCache(config=self.model.config)
        except TypeError:  # transformers 4
            cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
        pk, res = out.past_key_values, [out.logits]
        for i in range(self.layers):
            if hasattr(pk, "layers"):
                res += [pk.layers[i].keys, pk.layers[i].values]
            else:  # transformers 4
                res += [pk.key_cache[i], pk.value_cache[i]]
        return tuple(res)


def build(cfg: dict = TINY) -> WithCache:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg["seed"])
    config = LlamaConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
                         num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                         num_key_value_heads=cfg["kv_heads"], max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norm weights, as a trained model has
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return WithCache(model, cfg["layers"]).eval()


def input_names(cfg: dict = TINY) -> list[str]:
    return ["input_ids", "attention_mask"] + [f"past_{k}_{i}" for i in range(cfg["layers"]) for k in ("key", "value")]


def output_names(cfg: dict = TINY) -> list[str]:
    return ["logits"] + [f"present_{k}_{i}" for i in range(cfg["layers"]) for k in ("key", "value")]


def export(path: Path, cfg: dict = TINY) -> None:
    model = build(cfg)
    b, s, p = 2, 3, 5
    ids = torch.randint(0, cfg["vocab"], (b, s))
    mask = torch.ones(b, p + s, dtype=torch.int64)
    past = [torch.randn(b, cfg["kv_heads"], p, head_dim(cfg)) for _ in range(2 * cfg["layers"])]
    dim = torch.export.Dim
    batch, seq = dim("batch", min=1, max=16), dim("seq", min=1, max=64)
    past_len, total = dim("past", min=1, max=256), dim("total", min=2, max=320)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: total},
              "past": tuple({0: batch, 2: past_len} for _ in range(2 * cfg["layers"]))}
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask, *past), str(path), dynamo=True, dynamic_shapes=shapes,
                          input_names=input_names(cfg), output_names=output_names(cfg), external_data=False)


def model_path(cfg: dict = TINY) -> Path:
    return cached("hf_llama", cfg, lambda p: export(p, cfg), module=sys.modules[__name__])
