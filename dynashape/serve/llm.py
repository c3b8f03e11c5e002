"""LLMServer: generations of many clients served by one PagedEngine, each as a stream of tokens.

One thread runs the engine's steps while any conversation is running or waiting; ``submit``
queues a conversation (refused at once, with KVCapacityError, if it could never fit) and returns
its ``TokenStream``, which yields tokens as the steps make them. Closing a stream (a client gone)
aborts its conversation and frees its blocks. A failed step ends the streams of that step's
conversations with StreamEndedError and the server goes on with the others' next steps.

Latencies are recorded per stream (arrival, first token, each next token) for the load generator
and for ``stats()``: time to first token and inter-token latency, p50 and p99.
"""

from __future__ import annotations

import atexit
import itertools
import queue
import threading
import time
import weakref

import numpy as np

from ..errors import InputError, StreamEndedError
from ..paged.engine import PagedEngine, Sampling

_END = object()
_servers: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """At exit the step threads stop first: a daemon thread inside a CUDA call while the runtime
    tears down aborts the process (seen on an H200 when a client's error ended the script)."""
    for s in list(_servers):
        s.stop(timeout=30)


class TokenStream:
    """The tokens of one generation, as they come: iterate it (or ``next_token``); ``tokens`` holds
    those seen so far, ``finish_reason`` is "stop" (an EOS), "length" (max tokens) or "abort"."""

    def __init__(self, server: LLMServer, key, prompt_tokens: int, max_new: int) -> None:
        self.server, self.key = server, key
        self.prompt_tokens, self.max_new = prompt_tokens, max_new
        self._q: queue.Queue = queue.Queue()
        self.tokens: list[int] = []
        self.times: list[float] = []  # when each token reached the stream (time.perf_counter)
        self.arrived = time.perf_counter()
        self.finish_reason: str | None = None
        self.closed = False

    def __iter__(self):
        while True:
            t = self.next_token()
            if t is None:
                return
            yield t

    def next_token(self, timeout: float | None = None) -> int | None:
        """The next token, or None at the end; StreamEndedError if the stream was cut."""
        if self.closed and self._q.empty():
            return None
        item = self._q.get(timeout=timeout)
        if item is _END:
            self.closed = True
            return None
        if isinstance(item, Exception):
            self.closed = True
            raise item
        self.tokens.append(item)
        return item

    def close(self) -> None:
        """The client is gone: its conversation aborted, its blocks freed (nothing if it ended)."""
        if self.finish_reason is None:
            self.finish_reason = "abort"
            self.server._abort(self.key)
        self.closed = True

    # called by the server's loop
    def _put(self, token: int, now: float) -> None:
        self.times.append(now)
        self._q.put(token)

    def _end(self, reason: str | Exception) -> None:
        if isinstance(reason, Exception):
            self.finish_reason = "error"
            self._q.put(reason)
        else:
            self.finish_reason = reason
            self._q.put(_END)


class LLMServer:
    """``model`` (a decoder folder or .onnx file, or a PagedEngine) served to many clients;
    ``engine_options`` go to PagedEngine (device=, block_size=, num_blocks=, max_rows=, ...)."""

    def __init__(self, model, eos=None, **engine_options) -> None:
        self.engine = model if isinstance(model, PagedEngine) else PagedEngine(model, **engine_options)
        self.eos = eos if eos is not None else (self.engine.model.config.eos or None)
        self.streams: dict = {}
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._stopped = False
        self.failed_steps = 0
        self.ttft: list[float] = []  # seconds, of finished streams
        self.itl: list[float] = []
        self._thread = threading.Thread(target=self._loop, name="dynashape-llm", daemon=True)
        self._thread.start()
        _servers.add(self)

    def submit(self, prompt, max_new: int, sampling: Sampling | None = None, eos=None, key=None) -> TokenStream:
        """Queue a generation of up to ``max_new`` tokens after ``prompt`` (token ids); its stream.
        ``key``: a conversation's name: its blocks stay when it ends, and its next turn under the
        same key (a prompt that repeats the last one and its answer) reuses the positions they share."""
        keep = key is not None
        key = key if key is not None else f"r{next(self._ids)}"
        ids = np.asarray(prompt).reshape(-1)
        stream = TokenStream(self, key, len(ids), max_new)
        if self._stopped:
            raise StreamEndedError("the server is stopped")
        if self.streams.setdefault(key, stream) is not stream:
            raise InputError(f"conversation {key!r} is generating already: its next turn comes after this one ends")
        try:
            self.engine.add(key, ids, max_new, eos if eos is not None else self.eos, sampling, keep=keep)
        except Exception:
            self.streams.pop(key, None)
            raise
        with self._wake:
            self._wake.notify()
        return stream

    def generate(self, prompt, max_new: int, **kw) -> list[int]:
        """The whole generation at once."""
        return list(self.submit(prompt, max_new, **kw))

    def _abort(self, key) -> None:
        self.engine.abort(key)
        self.streams.pop(key, None)

    def stop(self, timeout: float = 10.0) -> None:
        """No more steps; streams still running end with StreamEndedError."""
        self._stopped = True
        with self._wake:
            self._wake.notify()
        self._thread.join(timeout)
        for key, s in list(self.streams.items()):
            self.engine.abort(key)
            s._end(StreamEndedError(f"stream {key!r}: the server stopped"))
        self.streams.clear()

    def _loop(self) -> None:
        while not self._stopped:
            with self._wake:
                while self.engine.idle and not self._stopped:
                    self._wake.wait(0.5)
            if self._stopped:
                return
            try:
                events = self.engine.step()
            except Exception as e:  # noqa: BLE001  a failed step ends its streams, the server goes on
                self.failed_steps += 1
                for key, s in list(self.streams.items()):
                    if key in {seq.key for seq in self.engine.scheduler.running}:
                        self.engine.abort(key)
                        self.streams.pop(key, None)
                        s._end(StreamEndedError(f"stream {key!r}: a step failed: {type(e).__name__}: {e}"))
                continue
            now = time.perf_counter()
            for ev in events:
                s = self.streams.get(ev.key)
                if s is None:
                    continue
                s._put(ev.token, now)
                if ev.finished:
                    self.streams.pop(ev.key, None)
                    self._record(s)
                    s._end("length" if len(s.times) >= s.max_new else "stop")

    def _record(self, s: TokenStream) -> None:
        self.ttft.append(s.times[0] - s.arrived)
        self.itl.extend(np.diff(s.times).tolist())

    def memory_stats(self) -> dict:
        """The engine's session and KV pool memory (PagedEngine.memory_stats)."""
        return self.engine.memory_stats()

    def stats(self) -> dict:
        def pct(xs, q):
            return float(np.percentile(xs, q) * 1e3) if xs else None
        return {**self.engine.stats(), "streams": len(self.streams), "failed_steps": self.failed_steps,
                "ttft_ms_p50": pct(self.ttft, 50), "ttft_ms_p99": pct(self.ttft, 99),
                "itl_ms_p50": pct(self.itl, 50), "itl_ms_p99": pct(self.itl, 99)}
