"""The CNNs shipped in the onnx package (backend/test/data/light), prepared for a dynamic batch.

The shipped files (opset 9) declare their image input as [1, 3, 224, 224] and build every weight
with a ConstantOfShape node that fills it with 0.02. Two things are done to them here:

* Their Reshape nodes carry shape constants with a hard-coded batch of 1 ([1, 9216] and the
  like), which no engine can apply to a batch of 2. ``prepare`` rewrites the leading 1 of those
  constants to 0 ("copy the input's dim"), so the batch flows through. Nothing else changes.
* With every weight equal, all channels are equal and every softmax output is exactly 1/1000,
  so a wrong Conv or pool would go unnoticed. The ``random`` variant replaces each weight-making
  ConstantOfShape by a seeded random initializer of the same shape (He-scaled conv / gemm
  weights, batch-norm variances in [0.5, 1.5]) so outputs differ per class and per image.

``model_path(name, variant)`` is the model for dynashape, still declaring batch 1: load it with
``dynamic_dims(name)``. ``ort_model(name, variant)`` is a copy of the same ModelProto with
dim_param "N" on axis 0 of the input and the outputs and no value_info (serialized, for
``onnxruntime.InferenceSession``), so onnxruntime sees the same shapes.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import dynashape

from .cache import cached

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MAX_BATCH = 8
VARIANTS = ("shipped", "random")
# The slowest on CPU (GFLOPs per image): tests may skip them with DYNASHAPE_SKIP_HEAVY=1.
HEAVY = frozenset({"vgg19", "resnet50", "densenet121"})


@functools.lru_cache(maxsize=1)
def light_models() -> dict[str, tuple[str, str]]:
    """Short name -> (path of the shipped .onnx, name of its image input)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(LIGHT_DIR, "*.onnx"))):
        name = os.path.basename(path)[len("light_"):-len(".onnx")].replace("bvlc_", "")
        out[name] = (path, image_input(onnx.load(path)))
    return out


def image_input(model: onnx.ModelProto) -> str:
    """The one graph input that no initializer feeds (``data_0`` or ``gpu_0/data_0``)."""
    inits = {i.name for i in model.graph.initializer}
    real = [i.name for i in model.graph.input if i.name not in inits]
    if len(real) != 1:
        raise ValueError(f"expected one image input, found {real}")
    return real[0]


def dynamic_dims(name: str) -> dict[str, list]:
    """The dynashape option that makes the batch of model ``name`` range over 1..MAX_BATCH."""
    _, inp = light_models()[name]
    return {inp: [dynashape.Dimension(1, MAX_BATCH), 3, 224, 224]}


# preparing -----------------------------------------------------------------------------------
def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    out: dict[str, list] = {}
    for n in graph.node:
        for i, name in enumerate(n.input):
            out.setdefault(name, []).append((n, i))
    return out


