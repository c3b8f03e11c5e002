"""The dynashape command: `run` a model on given shapes, `demo` a decode loop, `show` a program or its code,
`check` a model's ops and inputs (and, --compare, its results against onnxruntime), `bench` latency and
throughput over a sequence of shapes, `ops` the supported operators.

Exit codes: 0 ok, 1 a check that found problems, 2 a bad command-line value or input, 3 a model that
cannot be loaded (invalid, or an op without a kernel), 4 another dynashape error, 5 an internal error
(DYNASHAPE_TRACEBACK=1 shows its traceback), 130 interrupted.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import click
import numpy as np

from .cli_common import (  # noqa: F401  (also the names tests and bench use)
    UsageExit,
    _console,
    _feeds,
    _model_ranks,
    _parse_dims,
    _parse_dynamic_dim,
    _parse_range,
    _parse_shape_arg,
    _parse_shapes,
    _random_input,
    _session,
    _table,
    _version,
    check_names,
    dynamic_dims_option,
    input_shape,
    load_checked,
    random_feeds,
)
from .errors import DynashapeError, InputError, InvalidModelError, OptionsError, UnsupportedOpError


def cmd_run(args) -> int:
    sess = _session(args)
    feeds = _feeds(sess, args)
    times = []
    con = _console()
    n = max(1, args.repeat)
    warm = max(0, args.warmup)
    outs = None
    try:
        for i in range(n + warm):
            t0 = time.perf_counter()
            outs = sess.run(None, feeds)
            dt = time.perf_counter() - t0
            if i == 0 or i >= warm:
                times.append(dt)
            if n + warm > 3 and i == 0:
                con.print(f"first run {dt * 1e3:.2f} ms; {n + warm - 1} more ...", highlight=False)
    except KeyboardInterrupt:
        con.print("[yellow]interrupted[/yellow]")
        if outs is None:
            return 130
    table = _table(f"{args.model} on {sess.device}", ("output", "shape", "dtype", "sum", "sum |x|"))
    for arg, o in zip(sess.get_outputs(), outs):
        a = np.asarray(o)
        num = a.dtype != object
        table.add_row(arg.name, str(list(a.shape)), str(a.dtype),
                      f"{a.astype(np.float64).sum():.6g}" if num else "-",
                      f"{np.abs(a.astype(np.float64)).sum():.6g}" if num else "-")
    con.print(table)
    rest = times[1:]
    msg = f"first run {times[0] * 1e3:.2f} ms"
    if rest:
        r = np.asarray(rest) * 1e3
        msg += (f"; after {warm} warm-up run(s), {len(r)} runs: median {np.median(r):.2f} ms, "
                f"p90 {np.percentile(r, 90):.2f} ms, min {r.min():.2f} ms")
    con.print(msg, highlight=False, soft_wrap=True)
    return 0


def cmd_demo(args) -> int:
    from . import InferenceSession
    from .demo_model import HEAD_DIM, HEADS, build_demo_model
    sess = InferenceSession(build_demo_model(), device=args.device)
    rng = np.random.default_rng(args.seed)
    b = args.batch
    ids = rng.integers(0, 256, size=(b, args.prompt)).astype(np.int64)
    past_k = rng.standard_normal((b, HEADS, 1, HEAD_DIM)).astype(np.float32)  # one "BOS" position
    past_v = rng.standard_normal((b, HEADS, 1, HEAD_DIM)).astype(np.float32)
    table = _table(f"dynashape demo: tiny decoder, batch {b}, on {sess.device}",
                   ("step", "input_ids", "past", "logits", "present", "ms"))
    for c in table.columns:
        c.justify = "right"
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        logits, past_k2, past_v2 = sess.run(None, {"input_ids": ids, "past_key": past_k, "past_value": past_v})
        ms = (time.perf_counter() - t0) * 1e3
        table.add_row(str(step), str(list(ids.shape)), str(list(past_k.shape)), str(list(logits.shape)),
                      str(list(past_k2.shape)), f"{ms:.2f}")
        ids = logits[:, -1:, :].argmax(-1).astype(np.int64)  # greedy next token
        past_k, past_v = past_k2, past_v2
    con = _console()
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
        raise UsageExit("dynashape: --code shows generated code; the interpreter has none")
    _run_typical(sess, args)  # a run makes the specialization of these shapes
    for spec in sess.compiled.specs:
        t = spec.trace
        print(f"# {spec.filename}: {len(t.nodes)} nodes {t.counts()}; guards: "
              f"{[g.source(lambda x: x) for g in t.guards] or 'none'}")
        print(spec.source)
    return 0


# lengths tried for dynamic dims not given, after 2, when a model rejects smaller ones (an audio
# model's convolution window, a minimum sequence): each input's first dynamic axis stays 2, the others grow
TYPICAL_LENGTHS = (16, 64, 256, 576, 1024)


def _run_typical(sess, args) -> None:
    """Run at the given shapes, guessing the rest (``input_shape``): 2, then longer lengths for
    the axes after each input's first dynamic one while the model says the shape is too small."""
    from .errors import ExecutionError, ShapeError
    first = None
    for later in (2, *TYPICAL_LENGTHS):
        feeds = _feeds(sess, args, guess=True, later=later)
        try:
            sess.run(None, feeds)
        except (ShapeError, ExecutionError) as e:
            if first is None:
                if not isinstance(e, ShapeError):
                    raise  # the first guess failed for another reason than its size
                first = e
            continue
        if first is not None:
            print(f"# typical shapes: {', '.join(f'{k}={list(v.shape)}' for k, v in feeds.items())} "
                  f"(2 was too small: {str(first).splitlines()[0][:160]})")
        return
    names = [a.name for a in sess.get_inputs() if a.partial_shape is not None and not a.partial_shape.is_static]
    raise UsageExit(f"dynashape: no typical shape ran ({first}); give the dynamic inputs' shapes with "
                    + " ".join(f"--shape {n}=DIMS" for n in names))


