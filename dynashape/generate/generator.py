"""Model, GeneratorParams and Generator in the shape of onnxruntime-genai's Python API.

A Generator owns one request of the model's session (its own arena and KV storage), the tokens so
far and the KV tensors on the session's device. ``append_tokens`` runs the prompt; each
``generate_next_token`` runs the model on the token chosen last (lazily: none is run after the
last token) and chooses the next on the device (``sampling.py``). Rows of a batch finish on their
own EOS and then take the pad token; the generation is done when every row is, or at max_length.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from ..errors import GenerationError, InputError, InvalidModelError, OptionsError
from .folder import SEARCH_KEYS, decoder_io, read_folder
from .sampling import next_tokens

KV_DTYPES = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}
DEFAULT_MAX_LENGTH = 2048
IDLE_MAX = 2  # requests of collected generators a Model keeps for its next ones


def empty_past(io, batch: int, device) -> list[torch.Tensor]:
    """The KV inputs of a first run: ``batch`` rows of no positions, in the decoder's KV type."""
    kv = KV_DTYPES.get(io.kv_type, torch.float32)
    return [torch.zeros(batch, io.kv_heads, 0, io.head_dim, dtype=kv, device=device) for _ in io.past]


def _is_cuda(device) -> bool:
    """Whether ``device`` names a CUDA device (anything else, a bad name included, is the session's to judge)."""
    try:
        return device is not None and torch.device(device).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of an attention mask, as transformers makes them: the count of ones before,
    from 0 (left padding stays at 0)."""
    return (mask.cumsum(1) - 1).clamp_(min=0)


class Model:
    """A decoder folder (onnxruntime-genai's builder, optimum) or .onnx file on ``device``;
    ``session_options`` go to dynashape.InferenceSession."""

    def __init__(self, path, device: str | None = None, **session_options) -> None:
        from ..api import InferenceSession

        self.config = read_folder(path)
        self.folder = self.config.folder
        if "gqa_as_concat" not in session_options and _is_cuda(device):
            # GroupQueryAttention written out, so that the steps run as whole-step CUDA graphs
            # (frontend/gqa_concat.py); its padded rows then follow the left padding made here. The CPU
            # keeps the op, whose kernel gives onnxruntime's bits (tests/zoo/test_genai_int4_decode.py)
            session_options["gqa_as_concat"] = True
        self.session = InferenceSession(str(self.config.onnx_path), device=device, **session_options)
        self.io = decoder_io(self.session.get_inputs(), self.session.get_outputs())
        if self.io.past and not (self.io.kv_heads and self.io.head_dim):  # symbolic in the graph: the config's
            self.io.kv_heads = self.io.kv_heads or self.config.kv_heads or 0
            self.io.head_dim = self.io.head_dim or self.config.head_dim or 0
            if not (self.io.kv_heads and self.io.head_dim):
                raise InvalidModelError(f"decoder: {self.io.past[0]!r} leaves its heads or head size symbolic and "
                                        "the folder's config does not give them (num_key_value_heads, head_size)")
        self.device = self.session.device
        self.output_names = [o.name for o in self.session.get_outputs()]
        # rows of unequal length: left-padded under the mask (HF's convention), but right-padded for
        # onnxruntime's GroupQueryAttention kept as it is, which places a row's tokens from its start and its
        # next one at its length (seqlens_k, the mask's count): there a left-padded row's attention read pads
        self.pad_right = any(n.op_type == "GroupQueryAttention" for n in self.session.program.graph.nodes)
        # requests the next Generators take over (see Generator.__init__): those of generators that
        # were collected, and finished generators that lend theirs
        self._lock = threading.Lock()
        self._idle: list = []
        self._lent: list = []  # weak references to finished generators holding a request

    def _request(self):
        """A request for a new generator: an idle one, else a finished generator's (which gives up
        its cache: it rebuilds it from its tokens if it is asked to go on), else a new one. A
        request keeps what its runs built (the whole-step graphs of each batch size and bucket),
        so a model's second generation starts on graphs the first captured."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            while self._lent:
                g = self._lent.pop()()
                if g is not None and g._lending:
                    return g._give_request()
        return self.session.create_infer_request()

    def _return(self, request) -> None:
        """A collected generator's request, kept for the next one; beyond IDLE_MAX kept, it is let go
        (its buffers and KV storages with it)."""
        with self._lock:
            if len(self._idle) < IDLE_MAX:
                self._idle.append(request)

    @property
    def device_type(self) -> str:
        return self.device.type


