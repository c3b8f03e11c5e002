"""DFT, STFT, the windows, MelWeightMatrix (ops/signal.py) and NonMaxSuppression
(ops/data_dependent.py), each over a sequence of shapes in one session."""

import numpy as np
import onnx
import pytest

from dynashape.ops import native

from .harness import check_op, make_model, run_sequence

F32, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
FFT_TOL = dict(rtol=1e-4, atol=1e-4)  # float32 FFTs of a few dozen points: round-off ~1e-5


@pytest.mark.parametrize("last", [1, 2])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft20_full(last, inverse):
    seq = [[(2, 8, last)], [(3, 5, last)], [(1, 12, last)], [(2, 8, last)]]
    check_op("DFT", seq, attrs={"inverse": inverse}, opset=20, **FFT_TOL)


def test_dft20_axis_and_length_as_inputs():
    # axis 1 of a rank-4 input, dft_length pads the shorter signals and truncates the longer one
    seq = [[(2, 6, 3, 2), (), ()], [(1, 9, 2, 2), (), ()], [(3, 4, 5, 2), (), ()], [(2, 6, 3, 2), (), ()]]

    def mk(i, shape, rng):
        return np.array(7 if i == 1 else -3, dtype=np.int64) if i else None
    check_op("DFT", seq, opset=20, dtypes=[np.float32, np.int64, np.int64], make_input=mk, **FFT_TOL)


def test_dft20_rfft_and_irfft():
    seq = [[(2, 8, 1)], [(3, 7, 1)], [(1, 12, 1)], [(3, 7, 1)]]
    check_op("DFT", seq, attrs={"onesided": 1}, opset=20, **FFT_TOL)
    # IRFFT: one-sided spectra in, real signals of length 2 * (bins - 1) out
    seq = [[(2, 5, 2)], [(3, 4, 2)], [(1, 7, 2)], [(3, 4, 2)]]
    check_op("DFT", seq, attrs={"onesided": 1, "inverse": 1}, opset=20, references=("ref",), **FFT_TOL)


def test_dft17_axis_attribute():
    # opset 17 takes the axis as an attribute (default 1); dft_length is a constant here
    seq = [[(2, 6, 3, 2)], [(1, 9, 2, 2)], [(3, 4, 5, 2)]]
    for axis in (1, 2, -2):
        check_op("DFT", seq, attrs={"axis": axis}, opset=17, **FFT_TOL)
    model = make_model("DFT", 2, [F32, I64], {"axis": 2}, opset=17, const_inputs={1: np.array(6, np.int64)})
    rng = np.random.default_rng(1)
    feeds = [{"in0": rng.uniform(-2, 2, s).astype(np.float32)} for s in [(2, 3, 4, 1), (1, 5, 9, 1), (2, 3, 4, 1)]]
    run_sequence(model, feeds, **FFT_TOL)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft(onesided):
    # frame_step 3, the frame length taken from the window (length 8); the signal length varies
    seq = [[(2, 20, 1), (), (8,)], [(1, 31, 1), (), (8,)], [(3, 9, 1), (), (8,)], [(2, 20, 1), (), (8,)]]

    def mk(i, shape, rng):
        return np.array(3, dtype=np.int64) if i == 1 else None
    check_op("STFT", seq, attrs={"onesided": onesided}, dtypes=[np.float32, np.int64, np.float32],
             make_input=mk, **FFT_TOL)


def test_stft_frame_length_no_window_complex():
    model = make_model("STFT", 4, [F32, I64, F32, I64], {"onesided": 0}, opset=17,
                       const_inputs={1: np.array(4, np.int64), 3: np.array(6, np.int64)})
    model.graph.node[0].input[2] = ""  # no window: rectangular
    model.graph.input.pop(1)  # the window's graph input
    rng = np.random.default_rng(2)
    feeds = [{"in0": rng.uniform(-2, 2, s).astype(np.float32)} for s in [(2, 14, 2), (1, 23, 2), (3, 6, 2)]]
    run_sequence(model, feeds, references=("ref",), **FFT_TOL)  # ORT's STFT takes real signals only


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    sizes = iter([10, 3, 17, 10, 2])

    def mk(i, shape, rng):
        return np.array(next(sizes), dtype=np.int64)
    check_op(op, [[()]] * 5, attrs={"periodic": periodic}, dtypes=[np.int64], make_input=mk)


def test_window_output_datatype():
    sizes = iter([8, 5, 11])

    def mk(i, shape, rng):
        return np.array(next(sizes), dtype=np.int32)
    check_op("HannWindow", [[()]] * 3, attrs={"output_datatype": onnx.TensorProto.DOUBLE}, dtypes=[np.int32],
             make_input=mk)


def test_mel_weight_matrix():
    steps = iter([(8, 256, 8000, 0.0, 4000.0), (5, 64, 16000, 100.0, 7000.0), (12, 512, 22050, 50.0, 8000.0),
                  (8, 256, 8000, 0.0, 4000.0)])
    cur = {}

    def mk(i, shape, rng):
        if i == 0:
            cur["v"] = next(steps)
        v = cur["v"][i]
        return np.array(v, dtype=np.int64 if i < 3 else np.float32)
    check_op("MelWeightMatrix", [[(), (), (), (), ()]] * 4, dtypes=[np.int64] * 3 + [np.float32] * 2,
             make_input=mk)


