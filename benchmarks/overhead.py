"""Per-node overhead of the runtime, and a real model's latency, side by side with the peers.

Part 1: a chain of N small Adds (y = x + b + b + ...), shape unchanged between calls: what the
runtime adds per node beyond the kernel. Also the cost when the shape changes on every call
(the full update_shape -> realloc path). Peers: onnxruntime (graph optimisations off, one
thread: otherwise it fuses the chain away), OpenVINO CPU (one thread), PyTorch eager (the same
torch.add calls in a Python loop: the kernel floor for a torch-based runtime).

Part 2: tiny GPT-2 and BERT (random weights, exported by torch.onnx dynamo) at a few shapes,
dynashape vs onnxruntime (default optimisations) vs OpenVINO, same thread count.

    python benchmarks/overhead.py [--nodes 1000] [--json out.json] [--skip-models]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape  # noqa: E402
from benchmarks.common import interleaved, print_table, write_json  # noqa: E402
from tests.helpers import add_chain  # noqa: E402


def ort_session(model: onnx.ModelProto, threads: int, optimize: bool):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # onnxruntime's idle workers spin by default and would steal the cores of the engine timed
    # next in an interleaved run; with spinning off each engine gets the machine in its turn.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def openvino_model(model: onnx.ModelProto, threads: int):
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    m = core.read_model(model.SerializeToString(), b"")
    return core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"})


def cuda_chain_part(n: int, calls: int, rounds: int, device: str) -> tuple[list, dict]:
    """On a GPU the peers that run there: PyTorch eager on the same device (onnxruntime here is a
    CPU build). Every call ends with a synchronize so that the time is the whole call's."""
    model = add_chain(n, shape=("N", 16))
    dev = torch.device(device)
    x, b = torch.rand(4, 16, device=dev), torch.rand(1, 16, device=dev)
    x2 = torch.rand(5, 16, device=dev)
    ds = dynashape.InferenceSession(model, device=device)
    ds_chg = dynashape.InferenceSession(model, device=device)
    flip = [0]

    def sync(f):
        def g():
            f()
            torch.cuda.synchronize(dev)
        return g

    def changing():
        flip[0] ^= 1
        ds_chg.run(None, {"x": x if flip[0] else x2, "b": b})

    def eager():
        y = x
        for _ in range(n):
            y = torch.add(y, b)
        return y

    engines = {f"dynashape {device} (torch feeds)": sync(lambda: ds.run(None, {"x": x, "b": b})),
               f"dynashape {device}, shape changes every call": sync(changing),
               f"PyTorch eager loop {device}": sync(eager)}
    res = interleaved(engines, calls, rounds)
    rows = [[k, v["median_s"] / n * 1e6, v["min_s"] / n * 1e6, v["median_s"] * 1e3] for k, v in res.items()]
    return rows, {k: v["median_s"] / n * 1e6 for k, v in res.items()}


def chain_part(n: int, calls: int, rounds: int) -> tuple[list, dict]:
    torch.set_num_threads(1)
    model = add_chain(n, shape=("N", 16))
    rng = np.random.default_rng(0)
    x, b = rng.random((4, 16), dtype=np.float32), rng.random((1, 16), dtype=np.float32)
    x2 = rng.random((5, 16), dtype=np.float32)
    feeds = {"x": x, "b": b}
    ds = dynashape.InferenceSession(model)
    tx, tb = torch.from_numpy(x), torch.from_numpy(b)
    ds_torch = dynashape.InferenceSession(model)
    ort = ort_session(model, 1, optimize=False)
    flip = [0]

    def ds_changing():
        flip[0] ^= 1
        ds_chg.run(None, {"x": x if flip[0] else x2, "b": b})

    ds_chg = dynashape.InferenceSession(model)

    def eager():
        y = tx
        for _ in range(n):
            y = torch.add(y, tb)
        return y

    engines = {
        "dynashape (numpy feeds)": lambda: ds.run(None, feeds),
        "dynashape (torch feeds)": lambda: ds_torch.run(None, {"x": tx, "b": tb}),
        "dynashape, shape changes every call": ds_changing,
        "onnxruntime (opt off, 1 thread)": lambda: ort.run(None, feeds),
        "PyTorch eager loop": eager,
    }
    ov = openvino_model(model, 1)
    if ov is not None:
        req = ov.create_infer_request()
        engines["OpenVINO CPU (1 thread)"] = lambda: req.infer(feeds)
    res = interleaved(engines, calls, rounds)
    rows = [[k, v["median_s"] / n * 1e6, v["min_s"] / n * 1e6, v["median_s"] * 1e3] for k, v in res.items()]
    return rows, {k: v["median_s"] / n * 1e6 for k, v in res.items()}