class GeneratorParams:
    def __init__(self, model: Model) -> None:
        self.model = model
        c = model.config
        self.search = {"max_length": c.context_length or DEFAULT_MAX_LENGTH, "min_length": 0, "do_sample": False,
                       "top_k": 50, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.0,
                       "random_seed": -1}
        self.set_search_options(**c.search)

    def set_search_options(self, **options) -> None:
        bad = sorted(set(options) - set(SEARCH_KEYS) - {"batch_size", "num_beams", "past_present_share_buffer"})
        if bad:
            raise OptionsError(f"set_search_options: unknown option(s) {bad}; known: {list(SEARCH_KEYS)}")
        if options.get("num_beams", 1) != 1:
            raise OptionsError("set_search_options: beam search (num_beams > 1) is not supported; greedy or sampling")
        options = {k: v for k, v in options.items() if k in SEARCH_KEYS}
        for k in ("temperature", "repetition_penalty"):
            if k in options and not float(options[k]) > 0:
                raise OptionsError(f"set_search_options: {k} must be > 0, got {options[k]}")
        if "top_p" in options and not 0 < float(options["top_p"]) <= 1:
            raise OptionsError(f"set_search_options: top_p must be in (0, 1], got {options['top_p']}")
        self.search.update(options)

    @property
    def search_options(self) -> dict:
        return dict(self.search)


