"""``CompiledRunner``: one request's state over a CompiledModel (``compiled.py``).

What a run needs: the arena (one block per request, sized by the specializations' memory plans at
the symbols' capacities), a ``SpecState`` per specialization met (``spec_state.py``), output
buffers, KV-cache storages and the kernels of control-flow nodes; and a failing generated line
turned into an error that names its node.
"""

from __future__ import annotations

from collections import Counter

import torch

from ..codegen import SpecCode
from ..errors import DynashapeError, ExecutionError, ShapeError, at_node
from ..shape import expr as E
from .kv_append import KVAppend
from .spec_state import SpecState

KEEP_SMALL_BYTES = 1 << 20  # an output buffer this small is kept for any smaller output (output_buffer)


class CompiledRunner:
    """One request's state over a CompiledModel (``model``, ``compiled.py``; see the module docstring)."""

    def __init__(self, model, engine, predictor, stats: Counter, kv_growth: str | None = "geometric",
                 make_body=None) -> None:
        self.model, self.engine, self.predictor, self.stats = model, engine, predictor, stats
        self.kv_growth = kv_growth
        self.make_body = make_body  # (graph) -> callable running a control-flow body
        self.states: dict[int, SpecState] = {}
        self.last_shapes: tuple | None = None
        self.last_state: SpecState | None = None
        self.arena: torch.Tensor | None = None
        self.epoch = 0
        self.hand_out = True
        self.buffer_set = 0
        self.owned: list[torch.Tensor] = []  # this run's output buffers (torch mode: the caller's)
        self.kept: dict[tuple, tuple[torch.Tensor, int]] = {}  # (output, buffer set) -> buffer kept
        # (output, buffer set) -> (shape, dtype, view) last handed out of the kept buffer: a run of
        # the same shape takes it again (two torch calls and a loop less per output)
        self.kept_views: dict[tuple, tuple] = {}
        self._kv: dict[str, KVAppend] = {}
        self._subs: dict[str, object] = {}
        self._caps: dict[str, int] = {}
        self.prebuild = False  # build static impls at the first sight of a key (optimal values at load)
        self.traced = False  # whether this call traced a region for an inductor build (one per call)
        self.padded_call = False  # this call runs at a padded bucket (padded_calls.py): its keys come back
        self.bound: dict[str, torch.Tensor] = {}  # output name -> a caller's tensor to write it into (io_binding)

    # ---- per-request objects the specializations share ----------------------------------------
    def kv_for(self, node) -> KVAppend:
        kv = self._kv.get(node.name)
        if kv is None:
            kv = self._kv[node.name] = KVAppend(node.attrs.get("axis", 0), len(self._kv), self.kv_growth,
                                                self.engine, self.stats, self.predictor, node.name)
        return kv

    def sub_for(self, node):
        k = self._subs.get(node.name)
        if k is None:
            k = self._subs[node.name] = self.make_body(node)
        return k

    def capacity(self, symbol: str, value: int, step: int = 0) -> int:
        """The value a symbol's buffers are planned for: at least ``value``, more when the
        ShapePredictor sees the symbol grow (the next few steps fit). ``step``: how much it grew
        since the last call. The predictor hears of a symbol only when it passes its capacity,
        so it never sees the steady step of a decode loop (one a call) and took ratio mode's
        10%: a re-plan, and every group's views rebuilt, each ~5 steps at a past of 50. A small
        step is that loop's: room for the predictor's ``iters`` more steps, as its iterations
        mode gives when it sees the step twice."""
        cap = value
        if self.predictor is not None:
            ok, pred = self.predictor.predict(f"symbol:{symbol}", (value,), 8, False)
            if ok and pred[0] > value:
                cap = pred[0]
                self.stats["predictions_used"] += 1
            opts = self.predictor.options
            if 0 < step <= opts.max_dim_diff and opts.iters and value + step * opts.iters > cap:
                cap = value + step * opts.iters
                self.stats["predictions_used"] += 1
        self._caps[symbol] = cap
        return cap

    def arena_block(self, nbytes: int) -> torch.Tensor:
        """The request's arena with at least ``nbytes``; a new block means new views (epoch).
        The block serves every specialization of the request: it is reclaimed (shrunk) only when
        all of them are planned for a tenth of it, so that calls alternating between two
        specializations do not trade the block back and forth."""
        nbytes = max([nbytes] + [st.total for st in self.states.values()])
        have = 0 if self.arena is None else self.arena.numel()
        if self.arena is not None and nbytes <= have and nbytes * 10 >= have:
            return self.arena
        if self.arena is not None:
            self.engine.release(self.arena)
            self.stats["arena_grows" if nbytes > have else "arena_reclaims"] += 1
        self.arena = self.engine.allocate(max(nbytes, 64), torch.uint8)
        self.epoch += 1
        for st in self.states.values():  # their views are of the old block: the next run re-enters
            st.sig = None
        return self.arena

    def output_buffer(self, name: str, dtype: torch.dtype, shape: tuple) -> torch.Tensor:
        """The buffer an output is written into: fresh when it goes to the caller (torch mode),
        else kept per output and reused while it is large enough (numpy mode)."""
        if not self.hand_out:
            last = self.kept_views.get((name, self.buffer_set))
            if last is not None and last[0] == shape and last[1] == dtype:
                self.stats["buffer_reuses"] += 1
                return last[2]
        n = 1
        for d in shape:
            if d < 0:  # dims from the shape program of these inputs (Sub of a dim going below 0)
                raise ShapeError(f"output {name!r} would have the negative shape {list(shape)}")
            n *= d
        if self.hand_out:
            pre = self.bound.get(name)
            if pre is not None and tuple(pre.shape) == tuple(shape) and pre.dtype == dtype \
                    and pre.device == self.engine.device and pre.is_contiguous():
                self.stats["outputs_written_in_place"] += 1  # io_binding's preallocated output: no copy
                return pre
            buf = self.engine.allocate_output(shape, dtype)
            self.owned.append(buf)
            return buf
        key = (name, self.buffer_set)
        kept = self.kept.get(key)
        # a buffer 10x larger than needed goes back, unless it is small (<= 1 MiB: outputs whose
        # shapes alternate, a decoder's one token and a prompt's ten, would reallocate every call)
        if kept is not None and n <= kept[1] and (n * 10 >= kept[1] or kept[1] * dtype.itemsize <= KEEP_SMALL_BYTES) \
                and kept[0].dtype == dtype:
            self.stats["buffer_reuses"] += 1
            view = kept[0][:n].view(shape)
            self.kept_views[key] = (shape, dtype, view)
            return view
        if kept is not None:
            del self.kept[key]  # gone before anything below can fail: never released twice
            self.kept_views.pop(key, None)
            self.engine.release(kept[0])
        want = n
        if self.predictor is not None:
            ok, pred = self.predictor.predict(name, shape, dtype.itemsize * 8, False)
            if ok:
                p = 1
                for d in pred:
                    p *= d
                if p > n:
                    want = p
                    self.stats["predictions_used"] += 1
        buf = self.engine.allocate(want, dtype)
        self.kept[key] = (buf, want)
        view = buf[:n].view(shape)
        self.kept_views[key] = (shape, dtype, view)
        return view

    # ---- running -------------------------------------------------------------------------------
    def state(self, shapes: tuple) -> SpecState | None:
        if shapes == self.last_shapes:
            return self.last_state
        spec = self.model.spec_for(shapes)
        if spec is None:
            return None
        st = self.states.get(id(spec))
        if st is None:
            st = self.states[id(spec)] = SpecState(spec, self)
        self.last_shapes, self.last_state = shapes, st
        return st

    def run(self, inputs: list, hand_out: bool, buffer_set: int = 0, carried: tuple | None = None) -> list | None:
        """Outputs for ``inputs`` (in the model's input order), or None when no specialization
        serves these shapes (the caller runs the interpreter). ``buffer_set``: which of the kept
        output buffers (numpy mode, loop bodies) this run writes. ``carried = (shift, n)``: a Loop
        or Scan body's run, whose output ``j`` that is its input ``j + shift`` (``j + shift < n``:
        a value the body passes through unchanged, an invariant of the iterations) goes back
        uncopied (bodies.py)."""
        shapes = tuple([x.shape if isinstance(x, torch.Tensor) else None for x in inputs])
        st = self.state(shapes)
        if st is None:
            return None
        self.hand_out = hand_out
        self.buffer_set = buffer_set
        self.owned = []
        self.traced = False
        self.model.calls += 1  # (racy across requests: a threshold, not a count anyone reads exactly)
        ctx = self.model.context if self.model.marks_calls else None
        if ctx is not None:  # builds beside may wait or pause for the call (impls/context.py idle, Courtesy)
            ctx.call_began()
        try:
            outs = st.spec.run(st, *inputs)
        except Exception as e:
            self._forget()
            raise _named(e, st.spec) from e
        finally:
            if ctx is not None:
                ctx.call_ended()
        self.stats["compiled_runs"] += 1
        if st.spec.inplace_inputs:
            self.stats["concat_inputs_in_place"] += st.spec.inplace_inputs
        return self._collect(st, list(outs), inputs, carried)

    def _collect(self, st: SpecState, outs: list, inputs: list, carried: tuple | None = None) -> list:
        for j, action in enumerate(st.spec.outputs):
            t = outs[j]
            if isinstance(t, list):  # a sequence may hold tensors the next run overwrites
                outs[j] = [x.clone() if isinstance(x, torch.Tensor) else x for x in t]
            elif isinstance(t, torch.Tensor) and (
                    action == "clone" or (action == "check" and self._aliases(t, inputs))):
                if carried is not None and j + carried[0] < carried[1] and t is inputs[j + carried[0]]:
                    continue  # passed through unchanged: the same value every iteration
                outs[j] = t.clone()
        if self.hand_out:
            for kv in st.kv:
                kv.hand_out()
        self.owned = []
        return outs

    def _aliases(self, t: torch.Tensor, inputs: list) -> bool:
        if t._base is not None:
            return True
        ptr = t.untyped_storage().data_ptr()
        if self.arena is not None and ptr == self.arena.untyped_storage().data_ptr():
            return True
        return any(isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() == ptr for x in inputs)

    def _forget(self) -> None:
        """After a failed run: nothing half-built is kept (its output buffers die with it)."""
        self.owned = []
        self.last_shapes = self.last_state = None
        for kv in self._kv.values():
            kv.pending = None

    def close(self) -> None:
        for kv in self._kv.values():
            kv.close()


