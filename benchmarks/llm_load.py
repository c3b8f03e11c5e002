"""Load generator for LLM serving (issue 39): conversations arriving as a Poisson stream, served
together by dynashape's paged engine (serve/llm.py: continuous batching over the block pool)
against the same conversations served one at a time by dynashape.generate (the lone path: the
decode graphs' whole-step CUDA graphs on a GPU).

The model: the Llama-style decoder of benchmarks/decode_graphs.py (``--layers``, hidden 768, 12
heads / 4 KV heads; ``--tiny``: the tests' 2-layer hidden-64 one), exported by torch.onnx with an
attention_mask and position_ids (as optimum's decoders take them; the paged engine needs per-row
positions). Greedy decoding, random weights.

Reported: aggregate output tokens/s (every token from the first arrival to the last token), time
to first token and inter-token latency p50/p99 (taken where the engine hands a token to its
stream, no HTTP), and the same conversations one at a time (tokens/s, step time p50/p99); whether
each conversation's tokens equal its lone run's; the KV pool at its fullest: the blocks used
against what storages reserved per conversation for its prompt and longest answer would have held.
The load runs twice on one server: a first pass on the fresh server (every call counted), then a
second; ``--concurrency 1 8 64`` then runs it as closed loops of that many clients each (a client
sends its next conversation when its last has ended): throughput and latency against concurrency.

    python benchmarks/llm_load.py --device cuda [--layers 12] [--conversations 64] [--rate 32]
                                  [--prompt 16 512] [--output 16 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import dynashape.generate as dg  # noqa: E402
from benchmarks.common import print_table, write_json  # noqa: E402
from benchmarks.decode_graphs import config  # noqa: E402
from dynashape.serve.llm import LLMServer  # noqa: E402
from tests.models import llama  # noqa: E402


def workload(n: int, rate: float, prompt: tuple[int, int], output: tuple[int, int], vocab: int, seed: int):
    """``n`` conversations: (arrival s, prompt ids, output tokens); arrivals a Poisson stream of ``rate``/s."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n)) if rate > 0 else np.zeros(n)
    t -= t[0]
    return [(float(t[i]), rng.integers(1, vocab, int(rng.integers(prompt[0], prompt[1] + 1))).tolist(),
             int(rng.integers(output[0], output[1] + 1))) for i in range(n)]


def pct(xs, q) -> float:
    return float(np.percentile(xs, q)) * 1e3 if len(xs) else float("nan")


def lone_runs(path: str, device: str, convs) -> dict:
    """Each conversation alone, one after another (a warm-up generation first)."""
    model = dg.Model(path, device=device)

    def one(prompt, n):
        p = dg.GeneratorParams(model)
        p.set_search_options(max_length=len(prompt) + n)
        g = dg.Generator(model, p)
        g.append_tokens(np.asarray([prompt]))
        toks, steps = [], []
        t0 = time.perf_counter()
        while not g.is_done():
            g.generate_next_token()
            toks.append(int(g.get_next_tokens()[0]))
            t1 = time.perf_counter()
            steps.append(t1 - t0)
            t0 = t1
        return toks, steps
    one(convs[0][1], 32)
    tokens, steps, t0 = [], [], time.perf_counter()
    for _, prompt, n in convs:
        toks, st = one(prompt, n)
        tokens.append(toks)
        steps += st[1:]  # the step after the prompt is its first token (TTFT), not an inter-token gap
    total = time.perf_counter() - t0
    made = sum(len(t) for t in tokens)
    return {"tokens": tokens, "seconds": total, "tokens_per_s": made / total, "step_ms_p50": pct(steps, 50),
            "step_ms_p99": pct(steps, 99)}


