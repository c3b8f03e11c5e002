"""``first_divergence`` on the generated zoo with a planted error (issue 35): in each model one
node's constant input is changed (the edited copy runs in dynashape, the original in
onnxruntime), and the first row must name the first node whose output differs, which
onnxruntime running the two models side by side finds independently; that is the planted node
wherever onnxruntime can output its value. Without a plant there must be no row at all (no false
divergence before the real one). Two feeds of different shapes per model, fresh random values.

The Llama models are ``heavy`` like in test_generated.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dynashape.debug import compare_values, first_divergence, onnxruntime_values
from dynashape.frontend.expose import expose

from .test_generated import ALL_MODELS, G, params, t5_feeds

ort = pytest.importorskip("onnxruntime")

# the zoo's own tolerance for fp32 intermediates: summation orders differ, nothing else
RTOL, ATOL = 1e-3, 1e-4
# ops whose float inputs may set a shape: a changed value there moves shapes, not values
QUANTIZING = {"DynamicQuantizeLinear", "QuantizeLinear", "DynamicQuantizeMatMul", "QAttention", "QLinearMatMul",
              "QLinearAdd", "QLinearMul", "QLinearConv", "QLinearGlobalAveragePool"}
SHAPE_OPS = {"Resize", "Upsample", "Range", "ConstantOfShape", "Reshape", "Expand", "Tile", "Slice", "Pad"}


# feeds: two calls of different shapes per family -------------------------------------------------------
def _decoder_feeds(rng, b: int, s: int, past: int, past_names: list[str], heads: int, hd: int, vocab: int,
                   positions: bool) -> dict:
    feeds = {"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64),
             "attention_mask": np.ones((b, past + s), np.int64)}
    if positions:
        feeds["position_ids"] = np.tile(np.arange(past, past + s, dtype=np.int64), (b, 1))
    for n in past_names:
        feeds[n] = rng.standard_normal((b, heads, past, hd)).astype(np.float32)
    return feeds


def feeds_of(name: str, rng) -> list[dict]:
    family = name.split("-")[0]
    if family == "bert":
        return [G.bert_feeds(rng, 2, 9), G.bert_feeds(rng, 3, 5)]
    if family == "t5enc":
        return [t5_feeds(rng, 2, 9), t5_feeds(rng, 1, 13)]
    if family == "vit":
        c = G.VIT
        return [{"pixel_values": rng.standard_normal((b, c["channels"], c["image"], c["image"])).astype(np.float32)}
                for b in (2, 1)]
    if family == "cnn":
        return [G.cnn_feeds(rng, 2, 32, 40), G.cnn_feeds(rng, 1, 24, 24)]
    if family == "gpt2":
        c, (inputs, _) = G.GPT2, G.gpt2_io()
        args = (inputs[3:], c["heads"], c["hidden"] // c["heads"], c["vocab"], True)
        return [_decoder_feeds(rng, 2, 5, 0, *args), _decoder_feeds(rng, 1, 1, 6, *args)]
    if family == "llama":
        c, (inputs, _) = G.LLAMA, G.llama_io()
        args = (inputs[2:], c["kv_heads"], c["hidden"] // c["heads"], c["vocab"], False)
        return [_decoder_feeds(rng, 1, 6, 0, *args), _decoder_feeds(rng, 2, 1, 5, *args)]
    if name == "whisper-enc":
        c = G.WHISPER
        return [{"input_features": rng.standard_normal((b, c["mels"], c["frames"])).astype(np.float32)}
                for b in (2, 1)]
    if name == "sbert":
        return [G.bert_feeds(rng, 2, 9), G.bert_feeds(rng, 3, 5)]
    if name == "yolo-nms":
        return [G.yolo_feeds(rng, 2, 96, 64), G.yolo_feeds(rng, 1, 64, 96)]
    if name == "sam-decoder":
        return [G.sam_feeds(rng, 2, 5), G.sam_feeds(rng, 1, 2)]
    raise KeyError(name)


MERGED_DECODERS = frozenset({"whisper-dec", "bart-dec"})


# the plant ------------------------------------------------------------------------------------------------
def plant_candidates(model: onnx.ModelProto) -> list[tuple[int, str]]:
    """(node index, initializer) pairs where a float initializer is read by that node alone (not
    an input that may set a shape), the ones nearest the middle of the graph first."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(model.graph.node):
        for x in n.input:
            readers.setdefault(x, []).append(i)
    inputs = {i.name for i in model.graph.input}
    out = []
    for t in model.graph.initializer:
        users = readers.get(t.name, [])
        if t.name in inputs or len(set(users)) != 1 or t.data_type not in (onnx.TensorProto.FLOAT,
                                                                              onnx.TensorProto.FLOAT16):
            continue
        i = users[0]
        if model.graph.node[i].op_type not in SHAPE_OPS:
            out.append((i, t.name))
    mid = len(model.graph.node) // 2
    return sorted(out, key=lambda c: (abs(c[0] - mid), c[0]))


