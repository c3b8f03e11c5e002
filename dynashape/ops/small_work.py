"""Small products run on the calling thread alone.

torch's CPU kernels split their work over OpenMP threads in fixed shares and wait at a barrier:
MKL's sgemm threads a (16 x 32) @ (32 x 384) product, bmm splits any batch. Where other processes
load the machine (a 2-core host serving, a CI runner), a share given to a descheduled thread is
done only when that thread runs again: measured on this project's 2-core machine at load 3, that
product took 6.9 ms (median) on 2 threads and 4 us on one, and a 2-layer T5 decoder's steps took
10-170 ms against 0.4-0.7 ms. onnxruntime's pool lets the calling thread take the shares no worker
has started, so it does not see this. Below ``MIN_WORK`` multiply-adds (~10-25 us of one core: a
second thread would save at most half of that) the kernels below run with torch set to one thread
for the call (~0.3 us each way; the calling thread's OpenMP setting and MKL's).
"""

from __future__ import annotations

import functools

import torch

from . import native

MIN_WORK = 1 << 18


def when_small(work):
    """Decorates a kernel: where its first input is a CPU tensor, torch has more than one thread and
    ``work(*args, **kwargs)`` (multiply-adds) is below MIN_WORK, the kernel runs on one thread."""
    def deco(kernel):
        @functools.wraps(kernel)
        def run(*args, **kwargs):
            x = args[0]
            if type(x) is not torch.Tensor or x.device.type != "cpu" or work(*args, **kwargs) >= MIN_WORK:
                return kernel(*args, **kwargs)
            threads = torch.get_num_threads()
            if threads == 1:
                return kernel(*args, **kwargs)
            torch.set_num_threads(1)
            native.count("small_products_on_one_thread")
            try:
                return kernel(*args, **kwargs)
            finally:
                torch.set_num_threads(threads)
        return run
    return deco


def matmul_work(a, b, *args, **kwargs) -> int:
    """Multiply-adds of a (batched) product: each of a's rows against each of b's columns, or b's
    side where its batch is the broadcast one."""
    n = b.shape[-1] if b.dim() > 1 else 1
    m = a.shape[-2] if a.dim() > 1 else 1
    return max(a.numel() * n, b.numel() * m)


def gemm_work(a, b, *args, transA=0, **kwargs) -> int:
    k = a.shape[0] if transA else a.shape[-1]
    return a.numel() * b.numel() // max(k, 1)


def linear_work(x, weight, *args, **kwargs) -> int:
    return x.numel() * weight.shape[0]
