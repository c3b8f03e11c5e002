"""``first_divergence`` on the generated zoo with a planted error (issue 35): in each model one
node's constant input is changed (the edited copy runs in dynashape, the original in
onnxruntime), and the first row must name the first node whose output differs, which
onnxruntime running the two models side by side finds independently; that is the planted node
wherever onnxruntime can output its value. In optimum's merged decoders the plant is inside the If's
taken branch, and onnxruntime's side-by-side run is of the two models with that branch inlined.
Without a plant there must be no row at all (no false divergence before the real one). Two feeds
of different shapes per model, fresh random values.

The Llama models are ``heavy`` like in test_generated.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from benchmarks.real_models_specs import EXPORTED as EXPORTED_SPECS
from benchmarks.real_models_specs import fetch
from dynashape.debug import compare_values, first_divergence, inline_branches, onnxruntime_values
from dynashape.frontend.expose import expose

from .test_generated import ALL_MODELS, G, params, t5_feeds

ort = pytest.importorskip("onnxruntime")

# the zoo's own tolerance for fp32 intermediates: summation orders differ, nothing else
RTOL, ATOL = 1e-3, 1e-4
# absolute tolerances where a model's intermediates are large: the ultralytics YOLO's head works in
# pixels (hundreds), and its summation-order differences reach 2e-3 there (as onnxruntime's own two
# optimization levels differ by 4e-4 at its output)
ATOL_OF = {"ultralytics-yolov8-nms": 1e-2}
# ops whose float inputs may set a shape: a changed value there moves shapes, not values
QUANTIZING = {"DynamicQuantizeLinear", "QuantizeLinear", "DynamicQuantizeMatMul", "QAttention", "QLinearMatMul",
              "QLinearAdd", "QLinearMul", "QLinearConv", "QLinearGlobalAveragePool"}
SHAPE_OPS = {"Resize", "Upsample", "Range", "ConstantOfShape", "Reshape", "Expand", "Tile", "Slice", "Pad"}


MERGED_DECODERS = frozenset({"whisper-dec", "bart-dec"})
EXPORTED = {s.name: s for s in EXPORTED_SPECS}  # tests/zoo/exported: written by ultralytics, optimum, SAM


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


def _seq2seq_feeds(rng, c: dict, enc_mask: bool, b: int, s: int, past: int, enc_len: int) -> dict:
    """optimum's merged decoder: use_cache_branch True exactly when there is a past (whose
    cross-attention part has the encoder's length); Whisper's encoder length is fixed (frames / 2)."""
    heads, hd = c["heads"], c["d_model"] // c["heads"]
    enc_len = enc_len if enc_mask else c["frames"] // 2
    feeds = {"input_ids": rng.integers(0, c["vocab"], (b, s)).astype(np.int64),
             "encoder_hidden_states": rng.standard_normal((b, enc_len, c["d_model"])).astype(np.float32),
             "use_cache_branch": np.array([past > 0])}
    if enc_mask:
        feeds["encoder_attention_mask"] = G.right_padded_mask(rng, b, enc_len)
    for n in G.seq2seq_past_io(c["layers"])[0]:
        length = (past if ".decoder." in n else enc_len) if past else 0
        feeds[n] = rng.standard_normal((b, heads, length, hd)).astype(np.float32)
    return feeds


def feeds_of(name: str, rng) -> list[dict]:
    if name in EXPORTED:  # the exporters' models: two points of their benchmark sequence
        spec = EXPORTED[name]
        return [spec.make(rng, p) for p in spec.sequence[1:3]]
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
    if name in MERGED_DECODERS:  # a prompt on the no-past branch, then a step with past on the other
        c, enc_mask = (G.WHISPER, False) if name == "whisper-dec" else (G.BART, True)
        return [_seq2seq_feeds(rng, c, enc_mask, 2, 3, 0, 7), _seq2seq_feeds(rng, c, enc_mask, 1, 1, 4, 5)]
    if name == "sbert":
        return [G.bert_feeds(rng, 2, 9), G.bert_feeds(rng, 3, 5)]
    if name == "yolo-nms":
        return [G.yolo_feeds(rng, 2, 96, 64), G.yolo_feeds(rng, 1, 64, 96)]
    if name == "sam-decoder":
        return [G.sam_feeds(rng, 2, 5), G.sam_feeds(rng, 1, 2)]
    raise KeyError(name)


# the plant ------------------------------------------------------------------------------------------------
def _readers(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Value name -> the indices of the nodes that read it."""
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(model.graph.node):
        for x in n.input:
            readers.setdefault(x, []).append(i)
    return readers


