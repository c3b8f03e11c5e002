"""The generated part of the model zoo: tiny models made by the tools people ship ONNX models with.

Every model is random-initialised from a small config (nothing is downloaded) and run through a
real tool chain:

  torch.onnx.export (TorchScript exporter: the graph shape the onnxruntime fusions know)
    -> onnxruntime.transformers.optimizer.optimize_model      (com.microsoft fused ops)
    -> onnxruntime.quantization.quantize_dynamic / _static    (MatMulInteger, QLinear*, QDQ)
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


# Llama through onnxruntime-genai's model builder ------------------------------------------------------------
def llama_io() -> tuple[list[str], list[str]]:
    """The builder's names (it lists the keys of every layer, then the values)."""
    n = LLAMA["layers"]
    past = [f"past_key_values.{i}.{kv}" for kv in ("key", "value") for i in range(n)]
    present = [f"present.{i}.{kv}" for kv in ("key", "value") for i in range(n)]
    return ["input_ids", "attention_mask", *past], ["logits", *present]


def make_llama_checkpoint(d: Path) -> None:
    """A transformers Llama checkpoint (random weights) and a word-level tokenizer, both local: the
    builder loads the config with AutoConfig and the tokenizer with AutoTokenizer from the folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    _seed()
    c = LLAMA
    cfg = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
                      num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                      num_key_value_heads=c["kv_heads"], max_position_embeddings=c["max_positions"],
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(d))
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
