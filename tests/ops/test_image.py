"""Image ops (image.py) over sequences of shapes in one session, against onnxruntime and onnx's
reference evaluator."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import dynashape

from .harness import DEVICE, compare, make_model, rand, run_sequence

RNG = np.random.default_rng(11)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(op_type, n_inputs, in_types, attrs=None, opset=20, const_inputs=None, ranks=None):
    return make_model(op_type, n_inputs, in_types, attrs, opset, const_inputs=const_inputs, ranks=ranks)


# GridSample ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(mode, padding_mode, align_corners):
    m = model("GridSample", 2, [F32, F32], {"mode": mode, "padding_mode": padding_mode,
                                            "align_corners": align_corners}, ranks=[4, 4])
    steps = [((1, 2, 4, 5), (1, 3, 4)), ((2, 1, 3, 3), (2, 5, 2)), ((1, 2, 1, 6), (1, 2, 3)),
             ((1, 2, 4, 5), (1, 3, 4))]
    feeds = [{"in0": rand(xs, rng=RNG), "in1": rand((*gs, 2), rng=RNG, low=-1.6, high=1.6)} for xs, gs in steps]
    refs = ("ort", "ref")
    if mode == "cubic" and padding_mode == "border":
        refs = ("ort",)  # the reference clamps the coordinate before the taps: see image.py
    if padding_mode == "reflection" and align_corners:
        refs = ("ort",)  # the reference divides by zero reflecting in a size-1 axis (step 2)
    run_sequence(m, feeds, references=refs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d_and_1d(mode, padding_mode):
    # onnxruntime's GridSample is 4-D (and 5-D linear/nearest) only: the reference checks these
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": int(mode == "nearest")}
    if mode == "cubic" and padding_mode == "border":
        pytest.skip("the reference clamps the coordinate before the taps (see image.py); no other reference")
    m = model("GridSample", 2, [F32, F32], attrs, ranks=[5, 5])
    steps = [((1, 2, 3, 4, 2), (1, 2, 2, 3)), ((1, 1, 2, 3, 3), (1, 3, 1, 2))]
    feeds = [{"in0": rand(xs, rng=RNG), "in1": rand((*gs, 3), rng=RNG, low=-1.4, high=1.4)} for xs, gs in steps]
    run_sequence(m, feeds, references=("ref",), rtol=1e-4, atol=1e-5)
    m = model("GridSample", 2, [F32, F32], attrs, ranks=[3, 3])
    steps = [((1, 2, 5), (1, 7)), ((2, 1, 3), (2, 4)), ((1, 2, 5), (1, 2))]
    feeds = [{"in0": rand(xs, rng=RNG), "in1": rand((*gs, 1), rng=RNG, low=-1.4, high=1.4)} for xs, gs in steps]
    run_sequence(m, feeds, references=("ref",), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rank", [4, 5])
def test_grid_sample_gather_path_matches_torch(rank):
    # 4-D and 5-D run on torch's grid_sample: the general gather path must agree with it
    import torch

    from dynashape.ops.image import _grid_sample, _grid_sample_gather
    x = torch.from_numpy(rand((2, 3, 4, 5, 3)[:rank], rng=RNG))
    grid = torch.from_numpy(rand((2, 3, 4, 2, rank - 2)[:rank - 1] + (rank - 2,), rng=RNG, low=-1.5, high=1.5))
    for mode in ("linear", "nearest", "cubic")[:3 if rank == 4 else 2]:
        for pad in ("zeros", "border", "reflection"):
            for ac in (0, 1):
                want = _grid_sample(x, grid, mode, pad, ac).numpy()
                compare(_grid_sample_gather(x, grid, mode, pad, ac).numpy(), want, f"{mode} {pad} {ac}", 1e-4, 1e-5)


def test_grid_sample_opset16_names():
    m = model("GridSample", 2, [F32, F32], {"mode": "bicubic", "padding_mode": "reflection"}, opset=16,
              ranks=[4, 4])
    steps = [((1, 2, 4, 5), (1, 3, 4)), ((2, 1, 3, 3), (2, 5, 2)), ((1, 2, 4, 5), (1, 3, 4))]
    feeds = [{"in0": rand(xs, rng=RNG), "in1": rand((*gs, 2), rng=RNG, low=-1.2, high=1.2)} for xs, gs in steps]
    run_sequence(m, feeds, references=("ort",), rtol=1e-4, atol=1e-5)  # the evaluator lacks opset 16's names


# AffineGrid ------------------------------------------------------------------------------------
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(align_corners):
    # size is a graph input: the output shape follows its value
    m = model("AffineGrid", 2, [F32, I64], {"align_corners": align_corners}, ranks=[3, 1])
    # a size-1 axis with align_corners: the references disagree (see image.py), so only without
    sizes = [(2, 3, 4, 5), (1, 1, 2, 7), (3, 2, 1 + align_corners, 3), (2, 3, 4, 5)]
    feeds = [{"in0": rand((s[0], 2, 3), rng=RNG), "in1": np.array(s, np.int64)} for s in sizes]
    run_sequence(m, feeds)
    sizes = [(1, 1, 2, 3, 4), (2, 3, 3, 1 + align_corners, 2), (1, 1, 2, 3, 4)]
    feeds = [{"in0": rand((s[0], 3, 4), rng=RNG), "in1": np.array(s, np.int64)} for s in sizes]
    run_sequence(m, feeds, rtol=1e-5, atol=1e-6)


# CenterCropPad ---------------------------------------------------------------------------------
@pytest.mark.parametrize("axes", [None, [0, -1], [2]])
def test_center_crop_pad(axes):
    attrs = {"axes": axes} if axes else {}
    n = 3 if axes is None else len(axes)
    m = model("CenterCropPad", 2, [F32, I64], attrs, opset=18, ranks=[3, 1])
    steps = [((5, 4, 6), (3, 7, 6)[:n]), ((2, 3, 3), (6, 1, 4)[:n]), ((7, 2, 1), (7, 2, 2)[:n]),
             ((5, 4, 6), (3, 7, 6)[:n])]
    feeds = [{"in0": rand(xs, rng=RNG), "in1": np.array(t, np.int64)} for xs, t in steps]
    run_sequence(m, feeds)


# Col2Im ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}])
def test_col2im_2d(attrs):
    m = model("Col2Im", 3, [F32, I64, I64], attrs, opset=18, ranks=[3, 1, 1])
    s = attrs.get("strides", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    d = attrs.get("dilations", [1, 1])
    feeds = []
    for n, c, image, block in [(1, 2, (5, 6), (2, 3)), (2, 1, (4, 4), (3, 2)), (1, 3, (6, 5), (1, 2)),
                               (1, 2, (5, 6), (2, 3))]:
        blocks = [(image[i] + p[i] + p[2 + i] - d[i] * (block[i] - 1) - 1) // s[i] + 1 for i in range(2)]
        feeds.append({"in0": rand((n, c * block[0] * block[1], blocks[0] * blocks[1]), rng=RNG),
                      "in1": np.array(image, np.int64), "in2": np.array(block, np.int64)})
    run_sequence(m, feeds)


def test_col2im_3d():
    # onnxruntime's Col2Im is 2-D only: the reference checks the 3-D case
    m = model("Col2Im", 3, [F32, I64, I64], {"strides": [1, 2, 1], "pads": [0, 1, 0, 1, 0, 1]}, opset=18,
              const_inputs={1: np.array([3, 4, 5], np.int64), 2: np.array([2, 2, 3], np.int64)}, ranks=[3])
    # blocks: (3+1-2+1) x ((4+1-2)//2+1) x (5+1-3+1) = 3 x 2 x 4
    feeds = [{"in0": rand((n, c * 12, 24), rng=RNG)} for n, c in [(1, 2), (2, 1), (1, 2)]]
    run_sequence(m, feeds, references=("ref",))


# RoiAlign --------------------------------------------------------------------------------------
def rois(k, h, w, scale):
    """k boxes (x1, y1, x2, y2) in image coordinates, some reaching outside the map."""
    x1 = RNG.uniform(-1, w / scale, k)
    y1 = RNG.uniform(-1, h / scale, k)
    x2 = x1 + RNG.uniform(0.5, w / scale, k)
    y2 = y1 + RNG.uniform(0.5, h / scale, k)
    return np.stack([x1, y1, x2, y2], 1).astype(np.float32)


@pytest.mark.parametrize("attrs", [
    {}, {"mode": "max"}, {"coordinate_transformation_mode": "output_half_pixel", "sampling_ratio": 2},
    {"mode": "max", "sampling_ratio": 3, "spatial_scale": 0.5, "output_height": 2, "output_width": 3},
    {"spatial_scale": 0.25, "output_height": 3, "output_width": 2}])
def test_roi_align(attrs):
    m = model("RoiAlign", 3, [F32, F32, I64], attrs, opset=16, ranks=[4, 2, 1])
    scale = attrs.get("spatial_scale", 1.0)
    feeds = []
    for n, c, h, w, k in [(2, 3, 6, 7, 4), (1, 2, 5, 4, 2), (3, 1, 8, 3, 5), (2, 3, 6, 7, 4)]:
        feeds.append({"in0": rand((n, c, h, w), rng=RNG), "in1": rois(k, h, w, scale),
                      "in2": RNG.integers(0, n, k).astype(np.int64)})
    run_sequence(m, feeds, rtol=1e-4, atol=1e-5)


def test_roi_align_in_chunks(monkeypatch):
    # many rois are gathered a chunk at a time: force one roi per chunk
    from dynashape.ops import image
    monkeypatch.setattr(image, "_ROI_CHUNK", 1)
    test_roi_align({})
    test_roi_align({"mode": "max"})


def test_roi_align_opset10():
    m = model("RoiAlign", 3, [F32, F32, I64], {"output_height": 2, "output_width": 2}, opset=10, ranks=[4, 2, 1])
    feeds = [{"in0": rand((n, 2, h, w), rng=RNG), "in1": rois(k, h, w, 1.0),
              "in2": RNG.integers(0, n, k).astype(np.int64)} for n, h, w, k in [(1, 5, 5, 3), (2, 4, 6, 2),
                                                                                (1, 5, 5, 3)]]
    run_sequence(m, feeds, references=("ort",), rtol=1e-4, atol=1e-5)  # the evaluator has RoiAlign-16 only


# DeformConv ------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs, with_mask", [
    ({}, False), ({"pads": [1, 0, 1, 2], "strides": [2, 1], "dilations": [1, 2]}, True),
    ({"group": 2, "offset_group": 2, "pads": [1, 1, 1, 1]}, True)])
def test_deform_conv_2d(attrs, with_mask):
    n_in = 5 if with_mask else 3
    m = model("DeformConv", n_in, [F32] * n_in, attrs, opset=19, ranks=[4] * 3 + [1, 4][:n_in - 3])
    g, og = attrs.get("group", 1), attrs.get("offset_group", 1)
    s = attrs.get("strides", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    d = attrs.get("dilations", [1, 1])
    feeds = []
    for n, c, oc, h, w, kh, kw in [(1, 2, 4, 5, 6, 2, 2), (2, 4, 2, 4, 4, 3, 2), (1, 2, 2, 6, 5, 1, 3),
                                   (1, 2, 4, 5, 6, 2, 2)]:
        oh = (h + p[0] + p[2] - d[0] * (kh - 1) - 1) // s[0] + 1
        ow = (w + p[1] + p[3] - d[1] * (kw - 1) - 1) // s[1] + 1
        f = {"in0": rand((n, c, h, w), rng=RNG), "in1": rand((oc, c // g, kh, kw), rng=RNG),
             "in2": rand((n, og * kh * kw * 2, oh, ow), rng=RNG, low=-1.5, high=1.5)}
        if with_mask:
            f["in3"] = rand((oc,), rng=RNG)
            f["in4"] = rand((n, og * kh * kw, oh, ow), rng=RNG, low=0, high=1)
        feeds.append(f)
    run_sequence(m, feeds, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rank", [3, 5])
def test_deform_conv_zero_offset_is_conv(rank):
    # no reference takes 1-D/3-D DeformConv: with zero offsets it must equal Conv (onnxruntime)
    import onnxruntime as ort
    n_sp = rank - 2
    attrs = {"pads": [1] * n_sp + [0] * n_sp, "strides": [2] + [1] * (n_sp - 1)}
    deform = model("DeformConv", 3, [F32] * 3, attrs, opset=19, ranks=[rank] * 3)
    conv = model("Conv", 2, [F32] * 2, attrs, opset=19, ranks=[rank] * 2)
    sess = dynashape.InferenceSession(deform, device=DEVICE)
    ref = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"])
    for spatial, k in [((5, 4, 3)[:n_sp], (2, 2, 1)[:n_sp]), ((3, 6, 2)[:n_sp], (3, 1, 2)[:n_sp]),
                       ((5, 4, 3)[:n_sp], (2, 2, 1)[:n_sp])]:
        x, w = rand((2, 3, *spatial), rng=RNG), rand((4, 3, *k), rng=RNG)
        out = [(spatial[i] + attrs["pads"][i] - k[i]) // attrs["strides"][i] + 1 for i in range(n_sp)]
        off = np.zeros((2, int(np.prod(k)) * n_sp, *out), np.float32)
        want = ref.run(None, {"in0": x, "in1": w})[0]
        compare(sess.run(None, {"in0": x, "in1": w, "in2": off})[0], want, "deform vs conv", 1e-4, 1e-4)


# MaxUnpool -------------------------------------------------------------------------------------
def _pool_unpool(attrs, opset, with_shape):
    """MaxPool (with indices) then MaxUnpool of its outputs; output_shape = the pool's input shape."""
    x = helper.make_tensor_value_info("x", F32, ["n", "c", "h", "w"])
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs)]
    ins = ["p", "i"]
    if with_shape:
        nodes.append(helper.make_node("Shape", ["x"], ["s"]))
        ins.append("s")
    nodes.append(helper.make_node("MaxUnpool", ins, ["y"], **attrs))
    g = helper.make_graph(nodes, "unpool", [x], [helper.make_tensor_value_info("y", F32, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [11, 22])
def test_max_unpool(opset):
    seq = [(1, 2, 4, 6), (2, 1, 6, 4), (1, 3, 2, 2), (1, 2, 4, 6)]
    feeds = [{"x": rand(s, rng=RNG)} for s in seq]
    run_sequence(_pool_unpool({"kernel_shape": [2, 2], "strides": [2, 2]}, opset, False), feeds)
    # odd sizes: output_shape restores the pooled input's size. The indices are positions in that
    # tensor, as onnxruntime reads them; onnx's reference scatters into the inferred shape and pads
    # it at the end instead (its test_maxunpool_export_with_output_shape), so onnxruntime only
    seq = [(1, 2, 5, 7), (2, 1, 3, 4), (1, 1, 7, 5), (1, 2, 5, 7)]
    feeds = [{"x": rand(s, rng=RNG)} for s in seq]
    run_sequence(_pool_unpool({"kernel_shape": [2, 2], "strides": [2, 2]}, opset, True), feeds,
                 references=("ort",))
    run_sequence(_pool_unpool({"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 0]}, opset, True),
                 feeds, references=("ort",))


def test_max_unpool_const_output_shape_and_3d():
    attrs = {"kernel_shape": [2, 1, 2], "strides": [2, 1, 2]}
    m = model("MaxUnpool", 2, [F32, I64], attrs, opset=11, ranks=[5, 5])
    feeds = []
    for shape in [(1, 2, 2, 3, 2), (2, 1, 1, 2, 3), (1, 2, 2, 3, 2)]:
        n, c, d, h, w = shape
        plane = (2 * d) * h * (2 * w)
        # one distinct position per input element, in its own pooling window
        base = np.arange(n * c).reshape(n, c, 1, 1, 1) * plane
        dd, hh, ww = np.meshgrid(np.arange(d), np.arange(h), np.arange(w), indexing="ij")
        pos = (2 * dd + RNG.integers(0, 2, dd.shape)) * h * 2 * w + hh * 2 * w + 2 * ww + RNG.integers(0, 2, dd.shape)
        feeds.append({"in0": rand(shape, rng=RNG), "in1": (base + pos).astype(np.int64)})
    run_sequence(m, feeds)
