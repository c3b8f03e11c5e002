"""optimum.onnxruntime's ``ORTModelForCausalLM`` over dynashape (issue 38): code written for optimum
runs with ``from dynashape.optimum import ORTModelForCausalLM`` in place of optimum's import.

``from_pretrained(folder)`` reads a folder as optimum exports it (config.json, model.onnx or
decoder_model_merged.onnx, generation_config.json); ``provider="CUDAExecutionProvider"`` (or
``.to("cuda")``) runs it on the GPU. ``model(input_ids, attention_mask, position_ids,
past_key_values)`` is one run of the decoder (optimum's ``forward``: the logits and the presents,
as one (key, value) pair a layer); ``generate(input_ids, attention_mask, max_new_tokens, ...)``
follows transformers' ``generate`` for greedy search and sampling (left-padded rows, per-row EOS
then the pad token, the input ids followed by the new ones) and runs through
``dynashape.generate``, whose decode steps replay the whole-step graphs on CUDA. Beam search and
logits processors given as objects are refused with a typed error.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from .errors import InputError, OptionsError
from .generate import Generator, GeneratorParams, Model
from .generate.generator import empty_past, positions

_PROVIDERS = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}


class CausalLMOutputWithPast:
    """transformers' output of a causal LM step: ``logits`` and ``past_key_values`` by name or by
    position."""

    def __init__(self, logits: torch.Tensor, past_key_values) -> None:
        self.logits, self.past_key_values = logits, past_key_values

    def __getitem__(self, i):
        return (self.logits, self.past_key_values)[i]


class ORTModelForCausalLM:
    main_input_name = "input_ids"

    def __init__(self, folder: Path, device: str, config, **session_options) -> None:
        self.folder, self.config, self._options = folder, config, session_options
        base = folder if folder.is_dir() else folder.parent
        g = base / "generation_config.json"
        self.generation_config = json.loads(g.read_text()) if g.exists() else {}
        self.model = Model(folder, device=device, **session_options)
        self.use_cache = bool(self.model.io.past)

    @classmethod
    def from_pretrained(cls, model_id, provider: str = "CPUExecutionProvider", session_options=None,
                        use_cache: bool = True, use_io_binding=None, file_name: str | None = None,
                        subfolder: str = "", **kwargs) -> ORTModelForCausalLM:
        """A model folder (optimum's export; a hub id needs the folder on disk). ``provider``: onnxruntime's
        name of the device; ``session_options``: a dynashape (or onnxruntime-shaped) SessionOptions."""
        folder = Path(model_id) / subfolder
        if not folder.exists():
            raise InputError(f"ORTModelForCausalLM.from_pretrained({str(model_id)!r}): no such folder (dynashape "
                             "reads exported folders from disk; it does not download)")
        if provider not in _PROVIDERS:
            raise OptionsError(f"provider={provider!r}: expected one of {sorted(_PROVIDERS)}")
        if not use_cache:
            raise OptionsError("use_cache=False: dynashape runs the decoder with its KV cache")
        path = folder / file_name if file_name else folder
        options = {} if session_options is None else {"sess_options": session_options}
        return cls(path, _PROVIDERS[provider], _config(folder), **options)

    # ---- optimum's attributes -----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.device

    def to(self, device) -> ORTModelForCausalLM:
        """The model on ``device`` ('cpu', 'cuda', 'cuda:1' or a torch.device)."""
        dev = torch.device(device)
        if dev != self.model.device:
            self.model = Model(self.folder, device=str(dev), **self._options)
        return self

    def can_generate(self) -> bool:
        return True

    # ---- one run of the decoder -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values=None, use_cache: bool = True,
                **kwargs) -> CausalLMOutputWithPast:
        """The logits [batch, n, vocab] of ``input_ids`` [batch, n] after the past, and the presents as
        one (key, value) pair a layer (transformers' legacy cache layout, as optimum returns it)."""
        io, dev = self.model.io, self.model.device
        ids = torch.as_tensor(input_ids).to(dev, torch.int64)
        b, n = ids.shape
        flat = [t for pair in past_key_values for t in pair] if past_key_values is not None else []
        if flat and len(flat) != len(io.past):
            raise InputError(f"past_key_values: {len(flat)} tensors, the decoder takes {len(io.past)}")
        if not flat:
            flat = empty_past(io, b, dev)
        past = flat[0].shape[2] if flat else 0
        mask = (torch.ones(b, past + n, dtype=torch.int64, device=dev) if attention_mask is None
                else torch.as_tensor(attention_mask).to(dev, torch.int64))
        feeds = {io.input_ids: ids}
        if io.attention_mask is not None:
            feeds[io.attention_mask] = mask
        if io.position_ids is not None:
            if position_ids is None:  # transformers' rule: the count of the mask's ones before, from 0
                position_ids = positions(mask)[:, -n:]
            feeds[io.position_ids] = torch.as_tensor(position_ids).to(dev, torch.int64)
        if io.use_cache_branch is not None:
            feeds[io.use_cache_branch] = torch.tensor([past > 0], device=dev)
        feeds.update(zip(io.past, (t.to(dev) for t in flat)))
        outs = dict(zip(self.model.output_names, self.model.session.run(None, feeds)))
        presents = [outs[name] for name in io.present]
        pairs = tuple(zip(presents[0::2], presents[1::2]))
        return CausalLMOutputWithPast(outs[io.logits], pairs)

    __call__ = forward

    # ---- transformers' generate ---------------------------------------------------------------------------
    def generate(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 generation_config=None, max_new_tokens: int | None = None, max_length: int | None = None,
                 min_new_tokens: int | None = None, min_length: int | None = None, do_sample: bool | None = None,
                 temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                 repetition_penalty: float | None = None, eos_token_id=None, pad_token_id: int | None = None,
                 num_beams: int = 1, seed: int | None = None, **kwargs) -> torch.Tensor:
        """The input ids followed by the new tokens, [batch, input length + new] (rows that ended on
        EOS take the pad token after it), as transformers' ``generate`` returns them."""
        if kwargs.get("inputs") is not None and input_ids is None:
            input_ids = kwargs.pop("inputs")
        bad = sorted(k for k, v in kwargs.items() if v is not None and k not in ("use_cache", "return_dict_in_generate",
                                                                               "output_scores"))
        if bad or num_beams != 1 or kwargs.get("return_dict_in_generate"):
            raise OptionsError(f"generate: {bad or 'beam search / return_dict_in_generate'} not supported "
                               "(greedy search or sampling, the token ids returned)")
        gc = _generation_defaults(self.config, self.generation_config)
        gc.update(_generation_defaults(SimpleNamespace(), generation_config, base=False))
        pick = {k: v for k, v in dict(max_new_tokens=max_new_tokens, max_length=max_length,
                                      min_new_tokens=min_new_tokens, min_length=min_length, do_sample=do_sample,
                                      temperature=temperature, top_k=top_k, top_p=top_p,
                                      repetition_penalty=repetition_penalty, eos_token_id=eos_token_id,
                                      pad_token_id=pad_token_id).items() if v is not None}
        gc.update(pick)
        ids = torch.as_tensor(input_ids).to(torch.int64).cpu()
        if ids.dim() == 1:
            ids = ids[None]
        n_in = ids.shape[1]
        rows = _rows(ids, attention_mask)
        limit = n_in + int(gc["max_new_tokens"]) if gc.get("max_new_tokens") is not None else int(gc["max_length"])
        params = GeneratorParams(self.model)
        search = dict(max_length=limit, do_sample=bool(gc.get("do_sample", False)),
                      temperature=float(gc.get("temperature", 1.0)), top_k=int(gc.get("top_k", 50)),
                      top_p=float(gc.get("top_p", 1.0)), repetition_penalty=float(gc.get("repetition_penalty", 1.0)),
                      min_length=(n_in + int(gc["min_new_tokens"])) if gc.get("min_new_tokens") is not None
                      else int(gc.get("min_length", 0)))
        if seed is not None:
            search["random_seed"] = int(seed)
        params.set_search_options(**search)
        gen = Generator(self.model, params)
        eos = gc.get("eos_token_id")
        if eos is not None:
            gen.eos = frozenset(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
        if gc.get("pad_token_id") is not None:
            gen.pad = int(gc["pad_token_id"])
        if limit <= n_in:
            return ids.to(self.device)
        gen.append_tokens(rows)
        while not gen.is_done():
            gen.generate_next_token()
        new = torch.from_numpy(gen.host[:, n_in:gen.length].copy())
        return torch.cat([ids, new], 1).to(self.device)


def _rows(ids: torch.Tensor, attention_mask) -> list | np.ndarray:
    """The prompt rows: the ids as they are, or, with zeros in the mask, each row without its left
    padding (the generator pads them again)."""
    if attention_mask is None:
        return ids.numpy()
    mask = torch.as_tensor(attention_mask).to(torch.int64).cpu()
    if mask.shape != ids.shape:
        raise InputError(f"attention_mask: shape {tuple(mask.shape)}, input_ids {tuple(ids.shape)}")
    if bool(mask.all()):
        return ids.numpy()
    rows = []
    for r in range(ids.shape[0]):
        m = mask[r].numpy().astype(bool)
        first = int(m.argmax()) if m.any() else len(m)
        if not m[first:].all():
            raise InputError(f"attention_mask: row {r} is not left-padded (a 0 after a 1); pad on the left "
                             "(tokenizer.padding_side = 'left') as transformers' generate expects")
        rows.append(ids[r, first:].numpy())
    return rows


def _config(folder: Path):
    """config.json as attributes (transformers' PretrainedConfig where transformers is installed)."""
    try:
        from transformers import AutoConfig
        return AutoConfig.from_pretrained(str(folder))
    except Exception:  # noqa: BLE001  no transformers, or a config it does not know: the plain fields
        f = folder / "config.json"
        return SimpleNamespace(**(json.loads(f.read_text()) if f.exists() else {}))


def _generation_defaults(config, generation_config, base: bool = True) -> dict:
    """transformers' defaults (max_length 20, greedy; ``base``), then the config's eos and pad,
    then ``generation_config`` (a GenerationConfig or the folder's generation_config.json)."""
    out = {"max_length": 20, "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
           "repetition_penalty": 1.0, "min_length": 0} if base else {}
    known = ("max_length", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "min_length",
             "eos_token_id", "pad_token_id", "max_new_tokens", "min_new_tokens")
    for k in ("eos_token_id", "pad_token_id"):
        v = getattr(config, k, None)
        if v is not None:
            out[k] = v
    if generation_config:
        items = generation_config.to_dict() if hasattr(generation_config, "to_dict") else dict(generation_config)
        out.update({k: v for k, v in items.items() if v is not None and k in known})
    return out
