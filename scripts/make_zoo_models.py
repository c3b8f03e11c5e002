"""The generated part of the model zoo: tiny models made by the tools people ship ONNX models with.

Every model is random-initialised from a small config (nothing is downloaded) and run through a
real tool chain:

  torch.onnx.export (TorchScript exporter: the graph shape the onnxruntime fusions know)
    -> onnxruntime.transformers.optimizer.optimize_model      (com.microsoft fused ops)
    -> onnxruntime.quantization.quantize_dynamic / _static    (MatMulInteger, QLinear*, QDQ)
  torch.onnx.export of an encoder-decoder's decoder without and with past, merged under one If on
    use_cache_branch (optimum's merged-decoder layout, rebuilt here: optimum-onnx pins transformers < 4.58)
  torch modules written here -> torch.onnx.export: a sentence-transformers model (BERT + mean pooling +
    L2 norm, optimum's feature-extraction layout; optimum itself is not installed), a YOLOv8-style
    detector with NonMaxSuppression appended by onnx.helper (what ultralytics' export(nms=True) gives;
    ultralytics is not installed: it needs torchvision and opencv), a Segment-Anything-style decoder
  transformers checkpoint (save_pretrained, local tokenizer)
    -> python -m onnxruntime_genai.models.builder -p fp32|int4 -e cpu   (GQA, MatMulNBits)

Files land in ``<repo>/.cache/generated/<name>.onnx`` (or $DYNASHAPE_ZOO_DIR); a file that exists
is used as it is, unless its ``<name>.stamp`` (a hash of this script and of the versions of the
tools) says it was made by another version of this script or of the tools; ``--force`` rebuilds.
Each is written under a temporary name and renamed, so concurrent test processes never see half a
file.

    python scripts/make_zoo_models.py                 # make every model
    python scripts/make_zoo_models.py bert-opt llama-int4
    python scripts/make_zoo_models.py --ops           # make, then print the ops of note of each
    python scripts/make_zoo_models.py --list          # names, the tool chain, whether it is slow

The tests in tests/zoo/test_generated.py call ``generate(name)``.

What the chains give (onnxruntime 1.32, transformers 5, onnxruntime-genai 0.18; see ``--ops``):
  * the transformer optimizer fuses Attention/EmbedLayerNormalization only in TorchScript exports
    with eager attention; GPT-2 gets SkipLayerNormalization and FastGelu but no Attention (its
    fusion looks for the masked-bias pattern of older transformers), ViT no Attention either.
    onnxruntime's own GPT-2 exporter (onnxruntime.transformers.models.gpt2.convert_to_onnx) fails
    with transformers 5 (it passes the past as tuples), hence our DynamicCache wrapper.
  * quantize_dynamic of an optimized model needs extra_options DefaultTensorType (its error says
    so): the fused ops' outputs carry no inferred type.
  * the genai builder on the CPU puts the rotary embedding inside GroupQueryAttention (a separate
    RotaryEmbedding only for -e dml); int4 embeddings (GatherBlockQuantized) need
    op_types_to_quantize=MatMul/Gather.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE_DIR = Path(os.environ.get("DYNASHAPE_ZOO_DIR", REPO / ".cache" / "generated"))
OPSET = 17

# Tiny configs -------------------------------------------------------------------------------------
BERT = dict(vocab=1000, hidden=64, layers=2, heads=4, intermediate=256, max_positions=128, type_vocab=2)
GPT2 = dict(vocab=1000, hidden=64, layers=2, heads=4, max_positions=128)
VIT = dict(image=32, patch=8, channels=3, hidden=64, layers=2, heads=4, intermediate=128)
T5 = dict(vocab=1000, d_model=64, d_kv=16, heads=4, d_ff=128, layers=2)
CNN = dict(widths=(16, 32, 64), classes=10)
WHISPER = dict(vocab=256, mels=16, frames=40, d_model=64, layers=2, heads=4, ffn=128, max_target=64)
BART = dict(vocab=256, d_model=64, layers=2, heads=4, ffn=128, max_positions=128)
LLAMA = dict(vocab=256, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, max_positions=256)
SEED = 0


class ToolUnavailable(RuntimeError):
    """A generation tool (a Python package) is not installed: the model cannot be made here."""


class GenerationError(RuntimeError):
    """A tool ran but failed to produce the model."""


@dataclass(frozen=True)
class Spec:
    name: str
    make: Callable[[Path, Path], None]  # make(path, cache_dir): writes the model to path
    chain: str  # the tool chain, in words
    needs: tuple[str, ...] = ()  # importable modules the chain needs
    deps: tuple[str, ...] = ()  # other zoo models it starts from
    slow: bool = False  # generation takes more than ~20 s on a shared 2-core machine


MODELS: dict[str, Spec] = {}


def _model(name: str, chain: str, needs=(), deps=(), slow=False):
    def deco(fn):
        MODELS[name] = Spec(name, fn, chain, tuple(needs), tuple(deps), slow)
        return fn

    return deco


# Generation driver ---------------------------------------------------------------------------------
def missing_tools(name: str) -> list[str]:
    """The modules that ``name`` (or a model it starts from) needs and that are not importable."""
    spec = MODELS[name]
    out = [m for m in spec.needs if importlib.util.find_spec(m) is None]
    for d in spec.deps:
        out += [m for m in missing_tools(d) if m not in out]
    return out


def generate(name: str, cache_dir: Path | None = None, force: bool = False, verbose: bool = False) -> Path:
    """Path of ``<cache>/<name>.onnx``, made now (with the models it starts from) if not there yet.

    Raises ToolUnavailable when a tool it needs is not installed, GenerationError when one fails."""
    if name not in MODELS:
        raise KeyError(f"unknown zoo model {name!r}; known: {sorted(MODELS)}")
    d = Path(cache_dir or CACHE_DIR)
    path = d / f"{name}.onnx"
    stamp_file = path.with_suffix(".stamp")
    stamp = _stamp(name)
    if path.exists() and not force and stamp_file.exists() and stamp_file.read_text() == stamp:
        return path
    missing = missing_tools(name)
    if missing:
        raise ToolUnavailable(f"{name}: needs {', '.join(missing)} (pip install {' '.join(missing)})")
    spec = MODELS[name]
    for dep in spec.deps:
        generate(dep, d, verbose=verbose)
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=d) as tmp:
        out = Path(tmp) / f"{name}.onnx"
        try:
            with _quiet(not verbose):
                spec.make(out, d)
        except (GenerationError, ToolUnavailable):
            raise
        except Exception as e:  # the tool's own error, named after the model
            raise GenerationError(f"{name}: {spec.chain}: {type(e).__name__}: {e}") from e
        if not out.exists():
            raise GenerationError(f"{name}: the tool chain wrote no model")
        _check(out, name)
        os.chmod(out, 0o644)
        os.replace(out, path)
        tmp_stamp = Path(tmp) / "stamp"
        tmp_stamp.write_text(stamp)
        os.replace(tmp_stamp, stamp_file)
    if verbose:
        print(f"{name}: made in {time.perf_counter() - t0:.1f} s -> {path}")
    return path


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "onnx", "onnxruntime", "transformers", "onnxruntime-genai"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _stamp(name: str) -> str:
    """What decides the file's content: the model's name, this script, the tools' versions."""
    blob = json.dumps({"name": name, "script": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
                       "versions": _versions()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _check(path: Path, name: str) -> None:
    """The model loads in onnxruntime (onnx.checker would refuse the contrib ops that live in the
    default domain, e.g. SimplifiedLayerNormalization)."""
    import onnx

    try:
        onnx.load(str(path))
        if importlib.util.find_spec("onnxruntime") is not None:
            import onnxruntime as ort

            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:
        raise GenerationError(f"{name}: the written model does not load in onnxruntime: {e}") from e


@contextlib.contextmanager
def _quiet(on: bool):
    """Silence the exporters' and tools' warnings and progress output (stdout/stderr of this process)."""
    if not on:
        yield
        return
    import logging

    prev = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
                yield
    finally:
        logging.disable(prev)


def dep_path(name: str, cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or CACHE_DIR) / f"{name}.onnx"


# torch export helpers --------------------------------------------------------------------------------
def _seed() -> None:
    import torch

    torch.manual_seed(SEED)
    np.random.seed(SEED)


def _ts_export(module, args: tuple, path: Path, inputs: list[str], outputs: list[str], axes: dict) -> None:
    """torch.onnx.export with the TorchScript exporter (dynamo=False): the onnxruntime transformer
    optimizer's fusions (Attention, EmbedLayerNormalization) match its graphs, not the dynamo
    exporter's (measured: a dynamo export of the same BERT fuses no Attention and no
    EmbedLayerNormalization)."""
    import torch

    module = module.eval()
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                          opset_version=OPSET, do_constant_folding=True, dynamo=False)


class _HFWrapper:
    """Positional inputs -> keyword inputs of a transformers model; tuple outputs."""

    @staticmethod
    def make(model, keys: list[str], n_out: int):
        import torch

        class W(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(**dict(zip(keys, args)), return_dict=False)
                return tuple(out[:n_out])

        return W().eval()


# BERT ---------------------------------------------------------------------------------------------------
BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
BERT_OUTPUTS = ["last_hidden_state", "pooler_output"]


def bert_module():
    from transformers import BertConfig, BertModel

    _seed()
    c = BERT
    cfg = BertConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                     num_attention_heads=c["heads"], intermediate_size=c["intermediate"],
                     max_position_embeddings=c["max_positions"], type_vocab_size=c["type_vocab"])
    # eager attention: the sdpa path's mask helpers trace into graphs the fusions do not match
    cfg._attn_implementation = "eager"
    return _HFWrapper.make(BertModel(cfg).eval(), BERT_INPUTS, 2)


def bert_feeds(rng: np.random.Generator, batch: int, seq: int) -> dict:
    """ids in the vocab; a mask of 1s with 0-padding at the end of some rows (at least one 1 per row);
    token types 0 then 1 (two segments)."""
    ids = rng.integers(0, BERT["vocab"], (batch, seq)).astype(np.int64)
    mask = right_padded_mask(rng, batch, seq)
    types = np.zeros((batch, seq), np.int64)
    for b in range(batch):
        types[b, rng.integers(0, seq + 1):] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def right_padded_mask(rng: np.random.Generator, batch: int, seq: int, pad_rows: float = 0.5) -> np.ndarray:
    """1s, with the end of about ``pad_rows`` of the rows 0 (each row keeps at least one 1)."""
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        if seq > 1 and rng.random() < pad_rows:
            mask[b, rng.integers(1, seq):] = 0
    return mask


@_model("bert", "transformers BertModel -> torch.onnx.export (TorchScript, opset 17)", needs=["transformers"])
def make_bert(path: Path, cache: Path) -> None:
    import torch

    m = bert_module()
    b, s = 2, 7
    args = (torch.randint(0, BERT["vocab"], (b, s)), torch.ones(b, s, dtype=torch.int64),
            torch.zeros(b, s, dtype=torch.int64))
    axes = {n: {0: "batch", 1: "seq"} for n in BERT_INPUTS + ["last_hidden_state"]}
    axes["pooler_output"] = {0: "batch"}
    _ts_export(m, args, path, BERT_INPUTS, BERT_OUTPUTS, axes)


def _optimize(src: Path, path: Path, model_type: str, num_heads: int, hidden: int, opt_level: int,
              **fusion_options) -> None:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    opts = FusionOptions(model_type)
    for k, v in fusion_options.items():
        if not hasattr(opts, k):
            raise GenerationError(f"FusionOptions has no {k!r}")
        setattr(opts, k, v)
    om = optimize_model(str(src), model_type=model_type, num_heads=num_heads, hidden_size=hidden,
                        optimization_options=opts, opt_level=opt_level, use_gpu=False)
    om.save_model_to_file(str(path))


@_model("bert-opt", "bert -> optimize_model(model_type='bert', opt_level=1)", needs=["onnxruntime"], deps=["bert"])
def make_bert_opt(path: Path, cache: Path) -> None:
    _optimize(dep_path("bert", cache), path, "bert", BERT["heads"], BERT["hidden"], opt_level=1)


@_model("bert-opt-mha", "bert -> optimize_model(model_type='bert', opt_level=0, use_multi_head_attention=True)",
        needs=["onnxruntime"], deps=["bert"])
def make_bert_opt_mha(path: Path, cache: Path) -> None:
    _optimize(dep_path("bert", cache), path, "bert", BERT["heads"], BERT["hidden"], opt_level=0,
              use_multi_head_attention=True)


# reduce_range=True (7-bit weights) everywhere: on x86 CPUs without VNNI (AVX2 only, as these
# machines) onnxruntime's U8S8 integer kernels use VPMADDUBSW, whose int16 pair sums saturate, so
# with full 8-bit weights onnxruntime itself is inexact (seen: bert-qdyn 2.2e-3 away from the exact
# integer result of onnx's ReferenceEvaluator; one element of gpt2-opt-qdyn's present_key_1 off by
# 0.135 where the fp32 model agrees with the exact sum). reduce_range is onnxruntime's documented
# remedy; it keeps the reference exact on every x86 CPU, so the tests compare against exact results.
REDUCE_RANGE = True


def _quantize_dynamic(src: Path, path: Path, **kw) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(path), weight_type=kw.pop("weight_type", QuantType.QInt8),
                     reduce_range=REDUCE_RANGE, **kw)


