"""PagedEngine: an ONNX decoder's steps for many conversations at once, over the paged KV pool.

The model is the exporter's graph as it is: no attention is replaced. Each step the scheduler's
rows run as one batch (decode rows together, prompt chunks together): every row's past is
gathered from its blocks into the dense ``past_*`` inputs the model takes, the rows of different
lengths are told apart by the ``attention_mask`` (a row's unused past positions masked out) and
placed by ``position_ids`` (each row's rotary at its own positions); after the run the new
positions' keys and values are taken from the ``present_*`` outputs and written into the rows'
blocks. So any decoder that takes a mask and per-row positions batches, whatever its attention
looks like. Two conventions, found from the graph:

- ``concat``: ``present = Concat(past, new)`` (torch.onnx, optimum, transformers): the rows' pasts
  sit at the front of a ``P``-long past (P: the longest past, rounded up to ``past_multiple``), the
  new positions after it at ``P + t``; each layer's past is the start of a storage whose room the
  model's KV append fills in place (``kv_append.lend_room``); the model must take
  ``position_ids`` (a model that places its rotary by the past's length cannot run rows of
  different lengths together: refused).
- ``gqa``: onnxruntime's GroupQueryAttention (the model builder's models): each row's past is
  right-padded, the mask's ones count a row's positions, and the op writes a row's new positions
  at its own length and rotates them there. Its rule that a continued prompt runs alone (batch 1)
  is kept: such chunks run one by one.

Where the model's attention is fuse_attention's over ``Concat(past, new)`` (the concat convention's
exports), the session is made with ``paged_kv`` (compile/paged_kv.py): each attention reads the
pool in place through the rows' block tables (ops/paged_attention.py, a Triton kernel for decode
rows on CUDA) and writes the new keys and values itself; the pasts fed are empty, nothing is
gathered. Elsewhere (``stats()["paged_kv"]`` says why) every row's past is gathered from its
blocks into the dense pasts, which costs a copy of each row's past a step (``gathered_bytes``).

On CUDA a decode run is captured as one CUDA graph per (rows bucket, past bucket) and replayed
(``step_graphs.py``; with the pool read in place the past is no part of the key); prompt chunks
run eagerly.

Sampling is per row (greedy, or temperature / top-k / top-p / repetition penalty with a seed of
its own); the step reads the chosen tokens back once (the scheduler's stop conditions and the
streams need them on the host).
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import torch

from ..errors import InputError, InvalidModelError
from ..generate.folder import read_folder
from ..generate.generator import KV_DTYPES, Model
from ..generate.sampling import next_tokens
from ..runtime.kv_append import lend_room
from .batch import Batch, make_batch, make_packed_batch, make_paged_batch, to_device
from .blocks import BlockPool, blocks_for_memory
from .inflight import Event, Inflight, Sampling, decode_row, mark, ready
from .scheduler import BUCKETS, Plan, Scheduler, Sequence, bucket
from .step_graphs import StepGraphs

DEFAULT_HEADROOM = 0.5  # of the device's free memory, left for activations when the pool is sized from it
DEFAULT_CONTEXT = 4096  # positions a conversation may reach where the model's folder does not say
WARM_CHUNK_ROWS = 8  # prompt-chunk keys warm_up captures: runs of up to this many rows
TRACE_STEPS = 8192  # steps the trace keeps
CPU_POOL_BYTES = 256 << 20  # the pool on the CPU unless num_blocks says otherwise
CHUNK_GRAPH_TOKENS = 4096  # a prompt-chunk run padded beyond this many positions runs eagerly (each captured
                           # key keeps a request whose activations are planned for its shape)


def _pairs(io) -> list[tuple[str, str, str, str]]:
    """Per layer (past key, past value, present key, present value), from the KV inputs' names."""
    by = dict(zip(io.past, io.present))
    out = []
    for k in io.past:  # the last "key" of a name names it (past_key_values.3.key, past_key_3)
        head, sep, tail = k.rpartition("key")
        if not sep or "value" in tail:
            continue
        v = head + "value" + tail
        if v not in by:
            raise InvalidModelError(f"decoder: past input {k!r} has no value input {v!r}")
        out.append((k, v, by[k], by[v]))
    if 2 * len(out) != len(io.past):
        raise InvalidModelError(f"decoder: KV inputs {io.past} do not pair as keys and values")
    return out


def _convention(path) -> str:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return "gqa" if any(n.op_type == "GroupQueryAttention" for n in model.graph.node) else "concat"


