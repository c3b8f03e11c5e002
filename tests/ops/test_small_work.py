"""Small products on one thread (ops/small_work.py): which kernels, what they return, the thread
count restored; the effect on time is measured in benchmarks, never asserted here."""

import numpy as np
import onnx
import torch
from onnx import TensorProto as TP
from onnx import helper

from dynashape.ops import native, small_work

from .harness import run_sequence


def _model(k: int, n: int) -> onnx.ModelProto:
    """A batched product of activations (attention's scores) and one against a weight."""
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("MatMul", ["s", "w"], ["y"])]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("q", TP.FLOAT, ["B", "H", "S", 16]),
                                       helper.make_tensor_value_info("kt", TP.FLOAT, ["B", "H", 16, "T"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(rng, b, h, s, t):
    return {"q": rng.standard_normal((b, h, s, 16)).astype(np.float32),
            "kt": rng.standard_normal((b, h, 16, t)).astype(np.float32)}


def test_small_products_run_on_one_thread_and_large_ones_keep_the_threads(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rng = np.random.default_rng(1)
        # small: 4 x 2 x (3 x 16) @ (16 x 25), then (.. x 25) @ (25 x 8); large: 2 x 8 x (128 x 16) @ (16 x 128) ...
        seq = [_feeds(rng, 4, 2, 3, 25), _feeds(rng, 1, 1, 1, 25), _feeds(rng, 4, 2, 3, 25)]
        sess = run_sequence(_model(25, 8), seq)
        small = sess.stats()["small_products_on_one_thread"]
        assert small >= 2 * len(seq)  # both products of every call
        assert torch.get_num_threads() == 2  # restored
        before = native.counters().get("small_products_on_one_thread", 0)  # (process-wide counters)
        run_sequence(_model(128, 512), [_feeds(rng, 2, 8, 128, 128), _feeds(rng, 2, 8, 96, 128)])
        assert native.counters().get("small_products_on_one_thread", 0) == before
    finally:
        torch.set_num_threads(threads)


def test_the_kernel_sees_one_thread_and_an_error_restores_the_count():
    seen = []

    @small_work.when_small(lambda x: x.numel())
    def kernel(x):
        seen.append(torch.get_num_threads())
        if x.numel() == 3:
            raise ValueError("boom")
        return x * 2

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(kernel(torch.ones(4)), torch.full((4,), 2.0))
        try:
            kernel(torch.ones(3))
        except ValueError:
            pass
        assert torch.get_num_threads() == 2
        kernel(torch.ones(small_work.MIN_WORK))
        assert seen == [1, 1, 2]
    finally:
        torch.set_num_threads(threads)
