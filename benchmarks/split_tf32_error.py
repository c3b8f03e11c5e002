"""Where the split TF32 product's error comes from (experiment), and what the product costs.

For K in 256..4096: ||hi@hi (TF32) - hi@hi (float64)|| / ||ref|| (the parts are exact in TF32, so
this is the tensor cores' accumulation alone), ``split_tf32.product``'s error and cuBLAS float32's.
Then at BERT-base's products: the time of ``split_tf32.product`` against cuBLAS float32 (CUDA
events, medians, the weight's parts made before).

    python -m benchmarks.split_tf32_error
"""

import torch

from benchmarks.common import cuda_event_ms, rel_err
from dynashape.ops import split_tf32


def main():
    torch.manual_seed(0)
    for k in (256, 768, 1536, 3072, 4096):
        x = torch.randn(4096, k, device="cuda")
        w = torch.randn(k, 768, device="cuda") / k ** 0.5
        ref = x.double() @ w.double()
        xh, xl = split_tf32.split(x)
        wh, wl = split_tf32.split(w)
        torch.backends.cuda.matmul.allow_tf32 = True
        acc = rel_err(xh @ wh, xh.double() @ wh.double())
        torch.backends.cuda.matmul.allow_tf32 = False
        sp = rel_err(split_tf32.product(x, w, False), ref)
        ieee = rel_err(x @ w, ref)
        print(f"K {k:5d}  tf32 accumulation of exact parts {acc:.2e}  split product {sp:.2e}  cuBLAS fp32 {ieee:.2e}",
              flush=True)
    for m in (512, 1024, 3072, 6144, 12288):
        row = []
        for k, n in ((768, 768), (768, 2304), (768, 3072), (3072, 768)):
            x = torch.randn(m, k, device="cuda")
            w = torch.randn(n, k, device="cuda") / k ** 0.5
            split_tf32.parts(w, True)
            t_split = cuda_event_ms(lambda x=x, w=w: split_tf32.product(x, w, True))
            t_ieee = cuda_event_ms(lambda x=x, w=w: x @ w.t())
            row.append(f"{k}->{n} {t_ieee:.3f}/{t_split:.3f} ms (x{t_ieee / t_split:.2f})")
        print(f"M {m:5d}  fp32/split: " + "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
