"""Control flow. A body runs as a nested Network (runtime/subgraph.py) that reads outer-scope
values from the parent's slots at call time. Loop and Scan come with the conformance issue."""

from __future__ import annotations

from .registry import op


def _if(cond, *, then_branch, else_branch, out=None):
    # The branch taken decides the output shapes: known only once the condition is read.
    outs = (then_branch if bool(cond.reshape(-1)[0]) else else_branch)()
    return tuple(outs) if len(outs) > 1 else outs[0]


for _s in (1, 11, 13, 16, 19, 21, 23):
    op("If", _s, infer=None)(_if)