@_model("bert-qdyn", "bert -> quantize_dynamic (QOperator, reduce_range)", needs=["onnxruntime"], deps=["bert"])
def make_bert_qdyn(path: Path, cache: Path) -> None:
    _quantize_dynamic(dep_path("bert", cache), path)


@_model("bert-opt-qdyn", "bert-opt -> quantize_dynamic (QOperator, reduce_range)", needs=["onnxruntime"],
        deps=["bert-opt"])
def make_bert_opt_qdyn(path: Path, cache: Path) -> None:
    # the fused ops' outputs have no inferred type: the quantizer asks for a default (its error says so)
    import onnx

    _quantize_dynamic(dep_path("bert-opt", cache), path,
                      extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


@_model("bert-qdyn-ort", "bert-qdyn -> onnxruntime session at ORT_ENABLE_EXTENDED, optimized_model_filepath",
        needs=["onnxruntime"], deps=["bert-qdyn"])
def make_bert_qdyn_ort(path: Path, cache: Path) -> None:
    """What onnxruntime's own offline optimization writes for the quantized model: its CPU fusions
    (DynamicQuantizeMatMul, MatMulIntegerToFloat, FusedMatMul ...) saved as a model."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(path)
    ort.InferenceSession(str(dep_path("bert-qdyn", cache)), so, providers=["CPUExecutionProvider"])


class _Reader:
    """A CalibrationDataReader over a fixed list of feeds."""

    def __init__(self, feeds: list[dict]) -> None:
        self.feeds = list(feeds)
        self.it = iter(self.feeds)

    def get_next(self):
        return next(self.it, None)

    def rewind(self) -> None:
        self.it = iter(self.feeds)


def _quantize_static(src: Path, path: Path, feeds: list[dict], fmt: str, **kw) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(_Reader, CalibrationDataReader):
        pass

    quant_format = {"qop": QuantFormat.QOperator, "qdq": QuantFormat.QDQ}[fmt]
    quantize_static(str(src), str(path), Reader(feeds), quant_format=quant_format, reduce_range=REDUCE_RANGE, **kw)


def _bert_calibration() -> list[dict]:
    rng = np.random.default_rng(100)
    return [bert_feeds(rng, b, s) for b, s in [(2, 16), (1, 32), (3, 9), (2, 24)]]


@_model("bert-qop", "bert -> quantize_static(QuantFormat.QOperator, reduce_range), random calibration",
        needs=["onnxruntime"], deps=["bert"])
def make_bert_qop(path: Path, cache: Path) -> None:
    _quantize_static(dep_path("bert", cache), path, _bert_calibration(), "qop")


@_model("bert-qdq", "bert -> quantize_static(QuantFormat.QDQ, reduce_range), random calibration",
        needs=["onnxruntime"], deps=["bert"])
def make_bert_qdq(path: Path, cache: Path) -> None:
    _quantize_static(dep_path("bert", cache), path, _bert_calibration(), "qdq")


# GPT-2 with past ----------------------------------------------------------------------------------------
def gpt2_io() -> tuple[list[str], list[str]]:
    n = GPT2["layers"]
    past = [f"past_{kv}_{i}" for i in range(n) for kv in ("key", "value")]
    present = [f"present_{kv}_{i}" for i in range(n) for kv in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def gpt2_module():
    import torch
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

    _seed()
    c = GPT2
    cfg = GPT2Config(vocab_size=c["vocab"], n_embd=c["hidden"], n_layer=c["layers"], n_head=c["heads"],
                     n_positions=c["max_positions"], bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).eval()
    n = c["layers"]

    class WithPast(torch.nn.Module):
        """past_key_<i>/past_value_<i> [batch, heads, past, head_dim] in, logits and the presents out."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=self.model.config)
            for i in range(n):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True, return_dict=True)
            present = []
            for layer in out.past_key_values.layers[:n]:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return WithPast().eval()


