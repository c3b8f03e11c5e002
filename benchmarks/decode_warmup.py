"""What a decode loop gets in its first seconds: decode steps per second of wall time, second by
second, from the making of the session, in a fresh process per mode (nothing imported or
compiled before). The steady figures of ``decode.py`` come after warm-up rounds; this shows the
warm-up itself: the imports, traces and compiles that static impls cost before they pay, and
when the loop has made up for them (the break-even: the second from which the mode's cumulative
steps pass those of ``static_impls="off"``).

The loop: a prefill of 8 tokens, then 128 decode steps feeding the present back, again and again
for ``--seconds`` (the tiny Llama-style decoder of the tests, torch feeds, ``--threads`` threads).

    python benchmarks/decode_warmup.py [--modes off auto] [--batch 1] [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.common import print_table, write_json  # noqa: E402


def child(mode: str, batch: int, seconds: float, threads: int) -> dict:
    """The loop itself (run in a fresh process by ``main``)."""
    import torch

    import dynashape
    from tests.models import llama
    torch.set_num_threads(threads)
    cfg = llama.TINY
    path = str(llama.model_path(cfg))
    names = llama.input_names(cfg)
    ids = torch.randint(0, cfg["vocab"], (batch, 8 + 128), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    sess = dynashape.InferenceSession(path, static_impls=mode)
    per_second: list[int] = []
    while time.perf_counter() - t0 < seconds:
        past = [torch.zeros(batch, cfg["kv_heads"], 0, cfg["head_dim"]) for _ in range(2 * cfg["layers"])]
        out = sess.run(None, dict(zip(names, [ids[:, :8], *past])))
        for i in range(128):
            out = sess.run(None, dict(zip(names, [ids[:, 8 + i:9 + i], *out[1:]])))
            sec = int(time.perf_counter() - t0)
            while len(per_second) <= sec:
                per_second.append(0)
            per_second[sec] += 1
    st = sess.stats()
    return {"per_second": per_second[:int(seconds)], "static_impls": st.get("static_impls"),
            "static_builds": st.get("static_builds", 0), "static_trace_time_s": st.get("static_trace_time_s", 0),
            "static_build_time_s": st.get("static_build_time_s", 0)}


def break_even(mode: list[int], off: list[int]) -> int | None:
    """The first second after which ``mode`` has made at least as many steps as ``off``, and stays ahead."""
    a = b = 0
    first = None
    for i, (x, y) in enumerate(zip(mode, off)):
        a, b = a + x, b + y
        if a >= b and first is None:
            first = i + 1
        elif a < b:
            first = None
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["off", "auto"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.seconds, args.threads)))
        return
    results = {}
    for mode in args.modes:  # one fresh process each, one after another
        cmd = [sys.executable, __file__, "--child", mode, "--batch", str(args.batch), "--seconds", str(args.seconds),
               "--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    rows = []
    for mode, r in results.items():
        ps = r["per_second"]
        tail = ps[-3:] if len(ps) >= 3 else ps
        be = break_even(ps, results["off"]["per_second"]) if "off" in results and mode != "off" else None
        rows.append([mode, r["static_impls"], " ".join(str(x) for x in ps), sum(ps), sum(tail) / max(1, len(tail)),
                     r["static_builds"], be if be is not None else "-"])
    print_table(f"decode warm-up, tiny decoder, batch {args.batch}, {args.threads} threads: steps per wall second",
                ["mode", "static impls", "steps in each second", "total", "last 3 s per s", "builds", "break-even s"],
                rows)
    write_json(args.json, {"batch": args.batch, "threads": args.threads, "seconds": args.seconds, "results": results})


if __name__ == "__main__":
    main()
