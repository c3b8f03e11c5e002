"""``build_spec``: one specialization's code generated (``builder.py``), compiled, and handed over as a ``SpecCode``."""

from __future__ import annotations

import linecache
import operator
from itertools import count

import torch

from ..compile.memory_plan import MemoryPlan
from ..compile.shape_program import Trace
from ..ir import Value
from . import align
from .builder import _Builder
from .spec_code import RegionCode, SpecCode, StepCode

_ids = count()


def _output_action(plan: MemoryPlan, v: Value) -> str:
    """What the caller's copy of output ``v`` needs: ``keep`` (its memory is the caller's),
    ``clone`` (it is memory the request keeps, an input or a constant), ``check`` (a kernel result
    that may be an input or a view of one: decided at run time)."""
    c = plan.cls.get(id(v), "const" if v.is_const else "input")
    if c in ("input", "const", "sym", "memo"):
        return "clone"
    if c == "view":
        kept = ("arena", "input", "const", "memo", "sym")
        return "clone" if any(plan.cls.get(r) in kept for r in plan.roots.get(id(v), ())) else "keep"
    if c == "adopt" and id(v) in plan.outputs_needing_check:
        return "check"
    return "keep"


def build_spec(trace: Trace, device: torch.device, consts_device, consts_host, inplace: bool = True) -> SpecCode:
    """Generate and compile the code of one specialization (see the module docstring).
    ``consts_device(v)`` / ``consts_host(v)`` give a constant's tensor on the device / host;
    ``inplace``: producers write into their slot of a Concat's buffer."""
    b = _Builder(trace, device, consts_device, consts_host, inplace)
    b.build()
    source, line_nodes, groups = b.assemble()
    filename = f"<dynashape:{trace.graph.name}:{next(_ids)}>"
    code = compile(source, filename, "exec")
    ns = b.ns
    exec(code, ns)  # noqa: S102  our own generated source
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns["__symvars__"] = dict(b.symvar)
    outputs = [_output_action(b.plan, v) for v in trace.graph.outputs]
    spec = SpecCode(trace, b.plan, source, filename, ns["run"], ns["accepts"], [ns[f"g{g.index}"] for g in groups],
                    groups, b.sig_symbols, b.plan.arena, b.arena_dtypes,
                    [b.arena_dtypes.index(trace.of(a.value).dtype) for a in b.plan.arena], b.output_values,
                    b.kv_nodes, b.sub_nodes, outputs, line_nodes, ns, b.inplace_inputs,
                    tuple(i for i, name in enumerate(b.sig_symbols)
                          if any(name in a.nbytes.free for a in b.plan.arena)))
    spec.group_keys = [_key_of(g.key) for g in groups]
    spec.accepted_guards = b.accepted_guards  # what ``accepts`` checks (tests: every guard the build made)
    spec.kernel_items = sum(1 for it in b.items if it.node is not None)
    spec.bound_kernels = b.bound_kernels
    spec.sized_nodes = b.sized_nodes
    spec.step_refused = b.step_refused if b.kv_nodes else ""
    spec.input_locals = [b.local[id(v)] for v in trace.input_values]
    where = {name: (g.index, j) for g in groups for j, name in enumerate(g.members)}  # arena members
    if b.step is not None:
        spec.step = StepCode(b.step, ns["step"], {n: where[n] for n in b.step.live_in + b.step.prep_live_in
                                                  if n in where}, ns.get("prep") if b.step.prep else None)
    values = {id(v): v for n in trace.graph.nodes for v in n.inputs + n.outputs if v is not None}
    values.update((id(v), v) for v in trace.input_values)
    by_local = {name: values[i] for i, name in b.local.items() if i in values}
    for r in b.regions:
        symvars = [b.symvar[x] for x in sorted(r.syms)]
        body = [line for i in r.items for line in b.items[i].lines]
        nodes = [b.items[i].node for i in r.items if b.items[i].node is not None]
        aligned = align.plan(r, nodes, body, where, lambda n: b.member_info[n].shape_syms, by_local.get,
                             lambda v: trace.info[id(v)].dims if id(v) in trace.info else None,
                             lambda d: trace.env.canon(d.expr), b.input_symbols, b.sig_symbols)
        spec.regions.append(RegionCode(r, ns[f"r{r.index}"], symvars, body, aligned))
    spec.aligned_positions = {}
    for rc in spec.regions:
        if rc.align is not None and rc.align.kind != "tokens":  # (theirs: token_positions)
            spec.aligned_positions.setdefault(rc.align.sig_pos, set()).add(rc.align.kind)
    spec.token_positions = sorted({(rc.align.sig_pos, rc.align.sig_pos2) for rc in spec.regions
                                   if rc.align is not None and rc.align.kind == "tokens"})
    return spec


def _key_of(positions: tuple[int, ...]):
    if not positions:
        return lambda sig: ()
    if len(positions) == 1:
        (p,) = positions
        return lambda sig: (sig[p],)
    return operator.itemgetter(*positions)