@_model("gpt2", "transformers GPT2LMHeadModel with past (DynamicCache) -> torch.onnx.export (TorchScript)",
        needs=["transformers"])
def make_gpt2(path: Path, cache: Path) -> None:
    import torch

    m = gpt2_module()
    inputs, outputs = gpt2_io()
    b, s, p = 2, 3, 5  # a non-empty past, so the export keeps the concatenation general
    heads, hd = GPT2["heads"], GPT2["hidden"] // GPT2["heads"]
    args = (torch.randint(0, GPT2["vocab"], (b, s)), torch.ones(b, p + s, dtype=torch.int64),
            torch.arange(p, p + s).expand(b, s).contiguous(),
            *[torch.randn(b, heads, p, hd) for _ in inputs[3:]])
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total_seq"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past_seq"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "total_seq"} for n in outputs[1:]})
    _ts_export(m, args, path, inputs, outputs, axes)


@_model("gpt2-opt", "gpt2 -> optimize_model(model_type='gpt2', opt_level=0)", needs=["onnxruntime"], deps=["gpt2"])
def make_gpt2_opt(path: Path, cache: Path) -> None:
    _optimize(dep_path("gpt2", cache), path, "gpt2", GPT2["heads"], GPT2["hidden"], opt_level=0)


@_model("gpt2-opt-qdyn", "gpt2-opt -> quantize_dynamic (QOperator, reduce_range)", needs=["onnxruntime"],
        deps=["gpt2-opt"])