def cmd_check(args) -> int:
    """Ops, inputs and (--compare) errors against onnxruntime; exit 1 when something is missing or wrong."""
    from rich.markup import escape

    from . import check
    con = _console()
    proto = load_checked(args.model)
    ops = check.op_report(proto)
    missing = [r for r in ops if not r.supported]
    t = _table(f"{args.model}: {len(ops)} op types, {sum(r.count for r in ops)} nodes",
               ("domain", "op", "opset", "nodes", "supported"))
    for r in ops:
        t.add_row(r.domain or "ai.onnx", r.op_type, str(r.opset), str(r.count),
                  "yes" if r.supported else f"[red]NO[/red] {escape(r.detail)}")
    con.print(t)
    t = _table("inputs", ("input", "dtype", "dims", "note"))
    for r in check.input_report(proto):
        t.add_row(r.name, r.dtype, escape("[" + ", ".join("?" if d is None else str(d) for d in r.dims) + "]"),
                  escape(r.note))
    con.print(t)
    ok = not missing
    if missing:
        con.print(f"[red]{len(missing)} op type(s) have no kernel here:[/red] "
                  + ", ".join(f"{r.op_type} ({r.domain or 'ai.onnx'}, opset {r.opset})" for r in missing))
    if args.compare and ok:
        given = _parse_shapes(args.shape)
        check_names(given, [r.name for r in check.input_report(proto)], "--shape")
        rows = check.compare(args.model, trials=args.trials, seed=args.seed, given=given, int_high=args.int_high,
                             device=args.device)
        t = _table(f"dynashape vs onnxruntime, {args.trials} random shapes, one session",
                   ("shapes", "max |error| per output", "result"))
        for r in rows:
            t.add_row(" ".join(f"{k}={'x'.join(map(str, v))}" for k, v in r.shapes.items()),
                      ", ".join(f"{k}: {v:.3g}" for k, v in r.errors.items()), r.status)
        con.print(t)
        ok = ok and all(r.status in ("match",) or r.status.startswith("onnxruntime refused") for r in rows)
    con.print("[green]OK[/green]" if ok else "[red]NOT OK[/red]")
    return 0 if ok else 1


