"""Decode steps of the paged engine as CUDA graphs, one per (rows bucket, past bucket).

A decode run's device work (the pasts gathered from the blocks, the model, the new keys and values
written back) depends on the host only through its sizes, which the engine takes from few values
(rows padded to a bucket, the past to a multiple): so the whole run is captured once per key and
replayed with its inputs copied into the graph's own buffers. Replayed, the model's ~12 layers cost
one launch instead of hundreds of Python-side kernel calls.

What a key holds: its own InferRequest (the request's arena is planned for that one shape, so the
memory the graph baked in stays where it was), the input buffers, the gathered pasts' storages and
the graph. Decode keys share one memory pool, prompt-chunk keys another: a step replays at most one
of each, the decode run's logits read after the chunk run's replay. In one shared pool a key
captured later could be given, for its logits, memory that an earlier key's replay uses as scratch
(measured on an H200: 15 of 24 conversations' tokens changed from their second token on). The first run of a key runs
eagerly on those buffers (it is that step's result, and it warms the kernels), the capture records
the same work without running it (CudaGraphImpl's scheme, impls/static.py). Every row of the bucket
is written back: a padding row's keys and values go to the pool's scratch slot.

A capture that fails (the model reads the device mid-run, an op CUDA cannot capture) leaves its key,
and every key not captured yet, to the eager step (a failed capture can leave the allocator's
recording half way), counted (``step_graphs_refused``) with the reason.
"""

from __future__ import annotations

import logging

import torch

from .batch import padding_batch
from .staging import Staged

log = logging.getLogger("dynashape.paged")


class StepGraphs:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.keys: dict = {}  # (rows, past, new positions) -> _Key, or a str: why it was refused
        self.pools: dict = {}  # decode keys' memory pool (False) and prompt-chunk keys' (True)
        # a capture stream per kind too: cuBLAS keeps a workspace per stream, and a graph replays the
        # one it was captured with; decode and chunk graphs replayed at once on two streams (the engine's
        # chunk_stream) must not share one (split-K products keep partial sums and flags there)
        self.streams = {kind: torch.cuda.Stream(engine.dev) for kind in (False, True)}
        self.counters = {"step_graphs": 0, "step_graph_replays": 0, "step_graphs_refused": 0, "step_graph_bytes": 0}
        self.refusals: list[str] = []
        self.broken: str | None = None  # a failed capture may leave CUDA's or torch's state half way: no more
        self.failed: list = []  # the graphs whose capture failed, kept (see _first)

    def run(self, batch, patch=None):
        """The logits of a decode run replayed (or run then captured: the key's first run); None
        when the key is refused (the engine runs it eagerly)."""
        key = (batch.b, batch.p, batch.s)  # (s: a prompt chunk's length; 1 for decode rows)
        k = self.keys.get(key)
        if isinstance(k, str) or (k is None and self.broken):
            return None
        if k is None:
            return self._first(key, batch, patch)
        k.fill(batch)
        if patch is not None:  # tokens of the step in flight, from the device
            patch(k.t["ids"])
        k.graph.replay()
        self.counters["step_graph_replays"] += 1
        return k.logits

    def _first(self, key, batch, patch=None):
        eng = self.engine
        k = _Key(eng, batch)
        if patch is not None:
            patch(k.t["ids"])
        caller = torch.cuda.current_stream(eng.dev)
        stream = self.streams[key[2] > 1]
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            logits = eng.body(k.request, batch, k.t, k.dense)  # this step's result, eagerly
            graph = torch.cuda.CUDAGraph()
            try:
                pool = self.pools.setdefault(key[2] > 1, torch.cuda.graph_pool_handle())
                # thread_local: a CUDA call from another thread (a client's submit making a sampling
                # generator, the HTTP server's) does not invalidate the capture
                with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                    k.logits = eng.body(k.request, batch, k.t, k.dense)
            except Exception as e:  # noqa: BLE001  counted, the key stays eager
                why = f"{type(e).__name__}: {e}"
                self.keys[key] = self.broken = why
                # kept: a graph destroyed clears the cuBLAS workspaces of its capture stream, which the
                # live graphs captured there still use (pytorch/pytorch#193402)
                self.failed.append(graph)
                self.counters["step_graphs_refused"] += 1
                self.refusals.append(f"rows {key[0]}, past {key[1]}, new {key[2]}: {why}"[:300])
                log.warning("paged engine: a decode step could not be captured (%s); its steps run eagerly", why[:300])
                caller.wait_stream(stream)
                return logits
        caller.wait_stream(stream)
        logits.record_stream(caller)
        k.graph = graph
        self.keys[key] = k
        self.counters["step_graphs"] += 1
        self.counters["step_graph_bytes"] += k.nbytes
        return logits

    def warm(self, keys) -> int:
        """Each (rows, new positions) key captured now, on a run of padding rows only (they write the
        pool's scratch slot): a key's first run (eager, then the capture, ~0.1 s) is no step's tail.
        The keys captured."""
        eng, done = self.engine, 0
        for b, s in keys:
            if (b, 0, s) in self.keys or self.broken:
                continue
            self._first((b, 0, s), padding_batch(eng.pool, b, s, eng.table_width, packed=eng.packed and s > 1))
            done += isinstance(self.keys.get((b, 0, s)), _Key)
        return done


class _Key:
    """A key's request, input buffers and gathered pasts' storages."""

    def __init__(self, eng, batch) -> None:
        self.request = eng.model.session.create_infer_request()
        self.ints, self.io = eng._int, eng.io
        self.staged = Staged(batch.paged_arrays(self.ints, self.io), eng.dev) if batch.paged else None
        self.t = self.staged.tensors if batch.paged else batch.tensors(eng.dev, eng._int, eng.io,
                                                                       scratch=eng.pool.scratch_slot)
        self.dense = eng.dense(batch)
        self.nbytes = sum(x.numel() * x.element_size() for x in (*self.t.values(), *self.dense))
        self.graph = self.logits = None
        self.scratch = eng.pool.scratch_slot

    def fill(self, batch) -> None:
        """This run's inputs into the graph's buffers (rows past ``batch.n`` write the scratch slot)."""
        t, n, b = self.t, batch.n, batch.b
        if batch.paged:  # (padding rows name the scratch slot and block already; one copy, no wait)
            self.staged.fill(batch.paged_arrays(self.ints, self.io))
            return
        t["ids"].copy_(torch.from_numpy(batch.ids))
        t["mask"].copy_(torch.from_numpy(batch.mask))
        if "pos" in t:
            t["pos"].copy_(torch.from_numpy(batch.pos))
        t["idx"].copy_(torch.from_numpy(batch.gather.reshape(-1)))
        t["slots"][:n].copy_(torch.from_numpy(batch.slots))
        if n < b:
            t["slots"][n:].fill_(self.scratch)