def _nms_inputs(i, shape, rng):
    if i == 0:  # boxes: random corners in a 10x10 field, half of them given in the other diagonal order
        a, b = rng.uniform(0, 10, shape), rng.uniform(0, 10, shape)
        return np.where(rng.random(shape) < 0.5, a, b).astype(np.float32)
    if i == 1:
        return rng.uniform(0.01, 1, shape).astype(np.float32)
    return None


@pytest.mark.parametrize("center_point_box", [0, 1])
def test_nms(center_point_box):
    seq = [[(1, 12, 4), (1, 2, 12)], [(2, 30, 4), (2, 3, 30)], [(1, 5, 4), (1, 1, 5)], [(2, 30, 4), (2, 3, 30)]]
    model = make_model("NonMaxSuppression", 5, [F32, F32, I64, F32, F32], {"center_point_box": center_point_box},
                       opset=11, ranks=[3, 3], const_inputs={2: np.array([4], np.int64),
                                                             3: np.array([0.3], np.float32),
                                                             4: np.array([0.2], np.float32)})
    rng = np.random.default_rng(3)
    feeds = [{f"in{i}": _nms_inputs(i, s, rng) for i, s in enumerate(shapes)} for shapes in seq]
    run_sequence(model, feeds)


def test_nms_optional_inputs_absent_and_no_output():
    # only max_output_boxes_per_class: every box above the IoU threshold 0 against a selected one
    # goes; without it (default 0) nothing is selected, an empty [0, 3] result
    rng = np.random.default_rng(4)
    seq = [[(1, 10, 4), (1, 2, 10)], [(2, 4, 4), (2, 1, 4)], [(1, 10, 4), (1, 2, 10)]]
    feeds = [{f"in{i}": _nms_inputs(i, s, rng) for i, s in enumerate(shapes)} for shapes in seq]
    m = make_model("NonMaxSuppression", 3, [F32, F32, I64], opset=11, ranks=[3, 3],
                   const_inputs={2: np.array([10], np.int64)})
    # onnx's reference fails without an iou_threshold input (it reads .size of None)
    run_sequence(m, feeds, references=("ort",))
    m = make_model("NonMaxSuppression", 2, [F32, F32], opset=10, ranks=[3, 3])
    run_sequence(m, feeds, references=("ort",))


@pytest.mark.parametrize("native", ["1", "0"], ids=["nms.c", "numpy"])
def test_nms_ties_and_duplicates(native, monkeypatch):
    """Both host paths (ops/csrc/nms.c, and numpy where C cannot be built): equal scores keep the
    lower box index first, duplicated boxes (IoU 1) and empty boxes (IoU 0/0) as onnxruntime treats
    them, many classes and boxes."""
    monkeypatch.setenv("DYNASHAPE_NATIVE", native)
    rng = np.random.default_rng(5)

    def mk(shapes):
        boxes = _nms_inputs(0, shapes[0], rng)
        boxes[:, 1::7] = boxes[:, 0:1]  # duplicates of box 0
        boxes[:, 2::11, 2:] = boxes[:, 2::11, :2]  # empty boxes
        scores = np.round(rng.uniform(0, 1, shapes[1]) * 8).astype(np.float32) / 8  # many equal scores
        return {"in0": boxes, "in1": scores}

    seq = [[(2, 60, 4), (2, 5, 60)], [(1, 200, 4), (1, 8, 200)], [(3, 9, 4), (3, 2, 9)]]
    m = make_model("NonMaxSuppression", 5, [F32, F32, I64, F32, F32], opset=11, ranks=[3, 3],
                   const_inputs={2: np.array([25], np.int64), 3: np.array([0.4], np.float32),
                                 4: np.array([0.25], np.float32)})
    run_sequence(m, [mk(s) for s in seq], references=("ort",))


def test_nms_thousands_of_candidates_as_a_detector_head_gives_them():
    """A YOLO export's single class-offset NMS: thousands of boxes above the score threshold, up to 300
    kept (the C path checks each candidate against the kept boxes only: the numpy path's full IoU
    matrix of 6,300 candidates took seconds). Clustered boxes so that many overlap."""
    rng = np.random.default_rng(6)

    def mk(n):
        centre = rng.uniform(0, 640, (1, n, 2)).round(-1)  # on a grid: many near-duplicates
        size = rng.uniform(8, 120, (1, n, 2))
        boxes = np.concatenate([centre, size], -1).astype(np.float32)  # center_point_box=1
        return {"in0": boxes, "in1": rng.uniform(0, 1, (1, 1, n)).astype(np.float32)}

    m = make_model("NonMaxSuppression", 5, [F32, F32, I64, F32, F32], {"center_point_box": 1}, opset=11,
                   ranks=[3, 3], const_inputs={2: np.array([300], np.int64), 3: np.array([0.7], np.float32),
                                               4: np.array([0.25], np.float32)})
    sess = run_sequence(m, [mk(n) for n in (6300, 2100, 4000)], references=("ort",))
    if native.library("nms") is not None:
        assert sess.stats()["nms_native"] >= 3, sess.stats()
