"""Serving throughput: requests/s and p50/p99 latency, 1 vs 2 replicas, batching on vs off.

A closed loop of ``--clients`` threads sends a mixed-length stream of BERT requests (batch 1,
lengths drawn from 8..128, fresh token ids) and waits for each answer; the stream runs once to
warm every replica (first calls at each merged shape) and is then timed.

Backends:
- ``ray``: the Ray Serve deployment (dynashape.serve.ray_app) on a local Ray cluster, CPU
  replicas, through the Python handle client.
- ``local``: one process per replica, each a ``LocalServer`` over a ``ModelReplica`` on its own
  device (``--device cuda`` puts replica i on GPU i), requests handed over by multiprocessing
  queues: what the Ray replicas do, for machines that cannot carry Ray (the GPU hosts here).

    python benchmarks/serving.py --backend ray --layers 2 --json benchmarks/results/serving_cpu.json
    python benchmarks/serving.py --backend local --device cuda --layers 12 --json serving_gpu.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.static_impls import bert_model, export  # noqa: E402

PAD = {"pad": {"input_ids": 0}, "mask": "attention_mask"}


def export_bert(layers: int) -> str:
    path = os.path.join(tempfile.mkdtemp(), f"bert{layers}.onnx")
    b, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=512)
    args = (torch.randint(0, 30522, (2, 7)), torch.ones(2, 7, dtype=torch.int64))
    export(bert_model(layers), args, ["input_ids", "attention_mask"],
           {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}, path)
    return path


def stream(n: int, seed: int, lo: int = 8, hi: int = 128) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for length in rng.integers(lo, hi + 1, n):
        out.append({"input_ids": rng.integers(0, 30522, (1, int(length))),
                    "attention_mask": np.ones((1, int(length)), np.int64)})
    return out


def closed_loop(call, reqs: list[dict], clients: int) -> dict:
    """Every request once, ``clients`` at a time; req/s over the wall time, latency percentiles."""
    lat = [0.0] * len(reqs)
    nxt = iter(range(len(reqs)))
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            t0 = time.perf_counter()
            call(reqs[i])
            lat[i] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    wall = time.perf_counter() - t0
    ms = np.asarray(lat) * 1e3
    return {"req_per_s": len(reqs) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "wall_s": wall, "requests": len(reqs)}


# ---- Ray --------------------------------------------------------------------------------------------
def bench_ray(path: str, configs, reqs, clients, args) -> list[dict]:
    import ray
    from ray import serve

    from dynashape.serve.client import Client
    from dynashape.serve.ray_app import build_app

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for replicas, batching in configs:
            name = f"bert-{replicas}-{int(batching)}"
            h = serve.run(build_app(path, name=name, replicas=replicas, batching=batching, max_batch=args.max_batch,
                                    max_wait_ms=args.max_wait_ms, max_queue=10 * clients, num_cpus=args.threads,
                                    pad_multiple=args.pad_multiple, **PAD),
                          name=name, route_prefix=f"/{name}")
            client = Client(h)
            closed_loop(client.infer, reqs, clients)  # warm: every replica, every merged shape it will see
            r = closed_loop(client.infer, reqs, clients)
            rows.append({"replicas": replicas, "batching": batching, **r})
            print(rows[-1], flush=True)
            serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


# ---- one process per replica ---------------------------------------------------------------------------
def _worker(i: int, device: str, path: str, opts: dict, batching: bool, max_wait_ms: float, verify: int,
            inbox, outbox) -> None:
    torch.set_num_threads(opts.pop("threads", 1))
    from dynashape.serve import ModelReplica
    from dynashape.serve.local import LocalServer

    dev = f"cuda:{i}" if device == "cuda" else device
    rep = ModelReplica(path, device=dev, **opts)
    server = LocalServer(rep, max_wait_ms=max_wait_ms, max_queue=100000, batching=batching)
    checked = []
    outbox.put(("ready", i, None))
    while (msg := inbox.get()) is not None:
        rid, feeds = msg

        def done(fut, rid=rid, feeds=feeds):
            try:
                out = next(iter(fut.result().values()))
                if len(checked) < verify:  # the batched answer against this request run alone, unpadded
                    with rep.lock:
                        alone = rep.session.run(None, feeds)[0]
                    checked.append(float(np.abs(out - alone).max()))
                outbox.put((rid, out.shape, None))
            except Exception as e:  # noqa: BLE001  the client must hear it, not wait forever
                outbox.put((rid, None, repr(e)))
        server.submit(feeds).add_done_callback(done)
    server.close()
    outbox.put(("stats", i, {"stats": rep.stats(), "max_err": max(checked, default=None)}))


class _Pool:
    """Replica processes and a least-loaded dispatcher over multiprocessing queues."""

    def __init__(self, path: str, replicas: int, batching: bool, args) -> None:
        ctx = mp.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(replicas)]
        opts = dict(max_batch=args.max_batch, pad_multiple=args.pad_multiple, threads=args.threads, **PAD)
        self.procs = [ctx.Process(target=_worker, args=(i, args.device, path, dict(opts), batching, args.max_wait_ms,
                                                        8, self.inboxes[i], self.outbox)) for i in range(replicas)]
        for p in self.procs:
            p.start()
        for _ in self.procs:
            assert self.outbox.get(timeout=600)[0] == "ready"
        self.waiting: dict[str, threading.Event] = {}
        self.load = [0] * replicas
        self.lock = threading.Lock()
        self.errors: list = []
        self.stats: list = []
        self.collector = threading.Thread(target=self._collect, daemon=True)
        self.collector.start()

    def _collect(self) -> None:
        while (msg := self.outbox.get())[0] != "stats":
            rid, _, err = msg
            if err is not None:
                self.errors.append(err)
            self.waiting.pop(rid).set()
        self.stats.append(msg[2])

    def call(self, feeds) -> None:
        rid, ev = uuid.uuid4().hex, threading.Event()
        with self.lock:  # the replica with the fewest requests in flight
            i = min(range(len(self.load)), key=self.load.__getitem__)
            self.load[i] += 1
            self.waiting[rid] = ev
        self.inboxes[i].put((rid, feeds))
        ev.wait()
        with self.lock:
            self.load[i] -= 1

    def close(self) -> list[dict]:
        for q in self.inboxes:
            q.put(None)
        self.collector.join(timeout=600)
        while len(self.stats) < len(self.procs):
            self.stats.append(self.outbox.get(timeout=600)[2])
        for p in self.procs:
            p.join(timeout=60)
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} requests failed, e.g. {self.errors[0]}")
        return self.stats


def bench_local(path: str, configs, reqs, clients, args) -> list[dict]:
    rows = []
    n_dev = torch.cuda.device_count() if args.device == "cuda" else 2
    for replicas, batching in configs:
        if replicas > n_dev:
            print(f"skipped: {replicas} replicas on {n_dev} devices")
            continue
        pool = _Pool(path, replicas, batching, args)
        closed_loop(pool.call, reqs, clients)
        r = closed_loop(pool.call, reqs, clients)
        stats = pool.close()
        errs = [s["max_err"] for s in stats if s["max_err"] is not None]
        runs = sum(s["stats"]["counts"].get("runs", 0) for s in stats)
        done = sum(s["stats"]["counts"].get("requests_run", 0) for s in stats)
        rows.append({"replicas": replicas, "batching": batching, **r, "requests_per_run": done / max(runs, 1),
                     "max_err_vs_alone": max(errs, default=None)})
        print(rows[-1], flush=True)
    return rows


def baseline(path: str, reqs: list[dict], device: str, threads: int) -> dict:
    """The stream through one session, one request after another, no server: what the servers'
    own overhead and their batching are measured against."""
    import dynashape

    torch.set_num_threads(threads)
    sess = dynashape.InferenceSession(path, device="cuda:0" if device == "cuda" else device)
    for r in reqs:
        sess.run(None, r)
    lat = []
    t0 = time.perf_counter()
    for r in reqs:
        t1 = time.perf_counter()
        sess.run(None, r)
        lat.append(time.perf_counter() - t1)
    wall = time.perf_counter() - t0
    del sess
    ms = np.asarray(lat) * 1e3
    return {"replicas": 0, "batching": False, "req_per_s": len(reqs) / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "wall_s": wall, "requests": len(reqs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["ray", "local"], default="ray")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=2, help="BERT-base layers (hidden 768)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--pad-multiple", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per replica")
    ap.add_argument("--configs", default="1:0,1:1,2:0,2:1", help="replicas:batching pairs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    configs = [(int(a), b == "1") for a, b in (c.split(":") for c in args.configs.split(","))]
    path = export_bert(args.layers)
    reqs = stream(args.requests, seed=0)
    rows = [baseline(path, reqs, args.device, args.threads)]
    print(rows[-1], flush=True)
    rows += (bench_ray if args.backend == "ray" else bench_local)(path, configs, reqs, args.clients, args)
    dev = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print_table(f"serving BERT-base ({args.layers} layers), {args.backend}, {dev}, {args.clients} clients, "
                f"lengths 8..128", ["replicas", "batching", "req/s", "p50 ms", "p99 ms"],
                [[r["replicas"] or "no server", "on" if r["batching"] else "off", r["req_per_s"], r["p50_ms"],
                  r["p99_ms"]] for r in rows])
    write_json(args.json, {"backend": args.backend, "device": dev, "layers": args.layers, "clients": args.clients,
                           "max_batch": args.max_batch, "date": time.strftime("%Y-%m-%d"), "rows": rows})


if __name__ == "__main__":
    main()
