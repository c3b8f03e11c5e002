"""One replica's work, without Ray: a session, shape-aware batches, conversations, metrics.

The Ray deployment (``ray_app.py``) and the single-process server (``local.py``) both drive a
``ModelReplica``; everything that decides results lives here, so it is tested without a cluster.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import torch

from ..api import InferenceSession
from ..errors import (
    ConversationLostError,
    DynashapeError,
    ExecutionError,
    InputShapeError,
    InputTypeError,
    OptionsError,
)
from .batching import Feeds, merge, plan, rows, signature, split
from .conversations import Conversation, ConversationStore
from .metrics import Metrics
from .policy import derive_policy

# a signature is "ready" once it has run this often: its code is traced at the first run and its
# static impls (CUDA graphs) are built at the second sighting (impls/), so the third is a replay
READY_AFTER = 2

_TORCH_TYPES = {"float": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "double": torch.float64}


def _as_feeds(feeds) -> Feeds:
    if not isinstance(feeds, dict):
        raise InputTypeError(f"a request's feeds must be a dict of input name -> array, got {type(feeds).__name__}")
    return {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in feeds.items()}


def _typed(e: Exception) -> Exception:
    return e if isinstance(e, DynashapeError) else ExecutionError(f"{type(e).__name__}: {e}")


class ModelReplica:
    """A model loaded once, serving lists of requests (``infer_many``) and decode conversations
    (``step``). ``pad`` / ``mask`` / ``pad_multiple`` declare a paddable axis (see policy.py);
    ``state`` maps past inputs to present outputs (derived from the names when not given)."""

    def __init__(self, model, *, device="cpu", max_batch: int = 8, batch_symbol: str | None = None,
                 pad: dict | None = None, mask: str | None = None, pad_multiple: int = 16,
                 state: dict | None = None, conversation_timeout_s: float = 600.0, max_conversations: int = 256,
                 **session_options) -> None:
        if max_batch < 1:
            raise OptionsError(f"max_batch={max_batch}: expected an int >= 1")
        self.session = InferenceSession(model, device=device, **session_options)
        self.inputs = {a.name: list(a.shape) for a in self.session.get_inputs()}
        self.input_types = {a.name: a.type for a in self.session.get_inputs()}
        self.output_names = [a.name for a in self.session.get_outputs()]
        outputs = {a.name: list(a.shape) for a in self.session.get_outputs()}
        self.policy = derive_policy(self.inputs, outputs, batch_symbol=batch_symbol, pad=pad, mask=mask,
                                    pad_multiple=pad_multiple, state=state)
        self.max_batch = max_batch
        self.metrics = Metrics()
        self.seen: Counter = Counter()
        self.conversations = ConversationStore(conversation_timeout_s, max_conversations)
        self.lock = threading.Lock()  # one run at a time: the session's threads are the replica's

    # ---- stateless requests, batched ----------------------------------------------------------
    def _ready(self, sig: tuple, n_rows: int) -> bool:
        return self.seen[(sig, n_rows)] >= READY_AFTER

    def infer_many(self, requests: list, queued_ms: list[float] | None = None) -> list:
        """Each request's outputs (dict name -> array), or the typed error of that request alone:
        a bad request in a batch never fails the others."""
        for ms in queued_ms or ():
            self.metrics.queued(ms)
        self.metrics.count("requests", len(requests))
        results: list = [None] * len(requests)
        items: list[Feeds] = []
        good: list[int] = []
        for i, r in enumerate(requests):
            try:
                items.append(_as_feeds(r))
                good.append(i)
            except DynashapeError as e:
                results[i] = e
        for idxs in plan(self.policy, items, self.max_batch, self._ready):
            group = [items[i] for i in idxs]
            try:
                outs = self._run(group)
            except Exception as e:  # noqa: BLE001  isolate: each request alone says what is wrong with it
                if len(idxs) == 1:
                    results[good[idxs[0]]] = _typed(e)
                    continue
                self.metrics.count("batch_reruns")
                outs = []
                for it in group:
                    try:
                        outs.append(self._run([it])[0])
                    except Exception as e1:  # noqa: BLE001
                        outs.append(_typed(e1))
            for i, o in zip(idxs, outs):
                results[good[i]] = o
        self.metrics.count("errors", sum(isinstance(r, Exception) for r in results))
        return results

    def infer(self, feeds) -> Feeds:
        """One request, unbatched; raises its typed error."""
        (out,) = self.infer_many([feeds])
        if isinstance(out, Exception):
            raise out
        return out

    def _run(self, group: list[Feeds]) -> list[Feeds]:
        feeds, meta = merge(self.policy, group)
        sig = signature(self.policy, group[0], -1)
        n_rows = sum(r for r, _ in meta)
        t0 = time.perf_counter()
        with self.lock:
            outs = self.session.run(None, feeds)
        ms = (time.perf_counter() - t0) * 1e3
        real = padded = 0
        if self.policy.mask is not None:
            m = feeds[self.policy.mask]
            b = self.policy.batch_axes.get(self.policy.mask)
            per_row = (m.shape[b] if b is not None else 1) * m.shape[self.policy.pad_axes[self.policy.mask]]
            per_row_len = m.size // per_row
            real, padded = int(sum(r * n for r, n in meta)) * per_row_len, int(m.size)
        first = next(iter(feeds.values()))
        self.metrics.run("x".join(map(str, first.shape)), len(group), n_rows, ms, padded - real, real)
        self.seen[(sig, n_rows)] += 1
        return split(self.policy, dict(zip(self.output_names, outs)), meta)

    # ---- conversations (decode loops) ---------------------------------------------------------
    def _empty_state(self, feeds: Feeds) -> dict:
        n = rows(self.policy, feeds)
        state = {}
        for past in self.policy.state:
            dims = []
            for d in self.inputs[past]:
                if d == self.policy.batch_symbol:
                    dims.append(n)
                elif isinstance(d, str):
                    dims.append(0)  # the past length: an empty cache
                else:
                    dims.append(int(d))
            kind = self.input_types[past].removeprefix("tensor(").rstrip(")")
            state[past] = torch.zeros(dims, dtype=_TORCH_TYPES.get(kind, torch.float32), device=self.session.device)
        return state

    def step(self, key: str, feeds, start: bool = False) -> Feeds:
        """One decode step of conversation ``key``: ``feeds`` holds the inputs that are not state
        (the new tokens); the state comes from the last step's presents, kept on this replica.
        ``start=True`` begins it (again) with an empty cache. Returns the outputs that are not
        state, plus ``past_length`` (tokens now cached)."""
        if not self.policy.state:
            raise OptionsError("this model has no state pairs (past input -> present output): give state=")
        self.conversations.sweep()
        feeds = _as_feeds(feeds)
        conv = None if start else self.conversations.get(key)
        if conv is None and not start:
            raise ConversationLostError(
                f"conversation {key!r}: no state on this replica (idle longer than "
                f"{self.conversations.timeout_s:g} s, evicted, or its replica restarted); start it again "
                "with start=True and its whole prompt")
        if conv is None:
            conv = Conversation(self.session.create_infer_request(), self._empty_state(feeds))
        self._check_rows(key, feeds, conv)
        run_feeds = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
        run_feeds.update(conv.state)
        t0 = time.perf_counter()
        with self.lock:
            outs = dict(zip(self.output_names, conv.request.run(None, run_feeds)))
        self.metrics.count("conversation_steps")
        new_state = {past: outs.pop(present) for past, present in self.policy.state.items()}
        length_axis = [i for i, d in enumerate(self.inputs[next(iter(self.policy.state))])
                       if isinstance(d, str) and d != self.policy.batch_symbol]
        conv.state = new_state
        conv.length = int(next(iter(new_state.values())).shape[length_axis[0]]) if length_axis else 0
        conv.steps += 1
        self.conversations.put(key, conv)
        res = {k: v.detach().cpu().numpy() for k, v in outs.items()}
        res["past_length"] = np.asarray(conv.length)
        shape = "x".join(map(str, next(iter(feeds.values())).shape))
        self.metrics.run(f"step {shape}", 1, rows(self.policy, feeds), (time.perf_counter() - t0) * 1e3)
        return res

    def _check_rows(self, key: str, feeds: Feeds, conv: Conversation) -> None:
        """A step's batch must be its cache's: caught here, before the session would take the
        mismatch for a model whose dim names disagree (and run it as such)."""
        past = next(iter(self.policy.state))
        if self.policy.batch_symbol not in self.inputs[past]:
            return
        axis = self.inputs[past].index(self.policy.batch_symbol)
        want = conv.state[past].shape[axis]
        for name, b in self.policy.batch_axes.items():
            if name in feeds and feeds[name].ndim > b and feeds[name].shape[b] != want:
                raise InputShapeError(f"conversation {key!r}: input {name!r} has {feeds[name].shape[b]} rows on axis "
                                      f"{b}, its cache holds {want}")

    def end(self, key: str) -> bool:
        """Free a conversation now (its state is gone whether or not it existed)."""
        return self.conversations.drop(key)

    def stats(self) -> dict:
        s = self.metrics.snapshot()
        s["conversations"] = self.conversations.stats()
        s["memory"] = self.session.memory_stats()
        s["policy"] = {"batch_symbol": self.policy.batch_symbol, "batches": self.policy.batches,
                       "why_not_batched": self.policy.why_not_batched, "pad_symbol": self.policy.pad_symbol,
                       "max_batch": self.max_batch}
        return s
