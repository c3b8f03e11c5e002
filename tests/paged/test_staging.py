"""A run's small arrays as views of one device buffer, filled by one copy (paged/staging.py)."""

import numpy as np
import pytest
import torch

from dynashape.paged.staging import ALIGN, Staged


def _arrays(rng, b):
    return {"ids": (rng.integers(0, 1000, (b, 3)), torch.int32),
            "tables": (rng.integers(0, 50, (b, 5)), torch.int64),
            "mask": (np.ones((b, 3), dtype=np.int64), torch.int64),
            "flag": (rng.random(b) < 0.5, torch.bool)}


def test_views_of_one_buffer_hold_each_array_in_its_dtype_and_refill():
    rng = np.random.default_rng(0)
    first = _arrays(rng, 4)
    st = Staged(first, torch.device("cpu"))
    for name, (a, dtype) in first.items():
        t = st.tensors[name]
        assert t.dtype == dtype and t.shape == a.shape and t.is_contiguous()
        assert t.untyped_storage().data_ptr() == st.buffer.untyped_storage().data_ptr()
        assert (t.data_ptr() - st.buffer.data_ptr()) % ALIGN == 0
        np.testing.assert_array_equal(t.numpy(), a.astype(t.numpy().dtype))
    second = _arrays(rng, 4)
    st.fill(second)
    for name, (a, _) in second.items():
        np.testing.assert_array_equal(st.tensors[name].numpy(), a.astype(st.tensors[name].numpy().dtype))


def test_a_refill_of_another_shape_is_refused_by_name():
    rng = np.random.default_rng(1)
    st = Staged(_arrays(rng, 4), torch.device("cpu"))
    with pytest.raises(ValueError, match="'ids'"):
        st.fill(_arrays(rng, 2))
