"""A small Llama-style decoder with an explicit KV cache, exported with torch.onnx (dynamo).

Per layer: RMSNorm -> attention with rotary position embeddings and grouped-query attention
(4 query heads sharing 2 key/value heads, head dim 16) -> residual -> RMSNorm -> SwiGLU MLP ->
residual; then a final RMSNorm and the LM head.

Inputs: ``input_ids`` [batch, seq] and, per layer i, ``past_key_i`` / ``past_value_i``
[batch, kv_heads, past_len, head_dim]. Positions run from past_len to past_len + seq - 1.
Outputs: ``logits`` [batch, seq, vocab] and ``present_key_i`` / ``present_value_i``
[batch, kv_heads, past_len + seq, head_dim] (the past with this step's keys / values appended).
Query t of this step sees keys 0 .. past_len + t (causal also across a multi-token step).
``mask_input``: an ``attention_mask`` [batch, past_len + seq] input (optimum's decoders);
``position_ids`` (with it): a ``position_ids`` [batch, seq] input that places the rotary per row,
as HF's exports take it (what a batch of rows of different lengths needs: dynashape/paged/engine.py).
past_len is dynamic from 0 (an empty cache for the prefill step) to MAX_PAST.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from .cache import cached

MAX_BATCH, MAX_SEQ, MAX_PAST = 16, 64, 256
TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=1000,
            rope_theta=10000.0, eps=1e-5, seed=0)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
        h = cfg["hidden"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin, mask, past_k, past_v):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        groups = self.heads // self.kv_heads
        kk = k.repeat_interleave(groups, dim=1)
        vv = v.repeat_interleave(groups, dim=1)
        scores = q @ kk.transpose(-1, -2) / (self.head_dim ** 0.5)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:  # HF's additive mask: 0 where a key is seen, the dtype's lowest value where not
            scores = scores + mask
        out = torch.softmax(scores, dim=-1) @ vv
        out = out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg["hidden"], cfg["ffn"], bias=False)
        self.up = nn.Linear(cfg["hidden"], cfg["ffn"], bias=False)
        self.down = nn.Linear(cfg["ffn"], cfg["hidden"], bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg["hidden"], cfg["eps"])
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg["hidden"], cfg["eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past_k, past_v):
        a, k, v = self.attn(self.attn_norm(x), cos, sin, mask, past_k, past_v)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), k, v


class Llama(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg["vocab"], cfg["hidden"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["layers"]))
        self.norm = RMSNorm(cfg["hidden"], cfg["eps"])
        self.lm_head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)
        d = cfg["head_dim"]
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # non-trivial norm weights so that a norm that drops its scale is caught
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, RMSNorm):
                    m.weight.uniform_(0.5, 1.5)

    def forward(self, input_ids, *past):
        if self.cfg.get("mask_input"):
            attention_mask, past = past[0], past[1:]
        if self.cfg.get("position_ids"):
            position_ids, past = past[0], past[1:]
        s = input_ids.shape[1]
        p = past[0].shape[2]
        pos = torch.arange(s, device=input_ids.device) + p  # [s]: this step's places in the cache
        if self.cfg.get("position_ids"):  # rotary at the caller's positions, per row (HF's position_ids)
            freqs = position_ids[:, None, :, None].float() * self.inv_freq  # [b, 1, s, d/2]
        else:
            freqs = (pos[:, None].float() * self.inv_freq[None, :])[None, None]  # [1, 1, s, d/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        x = self.embed(input_ids)
        # rotary angles in fp32 (as HF computes them), applied in the model's dtype
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)  # [1 or b, 1, s, d]
        kpos = torch.arange(p + s, device=input_ids.device)
        mask = (kpos[None, :] <= pos[:, None])[None, None]  # [1, 1, s, p + s]
        if self.cfg.get("mask_input"):
            # as HF's exports (optimum's decoders) take it: attention_mask [batch, p + s], 1 for a
            # token, 0 for padding; made an additive [batch, 1, s, p + s] mask with the lowest value
            keep = mask & attention_mask[:, None, None, :].bool()
            mask = torch.zeros(keep.shape, dtype=x.dtype, device=x.device).masked_fill(~keep, torch.finfo(x.dtype).min)
        presents = []
        for i, layer in enumerate(self.layers):
            x, k, v = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            presents += [k, v]
        return (self.lm_head(self.norm(x)), *presents)


def input_names(cfg: dict = TINY) -> list[str]:
    names = ["input_ids"] + (["attention_mask"] if cfg.get("mask_input") else [])
    names += ["position_ids"] if cfg.get("position_ids") else []
    for i in range(cfg["layers"]):
        names += [f"past_key_{i}", f"past_value_{i}"]
    return names


def output_names(cfg: dict = TINY) -> list[str]:
    names = ["logits"]
    for i in range(cfg["layers"]):
        names += [f"present_key_{i}", f"present_value_{i}"]
    return names


def dtype_of(cfg: dict) -> torch.dtype:
    """The weights' dtype (``cfg["dtype"]``: 'float32', the default, 'float16' or 'bfloat16')."""
    return getattr(torch, cfg.get("dtype", "float32"))


def build(cfg: dict = TINY) -> Llama:
    torch.manual_seed(cfg["seed"])
    model = Llama(cfg).eval()
    for p in model.parameters():  # the rotary frequencies stay fp32
        p.data = p.data.to(dtype_of(cfg))
    return model


def example_args(cfg: dict = TINY, batch: int = 2, seq: int = 3, past: int = 5) -> tuple:
    ids = torch.randint(0, cfg["vocab"], (batch, seq))
    kv = [torch.randn(batch, cfg["kv_heads"], past, cfg["head_dim"]).to(dtype_of(cfg))
          for _ in range(2 * cfg["layers"])]
    mask = [torch.ones(batch, past + seq, dtype=torch.int64)] if cfg.get("mask_input") else []
    pos = [torch.arange(past, past + seq).repeat(batch, 1)] if cfg.get("position_ids") else []
    return (ids, *mask, *pos, *kv)


def export(path: Path, cfg: dict = TINY) -> None:
    model = build(cfg)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    seq = torch.export.Dim("seq", min=1, max=MAX_SEQ)
    past = torch.export.Dim("past", min=0, max=MAX_PAST)
    names = input_names(cfg)
    # forward(input_ids, *past): the var-positional ``past`` takes one spec per tensor
    kv = tuple({0: batch, 2: past} for _ in range(2 * cfg["layers"]))
    if cfg.get("mask_input"):  # the mask's length is its own dim, as in optimum's exports
        first = ({0: batch, 1: torch.export.Dim("total", min=1, max=MAX_PAST + MAX_SEQ)},)
        if cfg.get("position_ids"):  # [batch, seq], as optimum's decoders take them
            first += ({0: batch, 1: seq},)
        kv = first + kv
    dynamic_shapes = {"input_ids": {0: batch, 1: seq}, "past": kv}
    with torch.no_grad():
        torch.onnx.export(model, example_args(cfg), str(path), dynamo=True, dynamic_shapes=dynamic_shapes,
                          input_names=names, output_names=output_names(cfg), external_data=False)


def model_path(cfg: dict = TINY) -> Path:
    config = {**cfg, "max_batch": MAX_BATCH, "max_seq": MAX_SEQ, "max_past": MAX_PAST}
    return cached("llama", config, lambda p: export(p, cfg), module=sys.modules[__name__])