def cmd_ops(args) -> int:
    from .ops import registered
    from .ops.registry import domain_order, op_flags
    con = _console()
    rows: dict[str, list] = {}
    for (domain, op_type), versions in sorted(registered().items()):
        d = domain or "ai.onnx"
        if args.domain and args.domain not in (d, domain):
            continue
        flags = op_flags(versions[-1], adopts=False, host=True)
        rows.setdefault(d, []).append((op_type, ", ".join(str(v.since) for v in versions), "; ".join(flags)))
    if not rows:
        domains = sorted({d or "ai.onnx" for d, _ in registered()})
        raise UsageExit(f"dynashape: no ops in domain {args.domain!r}; the domains are {domains}")
    for d in domain_order(rows):
        t = _table(f"{d} ({len(rows[d])} ops)", ("op", "opsets", "notes"))
        for r in rows[d]:
            t.add_row(*r)
        con.print(t)
    con.print(f"{sum(len(r) for r in rows.values())} ops")
    return 0


def cmd_bench(args) -> int:
    from . import bench
    return bench.main(args)


# ---------------------------------------------------------------------------------------------------------------
# click wiring

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110, "show_default": True}

_model_arg = click.argument("model", metavar="MODEL")
_device_opt = click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N")
_seed_opt = click.option("--seed", type=int, default=0, show_default=True, help="seed of the random inputs")
_shape_opt = click.option("--shape", multiple=True, metavar="NAME=DIMS",
                          help="an input's shape, e.g. input_ids=1x16 (repeatable)")
_int_high_opt = click.option("--int-high", type=int, default=10, show_default=True,
                             help="random integer inputs lie in [0, this)")
_dyn_opt = click.option("--dynamic-dim", multiple=True, metavar="NAME=AXIS:MIN:MAX",
                        help="widen an input's axis to a range, e.g. x=0:1:32 (repeatable); the other axes stay "
                             "as the model declares them")
_ddd_opt = click.option("--default-dynamic-dim", metavar="MIN:MAX", default=None,
                        help="range of the model's symbolic dims that nothing else bounds")
_dim_param_opt = click.option("--dim-param", multiple=True, metavar="SYMBOL=MIN:MAX",
                              help="range of a dim_param of the model (repeatable)")


def _ns(**kw) -> SimpleNamespace:
    return SimpleNamespace(**kw)


@click.group(context_settings=CONTEXT, help="Run ONNX models with dynamic shapes on torch kernels.")
@click.version_option(_version(), "--version", "-V", prog_name="dynashape", message="%(prog)s %(version)s")
def cli() -> None:
    pass


@cli.command("run", help="Run a model on random inputs of given shapes (or an .npz) and time it.")
@_model_arg
@_shape_opt
@click.option("--inputs", metavar="FILE.npz", default=None, help=".npz file of named inputs")
@_device_opt
@click.option("--repeat", type=int, default=3, show_default=True, help="timed runs (the first is reported alone)")
@click.option("--warmup", type=int, default=0, show_default=True,
              help="runs after the first left out of the median")
@_seed_opt
@_int_high_opt
@_ddd_opt
@_dim_param_opt
@_dyn_opt
def _run(**kw) -> int:
    return cmd_run(_ns(**kw))


@cli.command("demo", help="Decode loop of the embedded default model, shapes growing each step.")
@click.option("--steps", type=int, default=16, show_default=True, help="decode steps")
@click.option("--prompt", type=int, default=8, show_default=True, help="prompt length")
@click.option("--batch", type=int, default=1, show_default=True, help="batch size")
@_device_opt
@_seed_opt
def _demo(**kw) -> int:
    return cmd_demo(_ns(**kw))


@cli.command("show", help="Print the compiled program, or (--code) the generated code.")
@_model_arg
@click.option("--code", is_flag=True,
              help="the generated code of the specialization for --shape (typical sizes where not given)")
@_shape_opt
@_device_opt
@_dyn_opt
def _show(**kw) -> int:
    return cmd_show(_ns(**kw))


@cli.command("check", help="Is every op supported, which inputs are dynamic; --compare: errors vs onnxruntime "
                           "over random shapes. Exit 1 when something is missing or wrong.")
@_model_arg
@click.option("--compare", is_flag=True, help="run random shapes here and in onnxruntime")
@click.option("--trials", type=int, default=3, show_default=True, help="how many random shapes (--compare)")
@_shape_opt
@_seed_opt
@_int_high_opt
@_device_opt
def _check(**kw) -> int:
    return cmd_check(_ns(**kw))