def _named(e: Exception, spec: SpecCode) -> Exception:
    """The exception of a generated line as an ExecutionError naming its node."""
    tb = e.__traceback__
    node = None
    frame_locals = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == spec.filename:
            node = spec.line_nodes.get(tb.tb_lineno, node)
            frame_locals = tb.tb_frame.f_locals
        tb = tb.tb_next
    if node is None:
        return e if isinstance(e, DynashapeError) else ExecutionError(f"generated code failed: {type(e).__name__}: {e}")
    shapes = _input_shapes(node, spec, frame_locals or {})
    return at_node(e, node.name, node.op_type, f" with input shapes {shapes}")


def _input_shapes(node, spec: SpecCode, f_locals: dict) -> list:
    out = []
    for v in node.inputs:
        if v is None:
            out.append(None)
            continue
        info = spec.trace.info.get(id(v))
        dims = None if info is None else info.dims
        try:
            out.append(tuple(int(E.evaluate(d.expr if hasattr(d, "expr") else d, _symbols(spec, f_locals)))
                             for d in dims) if dims is not None else None)
        except (KeyError, TypeError):
            out.append(None)
    return out


def _symbols(spec: SpecCode, f_locals: dict) -> dict:
    env = {}
    for name, var in spec.namespace.get("__symvars__", {}).items():
        if var in f_locals:
            env[name] = f_locals[var]
    return env