def plant_candidates(model: onnx.ModelProto) -> list[tuple[int, str]]:
    """(node index, initializer) pairs where a float initializer is read by that node alone (not
    an input that may set a shape), the ones nearest the middle of the graph first."""
    readers = _readers(model)
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


def first_changed(original: onnx.ModelProto, edited: onnx.ModelProto, feeds: dict, atol: float = ATOL) -> str | None:
    """The first node (in graph order) whose output onnxruntime computes differently for the two
    models: the answer first_divergence must give, found without dynashape."""
    before, _ = _ort_values(original, feeds)
    after, names = _ort_values(edited, feeds)
    producer = {o: n.name for n in edited.graph.node for o in n.output}
    for name in names:
        row = compare_values(after[name], before[name], RTOL, atol)
        if row is not None and row[1]:
            return producer[name]
    return None


def branch_plants(model: onnx.ModelProto, flat: onnx.ModelProto) -> list[tuple[int, str]]:
    """optimum's branches read the shared weights through an Identity each (``no_past/Identity_12``
    = Identity(an initializer of the main graph)): (index in ``flat``, the inlined Identity's name)
    for each one in the taken branch of a float weight whose copy feeds one node alone, that node
    nearest the middle of the branch first. The plant puts an edited copy of the weight inside the
    branch, as the branch's own initializer under the Identity's output name, in place of the
    Identity: the first value to change is then the reading node's output, inside the branch."""
    inits = {t.name: t for t in model.graph.initializer}
    readers = _readers(flat)
    outputs = {o.name for o in model.graph.output}
    out = []
    for n in flat.graph.node:
        if n.op_type != "Identity" or " / " not in n.name or n.input[0] not in inits:
            continue
        if inits[n.input[0]].data_type != onnx.TensorProto.FLOAT or n.output[0] in outputs:
            continue
        users = set(readers.get(n.output[0], []))
        if len(users) == 1 and flat.graph.node[min(users)].op_type not in SHAPE_OPS:
            out.append((min(users), n.name))
    mid = len(flat.graph.node) // 2
    return sorted(out, key=lambda c: (abs(c[0] - mid), c[0]))


def planted_in_branch(model: onnx.ModelProto, inlined: str) -> onnx.ModelProto:
    """A copy of ``model`` where the branch's Identity named by ``inlined`` ("<If> / <branch> / <node>")
    is replaced by an initializer of that branch holding the weight scaled and shifted."""
    if_name, branch, inner = inlined.split(" / ", 2)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    node = next(n for n in out.graph.node if n.name == if_name)
    body = next(a.g for a in node.attribute if a.name == branch)
    k = next(i for i, n in enumerate(body.node) if n.name == inner)
    ident = body.node[k]
    a = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == ident.input[0]))
    body.initializer.append(numpy_helper.from_array((a * 1.5 + 0.25).astype(a.dtype), ident.output[0]))
    del body.node[k]
    return out


