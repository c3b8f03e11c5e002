"""Host-fed indices of a CUDA session are checked before the copy (runtime/index_feeds.py). The
checks are built from the graph; here they run on the CPU (the CUDA run of tests/reliability
covers a session on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynashape.errors import IndexOutOfRangeError
from dynashape.runtime.index_feeds import IndexFeedChecks
from tests.reliability import cases as C


def _checks(model_fn) -> IndexFeedChecks:
    import onnx

    from dynashape.frontend.options import ParseOptions
    from dynashape.frontend.parse import parse_model
    m = model_fn()
    return IndexFeedChecks(parse_model(m if isinstance(m, onnx.ModelProto) else onnx.load_from_string(m),
                                       ParseOptions()))


INDEX_CASES = [c for c in C.all_cases() if c.group == "indices" and "out-of-range" in c.id]


@pytest.mark.parametrize("case", INDEX_CASES, ids=[c.id for c in INDEX_CASES])
def test_out_of_range_host_indices_are_refused(case):
    checks = _checks(case.model)
    with pytest.raises(IndexOutOfRangeError):
        checks(case.feeds())
    checks(case.good())  # good indices pass


def test_what_is_not_a_host_int_array_is_left_to_the_feed_check():
    checks = _checks(C.gather)
    checks({"x": C.f32(3, 4), "i": np.array([0.5, 99.0])})  # floats: the feed check's InputTypeError says why
    checks({"x": C.f32(3, 4), "i": torch.tensor([0, 99], device="meta")})  # a device tensor: not read back
    checks([1, 2])  # not a dict: the feed check says why
