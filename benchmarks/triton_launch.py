"""What a Triton kernel's launch costs the host against the torch kernels it replaces: a residual add
and LayerNorm over BERT-base's rows (ops/add_layer_norm.py) as torch's add, layer_norm and a copy
into a given buffer, as the Triton kernel launched by the JIT (``kernel[grid](...)``), and as the op
calls it (``add_layer_norm``: its checks, then the same launch). Host time: the
median of the calls' own time with the GPU idle (each call synchronised after); device time: CUDA
events (benchmarks/common.py).

    python benchmarks/triton_launch.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from benchmarks.common import cuda_event_ms
from dynashape.ops import add_layer_norm as aln


def _host_us(f, reps=50):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(ts)[reps // 2] * 1e6


def forms(m: int, n: int, gamma, beta) -> dict:
    """The three forms over ``m`` rows, writing one buffer."""
    x, r = torch.randn(m, n, device="cuda"), torch.randn(m, n, device="cuda")
    out, s = torch.empty(m, n, device="cuda"), torch.empty(m, n, device="cuda")

    def torch_form():
        torch.add(x, r, out=s)
        out.copy_(F.layer_norm(s, (n,), gamma, beta, 1e-5))

    def jit_form():
        aln._kernel[(m,)](x, r, gamma, beta, out, n, 1e-5, HAS_R=True, HAS_B=True, BLOCK=1024, num_warps=4)

    def op_form():
        aln.add_layer_norm(x, r, gamma, beta, 1e-5, out)
    op_form()
    torch.testing.assert_close(out, F.layer_norm(x + r, (n,), gamma, beta, 1e-5), atol=1e-5, rtol=1e-5)
    return {"torch": torch_form, "jit": jit_form, "op": op_form}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    args = ap.parse_args()
    n = 768
    gamma, beta = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    rows = []
    for m in (256, 1024, 4096, 12288):
        row = {"rows": m}
        for name, f in forms(m, n, gamma, beta).items():
            f()
            row[f"{name}_host_us"] = _host_us(f)
            row[f"{name}_device_ms"] = cuda_event_ms(f)
        rows.append(row)
        print("rows {rows:6d}  host us: torch {torch_host_us:.1f}  jit {jit_host_us:.1f}  op {op_host_us:.1f}   "
              "device ms: torch {torch_device_ms:.4f}  jit {jit_device_ms:.4f}  op {op_device_ms:.4f}".format(
                  **row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
