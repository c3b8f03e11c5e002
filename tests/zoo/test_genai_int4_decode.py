"""The 2-layer Llama of onnxruntime-genai's model builder at int4 (``-p int4 -e cpu``: MatMulNBits
with accuracy_level 4, activations quantized to int8 per block) over 256 decode steps.

A product one ulp away from onnxruntime's can quantize to another int8 value in the next product,
and that stays in the KV cache: with the MatMulNBits of before (int8 A, then a float matmul), 5 of
8 prompts drifted from onnxruntime by 4e-5 to 5e-3 on logits within 256 steps. Here:

* every MatMulNBits node of the model, fed onnxruntime's own input at each of 256 steps (random
  tokens forced), gives onnxruntime's output to the bit (the old kernel differed in most outputs);
* end to end, with onnxruntime-genai's greedy tokens forced, the logits of every step within 1e-5
  of onnxruntime's, and free-running, the greedy tokens equal onnxruntime-genai's for 256 steps,
  for the two prompts below. This is not yet so for every prompt: GroupQueryAttention,
  SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization and Sigmoid still round
  differently from onnxruntime's kernels in some outputs (by 3e-8 to 7e-7, fed onnxruntime's
  inputs), and such an ulp can still flip an int8 activation: 3 of the 8 prompts measured drift
  (1e-3 to 4e-3) within 256 steps. These two prompts passed with the old kernel too: the
  node-by-node test is the one that tells the kernels apart.

The checkpoint is scripts/make_zoo_models.py's (random weights, a word-level tokenizer) with room
for 512 positions; building it takes seconds. Skips where onnxruntime-genai, transformers or
tokenizers is not installed (the ``zoo`` extra), or on a CPU without AVX-512 VNNI (onnxruntime's
kernels sum in another order there: tests/contrib/test_nbits_int8.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import dynashape
from dynashape.ops import native
from tests.zoo.conftest import load_generator

STEPS, PROMPT = 256, 8

# heavy: ~40 s of CPU (the build, then three decode loops of 256 steps and onnxruntime-genai's)
pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif("avx512_vnni" not in native.cpuinfo("flags").split(),
                                 reason="onnxruntime's MatMulNBits int8 kernel sums in another order "
                                        "without AVX-512 VNNI")]


@pytest.fixture(scope="module")
def genai_dir(tmp_path_factory):
    for pkg in ("onnxruntime_genai", "transformers", "tokenizers"):
        pytest.importorskip(pkg, reason=f"{pkg} (the zoo extra) builds this model")
    G = load_generator()
    d = tmp_path_factory.mktemp("genai-int4")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(G.LLAMA, "max_positions", 512)  # the prompt and 256 steps, with room
        G.make_llama_checkpoint(d / "hf")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(d / "hf"), "-o",
                        str(d / "out"), "-p", "int4", "-e", "cpu", "-c", str(d / "cache")],
                       cwd=d, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stderr or r.stdout)[-2000:]
    return d / "out"


def _past_names(layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def _decode(sess, prompt: np.ndarray, forced: list[int] | None) -> tuple[list[np.ndarray], list[int]]:
    """The prompt, then one token a step (``forced``, or the greedy choice): the last position's
    logits of each of STEPS calls, and the tokens fed after them."""
    c = load_generator().LLAMA
    hd = c["hidden"] // c["heads"]
    names = _past_names(c["layers"])
    past = {n: np.zeros((1, c["kv_heads"], 0, hd), np.float32) for n in names}
    outs = [o.name for o in sess.get_outputs()]
    ids, total, logits, tokens = prompt, 0, [], []
    for step in range(STEPS):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total + ids.shape[1]), np.int64), **past}
        out = dict(zip(outs, sess.run(None, feeds)))
        total += ids.shape[1]
        last = np.asarray(out["logits"])[0, -1].copy()
        logits.append(last)
        tokens.append(int(last.argmax()) if forced is None else forced[step])
        ids = np.array([[tokens[-1]]], np.int64)
        past = {n: np.asarray(out[n.replace("past_key_values", "present")]) for n in names}
    return logits, tokens


def _genai_greedy(folder, prompt: np.ndarray) -> list[int]:
    import onnxruntime_genai as og
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=PROMPT + STEPS, min_length=PROMPT + STEPS)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt[0].astype(np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[PROMPT:]]


@pytest.mark.parametrize("seed", [0, 1])
def test_int4_decode_follows_onnxruntime_for_256_steps(genai_dir, seed):
    import onnx
    path = str(genai_dir / "model.onnx")
    levels = {a.i for n in onnx.load(path, load_external_data=False).graph.node if n.op_type == "MatMulNBits"
              for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {4}, f"the builder's int4 CPU model no longer quantizes activations: levels {levels}"
    vocab = load_generator().LLAMA["vocab"]
    prompt = np.random.default_rng(seed).integers(4, vocab, (1, PROMPT)).astype(np.int64)
    want_tokens = _genai_greedy(genai_dir, prompt)
    assert len(want_tokens) == STEPS
    # the same tokens forced on both: the logits of every step
    ref, _ = _decode(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), prompt, want_tokens)
    got, _ = _decode(dynashape.InferenceSession(path), prompt, want_tokens)
    worst = [float(np.abs(g - r).max()) for g, r in zip(got, ref)]
    bad = [i for i, w in enumerate(worst) if w > 1e-5]
    assert not bad, f"logits differ by more than 1e-5 from step {bad[0]} on (max {max(worst):.3g})"
    # free-running: dynashape's own greedy choices
    _, tokens = _decode(dynashape.InferenceSession(path), prompt, None)
    first = next((i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b), None)
    assert first is None, f"greedy tokens leave onnxruntime-genai's at step {first}"


def test_every_matmul_nbits_node_gives_onnxruntimes_bits(genai_dir):
    """Each MatMulNBits node of the model as a one-node session, fed onnxruntime's input for it at
    every step of a 256-step decode with random tokens forced (fresh random activations each step)."""
    import onnx
    from onnx import helper

    path = str(genai_dir / "model.onnx")
    model = onnx.load(path)
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    singles = []
    for n in nodes:
        g = helper.make_graph([n], "one", [onnx.ValueInfoProto(name=n.input[0])],
                              [onnx.ValueInfoProto(name=n.output[0])], [inits[x] for x in n.input[1:] if x in inits])
        one = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
        singles.append((n.input[0], n.output[0], dynashape.InferenceSession(one)))
        model.graph.output.extend(onnx.ValueInfoProto(name=x) for x in (n.input[0], n.output[0]))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [o.name for o in ref.get_outputs()]

    class Checked:  # onnxruntime's run, with every MatMulNBits redone here from its input
        def get_outputs(self):
            return ref.get_outputs()

        def run(self, _, feeds):
            res = ref.run(None, feeds)
            got = dict(zip(outs, res))
            for a, y, sess in singles:
                mine = sess.run(None, {a: got[a]})[0]
                differ = int((mine != got[y]).sum())
                assert differ == 0, f"{y}: {differ} of {mine.size} outputs differ from onnxruntime's"
            return res

    vocab = load_generator().LLAMA["vocab"]
    rng = np.random.default_rng(5)
    prompt = rng.integers(4, vocab, (1, PROMPT)).astype(np.int64)
    _decode(Checked(), prompt, [int(t) for t in rng.integers(4, vocab, STEPS)])
