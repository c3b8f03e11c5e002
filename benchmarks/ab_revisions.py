"""dynashape at an earlier revision against the working tree, each beside onnxruntime, on the CPU.

On a shared machine whose speed drifts by 30-100% over minutes, two benchmark runs taken an hour
apart cannot tell a 20% change. Here both versions run in one sitting, alternated: for each pass,
a process with the earlier revision's package (``git archive REV dynashape`` into a temporary
directory, first on sys.path), then one with the working tree's; in each, every model is timed
``--rounds`` times, alternating onnxruntime and dynashape (each with a fresh session, the other's
thread pool gone), keeping per shape the least median of ``--repeat`` calls. The figure per
model is the median over its shapes; onnxruntime is timed in both processes, so a drift shows.

    python benchmarks/ab_revisions.py --base REV --models a,b [--passes 2] [--rounds 2] [--json out.json]
    python benchmarks/ab_revisions.py --base-tree DIR --models a,b ...   # DIR/dynashape: a copy made
                                                                          # where git is (a device host)

Pin the processes to cores (``taskset -c 2,3 python ...``) where the machine has more than two.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2


def _model_path(name: str) -> str | None:
    for d in ("real_models", "generated"):
        p = ROOT / ".cache" / d / f"{name}.onnx"
        if p.exists():
            return str(p)
    return None


def _steady(run, calls: list, repeat: int) -> dict[str, float]:
    """Median seconds of ``repeat`` calls at each shape of the sequence (first appearance), after two."""
    out: dict[str, float] = {}
    for _point, feeds in calls:
        label = str({k: tuple(v.shape) for k, v in feeds.items()})
        if label in out:
            continue
        run(feeds)
        run(feeds)
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            run(feeds)
            ts.append(time.perf_counter() - t0)
        out[label] = statistics.median(ts)
    return out


def measure(tree: str, models: list[str], rounds: int, repeat: int) -> dict:
    """In this process: the package under ``tree`` against onnxruntime, per model."""
    sys.path.insert(0, tree)
    sys.path.insert(1, str(ROOT))
    import onnxruntime as ort
    import torch

    import dynashape
    from benchmarks.real_models_specs import GENERATED, SPECS
    assert Path(dynashape.__file__).resolve().is_relative_to(Path(tree).resolve()), dynashape.__file__
    torch.set_num_threads(THREADS)
    specs = {s.name: s for s in list(SPECS) + list(GENERATED)}
    res = {}
    for name in models:
        path = _model_path(name)
        if path is None:
            print(f"{name}: not in .cache (run benchmarks/real_models.py --fetch-only)", flush=True)
            continue
        calls = list(specs[name].feeds(0))
        best: dict[str, dict[str, float]] = {"onnxruntime": {}, "dynashape": {}}
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = THREADS, 1
        for _ in range(rounds):
            for runtime in ("onnxruntime", "dynashape"):
                sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]) if runtime == "onnxruntime" \
                    else dynashape.InferenceSession(path)
                for k, v in _steady(lambda f, s=sess: s.run(None, f), calls, repeat).items():
                    best[runtime][k] = min(v, best[runtime].get(k, float("inf")))
                del sess
                gc.collect()
        med = {k: statistics.median(v.values()) for k, v in best.items()}
        res[name] = {"onnxruntime_ms": med["onnxruntime"] * 1e3, "dynashape_ms": med["dynashape"] * 1e3,
                     "ratio": med["dynashape"] / med["onnxruntime"], "per_shape_s": best}
        print(f"  {name:26s} onnxruntime {res[name]['onnxruntime_ms']:8.3f} ms  dynashape "
              f"{res[name]['dynashape_ms']:8.3f} ms  ratio {res[name]['ratio']:.2f}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="the earlier revision (a git commit, tag or branch)")
    ap.add_argument("--base-tree", help="instead of --base: a directory holding the earlier dynashape package "
                                        "(git archive REV dynashape | tar -x -C DIR, made where git is)")
    ap.add_argument("--models", required=True, help="comma-separated names of benchmarks/real_models_specs.py")
    ap.add_argument("--passes", type=int, default=2, help="times each version's process runs, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="timings per model in a process, least kept")
    ap.add_argument("--repeat", type=int, default=10, help="calls per shape whose median is one timing")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--measure-tree", help=argparse.SUPPRESS)  # the child process: measure this tree
    o = ap.parse_args()
    models = [m for m in o.models.split(",") if m]
    if o.measure_tree:
        res = measure(o.measure_tree, models, o.rounds, o.repeat)
        if o.json:
            Path(o.json).write_text(json.dumps(res))
        return
    if not o.base and not o.base_tree:
        ap.error("--base or --base-tree is required")
    base = o.base or o.base_tree
    results: dict[str, list] = {"base": [], "working tree": []}
    with tempfile.TemporaryDirectory(prefix="dynashape-ab-") as tmp:
        if o.base_tree:
            tree = str(Path(o.base_tree).resolve())
        else:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", o.base, "dynashape"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            tree = tmp
        trees = {"base": tree, "working tree": str(ROOT)}
        for p in range(o.passes):
            for label, tree in trees.items():
                print(f"pass {p + 1}, {label} ({base if label == 'base' else 'working tree'}):", flush=True)
                out = Path(tmp) / f"{label.replace(' ', '_')}_{p}.json"
                cmd = [sys.executable, __file__, "--models", o.models, "--rounds", str(o.rounds), "--repeat",
                       str(o.repeat), "--measure-tree", tree, "--json", str(out)]
                subprocess.run(cmd, check=True)
                results[label].append(json.loads(out.read_text()))
    if o.json:
        Path(o.json).write_text(json.dumps({"base": base, "passes": o.passes, "rounds": o.rounds,
                                            "repeat": o.repeat, "threads": THREADS, "results": results}, indent=1))


if __name__ == "__main__":
    main()
