"""Static impls of a session on the second GPU (``cuda:1``): its graphs captured there, its
forms (cuBLAS products, cuDNN, Triton's Winograd and epilogue kernels) launched there, its
results those of the dynamic path, and the process's current device left as it was. Runs on a
machine with two CUDA devices (``device`` kind nvidia-h100-x2); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

import dynashape
from tests.models import llama

from ..ops.test_specialise import _conv_block
from .test_static_impls import assert_same, decode_alike, feeds, mlp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="two CUDA devices")
DEV = "cuda:1"


def _pair(model, **kw):
    return (dynashape.InferenceSession(model, device=DEV, static_impls="sync", **kw),
            dynashape.InferenceSession(model, device=DEV, static_impls="off", **kw))


def test_regions_replay_on_the_second_gpu_and_leave_the_current_device_alone():
    torch.cuda.set_device(0)
    sess, ref = _pair(mlp())
    for i, (n, s) in enumerate([(1, 3), (4, 5), (1, 3), (4, 5), (1, 3)]):
        f = feeds(n, s, DEV, i)
        out = sess.run(None, f)
        assert all(o.device == torch.device(DEV) for o in out)
        assert_same([out], [ref.run(None, f)])
    st = sess.stats()
    assert st["static_builds_cuda_graph"] >= 2 and st["static_hits"] >= 1 and st["static_refused"] == 0
    assert torch.cuda.current_device() == 0


def test_timed_conv_forms_run_on_the_second_gpu():
    torch.cuda.set_device(0)
    sess, ref = _pair(_conv_block())
    for i, n in enumerate([1, 3, 1, 3, 1]):
        x = torch.randn(n, 16, 14, 14, generator=torch.Generator().manual_seed(i)).to(DEV)
        torch.testing.assert_close(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert sess.stats()["static_hits"] >= 1 and torch.cuda.current_device() == 0


def test_a_decode_on_the_second_gpu_equals_the_dynamic_path():
    torch.cuda.set_device(0)
    sess = dynashape.InferenceSession(str(llama.model_path()), device=DEV)  # whole-step decode graphs
    ref = dynashape.InferenceSession(str(llama.model_path()), device=DEV, static_impls="off")
    decode_alike(sess, ref, DEV, 24)
    assert torch.cuda.current_device() == 0