def make_gpt2_opt_qdyn(path: Path, cache: Path) -> None:
    import onnx

    _quantize_dynamic(dep_path("gpt2-opt", cache), path,
                      extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


# ViT and T5 encoder ----------------------------------------------------------------------------------------
@_model("vit", "transformers ViTModel -> torch.onnx.export (TorchScript), dynamic batch", needs=["transformers"])
def make_vit(path: Path, cache: Path) -> None:
    import torch
    from transformers import ViTConfig, ViTModel

    _seed()
    c = VIT
    cfg = ViTConfig(image_size=c["image"], patch_size=c["patch"], num_channels=c["channels"],
                    hidden_size=c["hidden"], num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                    intermediate_size=c["intermediate"])
    cfg._attn_implementation = "eager"
    m = _HFWrapper.make(ViTModel(cfg).eval(), ["pixel_values"], 2)
    x = torch.randn(2, c["channels"], c["image"], c["image"])
    axes = {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"}, "pooler_output": {0: "batch"}}
    _ts_export(m, (x,), path, ["pixel_values"], ["last_hidden_state", "pooler_output"], axes)


@_model("vit-opt", "vit -> optimize_model(model_type='vit', opt_level=0)", needs=["onnxruntime"], deps=["vit"])
def make_vit_opt(path: Path, cache: Path) -> None:
    _optimize(dep_path("vit", cache), path, "vit", VIT["heads"], VIT["hidden"], opt_level=0)


@_model("t5enc", "transformers T5EncoderModel -> torch.onnx.export (TorchScript)", needs=["transformers"])
def make_t5enc(path: Path, cache: Path) -> None:
    import torch
    from transformers import T5Config, T5EncoderModel

    _seed()
    c = T5
    cfg = T5Config(vocab_size=c["vocab"], d_model=c["d_model"], d_kv=c["d_kv"], num_heads=c["heads"],
                   d_ff=c["d_ff"], num_layers=c["layers"], dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    m = _HFWrapper.make(T5EncoderModel(cfg).eval(), ["input_ids", "attention_mask"], 1)
    b, s = 2, 7
    args = (torch.randint(0, c["vocab"], (b, s)), torch.ones(b, s, dtype=torch.int64))
    axes = {n: {0: "batch", 1: "seq"} for n in ["input_ids", "attention_mask", "last_hidden_state"]}
    _ts_export(m, args, path, ["input_ids", "attention_mask"], ["last_hidden_state"], axes)


@_model("t5enc-opt", "t5enc -> optimize_model(model_type='t5', opt_level=0)", needs=["onnxruntime"],
        deps=["t5enc"])
def make_t5enc_opt(path: Path, cache: Path) -> None:
    _optimize(dep_path("t5enc", cache), path, "t5", T5["heads"], T5["d_model"], opt_level=0)


# CNN ---------------------------------------------------------------------------------------------------------
def cnn_module():
    """A small ResNet (3 stages of BasicBlocks, BatchNorm with random statistics, global average pool,
    linear head). torchvision is not a dependency of the project; this has resnet18's op mix."""
    import torch
    from torch import nn

    _seed()

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = CNN["widths"]
            self.stem = nn.Sequential(nn.Conv2d(3, w[0], 3, 1, 1, bias=False), nn.BatchNorm2d(w[0]), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            self.layers = nn.Sequential(Block(w[0], w[0], 1), Block(w[0], w[1], 2), Block(w[1], w[2], 2))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(w[2], CNN["classes"])

        def forward(self, x):
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    net = Net()
    for mod in net.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 2.0)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return net.eval()


def cnn_feeds(rng: np.random.Generator, batch: int, h: int, w: int) -> dict:
    return {"images": rng.standard_normal((batch, 3, h, w)).astype(np.float32)}


@_model("cnn", "small ResNet (torch) -> torch.onnx.export (TorchScript), dynamic batch and image size")
def make_cnn(path: Path, cache: Path) -> None:
    import torch

    x = torch.randn(2, 3, 32, 32)
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
    _ts_export(cnn_module(), (x,), path, ["images"], ["logits"], axes)


def _cnn_calibration() -> list[dict]:
    rng = np.random.default_rng(101)
    return [cnn_feeds(rng, b, h, w) for b, h, w in [(2, 32, 32), (1, 48, 40), (3, 24, 24), (2, 64, 48)]]


@_model("cnn-qop", "cnn -> quantize_static(QuantFormat.QOperator, reduce_range), random calibration",
        needs=["onnxruntime"], deps=["cnn"])
def make_cnn_qop(path: Path, cache: Path) -> None:
    _quantize_static(dep_path("cnn", cache), path, _cnn_calibration(), "qop")


@_model("cnn-qdq", "cnn -> quantize_static(QuantFormat.QDQ, per_channel, reduce_range), random calibration",
        needs=["onnxruntime"], deps=["cnn"])
def make_cnn_qdq(path: Path, cache: Path) -> None:
    _quantize_static(dep_path("cnn", cache), path, _cnn_calibration(), "qdq", per_channel=True)


# Encoder-decoders with past: Whisper and BART, in optimum's merged-decoder layout --------------------------
# optimum-onnx's exporter pins transformers < 4.58 (this project runs 5.x), so its layout is rebuilt here from
# two torch.onnx exports of the same module: the decoder without past (prompt; cross-attention keys/values
# computed from encoder_hidden_states) and with past (self- and cross-attention keys/values as inputs), put as
# the two branches of one If on ``use_cache_branch``, as optimum's merge_decoders does.
def seq2seq_past_io(layers: int) -> tuple[list[str], list[str]]:
    """optimum's names: past_key_values.<i>.decoder|encoder.key|value in, present.<i>.... out."""
    past = [f"past_key_values.{i}.{w}.{kv}" for i in range(layers) for w in ("decoder", "encoder")
            for kv in ("key", "value")]
    return past, [n.replace("past_key_values.", "present.") for n in past]


def whisper_model():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    _seed()
    c = WHISPER
    cfg = WhisperConfig(vocab_size=c["vocab"], num_mel_bins=c["mels"], d_model=c["d_model"],
                        encoder_layers=c["layers"], decoder_layers=c["layers"], encoder_attention_heads=c["heads"],
                        decoder_attention_heads=c["heads"], encoder_ffn_dim=c["ffn"], decoder_ffn_dim=c["ffn"],
                        max_source_positions=c["frames"] // 2, max_target_positions=c["max_target"],
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    cfg._attn_implementation = "eager"
    return WhisperForConditionalGeneration(cfg).eval()


def bart_model():
    from transformers import BartConfig, BartForConditionalGeneration

    _seed()
    c = BART
    cfg = BartConfig(vocab_size=c["vocab"], d_model=c["d_model"], encoder_layers=c["layers"],
                     decoder_layers=c["layers"], encoder_attention_heads=c["heads"],
                     decoder_attention_heads=c["heads"], encoder_ffn_dim=c["ffn"], decoder_ffn_dim=c["ffn"],
                     max_position_embeddings=c["max_positions"], pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    cfg._attn_implementation = "eager"
    return BartForConditionalGeneration(cfg).eval()


def _seq2seq_decoder_module(model, layers: int, with_past: bool, enc_mask: bool):
    """forward(input_ids, [encoder_attention_mask,] encoder_hidden_states, *past) -> logits, presents.
    Without past: the presents of both attentions; with past: the self-attention's (the cross-attention's
    do not change; the merged model passes them through)."""
    import torch
    from transformers import DynamicCache, EncoderDecoderCache

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, *args):
            mask, (enc, *past) = (args[0], args[1:]) if enc_mask else (None, args)
            cfg = self.model.config
            self_cache, cross_cache = DynamicCache(config=cfg), DynamicCache(config=cfg)
            if with_past:
                for i in range(layers):
                    self_cache.update(past[4 * i], past[4 * i + 1], i)
                    cross_cache.update(past[4 * i + 2], past[4 * i + 3], i)
            kw = {"attention_mask": mask} if enc_mask else {}
            out = self.model(decoder_input_ids=input_ids, encoder_outputs=(enc,), past_key_values=EncoderDecoderCache(
                self_cache, cross_cache), use_cache=True, return_dict=True, **kw)
            cache, present = out.past_key_values, []
            for i in range(layers):
                s = cache.self_attention_cache.layers[i]
                present += [s.keys, s.values]
                if not with_past:
                    x = cache.cross_attention_cache.layers[i]
                    present += [x.keys, x.values]
            return (out.logits, *present)

    return Decoder().eval()


def merge_decoders(no_past: Path, with_past: Path, path: Path) -> None:
    """One model with optimum's merged layout: If(use_cache_branch) with the with-past graph as then-branch
    and the no-past graph as else-branch, both reading the weights of the outer graph; the with-past branch
    gives the encoder presents as its encoder pasts (Identity). Weights are not deduplicated (tiny models)."""
    import onnx
    from onnx import TensorProto, helper

    m0, m1 = onnx.load(str(no_past)), onnx.load(str(with_past))
    out_names = [o.name for o in m0.graph.output]
    rank = {o.name: len(o.type.tensor_type.shape.dim) for o in m0.graph.output}

    def branch(m, tag: str):
        g = m.graph
        outer = {i.name for i in g.input}

        def ren(n: str) -> str:
            return n if not n or n in outer else f"{tag}/{n}"

        inits = []
        for t in g.initializer:
            t2 = onnx.TensorProto()
            t2.CopyFrom(t)
            t2.name = ren(t.name)
            inits.append(t2)
        nodes = []
        for nd in g.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(nd)
            n2.name = f"{tag}/{nd.name}"
            n2.input[:] = [ren(x) for x in nd.input]
            n2.output[:] = [ren(x) for x in nd.output]
            nodes.append(n2)
        produced = {o.name for o in g.output}
        outs = []
        for name in out_names:
            src = ren(name) if name in produced else name.replace("present.", "past_key_values.")
            nodes.append(helper.make_node("Identity", [src], [f"{tag}/out/{name}"], name=f"{tag}/out/{name}"))
            outs.append(helper.make_tensor_value_info(f"{tag}/out/{name}", TensorProto.FLOAT, [None] * rank[name]))
        return helper.make_graph(nodes, tag, [], outs), inits

    g0, i0 = branch(m0, "no_past")
    g1, i1 = branch(m1, "with_past")
    names0 = {i.name for i in m0.graph.input}
    inputs = list(m0.graph.input) + [i for i in m1.graph.input if i.name not in names0]
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    node = helper.make_node("If", ["use_cache_branch"], out_names, name="optimum::if", then_branch=g1, else_branch=g0)
    outputs = [helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, [None] * rank[o.name])
               for o in m0.graph.output]
    graph = helper.make_graph([node], "merged_decoder", inputs, outputs, initializer=i0 + i1)
    merged = helper.make_model(graph, opset_imports=m0.opset_import, ir_version=m0.ir_version)
    onnx.checker.check_model(merged)
    onnx.save(merged, str(path))


def _export_seq2seq_decoder(model, path: Path, layers: int, heads: int, head_dim: int, d_model: int, vocab: int,
                            enc_len: int, enc_mask: bool, enc_axis: bool) -> None:
    """Both exports (in a temporary folder next to ``path``), then merge_decoders."""
    import torch

    past_names, present_names = seq2seq_past_io(layers)
    b, s, p = 2, 3, 5  # a non-empty past, so the with-past export keeps the concatenation general
    lead = ["input_ids", *(["encoder_attention_mask"] if enc_mask else []), "encoder_hidden_states"]
    enc = torch.randn(b, enc_len, d_model)
    mask_arg = (torch.ones(b, enc_len, dtype=torch.int64),) if enc_mask else ()
    enc_dims = {0: "batch", 1: "encoder_sequence_length"} if enc_axis else {0: "batch"}
    axes = {"input_ids": {0: "batch", 1: "decoder_sequence_length"}, "encoder_hidden_states": enc_dims,
            "logits": {0: "batch", 1: "decoder_sequence_length"}}
    if enc_mask:
        axes["encoder_attention_mask"] = {0: "batch", 1: "encoder_sequence_length"}
    # the encoder pasts' length is its own dimension (optimum's name), dynamic even where the encoder's is
    # fixed (Whisper): the prompt feeds them empty, the decode steps at the encoder's length
    enc_len_axis = "encoder_sequence_length_out"
    with tempfile.TemporaryDirectory(prefix=".seq2seq-", dir=path.parent) as tmp:
        a, w = Path(tmp) / "decoder_model.onnx", Path(tmp) / "decoder_with_past_model.onnx"
        ax0 = dict(axes)
        for n in present_names:
            ax0[n] = {0: "batch", 2: "decoder_sequence_length" if ".decoder." in n else enc_len_axis}
        _ts_export(_seq2seq_decoder_module(model, layers, False, enc_mask), (torch.randint(0, vocab, (b, s)),
                   *mask_arg, enc), a, lead, ["logits", *present_names], ax0)
        ax1 = dict(axes)
        for n in past_names:
            ax1[n] = {0: "batch", 2: "past_decoder_sequence_length" if ".decoder." in n else enc_len_axis}
        self_present = [n for n in present_names if ".decoder." in n]
        ax1.update({n: {0: "batch", 2: "past_decoder_sequence_length + 1"} for n in self_present})
        pasts = [torch.randn(b, heads, p if ".decoder." in n else enc_len, head_dim) for n in past_names]
        _ts_export(_seq2seq_decoder_module(model, layers, True, enc_mask), (torch.randint(0, vocab, (b, 1)),
                   *mask_arg, enc, *pasts), w, lead + past_names, ["logits", *self_present], ax1)
        merge_decoders(a, w, path)


@_model("whisper-enc", "transformers WhisperForConditionalGeneration's encoder -> torch.onnx.export (TorchScript), "
        "dynamic batch", needs=["transformers"])
def make_whisper_enc(path: Path, cache: Path) -> None:
    import torch

    c = WHISPER
    enc = whisper_model().model.encoder

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = enc

        def forward(self, input_features):
            return self.encoder(input_features, return_dict=False)[0]

    x = torch.randn(2, c["mels"], c["frames"])
    axes = {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}}
    _ts_export(Encoder(), (x,), path, ["input_features"], ["last_hidden_state"], axes)


@_model("whisper-dec", "transformers WhisperForConditionalGeneration's decoder with self- and cross-attention "
        "past -> two torch.onnx.export (TorchScript) -> If on use_cache_branch (optimum's merged layout)",
        needs=["transformers"])
def make_whisper_dec(path: Path, cache: Path) -> None:
    c = WHISPER
    _export_seq2seq_decoder(whisper_model(), path, c["layers"], c["heads"], c["d_model"] // c["heads"], c["d_model"],
                            c["vocab"], c["frames"] // 2, enc_mask=False, enc_axis=False)


@_model("bart-dec", "transformers BartForConditionalGeneration's decoder with self- and cross-attention past "
        "-> two torch.onnx.export (TorchScript) -> If on use_cache_branch (optimum's merged layout)",
        needs=["transformers"])
def make_bart_dec(path: Path, cache: Path) -> None:
    c = BART
    _export_seq2seq_decoder(bart_model(), path, c["layers"], c["heads"], c["d_model"] // c["heads"], c["d_model"],
                            c["vocab"], 16, enc_mask=True, enc_axis=True)


# Llama through onnxruntime-genai's model builder ------------------------------------------------------------
def llama_io() -> tuple[list[str], list[str]]:
    """The builder's names (it lists the keys of every layer, then the values)."""
    n = LLAMA["layers"]
    past = [f"past_key_values.{i}.{kv}" for kv in ("key", "value") for i in range(n)]
    present = [f"present.{i}.{kv}" for kv in ("key", "value") for i in range(n)]
    return ["input_ids", "attention_mask", *past], ["logits", *present]


def make_llama_checkpoint(d: Path, arch: str = "llama") -> None:
    """A transformers checkpoint of a Llama-style architecture (``arch``: llama, qwen2 or phi3; random
    weights, LLAMA's sizes) and a word-level tokenizer, both local: the builder loads the config with
    AutoConfig and the tokenizer with AutoTokenizer from the folder."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    _seed()
    c = LLAMA
    config_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                             "phi3": ("Phi3Config", "Phi3ForCausalLM")}[arch]
    cfg = getattr(transformers, config_cls)(
        vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
        max_position_embeddings=c["max_positions"], bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=False,
        # Phi-3 mini's plain rotary (the builder's long-RoPE form wants scaling factors)
        **({"original_max_position_embeddings": c["max_positions"]} if arch == "phi3" else {}))
    getattr(transformers, model_cls)(cfg).eval().save_pretrained(str(d))
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {f"w{i}": i for i in range(4, c["vocab"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(str(d))


def _genai_build(path: Path, precision: str, extra: list[str] = ()) -> None:
    import onnx

    with tempfile.TemporaryDirectory(prefix="zoo-genai-") as tmp:
        tmp = Path(tmp)
        make_llama_checkpoint(tmp / "hf")
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(tmp / "hf"), "-o",
               str(tmp / "out"), "-p", precision, "-e", "cpu", "-c", str(tmp / "cache")]
        if extra:
            cmd += ["--extra_options", *extra]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        model = tmp / "out" / "model.onnx"
        if r.returncode != 0 or not model.exists():
            tail = (r.stderr or r.stdout)[-3000:]
            raise GenerationError(f"onnxruntime_genai builder failed (rc {r.returncode}): {tail}")
        # one self-contained file (the builder writes model.onnx + model.onnx.data)
        onnx.save_model(onnx.load(str(model), load_external_data=True), str(path), save_as_external_data=False)


@_model("llama-fp32", "transformers Llama checkpoint -> onnxruntime_genai.models.builder -p fp32 -e cpu",
        needs=["onnxruntime_genai", "transformers", "tokenizers"], slow=True)
def make_llama_fp32(path: Path, cache: Path) -> None:
    _genai_build(path, "fp32")


@_model("llama-int4", "transformers Llama checkpoint -> onnxruntime_genai.models.builder -p int4 -e cpu "
        "(its defaults: block 32, accuracy_level 4)", needs=["onnxruntime_genai", "transformers", "tokenizers"],
        slow=True)
def make_llama_int4(path: Path, cache: Path) -> None:
    _genai_build(path, "int4")


@_model("llama-int4-acc1", "as llama-int4 with --extra_options accuracy_level=1 (fp32 activations) "
        "op_types_to_quantize=MatMul/Gather (int4 embedding table)",
        needs=["onnxruntime_genai", "transformers", "tokenizers"], slow=True)
def make_llama_int4_acc1(path: Path, cache: Path) -> None:
    import onnx

    _genai_build(path, "int4", ["accuracy_level=1", "op_types_to_quantize=MatMul/Gather"])
    # the builder ignores extra options it does not know (0.18 took int4_accuracy_level silently):
    # check that the option took
    levels = {a.i for n in onnx.load(str(path)).graph.node if n.op_type == "MatMulNBits"
              for a in n.attribute if a.name == "accuracy_level"}
    if levels != {1}:
        raise GenerationError(f"llama-int4-acc1: MatMulNBits accuracy_level {sorted(levels)}, asked for 1")


# sentence-transformers, YOLO with NMS, SAM-style prompt decoder ---------------------------------------------
def sbert_module():
    """A sentence-transformers model as optimum exports it (feature-extraction with pooling): BertModel,
    mean pooling over the attention mask, L2 normalisation (all-MiniLM's Pooling + Normalize)."""
    import torch

    bert = bert_module().model

    class SBert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                          return_dict=False)[0]
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            emb = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return h, torch.nn.functional.normalize(emb, p=2.0, dim=1)

    return SBert().eval()


@_model("sbert", "BertModel + mean pooling + L2 normalisation (sentence-transformers' Pooling/Normalize, "
        "optimum's feature-extraction layout) -> torch.onnx.export (TorchScript)", needs=["transformers"])
def make_sbert(path: Path, cache: Path) -> None:
    import torch

    b, s = 2, 7
    args = (torch.randint(0, BERT["vocab"], (b, s)), torch.ones(b, s, dtype=torch.int64),
            torch.zeros(b, s, dtype=torch.int64))
    axes = {n: {0: "batch", 1: "seq"} for n in BERT_INPUTS + ["token_embeddings"]}
    axes["sentence_embedding"] = {0: "batch"}
    _ts_export(sbert_module(), args, path, BERT_INPUTS, ["token_embeddings", "sentence_embedding"], axes)


YOLO = dict(classes=8, widths=(8, 16, 32), strides=(8, 16, 32), max_out=30, iou=0.45, score=0.55)


def yolo_module():
    """A YOLOv8-style detector (anchor-free, decoupled box/class heads over three strides, grid decoding
    in the graph): boxes [batch, anchors, 4] as y1,x1,y2,x2 and scores [batch, classes, anchors]."""
    import torch
    from torch import nn

    _seed()
    c = YOLO

    def cbs(i, o, s):
        return nn.Sequential(nn.Conv2d(i, o, 3, s, 1), nn.BatchNorm2d(o), nn.SiLU())

    class Yolo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = c["widths"]
            self.stem = nn.Sequential(cbs(3, w[0], 2), cbs(w[0], w[0], 2), cbs(w[0], w[0], 2))  # /8
            self.down = nn.ModuleList([cbs(w[0], w[1], 2), cbs(w[1], w[2], 2)])  # /16, /32
            self.box = nn.ModuleList([nn.Sequential(cbs(x, 16, 1), nn.Conv2d(16, 4, 1)) for x in w])
            self.cls = nn.ModuleList([nn.Sequential(cbs(x, 16, 1), nn.Conv2d(16, c["classes"], 1)) for x in w])

        def forward(self, images):
            f = [self.stem(images)]
            for d in self.down:
                f.append(d(f[-1]))
            boxes, scores = [], []
            for i, (x, s) in enumerate(zip(f, c["strides"])):
                b, _, h, w = x.shape
                ys = (torch.arange(h, dtype=x.dtype) + 0.5).view(1, h, 1).expand(1, h, w)
                xs = (torch.arange(w, dtype=x.dtype) + 0.5).view(1, 1, w).expand(1, h, w)
                d = torch.nn.functional.softplus(self.box[i](x)) * 2.0  # l, t, r, b distances in cells
                y1, x1 = (ys - d[:, 1]) * s, (xs - d[:, 0]) * s
                y2, x2 = (ys + d[:, 3]) * s, (xs + d[:, 2]) * s
                boxes.append(torch.stack([y1, x1, y2, x2], -1).reshape(b, -1, 4))
                scores.append(torch.sigmoid(self.cls[i](x)).reshape(b, c["classes"], -1))
            return torch.cat(boxes, 1), torch.cat(scores, 2)

    net = Yolo()
    for mod in net.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 2.0)
    return net.eval()


@_model("yolo-nms", "YOLOv8-style anchor-free detector (torch) -> torch.onnx.export (TorchScript), then "
        "onnx.helper appends NonMaxSuppression and the Gather of the selected boxes and scores "
        "(ultralytics' export with nms=True, rebuilt: ultralytics is not installed)")
def make_yolo_nms(path: Path, cache: Path) -> None:
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper

    c = YOLO
    x = torch.randn(1, 3, 64, 64)
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "boxes": {0: "batch", 1: "anchors"},
            "scores": {0: "batch", 2: "anchors"}}
    raw = path.with_suffix(".raw.onnx")
    _ts_export(yolo_module(), (x,), raw, ["images"], ["boxes", "scores"], axes)
    m = onnx.load(str(raw))
    raw.unlink()
    g = m.graph
    consts = {"max_out": np.array([c["max_out"]], np.int64), "iou_thr": np.array([c["iou"]], np.float32),
              "score_thr": np.array([c["score"]], np.float32), "i0": np.array([0], np.int64),
              "i2": np.array([2], np.int64), "ax1": np.array([1], np.int64)}
    for k, v in consts.items():
        g.initializer.append(numpy_helper.from_array(v, k))
    nodes = [
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou_thr", "score_thr"], ["selected"],
                         center_point_box=0),
        # selected [n, 3] = (batch, class, box): the boxes and the scores they were selected with
        helper.make_node("Gather", ["selected", "i0"], ["sel_b"], axis=1),
        helper.make_node("Gather", ["selected", "ax1"], ["sel_c"], axis=1),
        helper.make_node("Gather", ["selected", "i2"], ["sel_i"], axis=1),
        helper.make_node("Concat", ["sel_b", "sel_i"], ["bi"], axis=1),
        helper.make_node("GatherND", ["boxes", "bi"], ["det_boxes"]),
        helper.make_node("GatherND", ["scores", "selected"], ["det_scores"]),
        helper.make_node("Squeeze", ["sel_c", "ax1"], ["det_classes"]),
    ]
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend([helper.make_tensor_value_info("selected_indices", TensorProto.INT64, ["n", 3]),
                     helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, ["n", 4]),
                     helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, ["n"]),
                     helper.make_tensor_value_info("det_classes", TensorProto.INT64, ["n"])])
    g.node.append(helper.make_node("Identity", ["selected"], ["selected_indices"]))
    onnx.checker.check_model(m)
    onnx.save(m, str(path))


