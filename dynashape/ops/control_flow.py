"""Control flow: If, Loop, Scan, SequenceMap.

A body runs as a nested Network (interpreter/subgraph.py) or as generated code
(runtime/bodies.py), reading outer-scope values of this run. The interpreter's bodies hand their
outputs over (fresh tensors each call); a compiled Loop or Scan body writes into two buffer sets
in turn (``reuses_outputs``), and the op copies what it keeps past the next iteration. Either
way a value carried from one iteration to the next is never overwritten by the iteration that
reads it. All four are data-dependent: how often a body runs, and so the output shapes, is known
only at run time.
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..ir.dtypes import torch_dtype
from .limits import check_loop
from .registry import op
from .shapes import first_item, norm_axis


def _if(cond, *, then_branch, else_branch, out=None):
    # The branch taken decides the output shapes: known only once the condition is read.
    taken, other = (then_branch, else_branch) if bool(first_item(cond)) else (else_branch, then_branch)
    outs = taken()
    warm = getattr(other, "warm", None)  # compiled bodies: the other branch compiled at the first run
    if warm is not None:
        warm()
    return tuple(outs) if len(outs) > 1 else outs[0]


op("If", (1, 11, 13, 16, 19, 21, 23), infer=None)(_if)


def _result(outs: list):
    return tuple(outs) if len(outs) != 1 else outs[0]


def _stack(items: list, axis: int = 0, reverse: bool = False) -> torch.Tensor:
    if reverse:
        items = items[::-1]
    return torch.stack(items, norm_axis(axis, items[0].dim() + 1))


_PREALLOCATE = 1 << 16  # iterations up to which a scan output's stack is made up front


class _Scans:
    """The scan outputs of a Loop or Scan, iteration by iteration. A body that reuses its output
    buffers (the compiled runtime's) hands back the same memory every other iteration: each
    output is copied into a stack made at the first iteration when the count is known, else
    cloned; otherwise the body's fresh tensors are kept as they are."""

    def __init__(self, n: int, copy: bool, count: int | None) -> None:
        self.copy, self.count = copy, count if count is not None and count <= _PREALLOCATE else None
        self.items: list[list] = [[] for _ in range(n)]
        self.bufs: list = [None] * n
        self.done = 0

    def add(self, outs) -> None:
        for k, s in enumerate(outs):
            if not self.copy:
                self.items[k].append(s)
            elif self.count is not None:
                if self.bufs[k] is None:
                    self.bufs[k] = s.new_empty((self.count, *s.shape))
                self.bufs[k][self.done].copy_(s)
            else:
                self.items[k].append(s.clone())
        self.done += 1

    def stacked(self, k: int, axis: int = 0, reverse: bool = False, device=None) -> torch.Tensor:
        if self.bufs[k] is None:
            items = self.items[k]
            return _stack(items, axis, reverse) if items else torch.empty((0,), device=device)
        r = self.bufs[k][:self.done]
        if reverse:
            r = r.flip(0)
        return r.movedim(0, norm_axis(axis, r.dim()))


def _no_scans(body, index: int, device) -> torch.Tensor:
    """A scan output of a Loop that ran no iteration: no element, but the rank and dtype the
    body's output has (onnxruntime: (0, *its dims), a dim not fixed by the graph 0), which the
    code after the Loop was traced for; (0,) of float32 where the body does not say."""
    graph = getattr(body, "graph", None)
    v = graph.outputs[index] if graph is not None and index < len(graph.outputs) else None
    dtype = torch.float32
    if v is not None and v.kind == "tensor":
        try:
            dtype = torch_dtype(v.elem_type)
        except KeyError:
            pass  # (a type torch does not hold: the float32 of a loop that made nothing)
    if v is None or v.shape is None:
        return torch.empty((0,), dtype=dtype, device=device)
    dims = [d.min if d.is_static else 0 for d in v.shape]
    return torch.empty((0, *dims), dtype=dtype, device=device)


def _owned(t):
    return t.clone() if isinstance(t, torch.Tensor) else t


def _loop(M=None, cond=None, *v_initial, body, _n_outputs=1, _device=None, out=None):
    """for (i = 0; i < M && keep_going; ++i). The body's condition output stops the loop whether or
    not the loop has a condition input: the spec's table calls it ignored in the (M, "") form, but
    onnxruntime stops on it there, and models are made to run on onnxruntime (a Loop(M, "") whose
    body turned its condition false ran on here and gave -2.579 where onnxruntime gives -1.579)."""
    trips = None if M is None else int(first_item(M))
    keep = True if cond is None else bool(first_item(cond))
    carried = list(v_initial)
    n_scan = _n_outputs - len(carried)
    reuses = getattr(body, "reuses_outputs", False)
    scans = _Scans(n_scan, reuses, trips)
    i = 0
    while keep and (trips is None or i < trips):
        check_loop(i)
        it = torch.tensor(i, dtype=torch.int64, device=_device)
        c = torch.tensor(keep, device=_device)
        outs = body(it, c, *carried)
        keep = bool(first_item(outs[0]))
        carried = list(outs[1:1 + len(carried)])
        scans.add(outs[1 + len(carried):])
        i += 1
    if i == 0 or reuses:  # the initial values, or the body's buffers: the caller gets its own copy
        carried = [_owned(c) for c in carried]
    if i == 0:
        stacked = [_no_scans(body, 1 + len(carried) + k, _device) for k in range(n_scan)]
    else:
        stacked = [scans.stacked(k, device=_device) for k in range(n_scan)]
    return _result(carried + stacked)


op("Loop", (1, 11, 13, 16, 19, 21, 23), infer=None)(_loop)


def _scan_run(body, states: list, xs: list, in_axes, in_dirs, out_axes, out_dirs, n_out: int):
    """One scan over the slices of ``xs``; returns final states and stacked scan outputs."""
    length = xs[0].shape[in_axes[0]] if xs else 0
    for x, a in zip(xs, in_axes):
        if x.shape[a] != length:
            raise ShapeError(f"scan inputs disagree on the scan length: {x.shape[a]} vs {length}")
    reuses = getattr(body, "reuses_outputs", False)
    scans = _Scans(n_out - len(states), reuses, length)
    for t in range(length):
        sl = [x.select(a, length - 1 - t if d else t) for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = body(*states, *sl)
        states = list(outs[:len(states)])
        scans.add(outs[len(states):])
    if length == 0:
        raise ShapeError("Scan over a length-0 axis: the scan outputs' shapes are not defined")
    if reuses:
        states = [_owned(s) for s in states]
    stacked = [scans.stacked(k, out_axes[k], bool(out_dirs[k])) for k in range(n_out - len(states))]
    return states, stacked


@op("Scan", (9, 11, 16, 19, 21, 23), infer=None)
def _scan(*inputs, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
          scan_output_axes=None, scan_output_directions=None, _n_outputs=1, out=None):
    n_state = len(inputs) - num_scan_inputs
    states, xs = list(inputs[:n_state]), list(inputs[n_state:])
    n_scan_out = _n_outputs - n_state
    in_axes = [norm_axis(a, x.dim()) for a, x in zip(scan_input_axes or [0] * len(xs), xs)]
    in_dirs = scan_input_directions or [0] * len(xs)
    out_axes = scan_output_axes or [0] * n_scan_out
    out_dirs = scan_output_directions or [0] * n_scan_out
    states, stacked = _scan_run(body, states, xs, in_axes, in_dirs, out_axes, out_dirs, _n_outputs)
    return _result(states + stacked)


@op("Scan", 8, infer=None)
def _scan8(sequence_lens, *inputs, body, num_scan_inputs, directions=None, _n_outputs=1, out=None):
    """Opset 8: axis 0 of every input is a batch; each batch item scans its own sequence
    (of length sequence_lens[b] when given, the rest of the scan outputs being zeros)."""
    n_state = len(inputs) - num_scan_inputs
    dirs = directions or [0] * num_scan_inputs
    batch = inputs[0].shape[0]
    per_item = []
    for b in range(batch):
        xs = [x[b] for x in inputs[n_state:]]
        if sequence_lens is not None:
            n = int(sequence_lens.reshape(-1)[b])
            xs = [x[:n] for x in xs]
        n_scan_out = _n_outputs - n_state
        per_item.append(_scan_run(body, [s[b] for s in inputs[:n_state]], xs, [0] * len(xs), dirs,
                                  [0] * n_scan_out, [0] * n_scan_out, _n_outputs))
    states = [torch.stack([p[0][k] for p in per_item]) for k in range(n_state)]
    longest = max(p[1][0].shape[0] for p in per_item) if _n_outputs > n_state else 0
    scans = []
    for k in range(_n_outputs - n_state):
        items = [torch.nn.functional.pad(p[1][k], (0, 0) * (p[1][k].dim() - 1) + (0, longest - p[1][k].shape[0]))
                 for p in per_item]
        scans.append(torch.stack(items))
    return _result(states + scans)


@op("SequenceMap", 17, infer=None)
def _sequence_map(seq, *additional, body, _n_outputs=1, out=None):
    """Run the body on element i of every sequence input (tensor inputs are passed whole)."""
    results: list[list] = [[] for _ in range(_n_outputs)]
    for i in range(len(seq)):
        extra = [a[i] if isinstance(a, list) else a for a in additional]
        for k, o in enumerate(body(seq[i], *extra)):
            results[k].append(o)
    return _result(results)
