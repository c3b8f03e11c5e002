"""A decode loop's step without a run: the last run's whole-step graph, bound (issue 38's lean step).

A generation loop calls the model once a token, and on a GPU a run's host work around the replayed
graph is more than the graph's own time: the feeds checked and staged, the shapes' symbols computed
and the specialization found, every past checked to be the last step's present and a view of each
KV storage handed back (24 tensors for a 12-layer model), the outputs collected. onnxruntime's
answer is IOBinding: the inputs and outputs bound once and kept on the device between calls.
``BoundStep`` is that for the whole-step decode (``decode_graph.py``): the KV stays in the bucket's
storages (the caller holds no view of them), a step writes only what changes (the token ids, the
positions, the mask's new column, the length ``P``), replays the graph and returns its output
buffers, valid until the next step.

It serves exactly the steps the run would have served by a replay of the same graph, and declines
(None) every other one: the bucket's end, the point where the next bucket's graph is to be built
ahead, an input of another shape, dtype or device, a bucket the request let go of. The caller then
takes the KV as presents (``presents()``), runs normally and binds again.
"""

from __future__ import annotations

import torch

from ..errors import ExecutionError, RequestBusyError


class BoundStep:
    """One request's decode step, bound to the bucket of ``key`` of ``graphs`` (a DecodeGraphs)."""

    def __init__(self, graphs, key: tuple, bucket, request, feeds: dict) -> None:
        self.graphs, self.key, self.b, self.request = graphs, key, bucket, request
        names = request._input_names
        self.n_inputs = len(names)
        self.past_names = [names[k] for k in graphs.past_pos]  # the storages' pasts, in their order
        padded = {k: axis for _, k, axis in graphs.pad_slots}
        # each input the step takes, as the run before took it: (name, position, shape, dtype, padded axis)
        self.feeds = []
        for k, name in enumerate(names):
            if k in graphs.past_pos:
                continue
            x = feeds[name]
            self.feeds.append((name, k, tuple(x.shape), x.dtype, padded.get(k)))
        self.new = graphs.new_len(*key) if graphs.kpos else graphs.new_len(0)
        results = graphs.plan.results
        outputs = [o.name for o in request.session.program.graph.outputs]
        self.outs = [(outputs[r], j) for r, (kind, j) in enumerate(results) if kind == "out"]
        self.device = graphs.device
        self.program = request.program

    def __call__(self, feeds: dict) -> dict | None:
        """The step over ``feeds`` (every input but the pasts): the outputs that are not presents,
        by name (the graph's buffers: read them before the next step), or None when a run must
        serve it."""
        req = self.request
        if not req._busy.acquire(blocking=False):
            raise RequestBusyError("this request is running for another caller; use one request per thread")
        try:
            return self._step(feeds)
        finally:
            req._busy.release()

    def _step(self, feeds: dict) -> dict | None:
        graphs, b = self.graphs, self.b
        g = b.filled
        total = g + self.new
        if graphs.buckets.get(self.key) is not b or b.impl is None or self.request.program is not self.program:
            return self._decline()
        if total > b.cap or (graphs.ahead and total + graphs.ahead >= b.cap and self.key not in graphs.next):
            return self._decline()  # a bucket change, or the next bucket's build to start: a run's work
        inputs = [None] * self.n_inputs
        for name, k, shape, dtype, axis in self.feeds:
            x = feeds[name]
            if not isinstance(x, torch.Tensor) or x.dtype != dtype or x.device != self.device:
                return self._decline()
            if axis is None:
                if x.shape != shape:
                    return self._decline()
            elif x.dim() != len(shape) or x.shape[axis] != total:
                return self._decline()
            inputs[k] = x
        if not graphs._fill_pads(b, inputs):
            return self._decline()
        outs = graphs._replay(b, inputs, g)
        if outs is None:
            return self._decline()
        b.filled = total
        graphs.stats["decode_bound_steps"] += 1
        return {name: outs[j] for name, j in self.outs}

    def _decline(self) -> None:
        self.graphs.stats["decode_bound_declines"] += 1
        return None

    def presents(self) -> dict[str, torch.Tensor]:
        """The KV as a run returns it (views of the storages at the current length), by the name
        of the past input each feeds: what the caller gives its next run."""
        b, axes = self.b, self.graphs.axes
        if not b.storages:  # only a run of this request lets a bucket go, and none ran since the bind
            raise ExecutionError("a bound decode step's KV storages were given back; the generation cannot go on")
        views = [s.narrow(a, 0, b.filled) for s, a in zip(b.storages, axes)]
        b.shapes = [v.shape for v in views]
        b.handed = True
        return dict(zip(self.past_names, views))