def natural_limit(name: str, step: int, flat: onnx.ModelProto, model: onnx.ModelProto, feeds: dict) -> int:
    """The index in ``flat`` (``model`` with its taken branches inlined) of the first node that
    differs without a plant (the node count when none does).
    Only a decision on float values may: in a quantized model an activation within float rounding
    of a quantization step rounds to the neighbouring integer (test_generated.py's tolerances say
    why), one step, of a quantizing op; NonMaxSuppression keeps or drops a pair of boxes whose IoU
    lies within float rounding of its threshold (test_exported.py checks those exactly on our own
    inputs). first_divergence rightly reports either. A plant must come before it."""
    rows = first_divergence(model, feeds, rtol=RTOL, atol=ATOL_OF.get(name, ATOL))
    if not rows:
        return len(flat.graph.node)
    first = rows[0]
    rounding = "q" in name.split("-", 1)[-1] and first.op_type in QUANTIZING and first.max_abs <= 1
    assert rounding or first.op_type == "NonMaxSuppression", \
        f"{name} step {step}: the unplanted model differs: {rows[:3]}"
    return next(i for i, n in enumerate(flat.graph.node) if n.name == first.node)


def check_planted(name: str, path, seed: int) -> None:
    model = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    for step, feeds in enumerate(feeds_of(name, rng)):
        # an If's taken branch inlined (the condition is a feed here); the model itself when it has none
        flat = inline_branches(model, feeds)
        if flat is not model:  # the inlined copy computes what the If does, to the bit
            for got, want in zip(ort_run(flat, feeds), ort_run(model, feeds)):
                np.testing.assert_array_equal(got, want)
        index = {n.name: i for i, n in enumerate(flat.graph.node)}
        limit = natural_limit(name, step, flat, model, feeds)
        if flat is model:
            candidates = [(i, lambda init=init: planted(model, init)) for i, init in plant_candidates(model)]
        else:
            candidates = [(i, lambda ident=ident: planted_in_branch(model, ident))
                          for i, ident in branch_plants(model, flat)]
        for node_index, plant in candidates:  # the first plant that changes a value here
            if node_index >= limit:
                continue
            edited = plant()
            truth = first_changed(flat, inline_branches(edited, feeds), feeds, ATOL_OF.get(name, ATOL))
            if truth is not None and index[truth] < limit:
                break
        else:
            pytest.fail(f"{name} step {step}: no plant before node {limit} changed any value")
        node = flat.graph.node[node_index]
        typed = expose(flat, "all")
        has_type = {o.name for o in typed.graph.output if o.type.tensor_type.elem_type}
        if any(o in has_type for o in node.output):
            assert truth == node.name, f"{name}: onnxruntime sees {truth!r} change first, not the planted {node.name!r}"
        rows = first_divergence(edited, feeds, rtol=RTOL, atol=ATOL_OF.get(name, ATOL), reference=model)
        assert rows, f"{name} step {step}: no row for the plant in {node.name!r} ({node.op_type})"
        assert rows[0].node == truth, (f"{name} step {step}: planted in {node.name!r} ({node.op_type}); first "
                                       f"changed {truth!r}; first_divergence says {rows[0]}")
        if flat is not model:
            assert " / " in truth  # (a node inside the branch, named through its If)


def ort_run(model: onnx.ModelProto, feeds: dict) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("zoo_model", params(ALL_MODELS), indirect=True)
def test_first_divergence_finds_a_planted_error(zoo_model):
    """For optimum's merged decoders (one If at the top level, each branch a whole decoder reading the
    weights of the main graph), the plant is inside the branch the feeds take, and the row names the
    node inside it (``"optimum::if / then_branch / with_past/MatMul_3"``)."""
    name, path = zoo_model
    check_planted(name, path, seed=sum(map(ord, name)))


@pytest.mark.parametrize("name", list(EXPORTED))
def test_first_divergence_finds_a_planted_error_in_the_exporters_models(name):
    """The same on the files ultralytics, optimum and segment-anything wrote (tests/zoo/exported)."""
    check_planted(name, fetch(EXPORTED[name]), seed=sum(map(ord, name)))