@cli.command("ops", help="The supported operators and their opsets, from the op registry.")
@click.option("--domain", default=None, metavar="D", help="only this domain (ai.onnx, com.microsoft, ...)")
def _ops(**kw) -> int:
    return cmd_ops(_ns(**kw))


@cli.command("bench", help="Latency and throughput over a shape or a sequence of shapes, optionally side by "
                           "side with other runtimes. Ctrl-C stops and reports what was measured.")
@_model_arg
@_shape_opt
@click.option("--shapes-file", metavar="FILE", default=None,
              help="JSON list of {name: dims} (or text, one 'name=DIMS name=DIMS' line per call): a sequence of "
                   "shape sets, one call each, cycled")
@click.option("--random-shapes", "random_shapes", multiple=True, metavar="NAME=DIMS",
              help="draw a new shape set for every call within ranges and count every call from the first, no "
                   "warm-up: e.g. x=1x3x96..640x96..640 (LO..HI/STEP for a range's own step; b:1..8 names a dim "
                   "that another input reuses as b) (repeatable)")
@click.option("--calls", type=int, default=24, show_default=True, help="with --random-shapes: the number of calls")
@click.option("--step", type=int, default=1, show_default=True,
              help="with --random-shapes: the step of the ranges' values (LO, LO+STEP, ... up to HI)")
@click.option("-n", "--runs", type=int, default=None, help="timed calls [default: 100, or unlimited with -t]")
@click.option("-t", "--time", "time_s", type=float, default=None, help="stop timing after this many seconds")
@click.option("--warmup", type=int, default=3, show_default=True,
              help="warm-up calls per distinct shape after its first call (both left out of the statistics)")
@_device_opt
@click.option("--threads", type=int, default=None, help="intra-op threads (torch and onnxruntime, openvino) "
                                                         "[default: the runtime's own]")
@_dyn_opt
@_seed_opt
@_int_high_opt
@click.option("--compare", default="", metavar="RT[,RT]",
              help="also time these runtimes on the same feeds: onnxruntime, openvino, torch-eager")
@click.option("--ov-precision", default="f32", show_default=True, metavar="f32|bf16|f16",
              help="OpenVINO's INFERENCE_PRECISION_HINT for --compare openvino: f32 computes as the others do "
                   "(its CPU default is bf16 where the CPU has AMX or AVX-512 BF16)")
@click.option("--torch-module", metavar="MODULE:FACTORY", default=None,
              help="for --compare torch-eager: a function returning the torch module the ONNX file was exported "
                   "from (e.g. mypkg.models:build); it is called with the inputs in the model's order")
@click.option("--json", "json_path", metavar="FILE", default=None, help="write all numbers and per-call latencies")
@click.option("--plot", metavar="FILE.png", default=None, help="plot latency (and memory) per call (matplotlib)")
@click.option("--no-progress", is_flag=True, help="no progress bar")
def _bench(**kw) -> int:
    return cmd_bench(_ns(**kw))


@cli.command("serve", help="Serve a model over HTTP (KServe v2 JSON) as Ray Serve replicas with shape-aware "
                           "batching (needs dynashape[serve]). See docs/serving.md.")
@_model_arg
@click.option("--replicas", type=int, default=1, help="replicas (each loads the model once)")
@click.option("--max-batch", type=int, default=8, help="rows per merged run")
@click.option("--max-wait-ms", type=float, default=5.0, help="how long the first request of a batch waits for others")
@click.option("--max-queue", type=int, default=64, help="requests waiting before the next is refused with 503")
@click.option("--no-batching", is_flag=True, help="run every request alone")
@click.option("--pad", multiple=True, metavar="NAME=[AXIS:]VALUE",
              help="an input's paddable axis and pad value (text length); needs --mask (repeatable)")
@click.option("--mask", default=None, metavar="NAME", help="the mask input that hides padding")
@click.option("--pad-multiple", type=int, default=16, help="padded lengths are rounded up to multiples of this")
@click.option("--batch-symbol", default=None, metavar="DIM", help="the batch dim's name [default: axis 0's]")
@click.option("--conversation-timeout", type=float, default=600.0, help="seconds before an idle conversation's "
                                                                         "KV cache is freed")
