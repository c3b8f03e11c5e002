"""Resize and Upsample over sequences of shapes (and of scales/sizes given at run time), against
onnxruntime and onnx's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dynashape

from .harness import DEVICE, compare, rand, run_sequence

RNG = np.random.default_rng(7)


def resize_model(attrs, opset=19, inputs=("roi", "scales", "sizes"), consts=None, op_type="Resize",
                 x_type=TensorProto.FLOAT, rank=4):
    """One Resize node; X is a graph input of dynamic dims; the other inputs named in ``inputs``
    are graph inputs unless given in ``consts``; the rest are absent ('')."""
    consts = consts or {}
    order = {"Resize": ("roi", "scales", "sizes"), "Upsample": ("scales",)}[op_type]
    if opset == 10:
        order = ("scales",)
    names = ["x"] + [n if n in inputs else "" for n in order]
    while names and names[-1] == "":
        names.pop()
    types = {"roi": TensorProto.FLOAT, "scales": TensorProto.FLOAT, "sizes": TensorProto.INT64}
    g_in = [helper.make_tensor_value_info("x", x_type, [f"d{i}" for i in range(rank)])]
    inits = []
    for n in names[1:]:
        if not n:
            continue
        if n in consts:
            inits.append(onnx.numpy_helper.from_array(np.asarray(consts[n]), n))
        else:
            length = 2 * rank if n == "roi" else rank
            if "axes" in attrs:
                length = 2 * len(attrs["axes"]) if n == "roi" else len(attrs["axes"])
            g_in.append(helper.make_tensor_value_info(n, types[n], [length]))
    node = helper.make_node(op_type, names, ["y"], **attrs)
    g = helper.make_graph([node], "resize", g_in, [helper.make_tensor_value_info("y", x_type, None)],
                          initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def feeds(shapes, dtype=np.float32, **per_step):
    """One feed dict per shape; keyword lists give the other inputs step by step."""
    out = []
    for i, s in enumerate(shapes):
        f = {"x": rand(s, dtype, RNG, low=0 if dtype == np.uint8 else -2, high=255 if dtype == np.uint8 else 2)}
        for k, v in per_step.items():
            f[k] = np.asarray(v[i], dtype=np.int64 if k == "sizes" else np.float32)
        out.append(f)
    return out


SEQ = [(1, 2, 4, 5), (2, 1, 7, 3), (1, 3, 2, 2), (1, 2, 4, 5), (1, 1, 9, 6)]


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("ctm", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
def test_nearest_scales(nearest_mode, ctm):
    m = resize_model({"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": ctm},
                     inputs=("scales",), consts={"scales": np.array([1, 1, 1.7, 0.6], np.float32)})
    if ctm != "align_corners":
        # onnxruntime only: at a halfway coordinate it and we (float32 coordinates) can round
        # otherwise than the reference evaluator (float64) when a scale is inexact, as 1.7 is
        run_sequence(m, feeds(SEQ), references=("ort",))
        return
    # align_corners with scales: onnxruntime divides by the integer output length - 1, the spec
    # (and its reference) by the fractional one, scale * input length - 1; scales exact in float32
    m = resize_model({"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": ctm},
                     inputs=("scales",), consts={"scales": np.array([1, 1, 1.75, 0.625], np.float32)})
    run_sequence(m, feeds(SEQ), references=("ref",))


@pytest.mark.parametrize("ctm", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                 "half_pixel_symmetric"])
def test_linear_sizes_at_run_time(ctm):
    # sizes is a graph input: the output shape changes with its value as well as with x's shape
    m = resize_model({"mode": "linear", "coordinate_transformation_mode": ctm}, inputs=("sizes",))
    sizes = [[1, 2, 7, 3], [2, 1, 3, 8], [1, 3, 5, 5], [1, 2, 7, 3], [1, 1, 2, 11]]
    run_sequence(m, feeds(SEQ, sizes=sizes))


@pytest.mark.parametrize("attrs", [{}, {"cubic_coeff_a": -0.5, "exclude_outside": 1},
                                   {"coordinate_transformation_mode": "align_corners"},
                                   {"coordinate_transformation_mode": "asymmetric", "exclude_outside": 1}])
def test_cubic_scales(attrs):
    m = resize_model({"mode": "cubic", **attrs}, inputs=("scales",))
    scales = [[1, 1, 2.0, 0.5], [1, 1, 0.8, 1.5], [1, 1, 3.0, 3.0], [1, 1, 2.0, 0.5], [1, 1, 0.5, 1.25]]
    # align_corners with scales: onnxruntime's integer output length (see test_nearest_scales)
    refs = ("ref",) if "align_corners" in str(attrs) else ("ort", "ref")
    run_sequence(m, feeds(SEQ, scales=scales), references=refs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_downscale(mode):
    m = resize_model({"mode": mode, "antialias": 1}, inputs=("sizes",))
    seq = [(1, 2, 16, 12), (2, 1, 9, 20), (1, 1, 16, 12)]
    sizes = [[1, 2, 5, 4], [2, 1, 3, 7], [1, 1, 7, 3]]
    run_sequence(m, feeds(seq, sizes=sizes), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_axes_and_aspect_policy(policy):
    m = resize_model({"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": policy},
                     inputs=("sizes",), consts={"sizes": np.array([6, 5], np.int64)})
    sess = run_sequence(m, feeds(SEQ))
    # negative axes: neither reference takes them (onnxruntime skips one, the evaluator fails),
    # so the same node with axes [3, -2] must give what [3, 2] gives
    neg = resize_model({"mode": "nearest", "axes": [3, -2], "keep_aspect_ratio_policy": policy},
                       inputs=("sizes",), consts={"sizes": np.array([6, 5], np.int64)})
    sess_neg = dynashape.InferenceSession(neg, device=DEVICE)
    for f in feeds(SEQ):
        compare(sess_neg.run(None, f)[0], sess.run(None, f)[0], "negative axes")


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_tf_crop_and_resize(mode):
    m = resize_model({"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                      "extrapolation_value": 7.5, "axes": [2, 3]},
                     inputs=("roi", "sizes"), consts={"sizes": np.array([5, 4], np.int64)})
    rois = [[0.2, -0.3, 0.9, 0.8], [0.0, 0.0, 1.0, 1.0], [-0.5, 0.4, 1.2, 1.1], [0.2, -0.3, 0.9, 0.8],
            [0.1, 0.1, 0.6, 0.3]]
    # nearest: roi 0.1 puts coordinates on halfway points, where the reference's mixed float32 /
    # float64 arithmetic rounds otherwise than onnxruntime's float32 (and ours)
    refs = ("ort",) if mode == "nearest" else ("ort", "ref")
    run_sequence(m, feeds(SEQ, roi=rois), references=refs, rtol=1e-4, atol=1e-4)


def test_trilinear_and_1d_reference():
    # 5-D trilinear and resizing the batch/channel axes too: onnxruntime's linear mode takes
    # 2-D/4-D/5-D inputs with fixed outer scales only, so the reference evaluator checks these
    m = resize_model({"mode": "linear"}, inputs=("scales",), rank=5)
    seq = [(1, 2, 3, 4, 5), (2, 2, 5, 2, 3), (1, 1, 2, 2, 2)]
    run_sequence(m, feeds(seq, scales=[[1.5, 1, 2, 0.5, 1.3]] * 3), references=("ref",))
    m = resize_model({"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, inputs=("scales",), rank=1)
    run_sequence(m, feeds([(7,), (3,), (12,)], scales=[[2.5]] * 3), references=("ref",), atol=1e-4)


def test_uint8_linear():
    m = resize_model({"mode": "linear"}, inputs=("scales",), x_type=TensorProto.UINT8,
                     consts={"scales": np.array([1, 1, 2.0, 4.0], np.float32)})
    # onnxruntime's uint8 bilinear path rounds its fixed-point weights differently: reference only,
    # with scales that make every weight exact, so halfway sums round (to even) the same way
    run_sequence(m, feeds([(1, 1, 4, 5), (1, 2, 3, 3), (1, 1, 4, 5)], dtype=np.uint8), references=("ref",))


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_older_opsets(opset):
    attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners"}
    # opset 11 needs roi and scales as inputs: empty ones stand for "absent"
    m = resize_model(attrs, opset=opset, inputs=("roi", "scales", "sizes"),
                     consts={"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32)})
    sizes = [[1, 2, 7, 3], [2, 1, 3, 8], [1, 3, 5, 5]]
    run_sequence(m, feeds(SEQ[:3], sizes=sizes))


def test_tf_half_pixel_for_nn_opset11():
    m = resize_model({"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, opset=11,
                     inputs=("roi", "scales"), consts={"roi": np.zeros(0, np.float32),
                                                       "scales": np.array([1, 1, 1.6, 0.7], np.float32)})
    run_sequence(m, feeds(SEQ[:3]), references=("ort",))  # the reference evaluator lacks this mode


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize10_and_upsample(mode):
    # the reference evaluator has no Resize-10 / Upsample semantics beyond integer nearest
    # upscales (it uses Resize-19's defaults): onnxruntime is the reference here
    scales = np.array([1, 1, 2.0, 1.5], np.float32)
    for opset, op_type in ((10, "Resize"), (9, "Upsample")):
        m = resize_model({"mode": mode}, opset=opset, inputs=("scales",), consts={"scales": scales},
                         op_type=op_type)
        run_sequence(m, feeds(SEQ[:3]), references=("ort",))
    m = resize_model({"mode": "nearest"}, opset=10, inputs=("scales",),
                     consts={"scales": np.array([1, 1, 0.6, 0.5], np.float32)})
    run_sequence(m, feeds(SEQ[:3]), references=("ort",))


def test_upsample7_attr():
    node = helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0])
    g = helper.make_graph([node], "u", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c", "d"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)], ir_version=8)
    run_sequence(m, feeds(SEQ[:3]), references=("ort",))  # the evaluator lacks Upsample-7's scales attribute


def test_one_tap_at_a_time(monkeypatch):
    # large inputs resample an axis one tap at a time: force that path on these small ones
    from dynashape.ops import resize as resize_mod
    monkeypatch.setattr(resize_mod, "_ONE_GATHER", 0)
    test_cubic_scales({"cubic_coeff_a": -0.5, "exclude_outside": 1})
    test_antialias_downscale("linear")
    test_tf_crop_and_resize("cubic")
