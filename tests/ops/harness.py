"""Check one op against onnxruntime and onnx's ReferenceEvaluator over a sequence of shapes.

    check_op("Add", [[(2, 3), (2, 3)], [(5, 3), (1, 3)]], opset=17)

builds a one-node model whose inputs have fully dynamic dims (so the *same* session sees every
shape of the sequence), feeds fresh random data each step, and compares every output.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper

import dynashape

RTOL, ATOL = 1e-4, 1e-5
# The same tests run on a GPU with DYNASHAPE_TEST_DEVICE=cuda (CI has none: CPU there).
DEVICE = os.environ.get("DYNASHAPE_TEST_DEVICE", "cpu")


def rand(shape, dtype=np.float32, rng: np.random.Generator | None = None, low=-2.0, high=2.0) -> np.ndarray:
    """Fresh random data, never zeros: floats in [low, high], ints in [low, high)."""
    rng = rng or np.random.default_rng()
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo = max(int(low), 0) if dtype.kind == "u" else int(low)
        return rng.integers(lo, max(int(high), lo + 1), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def make_model(op_type: str, n_inputs: int, in_types: Sequence[int], attrs: dict | None = None,
               opset: int = 17, n_outputs: int = 1, const_inputs: dict[int, np.ndarray] | None = None,
               ranks: Sequence[int] | None = None, domain: str = "") -> onnx.ModelProto:
    """A model of one node; input i is a graph input of rank ranks[i] with dynamic dims, or a
    constant initializer when i is in const_inputs. Outputs have unknown shapes."""
    const_inputs = const_inputs or {}
    names = [f"in{i}" for i in range(n_inputs)]
    inputs, inits = [], []
    for i, name in enumerate(names):
        if i in const_inputs:
            inits.append(onnx.numpy_helper.from_array(const_inputs[i], name))
        elif ranks is not None:
            inputs.append(helper.make_tensor_value_info(name, in_types[i], [f"d{i}_{k}" for k in range(ranks[i])]))
        else:
            inputs.append(helper.make_tensor_value_info(name, in_types[i], None))
    outs = [f"out{k}" for k in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **(attrs or {}))
    g = helper.make_graph([node], op_type.lower(), inputs,
                          [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
                          initializer=inits)
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(g, opset_imports=imports, ir_version=8)
    # onnxruntime wants typed outputs: take the element types from ONNX's own inference
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = list(inferred.graph.value_info) + list(inferred.graph.output)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in infos}
    for o in model.graph.output:
        if types.get(o.name):
            o.type.tensor_type.elem_type = types[o.name]
    return model


def compare(got, want, what: str, rtol=RTOL, atol=ATOL) -> None:
    if isinstance(want, list):  # a sequence: element by element
        assert isinstance(got, list) and len(got) == len(want), f"{what}: {got!r} is not a sequence of {len(want)}"
        for j, (g, w) in enumerate(zip(got, want)):
            compare(g, w, f"{what}[{j}]", rtol, atol)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}"
    if want.dtype == object or want.dtype.kind in "biuSU":
        assert got.dtype == want.dtype or want.dtype == object, f"{what}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def run_sequence(model: onnx.ModelProto, feeds_seq: Sequence[dict], references=("ort", "ref"),
                 rtol=RTOL, atol=ATOL, device=DEVICE, **session_options) -> dynashape.InferenceSession:
    """Run every feed dict through one dynashape session and compare with the references."""
    sess = dynashape.InferenceSession(model, device=device, **session_options)
    ort = ref = None
    if "ort" in references:
        import onnxruntime as ort_mod
        so = ort_mod.SessionOptions()
        so.graph_optimization_level = ort_mod.GraphOptimizationLevel.ORT_DISABLE_ALL
        ort = ort_mod.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    if "ref" in references:
        from onnx.reference import ReferenceEvaluator
        ref = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    for step, feeds in enumerate(feeds_seq):
        got = sess.run(None, feeds)
        for label, engine in (("onnxruntime", ort), ("reference", ref)):
            if engine is None:
                continue
            want = engine.run(None, feeds)
            # zip stops at the shorter list: a missing or extra output would go unchecked
            assert len(got) == len(want) == len(names), (
                f"step {step} {label}: {len(got)} outputs, {len(want)} from the reference, "
                f"the model declares {len(names)}")
            for name, g, w in zip(names, got, want):
                compare(g, w, f"step {step} {label} output {name} (input shapes "
                              f"{[_shape(v) for v in feeds.values()]})", rtol, atol)
    return sess


def _shape(v):
    return [np.shape(x) for x in v] if isinstance(v, list) else np.shape(v)


def check_op(op_type: str, shape_seq: Sequence[Sequence[tuple]], attrs: dict | None = None, opset: int = 17,
             dtypes: Sequence | None = None, n_outputs: int = 1, const_inputs: dict | None = None,
             make_input: Callable | None = None, references=("ort", "ref"), rtol=RTOL, atol=ATOL,
             seed: int = 0) -> dynashape.InferenceSession:
    """Check ``op_type`` over a sequence of input-shape lists (one list of shapes per run).

    ``make_input(i, shape, rng)`` can supply the data of input i (indices, axes, ...);
    by default float32 random data in [-2, 2]. Inputs in ``const_inputs`` are initializers.
    """
    rng = np.random.default_rng(seed)
    n_in = len(shape_seq[0])
    dtypes = list(dtypes or [np.float32] * n_in)
    in_types = [onnx.helper.np_dtype_to_tensor_dtype(np.dtype(d)) for d in dtypes]
    ranks = [len(s) for s in shape_seq[0]]
    if any([len(s) for s in shapes] != ranks for shapes in shape_seq):
        ranks = None  # the rank changes along the sequence: declare the inputs with unknown rank
    model = make_model(op_type, n_in, in_types, attrs, opset, n_outputs, const_inputs, ranks)
    feeds_seq = []
    for shapes in shape_seq:
        feeds = {}
        for i, shp in enumerate(shapes):
            if const_inputs and i in const_inputs:
                continue
            x = make_input(i, shp, rng) if make_input else None
            feeds[f"in{i}"] = rand(shp, dtypes[i], rng) if x is None else x
        feeds_seq.append(feeds)
    return run_sequence(model, feeds_seq, references, rtol, atol)


def recurrent_step_inputs(g, t: int, n: int, i: int, h: int, d: int, lens: bool, init: bool):
    """Fresh (X (T, N, I), sequence_lens or None, initial_h, initial_c or None) for a recurrent
    layer of D directions and hidden size H, as torch tensors from the generator ``g``."""
    import torch
    x = torch.randn(t, n, i, generator=g)
    sl = torch.randint(1, t + 1, (n,), generator=g).to(torch.int32) if lens else None
    h0 = torch.randn(d, n, h, generator=g) * 0.5 if init else None
    c0 = torch.randn(d, n, h, generator=g) * 0.5 if init else None
    return x, sl, h0, c0


def other_build(name: str, symbol: str, like, arch: str, cache):
    """``symbol`` of ops/csrc/<name>.c built for another x86 CPU (``x86-64-v3``: AVX2; ``x86-64``:
    no SIMD extension), with the signature of ``like`` (this CPU's function); skips the test off
    x86 or without a compiler."""
    import platform

    import pytest

    from dynashape.ops import native
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 builds")
    try:
        lib = native.build(name, arch=arch, cache=cache)
    except OSError as e:
        from tests.native_report import NATIVE_SKIP
        pytest.skip(f"{NATIVE_SKIP}: {e}")  # counted at the end of the run; an error where CI is set
    fn = getattr(lib, symbol)
    fn.argtypes, fn.restype = like.argtypes, like.restype
    return fn