def planted(model: onnx.ModelProto, init: str) -> onnx.ModelProto:
    """A copy of ``model`` whose initializer ``init`` is scaled and shifted (no element keeps its value)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.name == init:
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((a * 1.5 + 0.25).astype(a.dtype), init))
    return out


def _ort_values(model: onnx.ModelProto, feeds: dict) -> tuple[dict, list[str]]:
    """Every typed value of ``model`` by name, from onnxruntime at ORT_DISABLE_ALL, and the names in
    graph order."""
    values = onnxruntime_values(model, feeds)
    order = {o: i for i, n in enumerate(model.graph.node) for o in n.output}
    return values, sorted(values, key=lambda o: order.get(o, -1))


def first_changed(original: onnx.ModelProto, edited: onnx.ModelProto, feeds: dict) -> str | None:
    """The first node (in graph order) whose output onnxruntime computes differently for the two
    models: the answer first_divergence must give, found without dynashape."""
    before, _ = _ort_values(original, feeds)
    after, names = _ort_values(edited, feeds)
    producer = {o: n.name for n in edited.graph.node for o in n.output}
    for name in names:
        row = compare_values(after[name], before[name], RTOL, ATOL)
        if row is not None and row[1]:
            return producer[name]
    return None


def natural_limit(name: str, step: int, model: onnx.ModelProto, feeds: dict) -> int:
    """The index of the first node that differs without a plant (the node count when none does).
    Only a quantized model may have one: an activation within float rounding of a quantization
    step rounds to the neighbouring integer (test_generated.py's tolerances say why), which
    first_divergence rightly reports; one step, of a quantizing op. A plant must come before it."""
    rows = first_divergence(model, feeds, rtol=RTOL, atol=ATOL)
    if not rows:
        return len(model.graph.node)
    first = rows[0]
    assert "q" in name.split("-", 1)[-1] and first.op_type in QUANTIZING and first.max_abs <= 1, \
        f"{name} step {step}: the unplanted model differs: {rows[:3]}"
    return next(i for i, n in enumerate(model.graph.node) if n.name == first.node)


def check_planted(name: str, path, seed: int) -> None:
    model = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    index = {n.name: i for i, n in enumerate(model.graph.node)}
    for step, feeds in enumerate(feeds_of(name, rng)):
        limit = natural_limit(name, step, model, feeds)
        for node_index, init in plant_candidates(model):  # the first plant that changes a value here
            if node_index >= limit:
                continue
            edited = planted(model, init)
            truth = first_changed(model, edited, feeds)
            if truth is not None and index[truth] < limit:
                break
        else:
            pytest.fail(f"{name} step {step}: no plant before node {limit} changed any value")
        node = model.graph.node[node_index]
        typed = expose(model, "all")
        has_type = {o.name for o in typed.graph.output if o.type.tensor_type.elem_type}
        if any(o in has_type for o in node.output):
            assert truth == node.name, f"{name}: onnxruntime sees {truth!r} change first, not the planted {node.name!r}"
        rows = first_divergence(edited, feeds, rtol=RTOL, atol=ATOL, reference=model)
        assert rows, f"{name} step {step}: no row for the plant in {node.name!r} ({node.op_type}, {init!r})"
        assert rows[0].node == truth, (f"{name} step {step}: planted in {node.name!r} ({node.op_type}); first "
                                       f"changed {truth!r}; first_divergence says {rows[0]}")


@pytest.mark.parametrize("zoo_model", params(ALL_MODELS), indirect=True)
def test_first_divergence_finds_a_planted_error(zoo_model):
    name, path = zoo_model
    if name in MERGED_DECODERS:
        pytest.skip(f"{name}: optimum's merged decoder is one If at the top level; first_divergence compares "
                    "the top-level values and does not yet descend into a branch's nodes")
    check_planted(name, path, seed=sum(map(ord, name)))
