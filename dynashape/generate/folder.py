"""What a model folder says about its decoder: the ONNX file, its token/mask/position/KV inputs and
outputs (found by name, as the exporters write them), and the search defaults of its config."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidModelError

# the decoder files exporters write, in the order they are looked for
DECODER_FILES = ("model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx", "decoder_model.onnx")


@dataclass
class DecoderIO:
    """The decoder's inputs and outputs by role."""

    input_ids: str
    logits: str
    attention_mask: str | None = None
    position_ids: str | None = None
    use_cache_branch: str | None = None  # optimum's merged decoders: True once a past is fed
    past: list[str] = field(default_factory=list)     # KV inputs, in the graph's order
    present: list[str] = field(default_factory=list)  # the output that feeds each one next step
    kv_heads: int = 0
    head_dim: int = 0
    kv_type: str = "tensor(float)"  # onnxruntime's spelling of the KV inputs' element type


@dataclass
class FolderConfig:
    onnx_path: Path
    folder: Path | None
    eos: tuple[int, ...] = ()
    pad: int | None = None
    context_length: int | None = None
    search: dict = field(default_factory=dict)  # defaults for GeneratorParams
    kv_heads: int | None = None  # for a decoder whose KV inputs leave them symbolic
    head_dim: int | None = None


def read_folder(path: str | Path) -> FolderConfig:
    """The decoder file and the configuration of ``path`` (a folder or an .onnx file)."""
    p = Path(path)
    if p.is_file():
        return FolderConfig(p, p.parent, **_hf_config(p.parent))
    if not p.is_dir():
        raise InvalidModelError(f"model folder {str(p)!r}: no such file or folder")
    genai = p / "genai_config.json"
    if genai.exists():
        cfg = json.loads(genai.read_text())
        m = cfg.get("model", {})
        dec = m.get("decoder", {})
        onnx_path = p / dec.get("filename", "model.onnx")
        eos = m.get("eos_token_id", ())
        search = {k: v for k, v in cfg.get("search", {}).items() if k in SEARCH_KEYS}
        return FolderConfig(onnx_path, p, _ids(eos), m.get("pad_token_id"), m.get("context_length"), search,
                            dec.get("num_key_value_heads"), dec.get("head_size"))
    for name in DECODER_FILES:
        if (p / name).exists():
            return FolderConfig(p / name, p, **_hf_config(p))
    raise InvalidModelError(f"model folder {str(p)!r}: no genai_config.json and none of {', '.join(DECODER_FILES)}")


SEARCH_KEYS = ("max_length", "min_length", "do_sample", "top_k", "top_p", "temperature", "repetition_penalty",
               "random_seed")


def _ids(v) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else (int(v),)


def _hf_config(folder: Path) -> dict:
    """eos/pad/context length and search defaults from transformers' config.json and generation_config.json."""
    out: dict = {"search": {}}
    for name in ("config.json", "generation_config.json"):
        f = folder / name
        if not f.exists():
            continue
        c = json.loads(f.read_text())
        if c.get("eos_token_id") is not None:
            out["eos"] = _ids(c["eos_token_id"])
        if c.get("pad_token_id") is not None:
            out["pad"] = int(c["pad_token_id"])
        if c.get("max_position_embeddings"):
            out["context_length"] = int(c["max_position_embeddings"])
        heads = c.get("num_attention_heads")
        if heads:
            out["kv_heads"] = int(c.get("num_key_value_heads") or heads)
            out["head_dim"] = int(c.get("head_dim") or c["hidden_size"] // heads)
        if name == "generation_config.json":
            out["search"].update({k: v for k, v in c.items() if k in SEARCH_KEYS and k != "max_length"})
    return out


def decoder_io(inputs: list, outputs: list) -> DecoderIO:
    """The roles of the decoder's inputs and outputs (the session's NodeArgs), found by the names
    exporters use: ``input_ids``, ``attention_mask``, ``position_ids``, ``use_cache_branch``, and KV
    inputs named with ``past`` whose outputs are named with ``present`` (``past_key_values.3.key``
    -> ``present.3.key``, ``past_key_3`` -> ``present_key_3``)."""
    outs = [o.name for o in outputs]
    names = {v.name for v in inputs}
    if "input_ids" not in names:
        raise InvalidModelError(f"decoder: no input named 'input_ids' (inputs: {sorted(names)})")
    # (the paged engine's session takes a pool per past, "<past>.pool", and paged.* inputs: not pasts)
    past = [v for v in inputs if "past" in v.name and not v.name.startswith("paged.") and not v.name.endswith(".pool")]
    present = []
    for v in past:
        cands = [v.name.replace("past_key_values", "present"), v.name.replace("past", "present")]
        hit = next((c for c in cands if c in outs), None)
        if hit is None:
            raise InvalidModelError(f"decoder: past input {v.name!r} has no present output among {outs} "
                                    f"(looked for {cands})")
        present.append(hit)
    logits = "logits" if "logits" in outs else next((o for o in outs if o not in present), None)
    if logits is None:
        raise InvalidModelError(f"decoder: no logits output among {outs}")
    io = DecoderIO("input_ids", logits, past=[v.name for v in past], present=present)
    io.attention_mask = "attention_mask" if "attention_mask" in names else None
    io.position_ids = "position_ids" if "position_ids" in names else None
    io.use_cache_branch = "use_cache_branch" if "use_cache_branch" in names else None
    if past:
        dims = past[0].shape
        if len(dims) != 4:
            raise InvalidModelError(f"decoder: past input {past[0].name!r} should be [batch, heads, past, head_dim], "
                                    f"got rank {len(dims)}")
        fixed = [d if isinstance(d, int) else 0 for d in dims]  # 0: symbolic, the folder's config says
        io.kv_heads, io.head_dim, io.kv_type = fixed[1], fixed[3], past[0].type
    return io
