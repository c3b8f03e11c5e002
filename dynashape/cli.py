"""The dynashape command: `run` a model on given shapes, `demo` a decode loop, `show` a program or its code,
`check` a model's ops and inputs (and, --compare, its results against onnxruntime)."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .errors import DynashapeError


def _parse_dims(text: str) -> tuple[int, ...]:
    parts = text.replace("x", ",").split(",") if text else []
    try:
        return tuple(int(p) for p in parts if p != "")
    except ValueError as e:
        raise SystemExit(f"dynashape: bad dims {text!r}; write them as 1x3x224x224 or 1,3,224,224") from e


def _parse_range(text: str):
    from .shape import Dimension
    lo, _, hi = text.partition(":")
    return Dimension(int(lo), int(hi) if hi else None)


def _random_input(name: str, elem_type: int, shape, rng, int_high: int):
    from .ir import np_dtype
    dt = np_dtype(elem_type) if elem_type else np.dtype(np.float32)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0, int_high, size=shape).astype(dt)
    return rng.uniform(-1, 1, size=shape).astype(dt)


def _feeds(sess, args, guess: bool = False) -> dict:
    """Feeds from --inputs and --shape, random where not given; ``guess``: a dynamic dim not
    given takes a typical value (an optimal value, else 2 within its range) instead of an error."""
    shapes = {k: _parse_dims(v) for k, v in (s.split("=", 1) for s in args.shape or [])}
    feeds = dict(np.load(args.inputs)) if getattr(args, "inputs", None) else {}
    rng = np.random.default_rng(getattr(args, "seed", 0))
    for arg in sess.get_inputs():
        if arg.name in feeds:
            continue
        shape = shapes.get(arg.name)
        ps = arg.partial_shape
        if shape is None and ps is not None and not ps.is_static and guess:
            shape = tuple(d.min if d.is_static else (d.optimals[0] if d.optimals else max(d.min, min(2, d.max or 2)))
                          for d in ps)
        if shape is None:
            if ps is None or not ps.is_static:
                raise SystemExit(f"dynashape: input {arg.name!r} has dynamic shape {ps}; give it with "
                                 f"--shape {arg.name}=DIMS")
            shape = ps.to_static()
        spec = next(s for s in sess._specs if s.name == arg.name)
        feeds[arg.name] = _random_input(arg.name, spec.elem_type, shape, rng, getattr(args, "int_high", 10))
    return feeds


def _session(args):
    from . import InferenceSession
    opts = {}
    if getattr(args, "default_dynamic_dim", None):
        opts["default_dynamic_dim"] = _parse_range(args.default_dynamic_dim)
    if getattr(args, "dim_param", None):
        opts["dim_params"] = {k: _parse_range(v) for k, v in (p.split("=", 1) for p in args.dim_param)}
    return InferenceSession(args.model, device=getattr(args, "device", "cpu"), **opts)


def cmd_run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    sess = _session(args)
    feeds = _feeds(sess, args)
    times = []
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    table = Table(title=f"{args.model} on {sess.device}")
    for col in ("output", "shape", "dtype", "sum", "sum |x|"):
        table.add_column(col)
    for arg, o in zip(sess.get_outputs(), outs):
        a = np.asarray(o)
        num = a.dtype != object
        table.add_row(arg.name, str(list(a.shape)), str(a.dtype),
                      f"{a.astype(np.float64).sum():.6g}" if num else "-",
                      f"{np.abs(a.astype(np.float64)).sum():.6g}" if num else "-")
    con = Console()
    con.print(table)
    con.print(f"first run {times[0] * 1e3:.2f} ms; median of {len(times)} runs {np.median(times) * 1e3:.2f} ms")
    return 0


def cmd_demo(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import InferenceSession
    from .demo_model import HEAD_DIM, HEADS, build_demo_model
    sess = InferenceSession(build_demo_model(), device=args.device)
    rng = np.random.default_rng(args.seed)
    b = args.batch
    ids = rng.integers(0, 256, size=(b, args.prompt)).astype(np.int64)
    past_k = rng.standard_normal((b, HEADS, 1, HEAD_DIM)).astype(np.float32)  # one "BOS" position
    past_v = rng.standard_normal((b, HEADS, 1, HEAD_DIM)).astype(np.float32)
    table = Table(title=f"dynashape demo: tiny decoder, batch {b}, on {sess.device}")
    for col in ("step", "input_ids", "past", "logits", "present", "ms"):
        table.add_column(col, justify="right")
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        logits, past_k2, past_v2 = sess.run(None, {"input_ids": ids, "past_key": past_k, "past_value": past_v})
        ms = (time.perf_counter() - t0) * 1e3
        table.add_row(str(step), str(list(ids.shape)), str(list(past_k.shape)), str(list(logits.shape)),
                      str(list(past_k2.shape)), f"{ms:.2f}")
        ids = logits[:, -1:, :].argmax(-1).astype(np.int64)  # greedy next token
        past_k, past_v = past_k2, past_v2
    con = Console()
    con.print(table)
    st = sess.stats()
    con.print(f"specializations of the generated code: {st.get('specializations', 0)} "
              f"(traced {st.get('shape_program_traces', 0)}); view builds {st.get('group_builds', 0)}, "
              f"found again {st.get('group_hits', 0)}; allocations {st.get('allocations', 0)}")
    return 0


def cmd_show(args) -> int:
    sess = _session(args)
    if not args.code:
        print(sess.program)
        return 0
    if sess.compiled is None:
        raise SystemExit("dynashape: --code shows generated code; the interpreter has none")
    sess.run(None, _feeds(sess, args, guess=True))  # a run makes the specialization of these shapes
    for spec in sess.compiled.specs:
        t = spec.trace
        print(f"# {spec.filename}: {len(t.nodes)} nodes {t.counts()}; guards: "
              f"{[g.source(lambda x: x) for g in t.guards] or 'none'}")
        print(spec.source)
    return 0


def cmd_check(args) -> int:
    """Ops, inputs and (--compare) errors against onnxruntime; exit 1 when something is missing or wrong."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import check
    from .frontend.onnx import load_model_proto
    con = Console()
    proto = load_model_proto(args.model)
    ops = check.op_report(proto)
    missing = [r for r in ops if not r.supported]
    t = Table(title=f"{args.model}: {len(ops)} op types, {sum(r.count for r in ops)} nodes")
    for col in ("domain", "op", "opset", "nodes", "supported"):
        t.add_column(col)
    for r in ops:
        t.add_row(r.domain or "ai.onnx", r.op_type, str(r.opset), str(r.count),
                  "yes" if r.supported else f"[red]NO[/red] {r.detail}")
    con.print(t)
    t = Table(title="inputs")
    for col in ("input", "dtype", "dims", "note"):
        t.add_column(col)
    for r in check.input_report(proto):
        t.add_row(r.name, r.dtype, escape("[" + ", ".join("?" if d is None else str(d) for d in r.dims) + "]"),
                  escape(r.note))
    con.print(t)
    ok = not missing
    if missing:
        con.print(f"[red]{len(missing)} op type(s) have no kernel here:[/red] "
                  + ", ".join(f"{r.op_type} ({r.domain or 'ai.onnx'}, opset {r.opset})" for r in missing))
    if args.compare and ok:
        given = {k: _parse_dims(v) for k, v in (s.split("=", 1) for s in args.shape or [])}
        unknown = sorted(set(given) - {r.name for r in check.input_report(proto)})
        if unknown:
            raise SystemExit(f"dynashape: --shape names {unknown}, which the model's inputs are not")
        rows = check.compare(args.model, trials=args.trials, seed=args.seed, given=given, int_high=args.int_high,
                             device=args.device)
        t = Table(title=f"dynashape vs onnxruntime, {args.trials} random shapes, one session")
        for col in ("shapes", "max |error| per output", "result"):
            t.add_column(col)
        for r in rows:
            t.add_row(" ".join(f"{k}={'x'.join(map(str, v))}" for k, v in r.shapes.items()),
                      ", ".join(f"{k}: {v:.3g}" for k, v in r.errors.items()), r.status)
        con.print(t)
        ok = ok and all(r.status in ("match",) or r.status.startswith("onnxruntime refused") for r in rows)
    con.print("[green]OK[/green]" if ok else "[red]NOT OK[/red]")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dynashape", description="Run ONNX models with dynamic shapes.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a model on random inputs of given shapes (or an .npz)")
    r.add_argument("model")
    r.add_argument("--shape", action="append", metavar="NAME=DIMS", help="e.g. input_ids=1x16")
    r.add_argument("--inputs", help=".npz file of named inputs")
    r.add_argument("--device", default="cpu")
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--int-high", type=int, default=10, help="random integer inputs lie in [0, this)")
    r.add_argument("--default-dynamic-dim", metavar="MIN:MAX")
    r.add_argument("--dim-param", action="append", metavar="SYMBOL=MIN:MAX")
    d = sub.add_parser("demo", help="decode loop of the embedded default model, shapes growing each step")
    d.add_argument("--steps", type=int, default=16)
    d.add_argument("--prompt", type=int, default=8)
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--device", default="cpu")
    d.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("show", help="print the compiled program, or (--code) the generated code")
    s.add_argument("model")
    s.add_argument("--code", action="store_true",
                   help="the generated code of the specialization for --shape (typical sizes where not given)")
    s.add_argument("--shape", action="append", metavar="NAME=DIMS", help="e.g. input_ids=1x16")
    s.add_argument("--device", default="cpu")
    c = sub.add_parser("check", help="is every op supported, which inputs are dynamic; --compare: errors vs "
                                     "onnxruntime over random shapes")
    c.add_argument("model")
    c.add_argument("--compare", action="store_true", help="run random shapes here and in onnxruntime")
    c.add_argument("--trials", type=int, default=3, help="how many random shapes (--compare)")
    c.add_argument("--shape", action="append", metavar="NAME=DIMS", help="fix an input's shape, e.g. x=1x3x64x64")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--int-high", type=int, default=10, help="random integer inputs lie in [1, this)")
    c.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    try:
        return {"run": cmd_run, "demo": cmd_demo, "show": cmd_show, "check": cmd_check}[args.cmd](args)
    except DynashapeError as e:
        print(f"dynashape: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
