"""gqa_as_concat (frontend/gqa_concat.py): onnxruntime's GroupQueryAttention written out as exporters
write attention, so that a model builder's decoder steps in whole-step graphs. A two-layer decoder
made here the way the builder makes its graphs (packed QKV, rotary caches, seqlens_k and
total_sequence_length from the attention mask) is checked against onnxruntime running the original
op, on sequences of prompts and decode steps with fresh random inputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dynashape
import dynashape.generate as dg
from dynashape.frontend.gqa_concat import gqa_as_concat, refusal

V, D, N, KV, H, LAYERS, MAXPOS = 64, 64, 4, 2, 16, 2, 128


def _decoder(seed: int = 0, **gqa_attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    inv = 1.0 / 10000 ** (np.arange(0, H, 2) / H)
    ang = np.arange(MAXPOS)[:, None] * inv[None, :]
    inits = [numpy_helper.from_array(w(V, D), "emb"), numpy_helper.from_array(w(D, V), "lm"),
             numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos_cache"),
             numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin_cache"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(1, np.int64), "idx1")]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["x0"]),
             helper.make_node("ReduceSum", ["attention_mask", "one"], ["msum"]),
             helper.make_node("Sub", ["msum", "one"], ["msub"]),
             helper.make_node("Cast", ["msub"], ["seqlens_k"], to=TensorProto.INT32),
             helper.make_node("Shape", ["attention_mask"], ["mshape"]),
             helper.make_node("Gather", ["mshape", "idx1"], ["tot64"]),
             helper.make_node("Cast", ["tot64"], ["total"], to=TensorProto.INT32)]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_len"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", V])]
    attrs = {"num_heads": N, "kv_num_heads": KV, "do_rotary": 1, "scale": 1.0 / np.sqrt(H), **gqa_attrs}
    x = "x0"
    for i in range(LAYERS):
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        inputs += [helper.make_tensor_value_info(p, TensorProto.FLOAT, ["batch", KV, "past", H]) for p in (pk, pv)]
        outputs += [helper.make_tensor_value_info(f"present.{i}.{kv}", TensorProto.FLOAT, ["batch", KV, "tot", H])
                    for kv in ("key", "value")]
        inits += [numpy_helper.from_array(w(D, (N + 2 * KV) * H), f"wqkv{i}"),
                  numpy_helper.from_array(w(N * H, D), f"wo{i}")]
        nodes += [helper.make_node("MatMul", [x, f"wqkv{i}"], [f"qkv{i}"]),
                  helper.make_node("GroupQueryAttention",
                                   [f"qkv{i}", "", "", pk, pv, "seqlens_k", "total", "cos_cache", "sin_cache"],
                                   [f"attn{i}", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                                   **attrs),
                  helper.make_node("MatMul", [f"attn{i}", f"wo{i}"], [f"o{i}"]),
                  helper.make_node("Add", [x, f"o{i}"], [f"x{i + 1}"])]
        x = f"x{i + 1}"
    nodes.append(helper.make_node("MatMul", [x, "lm"], ["logits"]))
    graph = helper.make_graph(nodes, "gqa_decoder", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _half(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder in float16 (as the builder's ``-e cuda`` models are): weights, caches, inputs, outputs."""
    for t in model.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in list(model.graph.input) + list(model.graph.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    return model


def _feeds(rng, b: int, s: int, past: int) -> dict:
    f = {"input_ids": rng.integers(0, V, (b, s)).astype(np.int64),
         "attention_mask": np.ones((b, past + s), np.int64)}
    for i in range(LAYERS):
        for kv in ("key", "value"):
            f[f"past_key_values.{i}.{kv}"] = rng.standard_normal((b, KV, past, H)).astype(np.float32)
    return f


# (batch, new tokens, past): prompts, decode steps over growing pasts, a batch's decode steps
SEQUENCE = [(1, 5, 0), (1, 1, 5), (1, 1, 6), (1, 1, 7), (3, 4, 0), (3, 1, 4), (3, 1, 5), (1, 1, 30), (2, 1, 9)]


def _ort(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("decode_graphs", ["off", "on"])
def test_written_out_model_computes_the_op_on_unpadded_rows(decode_graphs, device):
    model = _decoder()
    rewritten, why = gqa_as_concat(model)
    assert why is None and not any(n.op_type == "GroupQueryAttention" for n in rewritten.graph.node)
    ref, theirs = _ort(model), _ort(rewritten)
    sess = dynashape.InferenceSession(model, gqa_as_concat=True, decode_graphs=decode_graphs, device=device)
    rng = np.random.default_rng(1)
    for b, s, past in SEQUENCE:
        f = _feeds(rng, b, s, past)
        want = ref.run(None, f)
        for got in (theirs.run(None, f), sess.run(None, f)):
            for w, g in zip(want, got):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    assert sess.stats()["gqa_as_concat"] == "rewritten"


def test_float16_model_computes_the_op(device):
    # the mask's lowest value and the rotary caches in float16; results within float16's rounding
    model = _half(_decoder(seed=5))
    ref = _ort(model)
    sess = dynashape.InferenceSession(model, gqa_as_concat=True, device=device)
    rng = np.random.default_rng(2)
    for b, s, past in SEQUENCE:
        f = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in _feeds(rng, b, s, past).items()}
        for w, g in zip(ref.run(None, f), sess.run(None, f)):
            w, g = w.astype(np.float32), g.astype(np.float32)
            np.testing.assert_allclose(g, w, rtol=5e-3, atol=5e-3 * max(1.0, float(np.abs(w).max())))


def _folder(tmp_path, model: onnx.ModelProto):
    onnx.save(model, str(tmp_path / "model.onnx"))
    cfg = {"model": {"decoder": {"filename": "model.onnx", "head_size": H, "hidden_size": D, "num_attention_heads": N,
                                 "num_key_value_heads": KV, "num_hidden_layers": LAYERS,
                                 "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                            "past_key_names": "past_key_values.%d.key",
                                            "past_value_names": "past_key_values.%d.value"},
                                 "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                             "present_value_names": "present.%d.value"}},
                     "eos_token_id": -1, "pad_token_id": 0, "context_length": MAXPOS, "type": "llama",
                     "vocab_size": V},
           "search": {"max_length": MAXPOS, "past_present_share_buffer": True}}
    (tmp_path / "genai_config.json").write_text(json.dumps(cfg))
    return tmp_path


def _generate(model: dg.Model, prompts, steps: int):
    params = dg.GeneratorParams(model)
    params.set_search_options(max_length=max(len(p) for p in prompts) + steps)
    gen = dg.Generator(model, params)
    gen.append_tokens(prompts if len(prompts) > 1 else np.asarray(prompts))
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(gen.get_next_tokens().tolist())
    return np.asarray(out).T, gen.request.stats()


def test_generation_steps_in_whole_step_graphs_with_the_op_s_tokens(tmp_path, device):
    folder = _folder(tmp_path, _decoder(seed=2))
    plain = dg.Model(str(folder), device=device, gqa_as_concat=False)
    written = dg.Model(str(folder), device=device, decode_graphs="on", gqa_as_concat=True)
    for prompt in ([5, 9, 2, 33], [7] * 11):
        want, _ = _generate(plain, [prompt], 40)
        got, stats = _generate(written, [prompt], 40)
        assert got.tolist() == want.tolist()
        assert stats["decode_graph_replays"] >= 30, stats  # the steps ran as the whole-step function


@pytest.mark.parametrize("written", [True, False], ids=["written-out-left-padded", "op-right-padded"])
def test_padded_rows_get_their_lone_tokens(tmp_path, device, written):
    # the written-out model follows HF's convention for padded rows (left padding under the mask); the
    # op's rows are right-padded (each row's tokens from its start, its next one at its length): either
    # way each row of a batch of prompts of different lengths gets the tokens it gets alone
    model = dg.Model(str(_folder(tmp_path, _decoder(seed=3))), device=device, decode_graphs="on",
                     gqa_as_concat=written)
    assert model.pad_right is not written
    prompts = [[4, 8, 15, 16, 23, 42], [1, 2], [60, 61, 62, 63]]
    got, _ = _generate(model, prompts, 20)
    for row, prompt in enumerate(prompts):
        alone, _ = _generate(model, [prompt], 20)
        assert got[row].tolist() == alone[0].tolist(), row


@pytest.mark.parametrize("attrs, why", [({"local_window_size": 4}, "attributes"), ({"softcap": 5.0}, "attributes"),
                                        ({"rotary_interleaved": 1}, "attributes")])
def test_forms_it_does_not_write_out_are_left_as_they_are(attrs, why):
    model = _decoder(**attrs)
    out, reason = gqa_as_concat(model)
    assert out is model and why in reason
    sess = dynashape.InferenceSession(model, gqa_as_concat=True)
    assert why in sess.gqa_as_concat


def test_seqlens_not_read_from_the_mask_is_refused():
    model = _decoder()
    for n in model.graph.node:  # seqlens_k from elsewhere: the op's rows need not be whole
        if n.op_type == "Cast" and n.output[0] == "seqlens_k":
            n.input[0] = "tot64"
    assert "seqlens_k" in refusal(model)
    assert refusal(helper.make_model(helper.make_graph([], "empty", [], []))) == "no GroupQueryAttention"


def test_the_paged_engine_keeps_the_op(tmp_path):
    # the engine's rows follow the op's convention (right-padded, each placed by its own length)
    from dynashape.errors import InvalidModelError
    from dynashape.paged.engine import PagedEngine
    folder = str(_folder(tmp_path, _decoder(seed=4)))
    engine = PagedEngine(folder, block_size=16, num_blocks=32, max_rows=4)
    assert engine.convention == "gqa" and engine.model.session.gqa_as_concat is None
    with pytest.raises(InvalidModelError, match="gqa_as_concat"):
        PagedEngine(dg.Model(folder, gqa_as_concat=True), block_size=16, num_blocks=32)
