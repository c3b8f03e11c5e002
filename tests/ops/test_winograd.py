"""Winograd F(2x2, 3x3) (``ops/winograd.py``): the transforms' arithmetic in torch ops against
conv2d in float64 on any machine, the Triton kernels against it on a CUDA device."""

import pytest
import torch
import torch.nn.functional as F

from dynashape.ops import winograd as wg

CASES = [  # (batch, in, out, height, width, padding)
    (1, 3, 4, 8, 8, 1), (2, 5, 3, 7, 9, 1), (3, 4, 6, 5, 5, 0), (1, 2, 2, 3, 3, 0), (2, 3, 5, 6, 11, 2),
    (1, 6, 4, 1, 1, 1),
]


def _case(case, dtype, device="cpu"):
    n, ci, co, h, w, p = case
    g = torch.Generator().manual_seed(sum(case))
    x = torch.randn(n, ci, h, w, generator=g, dtype=dtype)
    wt = torch.randn(co, ci, 3, 3, generator=g, dtype=dtype)
    b = torch.randn(co, generator=g, dtype=dtype)
    ref = F.conv2d(x.double(), wt.double(), b.double(), 1, p)
    z = torch.randn(ref.shape, generator=g, dtype=dtype)
    return x.to(device), wt.to(device), b.to(device), z.to(device), ref.to(device), (p, p)


@pytest.mark.parametrize("case", CASES)
def test_the_transforms_compute_the_convolution(case):
    x, w, b, z, ref, pad = _case(case, torch.float64)
    v = wg.input_transform_torch(x, pad)
    m = torch.bmm(wg.transformed_weight(w), v)
    y = wg.output_transform_torch(m, x.shape[0], ref.shape[2], ref.shape[3], b, z, relu=True)
    torch.testing.assert_close(y, (ref + z).relu(), rtol=1e-12, atol=1e-12)


def test_the_transformed_weight_is_kept_per_weight_and_renewed_when_it_changes():
    w = torch.randn(4, 3, 3, 3)
    u = wg.transformed_weight(w)
    assert wg.transformed_weight(w) is u and u.shape == (16, 4, 3)
    w.add_(1.0)  # an in-place change bumps the version
    assert wg.transformed_weight(w) is not u
    key = id(w)
    del w, u
    assert key not in wg._U  # gone with the weight


def test_only_3x3_stride_1_float32_on_cuda_is_served():
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert not wg.serves(x, w, (1, 1), (1, 1))  # CPU
    if torch.cuda.is_available() and wg.triton is not None:
        xc, wc = x.cuda(), w.cuda()
        assert wg.serves(xc, wc, (1, 1), (1, 1))
        assert not wg.serves(xc, wc, (2, 2), (1, 1)) and not wg.serves(xc, wc[:, :, :1, :1], (1, 1), (0, 0))
        assert not wg.serves(xc.half(), wc.half(), (1, 1), (1, 1))
        big = torch.empty(64, 3, 512, 512, device="cuda")  # 16 x 4 x 64 x 256 x 256 x 4 bytes of tiles
        assert not wg.serves(big, wc, (1, 1), (1, 1))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bias,residual,relu", [(True, True, True), (False, False, False), (True, False, True)])
def test_the_kernels_compute_the_convolution(device, case, bias, residual, relu):
    if device == "cpu" or wg.triton is None:
        pytest.skip("Triton kernels: a CUDA device")
    x, w, b, z, ref, pad = _case(case, torch.float32, device)
    v = wg.input_transform_torch(x, pad)
    ref_v = wg.input_transform_torch(x.double(), pad)
    torch.testing.assert_close(v.double(), ref_v, rtol=1e-6, atol=1e-5)
    y = wg.conv3x3(x, w, b if bias else None, pad, relu=relu, z=z if residual else None)
    if not bias:
        ref = ref - b.double().view(1, -1, 1, 1)
    if residual:
        ref = ref + z.double()
    if relu:
        ref = ref.relu()
    assert y.shape == ref.shape and y.is_contiguous()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