class PagedEngine:
    """``model``: a decoder folder or .onnx file (or a ``dynashape.generate.Model``). ``num_blocks``
    of ``block_size`` positions; by default room for ``max_rows`` conversations of the model's
    context (DEFAULT_CONTEXT where its folder does not say), within the device's free memory less
    ``headroom`` of it (CUDA) or ``CPU_POOL_BYTES`` (CPU). ``max_rows``, ``token_budget``, ``chunk``,
    ``prefill_budget``: the scheduler's (``chunk`` by default 128 with packed runs, else 256;
    ``prefill_budget`` "auto": a chunk with packed runs, else none). ``pad_rows``: a decode batch
    padded to a bucket of rows (the default on CUDA, so that its shapes, and the graphs captured for
    them, come back). ``past_multiple``: the past fed is the longest row's rounded up to it (default
    256 on CUDA, a block on the CPU).
    ``step_graphs``: decode runs replayed as CUDA graphs (step_graphs.py; the default on CUDA, where
    the session's own static impls are then off); ``chunk_graphs``: prompt-chunk runs too, where the
    attention reads the pool in place (the default with step graphs). ``warm_up``: those graphs
    captured at once for the usual keys (``warm_keys``; the default with step graphs), so that no
    step waits for a capture. ``overlap``: a step planned and launched while the device runs the
    last one (the default on CUDA). ``chunk_stream=True``: with overlap and chunk graphs, prompt
    chunks replayed on a CUDA stream of their own, so that a decode step's tokens do not wait for a
    prompt chunk launched beside it (opt-in: its CUDA tests pass, but the 12-layer load on an H200
    stopped making tokens with it, cause not found yet; see docs/serving.md). ``packed``: a step's
    decode rows and prompt chunks in one run, their tokens packed (the default with chunk graphs,
    where the attention takes packed rows; not GroupQueryAttention's). Packed runs with chunks of
    128 and at most one a step while decode rows run were measured on an H200 (the 12-layer decoder,
    64 conversations at 128/s): ITL p99 3.77 ms against 5.4 with chunks of 256 two at a time, tokens/s
    within 3%; all at once 3.9 ms against 12.4, tokens/s 15.3k against 16.1k (docs/serving.md)."""

    def __init__(self, model, *, device: str | None = None, block_size: int = 16, num_blocks: int | None = None,
                 headroom: float = DEFAULT_HEADROOM, max_rows: int = 64, token_budget: int = 512,
                 chunk: int | None = None,
                 pad_rows: bool | None = None, past_multiple: int | None = None, step_graphs: bool | None = None,
                 overlap: bool | None = None, chunk_graphs: bool | None = None,
                 prefill_budget: int | None | str = "auto",
                 warm_up: bool | None = None, chunk_stream: bool | None = None, packed: bool | None = None,
                 **session_options) -> None:
        path = model.config.onnx_path if isinstance(model, Model) else read_folder(model).onnx_path
        self.convention = _convention(path)
        # GroupQueryAttention stays the op here: its rows are right-padded, each placed by its own length
        # (dynashape.generate writes it out on CUDA, where a lone conversation steps in whole-step graphs)
        session_options.setdefault("gqa_as_concat", False)
        if isinstance(model, Model) and model.session.gqa_as_concat == "rewritten":
            raise InvalidModelError("paged engine: this Model's GroupQueryAttention was written out (gqa_as_concat, "
                                    "dynashape.generate's default on CUDA); make it with gqa_as_concat=False, or give "
                                    "the engine the folder")
        cuda_asked = str(device or "").startswith("cuda")
        # (GroupQueryAttention models step in graphs where their attention reads the pool: paged_kv=True)
        graphs = cuda_asked and step_graphs is not False and (self.convention == "concat"
                                                              or session_options.get("paged_kv") is True)
        if graphs or not cuda_asked:
            # CUDA: the step graphs capture the whole decode run, the session's own graphs would nest
            # in them; CPU: a build (inductor) per region key would take the cores from the steps,
            # and the keys (rows, past, chunk) change on most steps
            session_options.setdefault("static_impls", "off")
        # the whole-step decode graphs copy each fed past into capacity storages of their own per
        # shape key (the pasts here are new tensors every step) and hold those storages: measured on
        # an H200, 64 conversations ran out of memory with them
        session_options.setdefault("decode_graphs", "off")
        if self.convention == "concat" and cuda_asked and not isinstance(model, Model):
            # the pool read in place (the Triton kernels). On the CPU the torch form gathers each layer's
            # positions itself: with 32 conversations at once it was 15-20% slower than one gather a step,
            # and alike (4.1-4.5 against 3.7-5.2 ms a step, the tiny decoder, 2 cores) once the slots
            # and mask were shared by a run's layers; no gain measured, so the CPU keeps the gathered
            # pasts unless paged_kv=True is asked
            # (GroupQueryAttention models read the pool too with paged_kv=True: not measured on a GPU yet)
            session_options.setdefault("paged_kv", True)
        self.model = model if isinstance(model, Model) else Model(model, device=device, **session_options)
        graph = self.model.session.program.graph
        refused = getattr(graph, "paged_kv_refused", "the session was made without paged_kv")
        # the LM head computes each row's last position only (paged_kv's PagedLast): logits [rows, 1, vocab]
        self.last_only = refused is None and getattr(self.model.session.program.fused, "paged_last", 0) > 0
        # PagedAttention's rows may be packed (where each starts among the tokens); not the GQA form's
        self.takes_qstarts = "paged.qstarts" in {i.name for i in self.model.session.get_inputs()}
        # the attention reads the pool in place (None) or why the pasts are gathered instead
        self.paged_refused = refused
        io = self.model.io
        self.io, self.dev = io, self.model.device
        if not io.past:
            raise InvalidModelError("paged engine: the decoder takes no past KV inputs")
        if io.attention_mask is None:
            raise InvalidModelError("paged engine: the decoder takes no attention_mask; rows of different lengths "
                                    "cannot share a step")
        if self.convention == "concat" and io.position_ids is None:
            raise InvalidModelError("paged engine: the decoder takes no position_ids, so it places its rotary by "
                                    "the past's length, which rows of different lengths do not share (export it "
                                    "with position_ids, as optimum does)")
        self.layers = _pairs(io)
        kv_dtype = KV_DTYPES.get(io.kv_type, torch.float32)
        if num_blocks is None:
            item = torch.empty((), dtype=kv_dtype).element_size()
            per = 2 * len(self.layers) * block_size * io.kv_heads * io.head_dim * item
            # at most what max_rows conversations of the model's context fill: a pool of the
            # whole free memory left the static impls' graphs and the gathered pasts too little
            # (out of memory on an H200 with 115 GB of blocks for 64 conversations)
            context = self.model.config.context_length or DEFAULT_CONTEXT
            num_blocks = max_rows * -(-context // block_size)
            if self.dev.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.dev)
                num_blocks = min(num_blocks, blocks_for_memory(free, headroom, block_size, len(self.layers),
                                                               io.kv_heads, io.head_dim, kv_dtype))
            else:
                num_blocks = min(num_blocks, max(1, CPU_POOL_BYTES // per))
        self.pool = BlockPool(num_blocks, block_size, len(self.layers), io.kv_heads, io.head_dim, kv_dtype, self.dev)
        self.headroom = headroom
        cuda = self.dev.type == "cuda"
        self.pad_rows = cuda if pad_rows is None else pad_rows
        # on CUDA a run's shapes come from a few values (rows in buckets, the past in multiples of
        # 256, a chunk's length in multiples of 64), so that the static impls built for them serve
        # again; on the CPU every padded position is compute the step pays for
        self.past_multiple = past_multiple or (256 if cuda else block_size)
        self.chunk_multiple = 64 if cuda else 1
        # a captured decode step's block tables: as wide as a conversation of the model's context
        self.table_width = -(-(self.model.config.context_length or DEFAULT_CONTEXT) // block_size)
        types = {i.name: i.type for i in self.model.session.get_inputs()}
        self._int = {n: torch.int32 if types.get(n) == "tensor(int32)" else torch.int64
                     for n in (io.input_ids, io.attention_mask, io.position_ids) if n}
        self.request = self.model.session.create_infer_request()
        # decode runs replayed as CUDA graphs, one per (rows bucket, past bucket) (step_graphs.py)
        self.graphs = StepGraphs(self) if cuda and step_graphs is not False and (
            self.convention == "concat" or self.paged_refused is None) else None
        # prompt chunks captured too, per (rows bucket, chunk length), where the pool is read in place (the
        # tables as wide as a decode step's, the LM head over each row's last position only: a key's
        # buffers are its rows' inputs and one row of logits each). An eager chunk run took ~11 ms of
        # host time on an H200 (the 12-layer decoder's dynamic path), the step's ITL with it; replayed,
        # ~0.1 ms (64 conversations at 32/s, every token equal to its lone run's)
        self.chunk_graphs = (self.graphs is not None and self.paged_refused is None and self.last_only
                             and chunk_graphs is not False)
        self.sampling: dict = {}
        # a step planned and launched while the device runs the last one (CUDA by default: on the
        # CPU the runs are the host's own work, there is nothing to overlap)
        self.overlap = cuda if overlap is None else bool(overlap)
        self.inflight: Inflight | None = None
        # a step's decode rows and prompt chunks in one run of a batch of one, their tokens packed one after
        # another (the attention told where each row's start: paged.qstarts), so the products pass over
        # the weights once a step; by default where chunk runs are captured (measured there)
        self.packed_refused = self._packed_refusal(packed)
        self.packed = self.packed_refused is None
        # packed runs keep a step with a prompt chunk near a decode step's time with chunks of 128, at most
        # one a step while decode rows run (their warmed keys then cover every such step)
        if chunk is None:
            chunk = 128 if self.packed else 256
        if prefill_budget == "auto":
            prefill_budget = chunk if self.packed else None
        self.scheduler = Scheduler(self.pool, max_rows=max_rows, token_budget=token_budget, chunk=chunk,
                                   prefill_budget=prefill_budget)
        # prompt chunks on a stream of their own: the decode runs' tokens do not wait for them. A chunk's
        # conversations sit out the steps until its tokens are in (``held``, also while its run is
        # planned but not launched: their blocks are written by a stream the main one does not wait
        # for, so an abort meanwhile waits for that commit, ``abort_later``, and they are never preempted)
        self.chunk_stream = torch.cuda.Stream(self.dev) if (
            self.chunk_graphs and self.overlap and chunk_stream is True and not self.packed) else None
        self.chunks_inflight: list[Inflight] = []
        self.held: set = set()
        self.abort_later: set = set()
        self.lock = threading.Lock()  # add / abort from other threads while steps run
        self.counters = {"runs": 0, "rows": 0, "padded_rows": 0, "tokens": 0, "gathered_bytes": 0,
                         # where a step's host time goes: the inputs made, the device work launched
                         # (gather, model, KV written back; a graph's replay), the tokens' read (the
                         # step's one wait for the device)
                         "host_feed_s": 0.0, "host_model_s": 0.0, "read_s": 0.0,
                         # and the rest of a step: the plan, sampling (less the read), the commit and
                         # its events; the prompt chunks' runs (eager) apart from the decode runs
                         "plan_s": 0.0, "sample_s": 0.0, "commit_s": 0.0, "chunk_runs": 0, "host_chunk_s": 0.0,
                         "chunk_stream_runs": 0, "eager_runs": 0}
        # the pool at its fullest: the conversations it held then and what storages reserved per
        # conversation for its prompt and longest answer would have needed for them
        self.peak = {"blocks": 0, "conversations": 0, "positions_reserved": 0}
        # the last steps' make-up, where an inter-token latency's tail comes from: (wall seconds, decode
        # rows, prompt-chunk tokens, step graphs captured) a step
        self.trace: deque = deque(maxlen=TRACE_STEPS)
        self.warm_up_s = 0.0
        if warm_up is not False and self.graphs is not None and self.paged_refused is None:
            self.warm_up()

    def _packed_refusal(self, asked) -> str | None:
        """Why a step's rows do not run packed (None: they do)."""
        if asked is False:
            return "turned off"
        if asked is None and not self.chunk_graphs:  # the default: where chunk runs are captured
            return "no prompt-chunk graphs (CUDA's, with the pool read in place)"
        if self.paged_refused is not None:
            return f"the pool is not read in place: {self.paged_refused}"
        if not self.last_only:
            return "the LM head is not over each row's last token"
        if not self.takes_qstarts:
            return "the attention cannot take packed rows (GroupQueryAttention)"
        return None

    def warm_keys(self) -> list[tuple[int, int]]:
        """The (rows, new positions) keys captured before the first step: a decode run per bucket of
        rows up to ``max_rows``; with chunk graphs a prompt-chunk run per chunk length (multiples of
        64 up to the chunk) and bucket of up to WARM_CHUNK_ROWS rows (a Poisson stream's prompts
        mostly start alone; a burst's wider runs are captured when they come); packed, a run per
        bucket of rows and number of tokens up to a chunk and a multiple more."""
        top = bucket(self.scheduler.max_rows)
        keys = [(b, 1) for b in BUCKETS if b <= top]
        m = self.chunk_multiple
        if self.chunk_graphs and self.packed:  # a step's rows (any bucket) over its tokens: a chunk and the decode rows
            most = -(-min(self.scheduler.chunk, self.scheduler.token_budget) // m) * m + m
            keys += [(b, s) for s in range(m, min(most, CHUNK_GRAPH_TOKENS) + 1, m) for b in BUCKETS
                     if b <= top and b <= s]
        elif self.chunk_graphs:
            longest = min(self.scheduler.chunk, self.scheduler.token_budget)
            for s in range(self.chunk_multiple, -(-longest // self.chunk_multiple) * self.chunk_multiple + 1,
                           self.chunk_multiple):
                keys += [(b, s) for b in BUCKETS if b <= min(top, WARM_CHUNK_ROWS) and b * s <= CHUNK_GRAPH_TOKENS]
        return keys

    def warm_up(self) -> int:
        """The step graphs of ``warm_keys`` captured now (each on a run of padding rows, which writes
        the pool's scratch slot only); the keys captured, the seconds in ``stats()["warm_up_s"]``."""
        t0 = time.perf_counter()
        done = self.graphs.warm(self.warm_keys()) if self.graphs is not None else 0
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        self.warm_up_s += time.perf_counter() - t0
        return done

    # ---- conversations ------------------------------------------------------------------------
    def add(self, key, prompt, max_new: int, eos=None, sampling: Sampling | None = None, keep: bool = False) -> None:
        """A conversation joins (it runs from the next step on). ``eos``: a token id or ids that end
        it; KVCapacityError if it could never fit in the pool, InputError for a bad prompt.
        ``keep``: when it ends its blocks stay (parked) for its next turn under the same key, whose
        prompt repeats this one and the answer: the positions they share are not computed again
        (given back when other conversations need the blocks)."""
        ids = [int(t) for t in np.asarray(prompt).reshape(-1)]
        if not ids or max_new < 1:
            raise InputError(f"conversation {key!r}: expected a prompt of at least one token and max_new >= 1, "
                             f"got {len(ids)} tokens and max_new={max_new}")
        s = sampling or Sampling()
        s.check()
        if s.do_sample:
            s.generator = torch.Generator(device=self.dev)
            s.generator.manual_seed(s.seed if s.seed is not None else int(torch.seed() % (1 << 63)))
        stops = tuple(int(e) for e in np.asarray(eos).reshape(-1)) if eos is not None else ()
        with self.lock:
            if key in self.sampling:
                raise InputError(f"conversation {key!r} is running already")
            if key in self.abort_later:
                raise InputError(f"conversation {key!r} is still leaving (a prompt chunk of it runs): add it "
                                 "again once a step has passed")
            self.scheduler.add(Sequence(key, ids, int(max_new), stops or None, keep=keep))
            self.sampling[key] = (s, stops)

    def abort(self, key) -> bool:
        """A client gone: the conversation leaves, its blocks freed at once."""
        with self.lock:
            self.sampling.pop(key, None)
            if key in self.held:  # its prompt chunk may still write its blocks: they go at that commit
                self.abort_later.add(key)
                return True
            return self.scheduler.abort(key)

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and self.inflight is None and not self.chunks_inflight

    def memory_stats(self) -> dict:
        """The session's memory counters (InferenceSession.memory_stats) and the KV pool's: its blocks
        and bytes, those in use and their peak, and the headroom it was sized with (CUDA: the share
        of the free memory left for everything else)."""
        return {**self.model.session.memory_stats(), **self.pool.stats(), "kv_headroom": self.headroom}

    def stats(self) -> dict:
        graphs = self.graphs.counters if self.graphs is not None else {}
        return {**self.scheduler.stats, **self.counters, **graphs, **self.pool.stats(),
                "paged_kv": "on" if self.paged_refused is None else f"off: {self.paged_refused}",
                "overlap": self.overlap, "chunk_graphs": self.chunk_graphs, "warm_up_s": self.warm_up_s,
                "chunk_stream": self.chunk_stream is not None,
                "packed": "on" if self.packed else f"off: {self.packed_refused}",
                "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "parked": len(self.scheduler.parked),
                **{f"peak_{k}": v for k, v in self.peak.items()}}

    # ---- a step -------------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """One step of every running conversation (and prompt chunks): the tokens made. With
        ``overlap`` the tokens are those of the step before, committed once this step's device work
        is launched: the host plans and launches a step while the device runs the last one."""
        events, start = [], time.perf_counter()
        captures = self._captures()
        if self.inflight is not None and (not self.overlap or self._needs_history()):
            events = self._commit()  # a repetition penalty reads every token made: none may be in flight
        events += self._commit_chunks(wait=False)
        t0 = time.perf_counter()
        with self.lock:
            plan = self.scheduler.plan(held=self.held)
            if self.chunk_stream is not None:
                self.held |= {r.seq.key for r in plan.rows if not decode_row(r)}
            # the rows' options as the step began: an abort from another thread meanwhile drops them
            opts = {r.seq.key: self.sampling[r.seq.key][0] for r in plan.rows if r.seq.key in self.sampling}
            if self.pool.used_blocks > self.peak["blocks"]:
                run = self.scheduler.running
                self.peak = {"blocks": self.pool.used_blocks, "conversations": len(run),
                             "positions_reserved": sum(len(q.prompt) + q.max_new for q in run)}
        self.counters["plan_s"] += time.perf_counter() - t0
        try:
            launched = self._launch(plan, opts) if plan.rows else None
        except BaseException:
            self._release_failed()
            raise
        if self.inflight is not None:
            events += self._commit()
        self.inflight = launched
        if launched is not None and not self.overlap:
            events += self._commit()
        if launched is None and self.inflight is None and self.chunks_inflight and not events:
            events += self._commit_chunks(wait=True)  # nothing else to do: the oldest chunk's tokens
        if plan.rows:
            decode = plan.decode_rows
            self.trace.append((time.perf_counter() - start, decode, plan.tokens - decode, self._captures() - captures))
        return events

    def _release_failed(self) -> None:
        """After a launch failed: the device waited for (nothing of the step still runs), so only the
        chunks launched whole keep their conversations held; the aborts that waited are done."""
        if not self.held:
            return
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        with self.lock:
            keep = {r.seq.key for inf in self.chunks_inflight for r in inf.plan.rows}
            for key in (self.held - keep) & self.abort_later:
                self.abort_later.discard(key)
                self.scheduler.abort(key)
            self.held &= keep

    def _captures(self) -> int:
        c = self.graphs.counters if self.graphs is not None else None
        return c["step_graphs"] + c["step_graphs_refused"] if c else 0

    def _needs_history(self) -> bool:
        return any(s.repetition_penalty != 1 for s, _ in self.sampling.values())

    def _launch(self, plan, opts: dict) -> Inflight | None:
        """The plan's runs and their sampling, launched; the tokens on their way to the host (a prompt
        chunk replayed on the chunk stream goes to ``chunks_inflight``; None when nothing else ran)."""
        keys, logits = [], []
        decode = [r for r in plan.rows if decode_row(r)]
        chunks = [r for r in plan.rows if not decode_row(r)]
        before = mark(self.dev) if self.chunk_stream is not None and chunks else None  # the work before this step's
        groups = [decode] if decode else []
        if self.packed and chunks:  # decode rows and prompt chunks in one run, their tokens packed
            groups = [plan.rows]
        elif self.convention == "gqa" and self.paged_refused is not None:  # a continued prompt alone (the op's rule)
            first = [r for r in chunks if r.start == 0]
            groups += ([first] if first else []) + [[r] for r in chunks if r.start > 0]
        elif chunks:
            groups.append(chunks)
        main = []
        for rows in groups:
            batch = None
            if self.chunk_stream is not None and not all(decode_row(r) for r in rows):
                t0 = time.perf_counter()
                batch = self._batch(rows)
                self.counters["host_feed_s"] += time.perf_counter() - t0
            if batch is not None and batch.s > 1 and self._graphed(batch):
                self.chunks_inflight.append(self._launch_apart(rows, batch, before, opts))
                continue
            k, x = self._run(rows, batch)
            keys += k
            logits.append(x)
            main += rows
        if not main:
            return None
        sub = plan if len(main) == len(plan.rows) else Plan(main, plan.preempted)
        return self._send(sub, keys, torch.cat(logits) if len(logits) > 1 else logits[0], opts)

    def _launch_apart(self, rows, batch, before, opts: dict) -> Inflight:
        """A prompt-chunk run replayed on the chunk stream, after the main stream's work launched before
        this step (the blocks a preemption freed may still be written there), beside this step's decode."""
        self.counters["chunk_stream_runs"] += 1
        if before is None:  # (the CPU: work is done when launched; the tests drive this path there)
            return self._send(Plan(rows, []), *self._run(rows, batch), opts)
        self.chunk_stream.wait_event(before)
        with torch.cuda.stream(self.chunk_stream):
            keys, logits = self._run(rows, batch)
            return self._send(Plan(rows, []), keys, logits, opts)

    def _send(self, plan, keys: list, logits: torch.Tensor, opts: dict) -> Inflight:
        """The sampling of ``keys``' rows of ``logits`` launched, their tokens on their way to the host."""
        t0 = time.perf_counter()
        tokens = self._choose(plan, keys, logits, opts)
        host, event = tokens, None
        if tokens.is_cuda:  # read back without waiting; the commit waits for the event
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.counters["sample_s"] += time.perf_counter() - t0
        return Inflight(plan, keys, tokens, host, event, {k: j for j, k in enumerate(keys)})

    def _commit_chunks(self, wait: bool) -> list[Event]:
        """The prompt chunks whose tokens are in, oldest first (``wait``: the oldest waited for)."""
        events = []
        while self.chunks_inflight and (wait or ready(self.chunks_inflight[0])):
            events += self._commit(self.chunks_inflight.pop(0))
            wait = False
        return events

    def _commit(self, inf: Inflight | None = None) -> list[Event]:
        """The step in flight's tokens (or ``inf``'s) read back (the step's one wait for the device)
        and committed."""
        if inf is None:
            inf, self.inflight = self.inflight, None
        t0 = time.perf_counter()
        if inf.event is not None:
            inf.event.synchronize()
        values = inf.host.tolist()
        t1 = time.perf_counter()
        chosen = dict(zip(inf.keys, values))
        with self.lock:
            done = self.scheduler.commit(inf.plan, chosen)
            for seq in done:
                self.sampling.pop(seq.key, None)
            if self.held:  # the chunk's conversations take part again; the aborts that waited for it
                freed = {r.seq.key for r in inf.plan.rows if not decode_row(r)} & self.held
                self.held -= freed
                for key in freed & self.abort_later:
                    self.abort_later.discard(key)
                    self.scheduler.abort(key)
        ended = {s.key for s in done}
        # (a row planned after its conversation's last token, or aborted since, made no token)
        live = {r.seq.key for r in inf.plan.rows if r.seq.state in ("running", "waiting")} | ended
        events = [Event(k, t, k in ended) for k, t in chosen.items() if k in live]
        self.counters["read_s"] += t1 - t0
        self.counters["commit_s"] += time.perf_counter() - t1
        return events

    def _graphed(self, batch: Batch) -> bool:
        """Whether the run goes to the step graphs (their keys' shapes)."""
        return self.graphs is not None and (
            (batch.decode and (not batch.paged or batch.tables.shape[1] == self.table_width))
            or (self.chunk_graphs and batch.paged and batch.tables.shape[1] == self.table_width
                and batch.positions <= CHUNK_GRAPH_TOKENS))

    def _run(self, rows, batch: Batch | None = None) -> tuple[list, torch.Tensor]:
        """The model over ``rows`` as one batch: the keys of the rows that sample and their last
        positions' logits, [rows, vocab] in that order."""
        t0 = time.perf_counter()
        batch = batch if batch is not None else self._batch(rows)
        t1 = time.perf_counter()
        patch = self._pending(rows, batch)
        logits = self.graphs.run(batch, patch) if self._graphed(batch) else None
        if logits is None:  # the eager run (a key the step graphs refused, a prompt chunk, the CPU)
            # (where step graphs run, an eager run is a key they refused or a chunk too long for one)
            self.counters["eager_runs"] += self.graphs is not None
            t = batch.tensors(self.dev, self._int, self.io, scratch=None)
            if patch is not None:
                patch(t["ids"])
            t1 = time.perf_counter()
            logits = self.body(self.request, batch, t, self.dense(batch))
        c = self.counters
        c["runs"] += 1
        c["rows"] += batch.n
        c["padded_rows"] += batch.b - batch.n
        c["tokens"] += len(batch.slots) if not batch.paged else int((batch.lens - batch.starts)[:batch.n].sum())
        c["gathered_bytes"] += 2 * len(self.layers) * batch.b * batch.p * self.pool.k[0, 0, 0].numel() \
            * self.pool.k.element_size()
        c["host_feed_s"] += t1 - t0
        c["host_model_s"] += time.perf_counter() - t1
        if not batch.decode:
            c["chunk_runs"] += 1
            c["host_chunk_s"] += time.perf_counter() - t1
        picked = [(i, r.end - r.start - 1, r.seq.key) for i, r in enumerate(rows) if r.samples]
        if not picked:
            return [], logits.new_empty((0, logits.shape[-1]))
        i, t, keys = zip(*picked)
        if self.last_only and batch.paged:  # one position a row, each row's last (PagedLast)
            t = (0,) * len(t)
        # views or indices copied from pinned memory: nothing here waits for the run (an index list
        # copied from pageable memory would wait for the stream, the decode graph's replay included)
        if all(x == 0 for x in t) and i == tuple(range(len(i))):  # decode rows: the first rows' only position
            return list(keys), logits[:len(i), 0]
        return list(keys), logits[to_device(np.asarray(i), logits.device), to_device(np.asarray(t), logits.device)]

    def _pending(self, rows, batch: Batch):
        """For rows whose token is the step in flight's (overlap): what writes those tokens into the
        run's ``input_ids`` on the device, after the host's placeholders (None when no row waits)."""
        dst = [i for i, r in enumerate(rows) if r.pending]
        if not dst:
            return None
        prev = self.inflight
        if prev is None:
            raise RuntimeError("paged engine: a row waits for a token no step has in flight")
        src = to_device(np.asarray([prev.index[rows[i].seq.key] for i in dst]), prev.tokens.device)
        # each row's one token among the ids flattened (a packed run's rows start at their qstarts)
        at = batch.qstarts[dst] if batch.packed else np.asarray(dst) * batch.ids.shape[1]
        dst_t = to_device(np.asarray(at, dtype=np.int64), prev.tokens.device)

        def patch(ids: torch.Tensor) -> None:
            ids.view(-1)[dst_t] = prev.tokens[src].to(ids.dtype)
        return patch

    def _batch(self, rows) -> Batch:
        if self.paged_refused is None:
            longest = max(r.end for r in rows)
            decode = all(r.end - r.start == 1 for r in rows)
            graphed = self.graphs is not None and (decode or self.chunk_graphs)
            width = self.table_width if graphed and longest <= self.table_width * self.pool.block_size else None
            if self.packed and not decode:
                return make_packed_batch(rows, self.pool, self.pad_rows, self.chunk_multiple, width)
            return make_paged_batch(rows, self.pool, self.pad_rows, self.chunk_multiple, width)
        return make_batch(rows, self.pool, self.convention, self.pad_rows, self.past_multiple, self.chunk_multiple)

    def dense(self, batch: Batch) -> tuple:
        """Storages for every layer's gathered past, keys and values: [layers, rows, heads, past + new, dim]
        (none where the attention reads the pool)."""
        if batch.paged:
            return ()
        L, h, d = len(self.layers), self.pool.k.shape[3], self.pool.k.shape[4]
        shape = (L, batch.b, h, batch.p + batch.s, d)
        return tuple(torch.empty(shape, dtype=self.pool.k.dtype, device=self.dev) for _ in range(2))

    def body(self, request, batch: Batch, t: dict, dense: tuple) -> torch.Tensor:
        """The device work of a run: the pasts gathered, the model, the new keys and values written
        into their blocks; the logits. Only device work and no read back: a captured step records it."""
        io, b, p = self.io, batch.b, batch.p
        feeds = {io.input_ids: t["ids"], io.attention_mask: t["mask"]}
        if io.position_ids is not None:
            feeds[io.position_ids] = t["pos"]
        if io.use_cache_branch is not None:
            feeds[io.use_cache_branch] = t["branch"]
        if batch.paged:
            return self._paged_body(request, batch, t, feeds)
        # every layer's past in one gather and one copy into its storage: a layer's past is the start
        # of the storage, whose room the model's KV append fills in place
        L, h, d = len(self.layers), self.pool.k.shape[3], self.pool.k.shape[4]
        for j, store in enumerate((self.pool.k, self.pool.v)):
            flat = store.view(L, -1, h, d).index_select(1, t["idx"]).view(L, b, p, h, d)
            dense[j][:, :, :, :p].copy_(flat.permute(0, 1, 3, 2, 4))
            for layer, names in enumerate(self.layers):
                past = dense[j][layer, :, :, :p]
                if self.convention == "concat":
                    lend_room(past, dense[j][layer])
                feeds[names[j]] = past
        out = dict(zip(self.model.output_names, request.run(None, feeds)))
        for j, store in enumerate((self.pool.k, self.pool.v)):
            new = torch.stack([out[names[2 + j]][t["nb"], :, t["nt"], :] for names in self.layers])
            store.view(L, -1, h, d).index_copy_(1, t["slots"], new.to(store.dtype))
        return out[io.logits]

    def _paged_body(self, request, batch: Batch, t: dict, feeds: dict) -> torch.Tensor:
        """The run of a model whose attention reads the pool and writes its new positions (paged_kv):
        each layer's blocks, the rows' tables, first positions, lengths and slots, and pasts of length
        0. Each empty past is the start of a storage of the run's new positions whose room the model's
        KV append fills in place (lend_room): without it the append would allocate a storage per layer
        every run (a driver allocation, which a CUDA graph cannot capture)."""
        L, h, d = len(self.layers), self.pool.k.shape[3], self.pool.k.shape[4]
        room = self.pool.k.new_empty((2, L, batch.ids.shape[0], h, batch.s, d))
        for layer, names in enumerate(self.layers):
            for j, store in enumerate((self.pool.k, self.pool.v)):
                past = room[j, layer, :, :, :0]
                lend_room(past, room[j, layer])
                feeds[names[j]] = past
                feeds[names[j] + ".pool"] = store[layer]
        for k in ("tables", "starts", "lens", "slots"):
            feeds["paged." + k] = t[k]
        if self.last_only:
            feeds["paged.last"] = t["last"]
        if self.takes_qstarts:
            feeds["paged.qstarts"] = t["qstarts"]
        return request.run([self.io.logits], feeds)[0]

    def _choose(self, plan, keys: list, logits: torch.Tensor, opts: dict) -> torch.Tensor:
        """Each sampling row's next token from its row of ``logits`` (on the device): greedy rows in one
        argmax, the others with their options."""
        if not keys:
            return torch.empty(0, dtype=torch.int64, device=logits.device)
        plain = Sampling()
        special = [j for j, k in enumerate(keys)
                   if opts.get(k, plain).do_sample or opts.get(k, plain).repetition_penalty != 1]
        tokens = logits.argmax(1)
        if special:
            seqs = {r.seq.key: r.seq for r in plan.rows}
            for j in special:
                s = opts[keys[j]]
                held = torch.tensor([seqs[keys[j]].tokens], device=self.dev) if s.repetition_penalty != 1 else None
                tokens[j] = next_tokens(logits[j:j + 1], held, do_sample=s.do_sample, top_k=s.top_k, top_p=s.top_p,
                                        temperature=s.temperature, repetition_penalty=s.repetition_penalty,
                                        generator=s.generator)[0]
        return tokens
