"""Models written by the exporters users run, not by our own graph builders: each run by ONE dynashape
session over a sequence of changing shapes, every output compared with onnxruntime (CPU EP, default
level; its ORT_DISABLE_ALL level alongside, as in test_generated.py).

The files in tests/zoo/exported/ are small random-weight models exported by the tools themselves
(scripts/export_real/, run in an environment with scripts/export_real/requirements.txt):
- ultralytics 8.4 ``YOLO.export(format="onnx", dynamic=True, nms=True)``: YOLOv8 at width 1/16 with
  its NMS inside the graph (NonZero, NonMaxSuppression, GatherND, ScatterND; the detections padded to
  300 per image);
- optimum-onnx 0.1 ``main_export``: Whisper (automatic-speech-recognition-with-past), BART and T5
  (text2text-generation-with-past) as encoder + merged decoder (the If on use_cache_branch), and a
  sentence-transformers model (BERT, mean pooling, Normalize) through optimum's
  sentence_transformers path;
- segment-anything 1.0's ``SamOnnxModel`` exported as its export script does: the prompt decoder
  with a dynamic number of points, the masks upscaled to the size given as an input's value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .test_generated import SEQ2SEQ_SEQS, Compare

onnx = pytest.importorskip("onnx")
HERE = Path(__file__).with_name("exported")

# name -> (file, the ops its exporter must have written: the reason the file is here)
MODELS = {
    "ultralytics-yolov8-nms": ("yolov8-nms.onnx", {"NonMaxSuppression", "NonZero", "GatherND", "ScatterND"}),
    "optimum-whisper-enc": ("whisper-encoder.onnx", {"Conv", "Softmax"}),
    "optimum-whisper-dec": ("whisper-decoder-merged.onnx", {"If"}),
    "optimum-bart-enc": ("bart-encoder.onnx", {"Softmax"}),
    "optimum-bart-dec": ("bart-decoder-merged.onnx", {"If"}),
    "optimum-t5-enc": ("t5-encoder.onnx", {"Softmax"}),
    "optimum-t5-dec": ("t5-decoder-merged.onnx", {"If"}),
    "optimum-sentence-transformer": ("sentence-transformer.onnx", {"ReduceSum", "Softmax"}),
    "sam-prompt-decoder": ("sam-decoder.onnx", {"ConvTranspose", "Resize", "Sin", "Cos"}),
}
# the configurations scripts/export_real/export_hf.py gives the exporters
VOCAB, D_MODEL, HEADS, LAYERS = 384, 32, 2, 2
WHISPER_MELS, WHISPER_FRAMES = 16, 3000


def all_ops(graph) -> set[str]:
    ops = set()
    for n in graph.node:
        ops.add(n.op_type)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                ops |= all_ops(a.g)
    return ops


@pytest.mark.parametrize("name", list(MODELS))
def test_the_exporter_wrote_what_the_model_is_here_for(name):
    file, expected = MODELS[name]
    missing = expected - all_ops(onnx.load(str(HERE / file)).graph)
    assert not missing, f"{file}: no {sorted(missing)}"


def compare(name: str, device: str, zoo_stats: dict) -> Compare:
    return Compare(name, HERE / MODELS[name][0], device, zoo_stats)


def padded_mask(rng, b: int, s: int) -> np.ndarray:
    mask = np.ones((b, s), np.int64)
    for r in range(b):
        if s > 1 and rng.random() < 0.5:
            mask[r, rng.integers(1, s):] = 0
    return mask


def _nms_node(model):
    nms = [n for n in model.graph.node if n.op_type == "NonMaxSuppression"]
    assert len(nms) == 1
    return nms[0]


def _nms_alone(model, node) -> bytes:
    """The model's NonMaxSuppression node as a model of its own, its constant inputs (max boxes, IoU
    and score thresholds) carried as initializers."""
    from onnx import helper, numpy_helper

    consts = {t.name: t for t in model.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"})
    inits = [numpy_helper.from_array(numpy_helper.to_array(consts[x]), f"c{i}") for i, x in enumerate(node.input[2:])]
    one = helper.make_node("NonMaxSuppression", ["boxes", "scores", *[t.name for t in inits]], ["sel"],
                           center_point_box=next((a.i for a in node.attribute if a.name == "center_point_box"), 0))
    g = helper.make_graph([one], "nms", [helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, None),
                                         helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("sel", onnx.TensorProto.INT64, None)], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _unmatched(got: np.ndarray, want: np.ndarray) -> int:
    """Detections (rows with a score) of ``got`` with no row of ``want`` within FP32 tolerance."""
    rows = [w for w in want if w[4] > 0]
    left = 0
    for g in (r for r in got if r[4] > 0):
        hit = next((i for i, w in enumerate(rows) if np.allclose(g, w, rtol=1e-3, atol=1e-3)), None)
        if hit is None:
            left += 1
        else:
            rows.pop(hit)
    return left


def test_ultralytics_yolov8_with_nms(device, zoo_stats):
    """A batch and an image size new on most calls. NMS is a discrete decision over float boxes:
    onnxruntime's own two optimization levels move this model's boxes by ~4e-4, and a pair whose IoU
    lies that close to the threshold (or two scores that close) is kept by one and dropped by the
    other. So the check has three parts, each exact where it can be: the NMS's boxes and scores within
    FP32 tolerance of onnxruntime's; the selection equal, index for index, to onnxruntime's
    NonMaxSuppression run on dynashape's own boxes and scores; the detections (boxes, score, class)
    equal to onnxruntime's but for as many rows as the two selections differ in (each differing
    index moves one detection in, and may push one out of the 300 kept)."""
    import onnxruntime as ort

    import dynashape
    from dynashape.debug import onnxruntime_values

    path = HERE / MODELS["ultralytics-yolov8-nms"][0]
    model = onnx.load(str(path))
    node = _nms_node(model)
    boxes, scores, selected = node.input[0], node.input[1], node.output[0]
    sess = dynashape.InferenceSession(str(path), device=device, extra_outputs=[boxes, scores, selected])
    nms = ort.InferenceSession(_nms_alone(model, node), providers=["CPUExecutionProvider"])
    stats = zoo_stats.setdefault("ultralytics-yolov8-nms", {"steps": 0, "status": "started"})
    rng, kept, moved = np.random.default_rng(20), 0, 0
    for i, (b, h, w) in enumerate([(1, 320, 320), (2, 256, 384), (1, 96, 160), (3, 224, 224), (1, 320, 320),
                                   (2, 160, 96), (1, 64, 64)]):
        feeds = {"images": rng.random((b, 3, h, w), dtype=np.float32)}
        got = dict(zip([o.name for o in sess.get_outputs()], (np.asarray(x) for x in sess.run(None, feeds))))
        want = onnxruntime_values(path, feeds)
        where = f"step {i} (batch {b}, {h}x{w})"
        for name in (boxes, scores):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-3, err_msg=f"{where}: {name}")
        own = nms.run(None, {"boxes": got[boxes], "scores": got[scores]})[0]
        np.testing.assert_array_equal(got[selected], own, err_msg=f"{where}: NMS on dynashape's own boxes")
        differ = len({tuple(r) for r in got[selected]} ^ {tuple(r) for r in want[selected]})
        det = got["output0"]
        assert det.shape == (b, 300, 6), where
        for k in range(b):
            left = _unmatched(det[k], want["output0"][k])
            assert left <= 2 * differ, f"{where} image {k}: {left} detections differ, the selections in {differ}"
        kept += int((det[..., 4] > 0).sum())
        moved += differ
        stats["steps"] += 1
    stats["status"] = f"pass ({moved} selected indices differ from onnxruntime's, all from near-threshold inputs)"
    assert kept > 0, "no image kept a detection: the NMS path was not exercised"


def test_optimum_whisper_encoder(device, zoo_stats):
    run, rng = compare("optimum-whisper-enc", device, zoo_stats), np.random.default_rng(21)
    for i, b in enumerate([1, 3, 2, 1]):
        x = rng.standard_normal((b, WHISPER_MELS, WHISPER_FRAMES)).astype(np.float32)
        assert run({"input_features": x}, f"step {i} (batch {b})")["last_hidden_state"].shape == (b, 1500, D_MODEL)
    run.passed()


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_optimum_text_encoders(kind, device, zoo_stats):
    run, rng = compare(f"optimum-{kind}-enc", device, zoo_stats), np.random.default_rng(22)
    for i, (b, s) in enumerate([(1, 7), (3, 16), (2, 5), (1, 1), (4, 33)]):
        feeds = {"input_ids": rng.integers(0, VOCAB, (b, s)).astype(np.int64), "attention_mask": padded_mask(rng, b, s)}
        assert run(feeds, f"step {i} (batch {b}, seq {s})")["last_hidden_state"].shape == (b, s, D_MODEL)
    run.passed()


@pytest.mark.parametrize("kind", ["whisper", "bart", "t5"])
def test_optimum_merged_decoders_with_past(kind, device, zoo_stats):
    """optimum's merged decoder as its ORTModelForSeq2SeqLM drives it: a prompt with
    use_cache_branch False and empty pasts, then steps with it True feeding every present back as
    its past (the self-attention's growing; the cross-attention's kept from the prompt step); the
    batch, the encoder length (Whisper's is fixed: 1500) and its padding change."""
    run, rng = compare(f"optimum-{kind}-dec", device, zoo_stats), np.random.default_rng(23)
    hd = D_MODEL // HEADS
    past_names = [f"past_key_values.{i}.{w}.{kv}" for i in range(LAYERS) for w in ("decoder", "encoder")
                  for kv in ("key", "value")]
    inputs = {i.name for i in run.sess.get_inputs()}
    for si, (b, prompt, steps, enc_len) in enumerate(SEQ2SEQ_SEQS):
        enc_len = 1500 if kind == "whisper" else enc_len
        fixed = {"encoder_hidden_states": rng.standard_normal((b, enc_len, D_MODEL)).astype(np.float32)}
        if "encoder_attention_mask" in inputs:
            fixed["encoder_attention_mask"] = padded_mask(rng, b, enc_len)
        past = {n: np.zeros((b, HEADS, 0, hd), np.float32) for n in past_names}
        total = 0
        for k, s in enumerate([prompt, *steps]):
            feeds = {"input_ids": rng.integers(0, VOCAB, (b, s)).astype(np.int64), **fixed, **past,
                     "use_cache_branch": np.array([k > 0])}
            out = run(feeds, f"sequence {si} (batch {b}, encoder {enc_len}) step {k} (seq {s}, past {total})")
            total += s
            assert out["logits"].shape == (b, s, VOCAB)
            # the with-past branch returns placeholders for the cross-attention's presents: the
            # caller keeps the prompt step's (as optimum's ORTModelForSeq2SeqLM does)
            past = {n: out[n.replace("past_key_values.", "present.")] if k == 0 or ".decoder." in n else past[n]
                    for n in past_names}
            assert past["past_key_values.0.decoder.key"].shape == (b, HEADS, total, hd)
            assert past["past_key_values.0.encoder.key"].shape == (b, HEADS, enc_len, hd)
    run.passed()


def test_optimum_sentence_transformer(device, zoo_stats):
    run, rng = compare("optimum-sentence-transformer", device, zoo_stats), np.random.default_rng(24)
    for i, (b, s) in enumerate([(1, 7), (3, 16), (2, 5), (1, 1), (4, 40)]):
        feeds = {"input_ids": rng.integers(0, 231, (b, s)).astype(np.int64), "attention_mask": padded_mask(rng, b, s)}
        out = run(feeds, f"step {i} (batch {b}, seq {s})")
        np.testing.assert_allclose(np.linalg.norm(out["sentence_embedding"], axis=1), 1.0, rtol=1e-5)
    run.passed()


def test_sam_prompt_decoder(device, zoo_stats):
    """A new number of points on most calls (labels -1..3: padding, background, foreground, box
    corners), a mask prompt on some, and the original image size as data: the upscaled masks' shape
    follows orig_im_size's value."""
    run, rng = compare("sam-prompt-decoder", device, zoo_stats), np.random.default_rng(25)
    for i, (n, size, has_mask) in enumerate([(1, (48, 80), 0), (5, (64, 64), 1), (2, (100, 37), 0), (9, (48, 80), 1),
                                            (3, (20, 130), 0)]):
        feeds = {"image_embeddings": rng.standard_normal((1, 32, 16, 16)).astype(np.float32),
                 "point_coords": (rng.random((1, n, 2)) * 64).astype(np.float32),
                 "point_labels": rng.integers(-1, 4, (1, n)).astype(np.float32),
                 "mask_input": rng.standard_normal((1, 1, 64, 64)).astype(np.float32),
                 "has_mask_input": np.array([has_mask], np.float32),
                 "orig_im_size": np.array(size, np.float32)}
        out = run(feeds, f"step {i} (points {n}, image {size}, mask {has_mask})")
        assert out["masks"].shape == (1, 1, *size)
    run.passed()