def yolo_feeds(rng: np.random.Generator, batch: int, h: int, w: int) -> dict:
    return {"images": rng.standard_normal((batch, 3, h, w)).astype(np.float32)}


SAM = dict(dim=32, heads=2, mlp=64, layers=2, embed=8, image=64, masks=4)


def sam_decoder_module():
    """A Segment-Anything-style prompt decoder (the layout of SAM's exported decoder): points (with
    labels: -1 padding, 0 negative, 1 positive, 2/3 box corners) embedded by random-Fourier sin/cos
    positional encoding plus a learned per-label embedding; output tokens (IoU + masks) and the prompt
    tokens attend to a fixed-size image embedding in a two-way transformer; masks from the image
    embedding upsampled by two ConvTranspose and products with hypernetwork MLPs; an IoU head."""
    import torch
    from torch import nn

    _seed()
    c = SAM
    dim, e = c["dim"], c["embed"]

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

        def forward(self, q, k, v):
            b, nq, _ = q.shape
            h = c["heads"]
            q = self.q(q).view(b, nq, h, -1).transpose(1, 2)
            k = self.k(k).view(b, k.shape[1], h, -1).transpose(1, 2)
            v = self.v(v).view(b, v.shape[1], h, -1).transpose(1, 2)
            a = torch.softmax(q @ k.transpose(-1, -2) / (dim // h) ** 0.5, -1)
            return self.o((a @ v).transpose(1, 2).reshape(b, nq, dim))

    class TwoWay(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.self_attn, self.t2i, self.i2t = Attn(), Attn(), Attn()
            self.mlp = nn.Sequential(nn.Linear(dim, c["mlp"]), nn.ReLU(), nn.Linear(c["mlp"], dim))
            self.n = nn.ModuleList([nn.LayerNorm(dim) for _ in range(4)])

        def forward(self, tok, img, pe_tok, pe_img):
            tok = self.n[0](tok + self.self_attn(tok + pe_tok, tok + pe_tok, tok))
            tok = self.n[1](tok + self.t2i(tok + pe_tok, img + pe_img, img))
            tok = self.n[2](tok + self.mlp(tok))
            img = self.n[3](img + self.i2t(img + pe_img, tok + pe_tok, tok))
            return tok, img

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("gauss", torch.randn(2, dim // 2))
            self.label_embed = nn.Embedding(5, dim)  # label + 1: padding, negative, positive, box corners
            self.out_tokens = nn.Parameter(torch.randn(1 + c["masks"], dim))
            self.layers = nn.ModuleList([TwoWay() for _ in range(c["layers"])])
            self.final = Attn()
            self.up = nn.Sequential(nn.ConvTranspose2d(dim, dim // 4, 2, 2), nn.GroupNorm(1, dim // 4), nn.GELU(),
                                    nn.ConvTranspose2d(dim // 4, dim // 8, 2, 2), nn.GELU())
            self.hyper = nn.ModuleList([nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim // 8))
                                        for _ in range(c["masks"])])
            self.iou = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, c["masks"]))

        def pe(self, xy):  # xy in [0, 1]
            p = (2 * xy - 1) @ self.gauss * (2 * torch.pi)
            return torch.cat([torch.sin(p), torch.cos(p)], -1)

        def forward(self, image_embeddings, point_coords, point_labels):
            b = point_coords.shape[0]
            pts = self.pe((point_coords + 0.5) / c["image"])
            lab = point_labels.to(torch.int64)
            pts = pts * (lab != -1).unsqueeze(-1).to(pts.dtype) + self.label_embed(lab + 1)
            tok = torch.cat([self.out_tokens.unsqueeze(0).expand(b, -1, -1), pts], 1)
            img = image_embeddings.flatten(2).transpose(1, 2)
            ys = (torch.arange(e, dtype=torch.float32) + 0.5) / e
            grid = torch.stack([ys.view(1, e).expand(e, e), ys.view(e, 1).expand(e, e)], -1)
            pe_img = self.pe(grid).reshape(1, e * e, dim)
            q = tok
            for layer in self.layers:
                q, img = layer(q, img, tok, pe_img)
            q = q + self.final(q + tok, img + pe_img, img)
            up = self.up(img.transpose(1, 2).reshape(b, dim, e, e))
            hyp = torch.stack([self.hyper[i](q[:, 1 + i]) for i in range(c["masks"])], 1)
            masks = (hyp @ up.flatten(2)).view(b, c["masks"], up.shape[2], up.shape[3])
            return masks, self.iou(q[:, 0])

    return Decoder().eval()


@_model("sam-decoder", "Segment-Anything-style prompt decoder (torch: sin/cos point encoding, two-way transformer, "
        "ConvTranspose upsampling, IoU head) -> torch.onnx.export (TorchScript), dynamic batch and points")
def make_sam_decoder(path: Path, cache: Path) -> None:
    import torch

    c = SAM
    args = (torch.randn(2, c["dim"], c["embed"], c["embed"]), torch.rand(2, 3, 2) * c["image"],
            torch.ones(2, 3))
    axes = {"image_embeddings": {0: "batch"}, "point_coords": {0: "batch", 1: "points"},
            "point_labels": {0: "batch", 1: "points"}, "masks": {0: "batch"}, "iou_predictions": {0: "batch"}}
    _ts_export(sam_decoder_module(), args, path, ["image_embeddings", "point_coords", "point_labels"],
               ["masks", "iou_predictions"], axes)


def sam_feeds(rng: np.random.Generator, batch: int, points: int) -> dict:
    """Random points with labels 0/1, some rows padded at the end (-1), a box (labels 2, 3) in some rows."""
    c = SAM
    coords = (rng.random((batch, points, 2)) * c["image"]).astype(np.float32)
    labels = rng.integers(0, 2, (batch, points)).astype(np.float32)
    for b in range(batch):
        if points >= 3 and rng.random() < 0.5:
            labels[b, -2:] = [2, 3]
        elif points > 1 and rng.random() < 0.5:
            labels[b, rng.integers(1, points):] = -1
    return {"image_embeddings": rng.standard_normal((batch, c["dim"], c["embed"], c["embed"])).astype(np.float32),
            "point_coords": coords, "point_labels": labels}


# Ops of note ---------------------------------------------------------------------------------------------------
_QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}


def all_ops(path: Path | str) -> Counter:
    """Counter of (domain, op_type) over the main graph and every subgraph."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    out: Counter = Counter()

    def walk(g):
        for n in g.node:
            out[(n.domain or "ai.onnx", n.op_type)] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(m.graph)
    return out


def ops_of_note(path: Path | str) -> Counter:
    """The contrib and quantization ops: non-ONNX domains, ops the ONNX schemas do not know (e.g.
    SimplifiedLayerNormalization in the default domain), QLinear*/Q/DQ/*Integer ops."""
    import onnx

    out: Counter = Counter()
    for (dom, op), n in all_ops(path).items():
        std = dom == "ai.onnx" and onnx.defs.has(op)
        if not std or op.startswith("QLinear") or op in _QUANT_OPS:
            out[(dom, op)] = n
    return out


def format_ops(counter: Counter) -> str:
    return ", ".join(f"{d}:{o} x{n}" if d != "ai.onnx" else f"{o} x{n}"
                     for (d, o), n in sorted(counter.items(), key=lambda kv: (kv[0][0] == "ai.onnx", kv[0])))


def print_ops(names: list[str] | None = None, cache_dir: Path | None = None, markdown: bool = False) -> None:
    """Print the ops of note of each model that is made (for docs)."""
    if markdown:
        print("| model | tool chain | contrib / quantization ops |\n| --- | --- | --- |")
    for name in names or list(MODELS):
        p = Path(cache_dir or CACHE_DIR) / f"{name}.onnx"
        ops = format_ops(ops_of_note(p)) if p.exists() else "(not made)"
        if markdown:
            print(f"| {name} | {MODELS[name].chain} | {ops} |")
        else:
            print(f"{name:16s} {ops}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="models to make (default: all)")
    ap.add_argument("--force", action="store_true", help="rebuild the named models even if cached")
    ap.add_argument("--ops", action="store_true", help="print the contrib / quantization ops of each model")
    ap.add_argument("--markdown", action="store_true", help="with --ops: a markdown table")
    ap.add_argument("--list", action="store_true", help="list the models and their tool chains")
    ap.add_argument("--dir", type=Path, default=None, help=f"cache folder (default {CACHE_DIR})")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the tools' own output")
    args = ap.parse_args(argv)
    names = args.names or list(MODELS)
    if args.list:
        for n in names:
            s = MODELS[n]
            print(f"{n:16s} {'slow ' if s.slow else '     '}{s.chain}")
        return 0
    rc = 0
    for n in names:
        t0 = time.perf_counter()
        try:
            p = generate(n, args.dir, force=args.force, verbose=args.verbose)
            print(f"{n:16s} ok   {time.perf_counter() - t0:6.1f} s  {p}")
        except (ToolUnavailable, GenerationError) as e:
            print(f"{n:16s} FAIL {e}")
            rc = 1
    if args.ops:
        print_ops(names, args.dir, args.markdown)
    return rc


if __name__ == "__main__":
    sys.exit(main())