class Generator:
    def __init__(self, model: Model, params: GeneratorParams) -> None:
        self.model, self.params, self.io = model, params, model.io
        self.request = model._request()
        self._lending = False  # finished, and its request offered to the model's next generator
        # the request goes back to the model when this generator is collected (the holder below
        # is what the finalizer reads: a generator that gave its request away empties it)
        self._holder = [self.request]
        weakref.finalize(self, _give_back, model, self._holder)
        self.dev = model.device
        # every token so far on the host (the caller reads each one anyway), padding included
        self.host = np.zeros((0, 0), dtype=np.int64)
        self.host_mask = np.zeros((0, 0), dtype=bool)  # False for padding
        self.length = 0
        self.started = False
        # on the device, made where the model or the search needs them: the attention mask and the
        # positions (buffers of max_length columns, rebuilt only when tokens are appended), the tokens
        # for the repetition penalty
        self._mask_dev: torch.Tensor | None = None
        self._pos_dev: torch.Tensor | None = None
        self._seq_dev: torch.Tensor | None = None
        self._pending: torch.Tensor | None = None  # the tokens chosen last, not yet run
        self.past: list[torch.Tensor] = []
        self._branch: tuple | None = None  # optimum's use_cache_branch values on the device
        self.bound = None  # the lean step (runtime/bound_step.py) while the last run was a whole-step graph's
        self.fed = 0  # tokens the KV cache holds
        self.logits: torch.Tensor | None = None  # [batch, vocab] after the last token run, None until run
        self._tok_host: torch.Tensor | None = None  # pinned: the chosen tokens read while the next step runs
        self._tok_read = None
        self.ahead_steps = 0  # steps launched before the host read the token they run on
        s = params.search
        seed = int(s["random_seed"])
        self.rng = torch.Generator(device=self.dev)
        self.rng.manual_seed(seed if seed >= 0 else int(torch.randint(0, 2**62, (1,))))
        self.eos = frozenset(model.config.eos)
        pad = model.config.pad
        self.pad = pad if pad is not None else (model.config.eos[0] if model.config.eos else 0)
        self.last = np.zeros(0, dtype=np.int64)  # the tokens chosen last
        self.done_rows = np.zeros(0, dtype=bool)

    # ---- the prompt and appended tokens ----------------------------------------------------------
    def append_tokens(self, tokens) -> None:
        """Tokens for every row ([batch, n], or [n] for one row; rows of unequal length as a list are
        padded, which needs the model's attention_mask: on the left, or on the right for a model that keeps
        onnxruntime's GroupQueryAttention, ``Model.pad_right``); they are run now."""
        ids, mask = self._rows(tokens)
        b, n = ids.shape
        if not self.started:
            self.started = True
            self.done_rows = np.zeros(b, dtype=bool)
            self.host = np.full((b, 0), self.pad, dtype=np.int64)
            self.host_mask = np.zeros((b, 0), dtype=bool)
            self.past = empty_past(self.io, b, self.dev)
        elif b != self.host.shape[0]:
            raise InputError(f"append_tokens: {b} rows, the generator has {self.host.shape[0]}")
        elif self._pending is not None:
            self._run(self._pending)  # the last chosen token joins the cache first
        self._put(ids, mask)
        self._run(torch.from_numpy(ids).to(self.dev))

    def _put(self, ids: np.ndarray, mask: np.ndarray) -> None:
        """``ids`` written after the tokens so far; the device's mask and positions made again."""
        b, n = ids.shape
        have, cap = self.length, int(self.params.search["max_length"])
        if have + n > cap:
            raise GenerationError(f"the sequence would be {have + n} tokens, max_length is {cap}")
        if self.host.shape[1] < cap:  # first, or max_length raised since
            grown = np.full((b, cap), self.pad, dtype=np.int64)
            grown_mask = np.ones((b, cap), dtype=bool)  # tokens chosen later are never padding
            grown[:, :have], grown_mask[:, :have] = self.host[:, :have], self.host_mask[:, :have]
            self.host, self.host_mask = grown, grown_mask
        self.host[:, have:have + n], self.host_mask[:, have:have + n] = ids, mask
        self.length = have + n
        if self.io.attention_mask is not None or self.io.position_ids is not None:
            m = torch.from_numpy(self.host_mask.astype(np.int64))
            self._mask_dev = m.to(self.dev)
            self._pos_dev = positions(m).to(self.dev)
        if self._seq_dev is not None:
            self._seq_dev = torch.from_numpy(self.host).to(self.dev)

    def _rows(self, tokens) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(tokens, (list, tuple)) and tokens and isinstance(tokens[0], (list, tuple, np.ndarray)):
            rows = [np.asarray(r, dtype=np.int64).reshape(-1) for r in tokens]
            n = max(len(r) for r in rows)
            if any(len(r) != n for r in rows) and self.io.attention_mask is None:
                raise InputError("append_tokens: rows of unequal length need padding, and this model takes "
                                 "no attention_mask; give rows of one length")
            ids = np.full((len(rows), n), self.pad, dtype=np.int64)
            mask = np.zeros((len(rows), n), dtype=bool)
            for i, r in enumerate(rows):
                at = slice(0, len(r)) if self.model.pad_right else slice(n - len(r), n)
                ids[i, at], mask[i, at] = r, True
            return ids, mask
        t = np.asarray(tokens.cpu() if isinstance(tokens, torch.Tensor) else tokens).astype(np.int64)
        if t.ndim == 1:
            t = t[None]
        if t.ndim != 2 or t.shape[1] == 0:
            raise InputError(f"append_tokens: expected [batch, n] or [n] tokens with n > 0, got shape {t.shape}")
        return t, np.ones(t.shape, dtype=bool)

    # ---- one step ---------------------------------------------------------------------------------
    def _run(self, ids: torch.Tensor) -> None:
        """The model over ``ids`` [batch, n] after the cached tokens: the last position's logits, the KV."""
        io = self.io
        if self._lending or self.request is None:
            self._keep_request()
        feeds = {io.input_ids: ids}
        total = self.fed + ids.shape[1]
        if io.attention_mask is not None:
            feeds[io.attention_mask] = self._mask_dev[:, :total]
        if io.position_ids is not None:
            feeds[io.position_ids] = self._pos_dev[:, self.fed:total]
        if io.use_cache_branch is not None:  # the two values made once: no copy to the device a step
            if self._branch is None:
                self._branch = (torch.tensor([False], device=self.dev), torch.tensor([True], device=self.dev))
            feeds[io.use_cache_branch] = self._branch[self.fed > 0]
        if self.bound is not None:  # the lean step: the KV stays in the step's storages
            out = self.bound(feeds)
            if out is not None:
                self.logits = out[io.logits][:, -1, :]
                self.fed, self._pending = total, None
                return
            kv = self.bound.presents()  # a run serves this step: the KV as pasts again
            self.past, self.bound = [kv[n] for n in io.past], None
        feeds.update(zip(io.past, self.past))
        out = dict(zip(self.model.output_names, self.request.run(None, feeds)))
        self.logits = out[io.logits][:, -1, :]
        chunk = self.host_mask[:, self.fed:total]
        if self.model.pad_right and not chunk[:, -1].all():  # a right-padded row's last token is before its pads
            last = torch.from_numpy(chunk.shape[1] - 1 - np.argmax(chunk[:, ::-1], axis=1)).to(self.dev)
            self.logits = out[io.logits][torch.arange(len(last), device=self.dev), last, :]
        self.past = [out[n] for n in io.present]
        self.fed = total
        self._pending = None
        if io.past:
            self.bound = self.request.bound_step(feeds, dict(zip(io.past, self.past)))
            if self.bound is not None:
                self.past = []  # held by the bound step; a view kept here would hold the storages too

    def generate_next_token(self) -> None:
        if not self.started:
            raise GenerationError("generate_next_token: append_tokens (the prompt) first")
        if self.is_done():
            raise GenerationError("generate_next_token: the generation is done (every row ended or max_length)")
        if self.logits is None:
            self._run(self._pending)
        s = self.params.search
        penalty = float(s["repetition_penalty"])
        if penalty != 1.0 and self._seq_dev is None:
            self._seq_dev = torch.from_numpy(self.host).to(self.dev)
        seqs = self._seq_dev[:, :self.length] if penalty != 1.0 else None
        banned = tuple(self.eos) if self.length < int(s["min_length"]) else ()
        tok = next_tokens(self.logits, seqs, do_sample=bool(s["do_sample"]), top_k=int(s["top_k"]),
                          top_p=float(s["top_p"]), temperature=float(s["temperature"]),
                          repetition_penalty=penalty, generator=self.rng, banned=banned)
        # the step's one read from the device: the tokens (a streaming caller reads them anyway); the
        # rows' EOS bookkeeping is then the host's
        ahead = self.bound is not None and not self.done_rows.any() and self.length + 1 < int(s["max_length"])
        if ahead:
            last = self._run_ahead(tok)
        else:
            last = tok.cpu().numpy()
        if self.done_rows.any():
            last[self.done_rows] = self.pad
            tok = torch.from_numpy(last).to(self.dev)
        if self.eos:
            self.done_rows |= [int(t) in self.eos for t in last]
        self.last = last
        self.host[:, self.length] = last
        if self._seq_dev is not None:
            self._seq_dev[:, self.length] = tok
        self.length += 1
        if ahead:  # its run is done: the token is in the cache, the next logits are there
            if self.is_done():
                self._lend()
            return
        self._pending = tok[:, None]
        self.logits = None
        if self.is_done():
            self._lend()
        elif self.bound is not None:
            # the next step starts now rather than in the next call: the device runs it while the
            # caller handles this token (streams it, detokenizes), and the next call only chooses.
            # Nothing the caller can do in between changes that step: appended tokens come after
            # this token in the cache, as they would after a lazy run
            self._run(self._pending)

    def _run_ahead(self, tok: torch.Tensor) -> np.ndarray:
        """The next step launched on ``tok`` from the device before the host reads it, then the read:
        the device runs that step while the host takes the token and the caller handles it, instead
        of waiting for the host between two steps. (Only while no row has ended: an ended row's token
        is replaced by the pad on the host.) The read is queued before the step, so it waits for the
        choice only."""
        if tok.is_cuda:
            if self._tok_host is None or self._tok_host.shape != tok.shape:
                self._tok_host = torch.empty(tok.shape, dtype=tok.dtype, pin_memory=True)
                self._tok_read = torch.cuda.Event()
            self._tok_host.copy_(tok, non_blocking=True)
            self._tok_read.record()
            self._run(tok[:, None])
            self._tok_read.synchronize()
            last = self._tok_host.numpy().copy()
        else:
            self._run(tok[:, None])
            last = tok.numpy().copy()
        self.ahead_steps += 1
        return last

    # ---- the request, lent to the model's next generator once this one is done ----------------------
    def _lend(self) -> None:
        if not self._lending and self.request is not None:
            self._lending = True
            with self.model._lock:
                self.model._lent.append(weakref.ref(self))

    def _give_request(self):
        """(the model's lock held) This generator's request for another one: its cache goes with it."""
        req, self.request, self._lending = self.request, None, False
        self._holder.clear()
        self.bound, self.past, self.logits = None, [], None
        return req

    def _keep_request(self) -> None:
        """Asked to go on after it was done: keep its request, or, if another generator took it, take
        one and rebuild the cache from the tokens it holds."""
        with self.model._lock:
            kept = self._lending and self.request is not None
            self._lending = False
        if kept:
            return
        self.request = self.model._request()
        self._holder.append(self.request)
        fed, self.fed = self.fed, 0
        self.past = empty_past(self.io, self.host.shape[0], self.dev)
        pending = self._pending
        self._run(torch.from_numpy(self.host[:, :fed].copy()).to(self.dev))
        self._pending = pending

    def is_done(self) -> bool:
        if not self.started:
            return False
        return self.length >= self.params.search["max_length"] or bool(self.done_rows.all())

    # ---- what the caller reads -------------------------------------------------------------------
    def get_next_tokens(self) -> np.ndarray:
        """The token each row took last (read from the device when it was chosen)."""
        return self.last.copy()

    def get_sequence(self, row: int) -> np.ndarray:
        """Row ``row``'s tokens, prompt first, its padding left out."""
        return self.host[row, :self.length][self.host_mask[row, :self.length]].copy()

    def get_logits(self) -> np.ndarray:
        """The logits [batch, vocab] the next token will be chosen from (runs the model if needed)."""
        if self.logits is None:
            self._run(self._pending)
        return self.logits.float().cpu().numpy()


def _give_back(model: Model, holder: list) -> None:
    """A collected generator's request goes back to its model (none if it gave it away)."""
    for req in holder:
        model._return(req)