class GCPauses:
    """The garbage collector's pauses while a pass runs (a pause stops the engine's step too)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t))

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict:
        ms = [1e3 * t for _, t in self.pauses]
        return {"count": len(ms), "total_ms": sum(ms), "max_ms": max(ms, default=0.0),
                "gen2": sum(g == 2 for g, _ in self.pauses)}


def tail(trace, limit_ms: float) -> dict:
    """The engine's steps (wall time, decode rows, prompt-chunk tokens, captures): where the ITL's
    tail comes from, against ``limit_ms`` (3x the lone run's p99 step)."""
    ms = np.asarray([1e3 * t for t, _, _, _ in trace])
    chunk = np.asarray([c for _, _, c, _ in trace])
    caps = np.asarray([k for _, _, _, k in trace])
    slow = ms > limit_ms
    return {"steps": len(ms), "limit_ms": limit_ms, "slow": int(slow.sum()),
            "slow_with_chunk": int((slow & (chunk > 0)).sum()), "slow_with_capture": int((slow & (caps > 0)).sum()),
            "slow_chunk_tokens_p50": float(np.median(chunk[slow])) if slow.any() else 0.0,
            "step_ms_p99_decode_only": pct(ms[chunk == 0] / 1e3, 99),
            "step_ms_p99_with_chunk": pct(ms[chunk > 0] / 1e3, 99),
            "chunk_steps": int((chunk > 0).sum())}


def served(server: LLMServer, convs) -> dict:
    """The conversations submitted at their arrival times; every stream read to its end."""
    server.ttft.clear()
    server.itl.clear()
    server.engine.trace.clear()
    before = {k: v for k, v in server.stats().items() if isinstance(v, (int, float))}
    streams = []
    with GCPauses() as pauses:
        t0 = time.perf_counter()
        for arrival, prompt, n in convs:
            wait = t0 + arrival - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            streams.append(server.submit(prompt, n))
        tokens = [list(s) for s in streams]
    end = max(s.times[-1] for s in streams)
    made = sum(len(t) for t in tokens)
    st = server.stats()
    return {"tokens": tokens, "seconds": end - t0, "tokens_per_s": made / (end - t0), "ttft_ms_p50": st["ttft_ms_p50"],
            "ttft_ms_p99": st["ttft_ms_p99"], "itl_ms_p50": st["itl_ms_p50"], "itl_ms_p99": st["itl_ms_p99"],
            "trace": list(server.engine.trace), "gc": pauses.summary(),
            "stats": {k: v - before.get(k, 0) if k in COUNTED else v for k, v in st.items()
                      if isinstance(v, (int, float))}}


def closed_loop(server: LLMServer, convs, clients: int) -> dict:
    """``clients`` clients, each sending the workload's next conversation once its last has ended
    (arrival times ignored): throughput and latencies against concurrency."""
    server.ttft.clear()
    server.itl.clear()
    todo = iter(range(len(convs)))
    lock = threading.Lock()
    made = []

    def client():
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            _, prompt, n = convs[i]
            made.append(len(list(server.submit(prompt, n))))
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    st = server.stats()
    return {"clients": clients, "seconds": seconds, "tokens_per_s": sum(made) / seconds,
            **{k: st[k] for k in ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")}}


COUNTED = ("steps", "runs", "rows", "padded_rows", "tokens", "gathered_bytes", "finished", "host_feed_s",
           "plan_s", "sample_s", "commit_s", "chunk_runs", "host_chunk_s", "eager_runs", "chunk_stream_runs",
           "host_model_s", "read_s", "step_graph_replays")  # counters a pass adds to


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tiny", action="store_true", help="the tests' 2-layer hidden-64 decoder")
    ap.add_argument("--model", default=None,
                    help="another decoder: a folder (onnxruntime-genai's builder, optimum) or .onnx file; its EOS "
                         "ends a conversation on both sides")
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--rate", type=float, default=32.0, help="arrivals per second (Poisson); 0: all at once")
    ap.add_argument("--prompt", type=int, nargs=2, default=(16, 512))
    ap.add_argument("--output", type=int, nargs=2, default=(16, 512))
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument("--token-budget", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=None, help="the scheduler's chunk (default: the engine's)")
    ap.add_argument("--prefill-budget", type=int, default=None,
                    help="prompt positions a step takes while it has decode rows (the scheduler's prefill_budget; "
                         "0: none; default: the engine's)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-blocks", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static-impls", default=None, help="the session option for the paged engine's session")
    ap.add_argument("--option", action="append", default=[], metavar="K=V", help="another session option")
    ap.add_argument("--gathered", action="store_true",
                    help="the pasts gathered from the blocks into dense inputs (paged_kv off), as before the "
                         "attention read the pool in place")
    ap.add_argument("--paged", action="store_true",
                    help="the attention reading the pool in place where it is not the default (the CPU)")
    ap.add_argument("--no-chunk-graphs", action="store_true",
                    help="prompt-chunk runs eager (PagedEngine(chunk_graphs=False); on by default on CUDA)")
    ap.add_argument("--packed", action=argparse.BooleanOptionalAction, default=None,
                    help="a step's decode rows and prompt chunks in one run (PagedEngine(packed=...); default: the "
                         "engine's, on with chunk graphs)")
    ap.add_argument("--chunk-stream", action="store_true",
                    help="prompt chunks replayed on a CUDA stream of their own (PagedEngine(chunk_stream=True))")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="no step graphs captured before the first conversation (PagedEngine(warm_up=False))")
    ap.add_argument("--no-lone", action="store_true")
    ap.add_argument("--concurrency", type=int, nargs="*", default=[],
                    help="then closed loops of this many clients each (throughput and latency against concurrency)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg = {**(llama.TINY if args.tiny else config(args.layers, "float32")), "mask_input": True, "position_ids": True}
    path, eos = str(llama.model_path(cfg)) if args.model is None else args.model, None
    if args.model is not None:
        probe = dg.Model(path)
        eos = probe.config.eos or None
        cfg["vocab"] = int(probe.session.get_outputs()[0].shape[-1])
        del probe
    convs = workload(args.conversations, args.rate, tuple(args.prompt), tuple(args.output), cfg["vocab"], args.seed)
    data = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "args": vars(args),
            "model": (os.path.basename(os.path.normpath(args.model)) if args.model else
                      "tiny (2 layers, hidden 64)" if args.tiny else f"{args.layers} layers, hidden 768, fp32")}
    lone = None if args.no_lone else lone_runs(path, args.device, convs)
    gc.collect()  # the lone model's session and graphs gone before the server's
    extra = {"static_impls": args.static_impls} if args.static_impls else {}
    extra.update(o.split("=", 1) for o in args.option)
    if args.gathered:
        extra["paged_kv"] = False
    if args.paged:
        extra["paged_kv"] = True
    if args.prefill_budget is not None:  # (0: none)
        extra["prefill_budget"] = args.prefill_budget or None
    if args.no_chunk_graphs:
        extra["chunk_graphs"] = False
    if args.no_warm_up:
        extra["warm_up"] = False
    if args.chunk_stream:
        extra["chunk_stream"] = True
    if args.packed is not None:
        extra["packed"] = args.packed
    t0 = time.perf_counter()
    server = LLMServer(path, eos=eos, device=args.device, block_size=args.block_size, num_blocks=args.kv_blocks,
                       max_rows=args.max_rows, token_budget=args.token_budget, chunk=args.chunk, **extra)
    st = server.engine.stats()
    eng = server.engine  # the settings the engine took (its defaults where the arguments left them)
    data["args"].update(chunk=eng.scheduler.chunk, prefill_budget=eng.scheduler.prefill_budget, packed=eng.packed)
    data["start"] = {"seconds": time.perf_counter() - t0, "warm_up_s": st["warm_up_s"],
                     "step_graphs": st.get("step_graphs", 0)}
    print(f"server started in {data['start']['seconds']:.1f} s, of which {st['warm_up_s']:.1f} s capturing "
          f"{data['start']['step_graphs']} step graphs")
    passes = {}
    for name in ("first pass", "second pass"):
        passes[name] = served(server, convs)
    sweep = [closed_loop(server, convs, c) for c in args.concurrency]
    peak = server.engine.peak
    bs = server.engine.pool.block_size
    server.stop()
    rows = []
    if lone is not None:
        rows.append(["one at a time (dynashape.generate)", f"{lone['tokens_per_s']:,.0f}", "1.00", "-", "-",
                     f"{lone['step_ms_p50']:.2f} / {lone['step_ms_p99']:.2f}", "-", "-"])
    for name, r in passes.items():
        equal = sum(a == b for a, b in zip(r["tokens"], lone["tokens"])) if lone else None
        r["equal_to_lone"] = equal
        ratio = r["tokens_per_s"] / lone["tokens_per_s"] if lone else float("nan")
        itl_ratio = r["itl_ms_p99"] / lone["step_ms_p99"] if lone else float("nan")
        rows.append([f"paged engine, {name}", f"{r['tokens_per_s']:,.0f}", f"{ratio:.2f}",
                     f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f}",
                     f"{r['stats']['rows'] / max(r['stats']['runs'], 1):.1f}",
                     f"{r['itl_ms_p50']:.2f} / {r['itl_ms_p99']:.2f}", f"{itl_ratio:.2f}",
                     f"{equal}/{len(convs)}" if lone else "-"])
        r.pop("tokens")
    if lone is not None:
        lone.pop("tokens")
    used = peak["blocks"] * bs
    longest = args.prompt[1] + args.output[1]  # storages sized for the workload's longest conversation
    data.update(lone=lone, passes=passes, peak=peak, block_size=bs, concurrency=sweep,
                reserved_over_used=peak["positions_reserved"] / used if used else None,
                longest_over_used=peak["conversations"] * longest / used if used else None)
    print_table(f"{data['model']}, {args.conversations} conversations, Poisson {args.rate}/s, prompts "
                f"{args.prompt[0]}-{args.prompt[1]}, outputs {args.output[0]}-{args.output[1]} ({data['device']})",
                ["serving", "tokens/s", "x one at a time", "TTFT ms p50 / p99", "rows a run",
                 "ITL ms p50 / p99", "ITL p99 / lone p99", "tokens equal"], rows)
    if sweep:
        print_table("closed loop: each client sends its next conversation when its last ends",
                    ["clients", "tokens/s", "TTFT ms p50 / p99", "ITL ms p50 / p99"],
                    [[str(r["clients"]), f"{r['tokens_per_s']:,.0f}",
                      f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f}",
                      f"{r['itl_ms_p50']:.2f} / {r['itl_ms_p99']:.2f}"] for r in sweep])
    limit = 3 * lone["step_ms_p99"] if lone else 3.0
    for name, r in passes.items():
        r["tail"] = t = tail(r.pop("trace"), limit)
        g = r["gc"]
        print(f"{name}: steps over {limit:.2f} ms: {t['slow']} of {t['steps']} ({t['slow_with_chunk']} with a prompt "
              f"chunk, median {t['slow_chunk_tokens_p50']:.0f} chunk tokens; {t['slow_with_capture']} capturing); "
              f"step p99 {t['step_ms_p99_decode_only']:.2f} ms decode only, {t['step_ms_p99_with_chunk']:.2f} ms with "
              f"a chunk ({t['chunk_steps']} steps); gc pauses {g['count']} ({g['gen2']} full), {g['total_ms']:.1f} ms, "
              f"longest {g['max_ms']:.1f} ms")
    for name, r in passes.items():
        st = r["stats"]
        parts = ("plan_s", "host_feed_s", "host_model_s", "host_chunk_s", "sample_s", "read_s", "commit_s")
        per = {k: 1e3 * st.get(k, 0.0) / st["steps"] for k in parts}
        wall = 1e3 * r["seconds"] / st["steps"]
        print(f"{name}: {wall:.2f} ms a step (wall); host per step, ms: plan {per['plan_s']:.2f}, inputs "
              f"{per['host_feed_s']:.2f}, device work launched {per['host_model_s']:.2f} (of which "
              f"{st.get('chunk_runs', 0)} prompt-chunk runs {per['host_chunk_s']:.2f}), sampling "
              f"{per['sample_s']:.2f}, waiting for the tokens {per['read_s']:.2f}, commit {per['commit_s']:.2f}; "
              f"step graphs "
              f"{st.get('step_graphs', 0)}, replays {st.get('step_graph_replays', 0)}, refused "
              f"{st.get('step_graphs_refused', 0)}, runs eager beside them {st.get('eager_runs', 0)}")
    print(f"KV pool at its fullest: {peak['conversations']} conversations in {peak['blocks']} blocks "
          f"({used} positions); storages reserved for prompt + longest answer would take "
          f"{peak['positions_reserved']} ({data['reserved_over_used'] or 0:.2f}x); storages of the workload's "
          f"longest conversation ({longest} positions) {peak['conversations'] * longest} "
          f"({data['longest_over_used'] or 0:.2f}x)")
    write_json(args.json, data)


if __name__ == "__main__":
    main()