def model_part(calls: int, rounds: int) -> tuple[list, dict]:
    from tests.models.transformers_models import model_path
    threads = torch.get_num_threads()
    rows, out = [], {}
    rng = np.random.default_rng(0)
    for name, key, shapes in (("gpt2-tiny", "gpt2", [(1, 8), (1, 64), (4, 32), (8, 128)]),
                              ("bert-tiny", "bert", [(1, 8), (4, 32), (8, 128)])):
        path = str(model_path(key))
        model = onnx.load(path)
        ds = dynashape.InferenceSession(path)
        ort = ort_session(model, threads, optimize=True)
        ov = openvino_model(model, threads)
        ov_req = None if ov is None else ov.create_infer_request()
        names = [i.name for i in model.graph.input]
        for b, s in shapes:
            feeds = {"input_ids": rng.integers(0, 1000, (b, s)).astype(np.int64)}
            if "attention_mask" in names:
                feeds["attention_mask"] = np.ones((b, s), np.int64)
            engines = {"dynashape": lambda f=feeds, e=ds: e.run(None, f),
                       "onnxruntime": lambda f=feeds, e=ort: e.run(None, f)}
            if ov_req is not None:
                engines["openvino"] = lambda f=feeds, e=ov_req: e.infer(f)
            res = interleaved(engines, calls, rounds)
            ms = {k: v["median_s"] * 1e3 for k, v in res.items()}
            out[f"{name} {b}x{s}"] = ms
            rows.append([f"{name} {b}x{s}", ms["dynashape"], ms["onnxruntime"], ms.get("openvino", float("nan")),
                         ms["dynashape"] / ms["onnxruntime"]])
    return rows, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--skip-models", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--device", default="cpu", help="cuda: the chain on the GPU against PyTorch eager there")
    args = ap.parse_args()
    if args.device != "cpu":
        rows, chain = cuda_chain_part(args.nodes, args.calls, args.rounds, args.device)
        print_table(f"{args.nodes}-node Add chain on {args.device}, shape [4,16]",
                    ["engine", "us/node (median)", "us/node (best round)", "ms/call"], rows)
        write_json(args.json, {"chain_us_per_node": chain, "nodes": args.nodes, "torch": torch.__version__,
                               "device": torch.cuda.get_device_name()})
        return
    rows, chain = chain_part(args.nodes, args.calls, args.rounds)
    print_table(f"{args.nodes}-node Add chain, shape [4,16], one thread",
                ["engine", "us/node (median)", "us/node (best round)", "ms/call"], rows)
    data = {"chain_us_per_node": chain, "nodes": args.nodes, "torch": torch.__version__}
    if not args.skip_models:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        mrows, models = model_part(max(3, args.calls // 4), args.rounds)
        print_table(f"model latency, ms (median), {torch.get_num_threads()} threads",
                    ["model batch x seq", "dynashape", "onnxruntime", "openvino", "dynashape / ort"], mrows)
        data["models_ms"] = models
    write_json(args.json, data)


if __name__ == "__main__":
    main()