@click.option("--cpus-per-replica", type=float, default=1.0, help="CPUs Ray reserves per replica (its threads)")
@click.option("--gpus-per-replica", type=float, default=0.0, help="GPUs per replica (1: one GPU each, on cuda)")
@click.option("--device", default=None, help="cpu or cuda [default: cuda with GPUs per replica, else cpu]")
@click.option("--host", default="127.0.0.1", help="HTTP address")
@click.option("--port", type=int, default=8000, help="HTTP port")
@click.option("--name", default="model", help="the model's name in URLs")
@click.option("--address", default=None, help="a Ray cluster to join (ray://... or auto) [default: a local one]")
@click.option("--dry-run", is_flag=True, help="load the model, print the batching policy and options, stop")
@click.option("--llm", is_flag=True, help="generate: OpenAI-compatible /v1/completions and /v1/chat/completions, "
                                          "streaming, many conversations a step over a paged KV cache")
@click.option("--block-size", type=int, default=16, help="--llm: positions per KV block")
@click.option("--kv-blocks", type=int, default=None, help="--llm: KV blocks per replica [default: from free memory]")
@click.option("--max-rows", type=int, default=64, help="--llm: conversations a step")
@click.option("--token-budget", type=int, default=None, help="--llm: positions a step [default: 512]")
@click.option("--prefill-budget", type=int, default=None,
              help="--llm: prompt positions a step takes while it has decode rows (the ITL's tail against time "
                   "to first token) [default: the token budget's rest]")
@click.option("--chunk-graphs/--no-chunk-graphs", default=None,
              help="--llm: prompt-chunk runs captured as CUDA graphs too [default: on where decode runs are]")
def _serve(**kw) -> int:
    from .serve import command
    return command.main(_ns(**kw))


@cli.command("generate", help="Stream text from a decoder folder (onnxruntime-genai's builder or optimum) "
                               "through its tokenizer.json; tokens/s at the end.")
@click.argument("model_dir")
@click.option("--prompt", required=True, help="the prompt text")
@click.option("--max-length", type=int, default=None, help="prompt + generated tokens [default: the folder's]")
@click.option("--min-length", type=int, default=None, help="no EOS before this length")
@click.option("--do-sample", is_flag=True, help="sample (top-k, top-p, temperature) instead of greedy search")
@click.option("--top-k", type=int, default=None)
@click.option("--top-p", type=float, default=None)
@click.option("--temperature", type=float, default=None)
@click.option("--repetition-penalty", type=float, default=None)
@click.option("--seed", type=int, default=None, help="the sampler's seed (reproducible runs)")
@click.option("--device", default="cpu", show_default=True)
def _generate(**kw) -> int:
    from .generate import command
    return command.main(_ns(**kw))


def _fail(code: int, msg: str) -> int:
    print(msg if msg.startswith("dynashape:") else f"dynashape: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code; usage errors about inputs raise SystemExit(2) after saying why."""
    try:
        rc = cli.main(args=argv, prog_name="dynashape", standalone_mode=False)
        return 0 if rc is None else int(rc)
    except UsageExit as e:
        print(e.message, file=sys.stderr)
        raise
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.UsageError as e:
        hint = f" (see dynashape {e.ctx.info_name} --help)" if e.ctx is not None and e.ctx.info_name else ""
        return _fail(2, f"dynashape: {e.format_message()}{hint}")
    except click.ClickException as e:
        return _fail(e.exit_code, e.format_message())
    except (click.Abort, KeyboardInterrupt):
        return _fail(130, "dynashape: interrupted")
    except (InputError, OptionsError) as e:
        return _fail(2, f"dynashape: {type(e).__name__}: {e}")
    except (InvalidModelError, UnsupportedOpError) as e:
        return _fail(3, f"dynashape: {type(e).__name__}: {e}")
    except DynashapeError as e:
        return _fail(4, f"dynashape: {type(e).__name__}: {e}")
    except Exception as e:
        if os.environ.get("DYNASHAPE_TRACEBACK") == "1":
            raise
        first = str(e).splitlines()[0] if str(e) else ""
        return _fail(5, f"dynashape: internal error: {type(e).__name__}: {first} "
                        f"(run with DYNASHAPE_TRACEBACK=1 for the traceback)")


if __name__ == "__main__":
    sys.exit(main())