def fix_reshape_batch(model: onnx.ModelProto) -> int:
    """Make Reshape shape constants of the form [1, ...] copy the batch instead; returns the count."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    done = set()
    for n in g.node:
        if n.op_type != "Reshape" or n.input[1] not in inits or n.input[1] in done:
            continue
        shape = numpy_helper.to_array(inits[n.input[1]]).copy()
        if shape.ndim == 1 and len(shape) >= 2 and shape[0] == 1:
            shape[0] = 0
            inits[n.input[1]].CopyFrom(numpy_helper.from_array(shape.astype(np.int64), n.input[1]))
            done.add(n.input[1])
    return len(done)


def _random_weight(shape: tuple, uses: list[tuple[onnx.NodeProto, int]], consumers, rng):
    """A weight for a tensor used as ``uses``, scaled so activations stay of order one: an array,
    or for big matrices a pair (A, B) of low-rank factors whose product A @ B is the weight."""
    for node, idx in uses:
        op = node.op_type
        if op == "BatchNormalization":
            if idx in (1, 4):  # scale, variance
                return rng.uniform(0.5, 1.5, shape)
            return rng.uniform(-0.1, 0.1, shape)  # bias, mean
        if op in ("Unsqueeze", "Reshape") and idx == 0:  # look through to what uses the result
            nxt = consumers.get(node.output[0], [])
            if nxt and all(n.op_type == "Mul" for n, _ in nxt):
                return rng.uniform(0.5, 1.5, shape)
            if nxt and all(n.op_type == "Add" for n, _ in nxt):
                return rng.uniform(-0.1, 0.1, shape)
            return _random_weight(shape, nxt, consumers, rng)
        if op == "Conv" and idx == 1:
            return _gaussian(shape, rng, np.sqrt(2.0 / np.prod(shape[1:])))
        if op == "Gemm" and idx == 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            fan_in = shape[1] if trans_b else shape[0]
            return _gaussian(shape, rng, np.sqrt(1.0 / fan_in))
    if len(shape) >= 2:
        return _gaussian(shape, rng, np.sqrt(1.0 / np.prod(shape[1:])))
    return rng.uniform(-0.1, 0.1, shape)


LOW_RANK_ABOVE = 1 << 21  # elements; the FC layers of VGG / AlexNet / ZFNet (~100 MB each)
RANK = 64


def _gaussian(shape: tuple, rng, std: float):
    if len(shape) == 2 and shape[0] * shape[1] > LOW_RANK_ABOVE:
        a = rng.standard_normal((shape[0], RANK)) * (std / np.sqrt(RANK))
        b = rng.standard_normal((RANK, shape[1]))
        return a, b
    return rng.standard_normal(shape) * std


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> int:
    """Replace every ConstantOfShape fed by an initializer with a random initializer (or, for a
    big matrix, a MatMul of two random low-rank initializers); returns the count."""
    g = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in g.initializer}
    consumers = _consumers(g)
    nodes, new_inits = [], []
    replaced = 0
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            replaced += 1
            shape = tuple(int(s) for s in numpy_helper.to_array(inits[n.input[0]]))
            w = _random_weight(shape, consumers.get(n.output[0], []), consumers, rng)
            if isinstance(w, tuple):
                names = [f"{n.output[0]}__lowrank_a", f"{n.output[0]}__lowrank_b"]
                new_inits += [numpy_helper.from_array(f.astype(np.float32), nm) for f, nm in zip(w, names)]
                nodes.append(onnx.helper.make_node("MatMul", names, [n.output[0]],
                                                   name=f"{n.output[0]}__lowrank"))
            else:
                new_inits.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    # ir_version 3 lists initializers among the inputs: list the new ones, drop the unused shapes
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    real = [i for i in g.input if i.name not in inits]
    del g.input[:]
    g.input.extend(real)
    if model.ir_version < 4:
        g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in keep)
    return replaced


def scale_softmax_input(model: onnx.ModelProto, scale: float) -> None:
    """Multiply the input of the final Softmax by ``scale`` (a Mul node before it)."""
    g = model.graph
    nodes = list(g.node)
    for i, n in enumerate(nodes):
        if n.op_type == "Softmax":
            name = f"{n.input[0]}__scale"
            g.initializer.append(numpy_helper.from_array(np.array(scale, np.float32), name))
            if model.ir_version < 4:
                g.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, []))
            mul = onnx.helper.make_node("Mul", [n.input[0], name], [f"{n.input[0]}__scaled"], name=name)
            n.input[0] = mul.output[0]
            nodes.insert(i, mul)
            break
    del g.node[:]
    g.node.extend(nodes)


def logit_std(model: onnx.ModelProto, inp: str, seed: int = 0) -> float | None:
    """Std of the final Softmax's input for two random images (onnxruntime), None without Softmax."""
    import onnxruntime as ort

    sm = [n for n in model.graph.node if n.op_type == "Softmax"]
    if not sm:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    make_batch_symbolic(m)
    m.graph.output.append(onnx.helper.make_tensor_value_info(sm[-1].input[0], onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(seed).standard_normal((2, 3, 224, 224)).astype(np.float32)
    logits = sess.run([sm[-1].input[0]], {inp: x})[0].reshape(2, -1)
    return float(logits.std(axis=1).mean())


def make_batch_symbolic(model: onnx.ModelProto, symbol: str = "N") -> None:
    """dim_param ``symbol`` on axis 0 of the image input and of every output; no value_info."""
    inp = image_input(model)
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name == inp or vi in model.graph.output:
            dim = vi.type.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_param = symbol
    del model.graph.value_info[:]


def model_path(name: str, variant: str = "shipped") -> Path:
    """The prepared model (cached): batch fixed through the Reshapes, weights per ``variant``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}; expected one of {VARIANTS}")
    src, _ = light_models()[name]

    def write(path: Path) -> None:
        m = onnx.load(src)
        fix_reshape_batch(m)
        if variant == "random":
            randomize_weights(m, seed=sum(map(ord, name)))
            std = logit_std(m, image_input(m))
            if std is not None:  # logits of std ~3: softmax outputs that differ per class and image
                scale_softmax_input(m, 3.0 / std)
        onnx.checker.check_model(m)
        onnx.save(m, str(path))

    with open(src, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    config = {"model": name, "variant": variant, "src": digest}
    return cached(f"cnn-{name}-{variant}", config, write, module=sys.modules[__name__])


def ort_model(name: str, variant: str = "shipped") -> bytes:
    """The model of ``model_path`` with a symbolic batch, serialized for onnxruntime."""
    m = onnx.load(str(model_path(name, variant)))
    make_batch_symbolic(m)
    return m.SerializeToString()


def export_all(outdir: Path) -> list[Path]:
    """Write every prepared CNN (both variants) into ``outdir`` as ``cnn-<name>-<variant>.onnx``,
    the names ``cached`` looks for in $DYNASHAPE_MODELS_DIR."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in light_models():
        for variant in VARIANTS:
            path = model_path(name, variant)
            dst = outdir / (path.stem.rsplit("-", 1)[0] + ".onnx")
            shutil.copyfile(path, dst)
            written.append(dst)
    return written
